/* The JSON parser: valid and invalid documents, escapes, numbers, depth.
 * Every input is copied into a buffer of exactly its length (no NUL after
 * it), so a build with -DAOTR_SANITIZE=ON catches any read past `len`. */
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static int failures;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "FAIL line %d: ", __LINE__);                                               \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        failures++;                                                                                \
    } while (0)

/* Parse `len` bytes from an exact-size heap copy. */
static aotr_json *parse_n(const char *text, size_t len)
{
    char *copy = malloc(len ? len : 1);
    if (copy == NULL)
        exit(2);
    if (len)
        memcpy(copy, text, len);
    aotr_json *doc = aotr_json_parse(copy, len);
    free(copy); /* the DOM must not point into the input */
    return doc;
}

static aotr_json *parse(const char *text) { return parse_n(text, strlen(text)); }

static void valid(const char *text)
{
    aotr_json *doc = parse(text);
    if (doc == NULL)
        FAIL("rejected valid %s: %s", text, aotr_last_error());
    aotr_json_free(doc);
}

static void invalid_n(const char *text, size_t len, const char *why)
{
    aotr_json *doc = parse_n(text, len);
    if (doc != NULL) {
        FAIL("accepted invalid (%s): %.*s", why, (int)len, text);
        aotr_json_free(doc);
    } else if (strncmp(aotr_last_error(), "json: ", 6) != 0 ||
               strstr(aotr_last_error(), " at byte ") == NULL) {
        FAIL("message lacks 'json: ... at byte N': %s", aotr_last_error());
    }
}

static void invalid(const char *text, const char *why) { invalid_n(text, strlen(text), why); }

/* The string value of a one-string document, compared byte for byte. */
static void string_is(const char *text, const char *want, size_t want_len)
{
    aotr_json *doc = parse(text);
    if (doc == NULL || doc->type != AOTR_JSON_STRING) {
        FAIL("%s: not parsed as a string (%s)", text, doc ? "" : aotr_last_error());
    } else if (doc->n != want_len || memcmp(doc->s, want, want_len) != 0 ||
               doc->s[want_len] != '\0') {
        FAIL("%s: decoded to %zu bytes, want %zu", text, doc->n, want_len);
    }
    aotr_json_free(doc);
}

static void int_is(const char *text, int64_t want)
{
    aotr_json *doc = parse(text);
    int64_t v = 0;
    if (doc == NULL || !aotr_json_int(doc, &v) || v != want)
        FAIL("%s: want int %lld, got %lld (%s)", text, (long long)want, (long long)v,
             doc ? "" : aotr_last_error());
    aotr_json_free(doc);
}

static void double_is(const char *text, double want, int is_int)
{
    aotr_json *doc = parse(text);
    if (doc == NULL || doc->type != AOTR_JSON_NUMBER || doc->d != want || doc->is_int != is_int)
        FAIL("%s: want %.17g (is_int %d), got %.17g (is_int %d)", text, want, is_int,
             doc ? doc->d : 0.0, doc ? doc->is_int : -1);
    aotr_json_free(doc);
}

static void test_values(void)
{
    const char *doc_text =
        " {\"manifest\": {\"arch\": \"gfx942\", \"warp_size\": 64, \"x\": null},\n"
        "  \"kernels\": [ {\"k\": true, \"f\": false}, [], {}, [1, -2.5e3, \"s\"] ],"
        " \"dup\": 1, \"dup\": 2 } \t\r\n";
    aotr_json *doc = parse(doc_text);
    if (doc == NULL) {
        FAIL("main document: %s", aotr_last_error());
        return;
    }
    const aotr_json *m = aotr_json_get(doc, "manifest");
    const aotr_json *k = aotr_json_get(doc, "kernels");
    int64_t ws = 0, dup = 0;
    if (doc->type != AOTR_JSON_OBJECT || doc->n != 4)
        FAIL("root: type %d n %zu", doc->type, doc->n);
    if (m == NULL || strcmp(aotr_json_str(aotr_json_get(m, "arch")), "gfx942") != 0)
        FAIL("manifest.arch");
    if (!aotr_json_int(aotr_json_get(m, "warp_size"), &ws) || ws != 64)
        FAIL("manifest.warp_size");
    if (aotr_json_get(m, "x") == NULL || aotr_json_get(m, "x")->type != AOTR_JSON_NULL)
        FAIL("manifest.x is null");
    if (aotr_json_get(m, "missing") != NULL || aotr_json_get(k, "arch") != NULL)
        FAIL("get on a missing key / an array");
    if (aotr_json_str(aotr_json_get(m, "warp_size")) != NULL || aotr_json_int(m, &ws))
        FAIL("typed getters must refuse other types");
    if (k == NULL || k->type != AOTR_JSON_ARRAY || k->n != 4)
        FAIL("kernels array");
    else {
        if (aotr_json_get(&k->items[0], "k")->type != AOTR_JSON_TRUE ||
            aotr_json_get(&k->items[0], "f")->type != AOTR_JSON_FALSE)
            FAIL("true/false");
        if (k->items[1].type != AOTR_JSON_ARRAY || k->items[1].n != 0 ||
            k->items[2].type != AOTR_JSON_OBJECT || k->items[2].n != 0)
            FAIL("empty containers");
        const aotr_json *a = &k->items[3];
        if (a->n != 3 || a->items[1].d != -2500.0 || !a->items[1].is_int ||
            strcmp(a->items[2].s, "s") != 0)
            FAIL("mixed array");
    }
    if (!aotr_json_int(aotr_json_get(doc, "dup"), &dup) || dup != 2)
        FAIL("the last duplicate key wins");
    aotr_json_free(doc);
    aotr_json_free(NULL);

    valid("0");
    valid("\"\"");
    valid("null");
    valid(" [ ] ");
    valid("[[[[[[[[[[]]]]]]]]]]");
    valid("{\"a\":{\"b\":{\"c\":[1,{\"d\":[]}]}}}");

    /* a large document: spans several arena blocks */
    size_t big_n = 20000;
    char *big = malloc(big_n * 24 + 16);
    size_t len = 0;
    big[len++] = '[';
    for (size_t i = 0; i < big_n; i++)
        len += (size_t)sprintf(big + len, "%s{\"k%zu\":\"v%zu\"}", i ? "," : "", i, i);
    big[len++] = ']';
    doc = parse_n(big, len);
    free(big);
    if (doc == NULL || doc->n != big_n ||
        strcmp(aotr_json_str(aotr_json_get(&doc->items[12345], "k12345")), "v12345") != 0)
        FAIL("big document");
    aotr_json_free(doc);
}

static void test_invalid(void)
{
    invalid("", "empty");
    invalid("   ", "only whitespace");
    invalid("[1,]", "trailing comma");
    invalid("{\"a\":1,}", "trailing comma in object");
    invalid("[1 2]", "missing comma");
    invalid("{\"a\" 1}", "missing colon");
    invalid("{a:1}", "unquoted key");
    invalid("{1:1}", "number key");
    invalid("[1]x", "trailing garbage");
    invalid("[1] [2]", "two documents");
    invalid("{\"a\":1}}", "extra brace");
    invalid("[", "unclosed array");
    invalid("{\"a\":", "unclosed object");
    invalid("\"abc", "unterminated string");
    invalid("\"abc\\", "backslash at the end");
    invalid("tru", "short literal");
    invalid("trueish", "literal with garbage");
    invalid("nul", "short null");
    invalid("NaN", "NaN");
    invalid("Infinity", "Infinity");
    invalid("'a'", "single quotes");
    invalid("\xef\xbb\xbf{}", "byte order mark");
    invalid("/* c */ 1", "comment");
    invalid_n("[1]\0", 4, "NUL after the document");
    invalid_n("\"a\0b\"", 5, "raw NUL in a string");
    invalid("\"a\tb\"", "raw tab in a string");
    invalid("\"a\nb\"", "raw newline in a string");
    invalid("\"\x1f\"", "control character");
    invalid("\"\\x41\"", "bad escape");
    invalid("\"\\U0041\"", "uppercase U escape");
    invalid("\"\\'\"", "escaped single quote");
    invalid("\"\\u12\"", "short \\u escape");
    invalid("\"\\u12g4\"", "bad hex digit");
    invalid("\"\\u0000\"", "\\u0000");
    invalid("\"\\ud800\"", "lone high surrogate");
    invalid("\"\\ud800x\"", "high surrogate then a char");
    invalid("\"\\ud800\\u0041\"", "high surrogate then a non-surrogate");
    invalid("\"\\ud800\\ud800\"", "two high surrogates");
    invalid("\"\\udc00\"", "lone low surrogate");
    invalid("\"\\udc00\\ud800\"", "reversed pair");
    invalid("\"\\ud83d\\ude0\"", "truncated low surrogate");
    invalid("\"\xff\"", "invalid UTF-8 byte");
    invalid("\"\xc3\"", "truncated UTF-8");
    invalid("\"\xc0\xaf\"", "overlong UTF-8");
    invalid("\"\xe0\x80\xaf\"", "overlong 3-byte UTF-8");
    invalid("\"\xed\xa0\x80\"", "UTF-8 encoded surrogate");
    invalid("\"\xf4\x90\x80\x80\"", "above U+10FFFF");
    invalid("\"\x80\"", "lone continuation byte");

    /* numbers */
    invalid("01", "leading zero");
    invalid("-", "lone minus");
    invalid("+1", "plus sign");
    invalid(".5", "no integer part");
    invalid("1.", "no fraction digits");
    invalid("1.e5", "no fraction digits before exponent");
    invalid("1e", "no exponent digits");
    invalid("1e+", "no exponent digits after sign");
    invalid("0x10", "hex");
    invalid("1e400", "overflows a double");
    invalid("-1e400", "overflows a double (negative)");
    invalid("--1", "double minus");
    invalid("1,", "trailing comma at top level");
}

static void test_strings(void)
{
    string_is("\"plain\"", "plain", 5);
    string_is("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "\"\\/\b\f\n\r\t", 8);
    string_is("\"\\u0041\\u00e9\\u20AC\"", "A\xc3\xa9\xe2\x82\xac", 6);
    string_is("\"\\ud83d\\ude00\"", "\xf0\x9f\x98\x80", 4); /* U+1F600 */
    string_is("\"\\uDBFF\\uDFFF\"", "\xf4\x8f\xbf\xbf", 4); /* U+10FFFF */
    string_is("\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"", "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80",
              9);
    string_is("\"\\u0001\"", "\x01", 1);
    string_is("\"\x7f\"", "\x7f", 1);
}

static void test_numbers(void)
{
    int_is("0", 0);
    int_is("-0", 0);
    int_is("42", 42);
    int_is("-17", -17);
    int_is("9223372036854775807", INT64_MAX);
    int_is("-9223372036854775808", INT64_MIN);
    int_is("1.0", 1);
    int_is("1e3", 1000);
    int_is("2.5e1", 25);
    int_is("-4.0E+2", -400);
    double_is("0.5", 0.5, 0);
    double_is("-2.25", -2.25, 0);
    double_is("1e-2", 0.01, 0);
    double_is("1.5e300", 1.5e300, 0);
    double_is("1e-400", 0.0, 1); /* underflows to 0: accepted */
    double_is("9223372036854775808", 9223372036854775808.0, 0);
    double_is("-9223372036854775809", -9223372036854775808.0, 1);
    double_is("18446744073709551616", 18446744073709551616.0, 0);
    double_is("123456789012345678901234567890123456789012345678901234567890123456789012345",
              1.2345678901234568e74, 0);
    /* is_int needs the value in int64 range */
    double_is("1e19", 1e19, 0);
    double_is("-1e19", -1e19, 0);
    /* a decimal comma locale must not change the parse (when one is installed) */
    const char *comma[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "ru_RU.UTF-8"};
    for (size_t i = 0; i < sizeof comma / sizeof *comma; i++)
        if (setlocale(LC_NUMERIC, comma[i]) != NULL) {
            double_is("0.5", 0.5, 0);
            double_is("-1.25e1", -12.5, 0);
            invalid("0,5", "a decimal comma");
            setlocale(LC_NUMERIC, "C");
            break;
        }
}

static void test_depth(void)
{
    char buf[400];
    for (int depth = 63; depth <= 66; depth++) {
        for (int i = 0; i < depth; i++)
            buf[i] = '[', buf[2 * depth - 1 - i] = ']';
        aotr_json *doc = parse_n(buf, (size_t)(2 * depth));
        if ((doc != NULL) != (depth <= 64))
            FAIL("depth %d: %s", depth, doc ? "accepted" : aotr_last_error());
        aotr_json_free(doc);
    }
    /* deep objects too, and a deep unclosed prefix */
    size_t n = 0;
    for (int i = 0; i < 65; i++)
        n += (size_t)sprintf(buf + n, "{\"a\":");
    invalid_n(buf, n, "deep unclosed objects");
    char *deep = malloc(100000);
    memset(deep, '[', 100000);
    invalid_n(deep, 100000, "100000 open brackets");
    free(deep);
}

/* Repeated containers (64 bytes or more) share their parsed value: equal
 * text gives equal values, a difference late in the text does not, and the
 * depth limit holds for a repeat nested deeper than its first occurrence. */
static void test_repeats(void)
{
#define ARGS(last)                                                                                 \
    "[[\"Q\",\"*fp16\"],[\"K\",\"*fp16\"],[\"V\",\"*fp16\"],[\"stride_qz\",\"" last "\"]]"
    const char *text = "{\"k\":[{\"args\":" ARGS("i32") "},{\"args\":" ARGS(
        "i32") "},{\"args\":" ARGS("i64") "},[" ARGS("i32") "]]}";
#undef ARGS
    aotr_json *doc = parse(text);
    const aotr_json *k = aotr_json_get(doc, "k");
    if (doc == NULL || k == NULL || k->n != 4) {
        FAIL("repeats: %s", doc ? "wrong shape" : aotr_last_error());
    } else {
        static const char *const want[] = {"i32", "i32", "i64", "i32"};
        for (size_t i = 0; i < 4; i++) {
            const aotr_json *list =
                i < 3 ? aotr_json_get(&k->items[i], "args") : &k->items[i].items[0];
            const char *got = list && list->n == 4 ? aotr_json_str(&list->items[3].items[1]) : NULL;
            if (got == NULL || strcmp(got, want[i]) != 0)
                FAIL("repeats: list %zu ends in %s, not %s", i, got ? got : "(none)", want[i]);
        }
    }
    aotr_json_free(doc);
    size_t len = strlen(text);
    char *copy = malloc(len);
    for (size_t i = 0; i < len; i++) {
        memcpy(copy, text, len);
        copy[i] = (char)(copy[i] == ']' ? ',' : ']');
        aotr_json_free(parse_n(copy, len));
    }
    free(copy);

    /* a 3-level container at depth 1, then again at depth 61 and 62 */
    char inner[128] = "[[[";
    for (int i = 0; i < 30; i++)
        strcat(inner, "1,");
    strcat(inner, "1]]]");
    for (int depth = 61; depth <= 62; depth++) {
        char buf[512];
        size_t n = (size_t)sprintf(buf, "[%s,", inner);
        for (int i = 1; i < depth; i++)
            buf[n++] = '[';
        n += (size_t)sprintf(buf + n, "%s", inner);
        for (int i = 0; i < depth; i++)
            buf[n++] = ']';
        doc = parse_n(buf, n);
        if ((doc != NULL) != (depth == 61))
            FAIL("repeat at depth %d: %s", depth, doc ? "accepted" : aotr_last_error());
        aotr_json_free(doc);
    }
}

/* Every prefix and every single-byte corruption of a document parses or
 * fails cleanly (ASan/UBSan builds check the reads). */
static void test_prefixes(void)
{
    const char *text =
        "{\"manifest\":{\"arch\":\"sm_90\",\"n\":-1.5e-3,\"u\":\"\\ud83d\\ude00\\u00e9\","
        "\"t\":[true,false,null]},\"kernels\":[{\"args\":[[\"Q\",\"*fp16\"]]}]}";
    size_t len = strlen(text);
    aotr_json *doc = parse(text);
    if (doc == NULL)
        FAIL("prefix base: %s", aotr_last_error());
    aotr_json_free(doc);
    for (size_t i = 0; i < len; i++) {
        doc = parse_n(text, i);
        if (doc != NULL)
            FAIL("prefix of %zu bytes accepted", i);
        aotr_json_free(doc);
    }
    char *copy = malloc(len);
    static const char bytes[] = {'"', '\\', '{',    '}',    '[', ']', ',', ':', 'u',
                                 '0', '\0', '\x80', '\xff', 'e', '-', '.', ' '};
    for (size_t i = 0; i < len; i++)
        for (size_t b = 0; b < sizeof bytes; b++) {
            memcpy(copy, text, len);
            copy[i] = bytes[b];
            aotr_json_free(parse_n(copy, len));
        }
    free(copy);
}

int main(void)
{
    test_values();
    test_invalid();
    test_strings();
    test_numbers();
    test_depth();
    test_repeats();
    test_prefixes();
    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("json: all tests passed\n");
    return 0;
}
