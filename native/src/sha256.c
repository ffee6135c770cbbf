/* SHA-256 (FIPS 180-4): portable C, and the x86 SHA extensions where the
 * CPU has them (about 20x faster: the archive index is hashed at every
 * runtime start, code objects at first load). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define AOTR_SHA_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t rotr(uint32_t x, unsigned n) { return x >> n | x << (32 - n); }

static void compress(uint32_t h[8], const uint8_t *p)
{
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 |
               (uint32_t)p[4 * t + 2] << 8 | (uint32_t)p[4 * t + 3];
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ w[t - 15] >> 3;
        uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ w[t - 2] >> 10;
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 =
            k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += k;
}

#ifdef AOTR_SHA_X86
/* The SHA extensions keep the state as (a, b, e, f) and (c, d, g, h) and
 * run two rounds per sha256rnds2; sha256msg1/msg2 extend the schedule four
 * words at a time (Intel SHA Extensions, 2013). */
__attribute__((target("sha,sse4.1,ssse3"))) static void
compress_blocks_x86(uint32_t h[8], const uint8_t *p, size_t blocks)
{
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
    __m128i dcba = _mm_loadu_si128((const __m128i *)(const void *)&h[0]);
    __m128i hgfe = _mm_loadu_si128((const __m128i *)(const void *)&h[4]);
    __m128i cdab = _mm_shuffle_epi32(dcba, 0xB1);
    __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);
    __m128i abef = _mm_alignr_epi8(cdab, efgh, 8);
    __m128i cdgh = _mm_blend_epi16(efgh, cdab, 0xF0);
    for (; blocks > 0; blocks--, p += 64) {
        const __m128i abef_in = abef, cdgh_in = cdgh;
        __m128i w[16];
        for (int g = 0; g < 16; g++) {
            if (g < 4) {
                const void *block = p + 16 * g;
                w[g] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)block), bswap);
            } else {
                __m128i t = _mm_sha256msg1_epu32(w[g - 4], w[g - 3]);
                t = _mm_add_epi32(t, _mm_alignr_epi8(w[g - 1], w[g - 2], 4));
                w[g] = _mm_sha256msg2_epu32(t, w[g - 1]);
            }
            const void *k = &K[4 * g];
            __m128i m = _mm_add_epi32(w[g], _mm_loadu_si128((const __m128i *)k));
            cdgh = _mm_sha256rnds2_epu32(cdgh, abef, m);
            abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(m, 0x0E));
        }
        abef = _mm_add_epi32(abef, abef_in);
        cdgh = _mm_add_epi32(cdgh, cdgh_in);
    }
    __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
    __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
    _mm_storeu_si128((__m128i *)(void *)&h[0], _mm_blend_epi16(feba, dchg, 0xF0));
    _mm_storeu_si128((__m128i *)(void *)&h[4], _mm_alignr_epi8(dchg, feba, 8));
}

static int cpu_has_sha(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSSE3) || !(c & bit_SSE4_1))
        return 0;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 29)) != 0;
}
#endif

/* `blocks` 64-byte blocks at `p` into the state. */
static void compress_blocks(uint32_t h[8], const uint8_t *p, size_t blocks)
{
#ifdef AOTR_SHA_X86
    /* AOTRITON_ROCM_PORTABLE_SHA256 set: the portable code (its ctest run).
     * A race only computes the same answer twice. */
    static int has_sha = -1;
    if (has_sha < 0)
        has_sha = cpu_has_sha() && !getenv("AOTRITON_ROCM_PORTABLE_SHA256");
    if (has_sha) {
        compress_blocks_x86(h, p, blocks);
        return;
    }
#endif
    for (; blocks > 0; blocks--, p += 64)
        compress(h, p);
}

void aotr_sha256_init(aotr_sha256 *ctx)
{
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(ctx->h, h0, sizeof h0);
    ctx->length = 0;
    ctx->used = 0;
}

void aotr_sha256_update(aotr_sha256 *ctx, const void *data, size_t len)
{
    const uint8_t *p = data;
    if (len == 0)
        return;
    ctx->length += len;
    if (ctx->used > 0) {
        size_t take = 64 - ctx->used < len ? 64 - ctx->used : len;
        memcpy(ctx->block + ctx->used, p, take);
        ctx->used += take;
        p += take;
        len -= take;
        if (ctx->used < 64)
            return;
        compress_blocks(ctx->h, ctx->block, 1);
        ctx->used = 0;
    }
    compress_blocks(ctx->h, p, len / 64);
    p += len / 64 * 64;
    len %= 64;
    if (len > 0) {
        memcpy(ctx->block, p, len);
        ctx->used = len;
    }
}

void aotr_sha256_final(aotr_sha256 *ctx, uint8_t digest[32])
{
    uint64_t bits = ctx->length * 8;
    ctx->block[ctx->used++] = 0x80;
    if (ctx->used > 56) {
        memset(ctx->block + ctx->used, 0, 64 - ctx->used);
        compress_blocks(ctx->h, ctx->block, 1);
        ctx->used = 0;
    }
    memset(ctx->block + ctx->used, 0, 56 - ctx->used);
    for (int i = 0; i < 8; i++)
        ctx->block[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    compress_blocks(ctx->h, ctx->block, 1);
    for (int i = 0; i < 8; i++) {
        digest[4 * i] = (uint8_t)(ctx->h[i] >> 24);
        digest[4 * i + 1] = (uint8_t)(ctx->h[i] >> 16);
        digest[4 * i + 2] = (uint8_t)(ctx->h[i] >> 8);
        digest[4 * i + 3] = (uint8_t)ctx->h[i];
    }
    ctx->used = 0;
}

void aotr_sha256_digest(const void *data, size_t len, uint8_t digest[32])
{
    aotr_sha256 ctx;
    aotr_sha256_init(&ctx);
    aotr_sha256_update(&ctx, data, len);
    aotr_sha256_final(&ctx, digest);
}

int aotr_hex_to_digest(const char *hex, uint8_t digest[32])
{
    if (hex == NULL)
        return 0;
    uint8_t out[32];
    for (size_t i = 0; i < 64; i++) {
        char c = hex[i]; /* stops at a NUL before reading further */
        unsigned v;
        if (c >= '0' && c <= '9')
            v = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v = (unsigned)(c - 'a' + 10);
        else
            return 0;
        if (i % 2 == 0)
            out[i / 2] = (uint8_t)(v << 4);
        else
            out[i / 2] = (uint8_t)(out[i / 2] | v);
    }
    if (hex[64] != '\0')
        return 0;
    memcpy(digest, out, sizeof out);
    return 1;
}
