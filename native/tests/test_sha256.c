/* SHA-256 against the FIPS 180-4 / NIST example vectors, in one piece and
 * split across many update calls. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static int failures;

static void hex(const uint8_t d[32], char out[65])
{
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void expect_digest(const char *what, const uint8_t d[32], const char *want)
{
    char got[65];
    hex(d, got);
    if (strcmp(got, want) != 0) {
        fprintf(stderr, "FAIL %s: got %s, want %s\n", what, got, want);
        failures++;
    }
}

static void check(const char *what, const void *data, size_t len, const char *want)
{
    uint8_t d[32];
    aotr_sha256_digest(data, len, d);
    expect_digest(what, d, want);
    /* every split into two updates, and byte-at-a-time */
    for (size_t cut = 0; cut <= len && len <= 200; cut++) {
        aotr_sha256 ctx;
        aotr_sha256_init(&ctx);
        aotr_sha256_update(&ctx, data, cut);
        aotr_sha256_update(&ctx, (const uint8_t *)data + cut, len - cut);
        aotr_sha256_final(&ctx, d);
        expect_digest(what, d, want);
    }
    aotr_sha256 ctx;
    aotr_sha256_init(&ctx);
    for (size_t i = 0; i < len; i++)
        aotr_sha256_update(&ctx, (const uint8_t *)data + i, 1);
    aotr_sha256_final(&ctx, d);
    expect_digest(what, d, want);
}

int main(void)
{
    check("empty", "", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    check("abc", "abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    check("448 bits", m448, strlen(m448),
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const char *m896 =
        "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklm"
        "nopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    check("896 bits", m896, strlen(m896),
          "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    /* 55, 56, 63 and 64 bytes: the padding boundaries */
    char block[128];
    memset(block, 'a', sizeof block);
    check("55 a", block, 55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
    check("56 a", block, 56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
    check("64 a", block, 64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");

    /* one million 'a', fed in uneven chunks */
    const char *million = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
    uint8_t *buf = malloc(1000000);
    if (buf == NULL)
        return 2;
    memset(buf, 'a', 1000000);
    uint8_t d[32];
    aotr_sha256_digest(buf, 1000000, d);
    expect_digest("million a", d, million);
    aotr_sha256 ctx;
    aotr_sha256_init(&ctx);
    size_t done = 0, step = 1;
    while (done < 1000000) {
        size_t n = step < 1000000 - done ? step : 1000000 - done;
        aotr_sha256_update(&ctx, buf + done, n);
        done += n;
        step = step * 7 % 997 + 1;
    }
    aotr_sha256_final(&ctx, d);
    expect_digest("million a, split", d, million);
    free(buf);

    /* hex parsing */
    uint8_t h[32];
    const char *good = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    if (!aotr_hex_to_digest(good, h))
        failures++, fprintf(stderr, "FAIL hex: good rejected\n");
    else
        expect_digest("hex round trip", h, good);
    const char *bad[] = {
        "",
        "ba78",
        NULL,
        "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD",
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad0",
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015a",
        "ga7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (aotr_hex_to_digest(bad[i], h)) {
            fprintf(stderr, "FAIL hex: accepted '%s'\n", bad[i] ? bad[i] : "(null)");
            failures++;
        }
    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("sha256: all tests passed\n");
    return 0;
}
