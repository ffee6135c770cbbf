/* A strict RFC 8259 JSON parser into a read-only DOM (the archive index).
 *
 * Every value, string and array of a document lives in one arena (a list of
 * blocks) owned by the document; aotr_json_free(root) releases it all.
 * Children of the containers being parsed collect on a scratch stack and are
 * copied into the arena, contiguously, when their container closes.
 *
 * An index repeats whole containers: every record of a kernel has the same
 * argument list. A container of MEMO_MIN_LEN bytes or more is remembered by
 * its source text; where the same bytes appear again at the same depth the
 * parsed value is shared (the DOM is read-only), not parsed again. Equal
 * bytes at equal depth parse to the same value, so this changes no result. */
#include <errno.h>
#include <locale.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MAX_DEPTH 64
#define BLOCK_SIZE ((size_t)64 * 1024)
#define MEMO_MIN_LEN 64 /* bytes of source text; also the length of the hashed prefix */
#define MEMO_SLOTS 1024

typedef struct memo_entry {
    const char *text; /* NULL: empty slot */
    size_t len;
    int depth;
    aotr_json value;
} memo_entry;

typedef struct block {
    struct block *next;
    size_t used, capacity;
    max_align_t data[];
} block;

/* The root value is embedded in the document so that aotr_json_free can
 * find the arena from it. */
typedef struct document {
    block *blocks;
    aotr_json root;
} document;

typedef struct parser {
    const char *p;
    size_t len, pos;
    document *doc;
    /* scratch stack of parsed children (values and their keys) */
    aotr_json *stack;
    const char **stack_keys;
    size_t top, capacity;
    memo_entry *memo; /* MEMO_SLOTS entries, or NULL (no memo) */
    int failed;
} parser;

static aotr_status fail_at(parser *ps, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static aotr_status fail_at(parser *ps, size_t at, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    ps->failed = 1;
    return aotr_fail(AOTR_ARCHIVE_INVALID, "json: %s at byte %zu", what, at);
}

static void *arena_alloc(parser *ps, size_t size)
{
    const size_t align = sizeof(max_align_t);
    size = (size + align - 1) / align * align;
    if (size == 0)
        size = align;
    block *b = ps->doc->blocks;
    if (b == NULL || b->capacity - b->used < size) {
        size_t cap = size > BLOCK_SIZE ? size : BLOCK_SIZE;
        block *nb = malloc(sizeof(block) + cap);
        if (nb == NULL) {
            ps->failed = 1;
            aotr_fail(AOTR_OUT_OF_MEMORY, "json: out of memory at byte %zu", ps->pos);
            return NULL;
        }
        nb->used = 0;
        nb->capacity = cap;
        /* A block too big to be worth keeping open goes behind the current one. */
        if (b != NULL && cap > BLOCK_SIZE) {
            nb->next = b->next;
            b->next = nb;
        } else {
            nb->next = b;
            ps->doc->blocks = nb;
        }
        b = nb;
    }
    void *out = (char *)b->data + b->used;
    b->used += size;
    return out;
}

static int stack_push(parser *ps, const aotr_json *v, const char *key)
{
    if (ps->top == ps->capacity) {
        size_t cap = ps->capacity ? ps->capacity * 2 : 64;
        aotr_json *s = realloc(ps->stack, cap * sizeof *s);
        if (s == NULL)
            goto oom;
        ps->stack = s;
        const char **k = realloc(ps->stack_keys, cap * sizeof *k);
        if (k == NULL)
            goto oom;
        ps->stack_keys = k;
        ps->capacity = cap;
    }
    ps->stack[ps->top] = *v;
    ps->stack_keys[ps->top] = key;
    ps->top++;
    return 1;
oom:
    ps->failed = 1;
    aotr_fail(AOTR_OUT_OF_MEMORY, "json: out of memory at byte %zu", ps->pos);
    return 0;
}

static void skip_ws(parser *ps)
{
    while (ps->pos < ps->len) {
        char c = ps->p[ps->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        ps->pos++;
    }
}

static int peek(const parser *ps) { return ps->pos < ps->len ? (unsigned char)ps->p[ps->pos] : -1; }

static int literal(parser *ps, const char *word)
{
    size_t n = strlen(word);
    if (ps->len - ps->pos < n || memcmp(ps->p + ps->pos, word, n) != 0) {
        fail_at(ps, ps->pos, "invalid literal");
        return 0;
    }
    ps->pos += n;
    return 1;
}

static int hex4(parser *ps, size_t at, uint32_t *out)
{
    if (ps->len - at < 4) {
        fail_at(ps, at, "truncated \\u escape");
        return 0;
    }
    uint32_t v = 0;
    for (size_t i = 0; i < 4; i++) {
        char c = ps->p[at + i];
        uint32_t d;
        if (c >= '0' && c <= '9')
            d = (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            d = (uint32_t)(c - 'A' + 10);
        else {
            fail_at(ps, at + i, "bad hex digit in \\u escape");
            return 0;
        }
        v = v << 4 | d;
    }
    *out = v;
    return 1;
}

static size_t put_utf8(char *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid UTF-8 sequence starting at `at` (non-ASCII lead), or 0. */
static size_t utf8_seq(const parser *ps, size_t at)
{
    const unsigned char *s = (const unsigned char *)ps->p + at;
    size_t left = ps->len - at;
    unsigned char c = s[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0; /* overlong */
        else if (c == 0xED)
            hi = 0x9F; /* UTF-16 surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F; /* above U+10FFFF */
    } else
        return 0;
    if (left < n || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return n;
}

/* At the opening quote. Decoded strings are never longer than their source. */
static const char *parse_string(parser *ps, size_t *out_len)
{
    size_t start = ++ps->pos;
    size_t end = start;
    /* find the closing quote first to size the allocation; a string of
     * printable ASCII without escapes (most of an index) is copied as is */
    int plain = 1;
    while (1) {
        if (end >= ps->len) {
            fail_at(ps, start - 1, "unterminated string");
            return NULL;
        }
        unsigned char c = (unsigned char)ps->p[end];
        if (c == '"')
            break;
        if (c == '\\') {
            plain = 0;
            end += 2;
            continue;
        }
        if (c < 0x20 || c >= 0x80)
            plain = 0;
        end++;
    }
    char *out = arena_alloc(ps, end - start + 1);
    if (out == NULL)
        return NULL;
    size_t n = 0;
    size_t i = start;
    if (plain) {
        memcpy(out, ps->p + start, end - start);
        n = end - start;
        i = end;
    }
    while (i < end) {
        unsigned char c = (unsigned char)ps->p[i];
        if (c < 0x20) {
            fail_at(ps, i, "control character in string");
            return NULL;
        }
        if (c >= 0x80) {
            size_t k = utf8_seq(ps, i);
            if (k == 0 || i + k > end) {
                fail_at(ps, i, "invalid UTF-8 in string");
                return NULL;
            }
            memcpy(out + n, ps->p + i, k);
            n += k;
            i += k;
            continue;
        }
        if (c != '\\') {
            out[n++] = (char)c;
            i++;
            continue;
        }
        char e = ps->p[i + 1]; /* i + 1 < end: the scan above skipped pairs */
        switch (e) {
        case '"': out[n++] = '"'; break;
        case '\\': out[n++] = '\\'; break;
        case '/': out[n++] = '/'; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'n': out[n++] = '\n'; break;
        case 'r': out[n++] = '\r'; break;
        case 't': out[n++] = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (i + 6 > end || !hex4(ps, i + 2, &cp)) {
                if (!ps->failed)
                    fail_at(ps, i, "truncated \\u escape");
                return NULL;
            }
            if (cp == 0) {
                fail_at(ps, i, "\\u0000 in string");
                return NULL;
            }
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                fail_at(ps, i, "lone low surrogate");
                return NULL;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (i + 12 > end || ps->p[i + 6] != '\\' || ps->p[i + 7] != 'u') {
                    fail_at(ps, i, "lone high surrogate");
                    return NULL;
                }
                if (!hex4(ps, i + 8, &lo))
                    return NULL;
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    fail_at(ps, i, "lone high surrogate");
                    return NULL;
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                i += 6;
            }
            n += put_utf8(out + n, cp);
            i += 6;
            continue;
        }
        default: fail_at(ps, i, "bad escape"); return NULL;
        }
        i += 2;
    }
    out[n] = '\0';
    ps->pos = end + 1;
    *out_len = n;
    return out;
}

static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;
static locale_t c_locale;

static void make_c_locale(void) { c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0); }

static int parse_number(parser *ps, aotr_json *v)
{
    size_t start = ps->pos, i = start;
    const char *s = ps->p;
    int neg = 0, integral = 1;
    if (i < ps->len && s[i] == '-') {
        neg = 1;
        i++;
    }
    if (i >= ps->len || s[i] < '0' || s[i] > '9') {
        fail_at(ps, start, "invalid number");
        return 0;
    }
    size_t int_start = i;
    if (s[i] == '0')
        i++;
    else
        while (i < ps->len && s[i] >= '0' && s[i] <= '9')
            i++;
    size_t int_end = i;
    if (i < ps->len && s[i] == '.') {
        integral = 0;
        i++;
        if (i >= ps->len || s[i] < '0' || s[i] > '9') {
            fail_at(ps, i, "digit expected after decimal point");
            return 0;
        }
        while (i < ps->len && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    if (i < ps->len && (s[i] == 'e' || s[i] == 'E')) {
        integral = 0;
        i++;
        if (i < ps->len && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i >= ps->len || s[i] < '0' || s[i] > '9') {
            fail_at(ps, i, "digit expected in exponent");
            return 0;
        }
        while (i < ps->len && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    ps->pos = i;
    v->type = AOTR_JSON_NUMBER;
    if (integral) {
        /* accumulate as a negative number: INT64_MIN has no positive twin */
        int64_t acc = 0;
        int overflow = 0;
        for (size_t k = int_start; k < int_end; k++) {
            int64_t d = s[k] - '0';
            if (acc < (INT64_MIN + d) / 10) {
                overflow = 1;
                break;
            }
            acc = acc * 10 - d;
        }
        if (!overflow && !neg && acc == INT64_MIN)
            overflow = 1;
        if (!overflow) {
            v->is_int = 1;
            v->i = neg ? acc : -acc;
            v->d = (double)v->i;
            return 1;
        }
    }
    char small[64];
    size_t n = i - start;
    char *copy = n < sizeof small ? small : malloc(n + 1);
    if (copy == NULL) {
        fail_at(ps, start, "out of memory");
        return 0;
    }
    memcpy(copy, s + start, n);
    copy[n] = '\0';
    pthread_once(&c_locale_once, make_c_locale);
    char *end = NULL;
    errno = 0;
    double d = c_locale ? strtod_l(copy, &end, c_locale) : strtod(copy, &end);
    int ok = end == copy + n && !(errno == ERANGE && (d > 1.0 || d < -1.0));
    if (copy != small)
        free(copy);
    if (!ok) {
        fail_at(ps, start, "number out of range");
        return 0;
    }
    v->d = d;
    if (d >= -9223372036854775808.0 && d < 9223372036854775808.0 && (double)(int64_t)d == d) {
        v->is_int = 1;
        v->i = (int64_t)d;
    }
    return 1;
}

static int parse_value(parser *ps, aotr_json *v, int depth);

/* The memo slot of the container at `at`: a hash of its first MEMO_MIN_LEN
 * bytes (NULL when fewer are left: no container there is long enough). */
static memo_entry *memo_slot(const parser *ps, size_t at)
{
    if (ps->memo == NULL || ps->len - at < MEMO_MIN_LEN)
        return NULL;
    uint64_t h = 0;
    for (size_t i = 0; i < MEMO_MIN_LEN; i += 8) {
        uint64_t w;
        memcpy(&w, ps->p + at + i, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    }
    return &ps->memo[(h >> 40) % MEMO_SLOTS];
}

/* At '[' or '{'. */
static int parse_container(parser *ps, aotr_json *v, int depth)
{
    int object = ps->p[ps->pos] == '{';
    char close = object ? '}' : ']';
    size_t open_at = ps->pos;
    if (depth >= MAX_DEPTH) {
        fail_at(ps, open_at, "nesting deeper than %d", MAX_DEPTH);
        return 0;
    }
    memo_entry *memo = memo_slot(ps, open_at);
    if (memo != NULL && memo->text != NULL && memo->depth == depth &&
        memo->len <= ps->len - open_at && memcmp(memo->text, ps->p + open_at, memo->len) == 0) {
        *v = memo->value;
        ps->pos = open_at + memo->len;
        return 1;
    }
    ps->pos++;
    size_t base = ps->top;
    skip_ws(ps);
    if (peek(ps) == close) {
        ps->pos++;
    } else {
        while (1) {
            const char *key = NULL;
            if (object) {
                size_t klen;
                if (peek(ps) != '"') {
                    fail_at(ps, ps->pos, "object key expected");
                    return 0;
                }
                key = parse_string(ps, &klen);
                if (key == NULL)
                    return 0;
                skip_ws(ps);
                if (peek(ps) != ':') {
                    fail_at(ps, ps->pos, "':' expected");
                    return 0;
                }
                ps->pos++;
                skip_ws(ps);
            }
            aotr_json child;
            if (!parse_value(ps, &child, depth + 1))
                return 0;
            if (!stack_push(ps, &child, key))
                return 0;
            skip_ws(ps);
            int c = peek(ps);
            if (c == ',') {
                ps->pos++;
                skip_ws(ps);
                continue;
            }
            if (c == close) {
                ps->pos++;
                break;
            }
            fail_at(ps, ps->pos, "',' or '%c' expected", close);
            return 0;
        }
    }
    size_t n = ps->top - base;
    memset(v, 0, sizeof *v);
    v->type = object ? AOTR_JSON_OBJECT : AOTR_JSON_ARRAY;
    v->n = n;
    if (n > 0) {
        v->items = arena_alloc(ps, n * sizeof(aotr_json));
        if (v->items == NULL)
            return 0;
        memcpy(v->items, ps->stack + base, n * sizeof(aotr_json));
        if (object) {
            v->keys = arena_alloc(ps, n * sizeof(const char *));
            if (v->keys == NULL)
                return 0;
            memcpy(v->keys, ps->stack_keys + base, n * sizeof(const char *));
        }
    }
    ps->top = base;
    if (memo != NULL && ps->pos - open_at >= MEMO_MIN_LEN)
        *memo = (memo_entry){ps->p + open_at, ps->pos - open_at, depth, *v};
    return 1;
}

static int parse_value(parser *ps, aotr_json *v, int depth)
{
    memset(v, 0, sizeof *v);
    switch (peek(ps)) {
    case -1: fail_at(ps, ps->pos, "unexpected end of input"); return 0;
    case '{':
    case '[': return parse_container(ps, v, depth);
    case '"':
        v->type = AOTR_JSON_STRING;
        v->s = parse_string(ps, &v->n);
        return v->s != NULL;
    case 't': v->type = AOTR_JSON_TRUE; return literal(ps, "true");
    case 'f': v->type = AOTR_JSON_FALSE; return literal(ps, "false");
    case 'n': v->type = AOTR_JSON_NULL; return literal(ps, "null");
    default: return parse_number(ps, v);
    }
}

aotr_json *aotr_json_parse(const char *text, size_t len)
{
    if (text == NULL && len > 0) {
        aotr_fail(AOTR_INVALID_ARGUMENT, "json: NULL text");
        return NULL;
    }
    document *doc = calloc(1, sizeof *doc);
    if (doc == NULL) {
        aotr_fail(AOTR_OUT_OF_MEMORY, "json: out of memory");
        return NULL;
    }
    /* without the memo (out of memory) the parse is only slower */
    parser ps = {.p = text, .len = len, .doc = doc, .memo = calloc(MEMO_SLOTS, sizeof(memo_entry))};
    skip_ws(&ps);
    int ok = parse_value(&ps, &doc->root, 0);
    if (ok) {
        skip_ws(&ps);
        if (ps.pos != ps.len) {
            fail_at(&ps, ps.pos, "trailing characters after the document");
            ok = 0;
        }
    }
    free(ps.stack);
    free(ps.stack_keys);
    free(ps.memo);
    if (!ok) {
        aotr_json_free(&doc->root);
        return NULL;
    }
    return &doc->root;
}

void aotr_json_free(aotr_json *root)
{
    if (root == NULL)
        return;
    document *doc = (document *)(void *)((char *)root - offsetof(document, root));
    block *b = doc->blocks;
    while (b != NULL) {
        block *next = b->next;
        free(b);
        b = next;
    }
    free(doc);
}

const aotr_json *aotr_json_get(const aotr_json *obj, const char *key)
{
    if (obj == NULL || key == NULL || obj->type != AOTR_JSON_OBJECT)
        return NULL;
    /* the last duplicate wins, as in Python's json */
    for (size_t i = obj->n; i-- > 0;)
        if (obj->keys[i][0] == key[0] && strcmp(obj->keys[i], key) == 0)
            return &obj->items[i];
    return NULL;
}

int aotr_json_int(const aotr_json *v, int64_t *out)
{
    if (v == NULL || v->type != AOTR_JSON_NUMBER || !v->is_int)
        return 0;
    if (out != NULL)
        *out = v->i;
    return 1;
}

const char *aotr_json_str(const aotr_json *v)
{
    return v != NULL && v->type == AOTR_JSON_STRING ? v->s : NULL;
}
