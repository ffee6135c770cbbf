/* aotr_archive_dump ARCHIVE: the internal view of an archive, for pytest to
 * compare with the Python reader. Prints one JSON object per kernel record
 * (the parsed fields and the sha256 of its code object), after fetching
 * every code object from 8 threads at once: all threads must get the same
 * bytes (one cached copy per record). Exit 0, or 1 with an ERROR line. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define THREADS 8

typedef struct job {
    size_t id;
    aotr_archive *archive;
    size_t count;
    const uint8_t **code; /* per record */
    size_t *size;
    aotr_status status;
    char message[512];
} job;

static void *fetch_all(void *arg)
{
    job *j = arg;
    /* every thread walks the records from a different start */
    size_t start = j->count ? j->id % j->count : 0;
    for (size_t k = 0; k < j->count; k++) {
        size_t i = (start + k) % j->count;
        aotr_status st = aotr_archive_code_object(j->archive, i, &j->code[i], &j->size[i]);
        if (st != AOTR_OK) {
            j->status = st;
            snprintf(j->message, sizeof j->message, "%s", aotr_last_error());
            return NULL;
        }
    }
    return NULL;
}

static void print_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: aotr_archive_dump ARCHIVE\n");
        return 2;
    }
    aotr_archive *a;
    aotr_status st = aotr_archive_open(argv[1], &a);
    if (st != AOTR_OK) {
        printf("ERROR %s: %s\n", aotr_status_name(st), aotr_last_error());
        return 1;
    }
    const aotr_kernel_record *records;
    size_t count = aotr_archive_records(a, &records);
    job jobs[THREADS];
    pthread_t threads[THREADS];
    for (int t = 0; t < THREADS; t++) {
        jobs[t] = (job){.id = (size_t)t, .archive = a, .count = count, .status = AOTR_OK};
        jobs[t].code = calloc(count + 1, sizeof *jobs[t].code);
        jobs[t].size = calloc(count + 1, sizeof *jobs[t].size);
        if (pthread_create(&threads[t], NULL, fetch_all, &jobs[t]) != 0)
            return 3;
    }
    int failed = 0;
    for (int t = 0; t < THREADS; t++) {
        pthread_join(threads[t], NULL);
        if (jobs[t].status != AOTR_OK && !failed) {
            printf("ERROR %s: %s\n", aotr_status_name(jobs[t].status), jobs[t].message);
            failed = 1;
        }
    }
    for (size_t i = 0; i < count && !failed; i++) {
        for (int t = 1; t < THREADS; t++)
            if (jobs[t].code[i] != jobs[0].code[i] || jobs[t].size[i] != jobs[0].size[i]) {
                printf("ERROR threads got different copies of record %zu\n", i);
                failed = 1;
            }
        const aotr_kernel_record *r = &records[i];
        uint8_t digest[32];
        aotr_sha256_digest(jobs[0].code[i], jobs[0].size[i], digest);
        printf("{\"key\": ");
        print_string(r->key);
        printf(", \"kernel\": ");
        print_string(r->kernel);
        printf(", \"symbol\": ");
        print_string(r->symbol);
        printf(", \"dtype\": %d, \"head_dim\": %d, \"pad_head\": %d, \"has_bias\": %d, "
               "\"enable_dropout\": %d, \"block_m\": %d, \"block_n\": %d, \"num_warps\": %d, "
               "\"num_stages\": %d, \"warp_size\": %d, \"shared\": %u, \"offset\": %llu, "
               "\"compressed_size\": %llu, \"size\": %llu, \"code_size\": %zu, \"args\": [",
               (int)r->dtype, r->head_dim, r->pad_head, r->has_bias, r->enable_dropout, r->block_m,
               r->block_n, r->num_warps, r->num_stages, r->warp_size, r->shared,
               (unsigned long long)r->offset, (unsigned long long)r->compressed_size,
               (unsigned long long)r->size, jobs[0].size[i]);
        for (size_t k = 0; k < r->num_args; k++) {
            printf("%s[", k ? ", " : "");
            print_string(r->args[k].name);
            printf(", ");
            print_string(r->args[k].type);
            printf(", %d]", (int)r->args[k].kind);
        }
        printf("], \"divisible_16\": [");
        for (size_t k = 0; k < r->num_divisible; k++) {
            printf("%s", k ? ", " : "");
            print_string(r->divisible_16[k]);
        }
        printf("], \"code_sha256\": \"");
        for (int k = 0; k < 32; k++)
            printf("%02x", digest[k]);
        printf("\", \"record_is_json\": %d}\n",
               r->json != NULL && aotr_json_get(r->json, "key") != NULL);
    }
    for (int t = 0; t < THREADS; t++) {
        free(jobs[t].code);
        free(jobs[t].size);
    }
    aotr_archive_close(a);
    return failed;
}
