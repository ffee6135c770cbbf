/* aotr_archive_tool [--verify] [--find ARCH DIR] ARCHIVE...
 *
 * Opens each archive through the public API and prints one line for it:
 *   OK <arch> <abi_version> <kernel count>
 *   ERROR <status name>: <message>
 * --verify also checks every code object. --find prints "FOUND <path>" (or
 * an ERROR line) for aotr_find_archive(ARCH, DIR) (DIR "" means none) and
 * opens what it found. Exit status: 0 when every step succeeded, 1 when one
 * failed, 2 on bad usage. */
#include <stdio.h>
#include <string.h>

#include "aotriton_rocm/aotriton_rocm.h"

static void error_line(aotr_status st)
{
    printf("ERROR %s: %s\n", aotr_status_name(st), aotr_last_error());
}

static int check(const char *path, int verify)
{
    aotr_archive *a = NULL;
    aotr_status st = aotr_archive_open(path, &a);
    if (st == AOTR_OK && verify)
        st = aotr_archive_verify(a);
    if (st != AOTR_OK) {
        error_line(st);
        aotr_archive_close(a);
        return 1;
    }
    const char *arch = aotr_archive_manifest_string(a, "arch");
    const char *abi = aotr_archive_manifest_string(a, "abi_version");
    printf("OK %s %s %zu\n", arch ? arch : "?", abi ? abi : "?", aotr_archive_kernel_count(a));
    aotr_archive_close(a);
    return 0;
}

int main(int argc, char **argv)
{
    int verify = 0, failed = 0, archives = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--verify") == 0) {
            verify = 1;
        } else if (strcmp(argv[i], "--find") == 0) {
            if (i + 2 >= argc) {
                fprintf(stderr, "usage: --find ARCH DIR\n");
                return 2;
            }
            const char *arch = argv[i + 1], *dir = argv[i + 2];
            i += 2;
            char path[4096];
            aotr_status st = aotr_find_archive(arch, dir[0] ? dir : NULL, path, sizeof path);
            archives++;
            if (st != AOTR_OK) {
                error_line(st);
                failed = 1;
                continue;
            }
            printf("FOUND %s\n", path);
            failed |= check(path, verify);
        } else if (strncmp(argv[i], "--", 2) == 0 && argv[i][2] != '\0') {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        } else {
            archives++;
            failed |= check(argv[i], verify);
        }
    }
    if (archives == 0) {
        fprintf(stderr, "usage: aotr_archive_tool [--verify] [--find ARCH DIR] ARCHIVE...\n");
        return 2;
    }
    fflush(stdout);
    return failed;
}
