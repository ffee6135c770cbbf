/* Locating `<arch>.aotr`: the caller's directory, AOTRITON_ROCM_ARCHIVE_DIR,
 * then the image packages installed beside this library. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "internal.h"

#define MAX_ARCH 64
#define PATH_CAP 4096

/* Any object of this library: dladdr on it names the library's file. */
static const char library_anchor = 0;

typedef struct search {
    const char *arch;
    char *out;
    size_t cap;
    char looked[1200]; /* "; "-separated places looked at, for the message */
    size_t looked_len;
    int found;
    aotr_status status;
} search;

static int valid_arch(const char *arch)
{
    size_t n = 0;
    for (const char *p = arch; *p; p++, n++) {
        char c = *p;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_'))
            return 0;
    }
    return n > 0 && n <= MAX_ARCH;
}

static void note(search *s, const char *place)
{
    if (s->looked_len >= sizeof s->looked)
        return;
    int n = snprintf(s->looked + s->looked_len, sizeof s->looked - s->looked_len, "%s%s",
                     s->looked_len ? ", " : "", place);
    if (n > 0)
        s->looked_len += (size_t)n;
    if (s->looked_len > sizeof s->looked)
        s->looked_len = sizeof s->looked;
}

/* Try `<dir>/<arch>.aotr`; 1 when the search is over (found, or an error). */
static int try_dir(search *s, const char *dir, size_t dir_len)
{
    char candidate[PATH_CAP];
    while (dir_len > 1 && dir[dir_len - 1] == '/')
        dir_len--;
    if (dir_len > INT_MAX)
        return 0;
    int n = snprintf(candidate, sizeof candidate, "%.*s/%s.aotr", (int)dir_len, dir, s->arch);
    if (n < 0 || (size_t)n >= sizeof candidate)
        return 0;
    note(s, candidate);
    struct statx st;
    if (statx(AT_FDCWD, candidate, 0, STATX_TYPE, &st) != 0 || !S_ISREG(st.stx_mode))
        return 0;
    if ((size_t)n >= s->cap) {
        s->status = aotr_fail(AOTR_INVALID_ARGUMENT,
                              "aotr_find_archive: found %s, but the path buffer holds %zu bytes "
                              "(needs %d)",
                              candidate, s->cap, n + 1);
    } else {
        memcpy(s->out, candidate, (size_t)n + 1);
        s->status = AOTR_OK;
        s->found = 1;
    }
    return 1;
}

/* Drop the last path component ("/a/b/c" -> "/a/b"); 0 when there is none. */
static int parent(char *p)
{
    char *slash = strrchr(p, '/');
    if (slash == NULL)
        return 0;
    if (slash == p)
        slash[1] = '\0';
    else
        *slash = '\0';
    return 1;
}

static int beside_library(search *s)
{
    Dl_info info;
    if (dladdr(&library_anchor, &info) == 0 || info.dli_fname == NULL)
        return 0;
    char libdir[PATH_MAX];
    if (realpath(info.dli_fname, libdir) == NULL) {
        if (strlen(info.dli_fname) >= sizeof libdir)
            return 0;
        strcpy(libdir, info.dli_fname);
    }
    if (!parent(libdir))
        return 0;
    char pkg[MAX_ARCH + 1];
    size_t k = 0;
    for (const char *p = s->arch; *p; p++)
        if (*p != '_')
            pkg[k++] = *p;
    pkg[k] = '\0';
    char dir[PATH_CAP];
    int n;
    /* wheel: site-packages/aotriton_rocm/lib/ -> site-packages/aotriton_rocm_<pkg>/ */
    strcpy(dir, libdir);
    if (parent(dir) && parent(dir)) {
        n = snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "%saotriton_rocm_%s",
                     dir[strlen(dir) - 1] == '/' ? "" : "/", pkg);
        if (n > 0 && (size_t)n < sizeof dir && try_dir(s, dir, strlen(dir)))
            return 1;
    }
    /* conda: <prefix>/lib/ -> <prefix>/share/aotriton-rocm/ */
    strcpy(dir, libdir);
    if (parent(dir)) {
        n = snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "%sshare/aotriton-rocm",
                     dir[strlen(dir) - 1] == '/' ? "" : "/");
        if (n > 0 && (size_t)n < sizeof dir && try_dir(s, dir, strlen(dir)))
            return 1;
    }
    return 0;
}

aotr_status aotr_find_archive(const char *arch, const char *dir, char *path, size_t path_capacity)
{
    if (arch == NULL || path == NULL || path_capacity == 0)
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "aotr_find_archive: arch and path must not be NULL, path_capacity > 0");
    path[0] = '\0';
    if (!valid_arch(arch))
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "aotr_find_archive: '%.80s' is not an arch name (letters, digits and "
                         "'_' only, e.g. gfx942 or sm_90)",
                         arch);
    search s = {.arch = arch, .out = path, .cap = path_capacity, .status = AOTR_NOT_FOUND};
    if (dir != NULL && dir[0] != '\0' && try_dir(&s, dir, strlen(dir)))
        goto done;
    const char *env = getenv("AOTRITON_ROCM_ARCHIVE_DIR");
    if (env != NULL) {
        for (const char *p = env;;) {
            const char *colon = strchr(p, ':');
            size_t len = colon ? (size_t)(colon - p) : strlen(p);
            if (len > 0 && try_dir(&s, p, len))
                goto done;
            if (colon == NULL)
                break;
            p = colon + 1;
        }
    }
    if (beside_library(&s))
        goto done;
done:
    if (s.found) {
        aotr_clear_error();
        return AOTR_OK;
    }
    if (s.status != AOTR_NOT_FOUND)
        return s.status;
    char pkg[MAX_ARCH + 1];
    size_t k = 0;
    for (const char *p = arch; *p; p++)
        if (*p != '_')
            pkg[k++] = *p;
    pkg[k] = '\0';
    return aotr_fail(AOTR_NOT_FOUND,
                     "no kernel archive for %s is installed (looked for %s). Install the kernel "
                     "image: pip install 'aotriton-rocm[%s]' (or the conda package), or set "
                     "AOTRITON_ROCM_ARCHIVE_DIR to the directory holding %s.aotr",
                     arch, s.looked_len ? s.looked : "nothing", pkg, arch);
}
