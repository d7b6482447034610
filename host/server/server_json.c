/* Strict JSON (RFC 8259) for request bodies, building a cJSON tree.
 *
 * Why not cJSON_Parse: it accepts what a request must not be allowed to mean two things — data
 * after the value ("{...} xyz", "{...}{...}" parse as the first object), duplicate keys (the
 * first wins, a proxy may see the last), and an escaped NUL ("\u0000") that silently ends the C
 * string and so truncates a prompt — and it writes a process-wide error pointer, which forced a
 * lock around every parse. This parser rejects each of those with a message naming the byte and
 * the top-level field, keeps no global state (any number of threads parse at once), bounds the
 * nesting depth (64) and rejects invalid UTF-8, lone surrogates, control characters in strings,
 * numbers outside the JSON grammar or the double range.
 *
 * Cost: O(n) for the text plus O(k log k) per object of k keys (the duplicate check sorts them). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/server/server.h"

#define JSON_MAX_DEPTH 64

typedef struct jp {
    const unsigned char *p, *end, *start;
    int depth;
    const char *top_key; /* the top-level field being parsed (error messages), or NULL */
    srv_json_err *err;
    bool failed;
} jp;

static void fail(jp *j, const unsigned char *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(jp *j, const unsigned char *at, const char *fmt, ...)
{
    if (j->failed)
        return;
    j->failed = true;
    j->err->at = (size_t)(at - j->start);
    snprintf(j->err->key, sizeof j->err->key, "%s", j->top_key ? j->top_key : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->err->msg, sizeof j->err->msg, fmt, ap);
    va_end(ap);
}

static void skip_ws(jp *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static cJSON *value(jp *j);

static int hex4(const unsigned char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int c = p[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

static size_t put_utf8(char *o, uint32_t c)
{
    if (c < 0x80)
        return o[0] = (char)c, 1;
    if (c < 0x800)
        return o[0] = (char)(0xC0 | c >> 6), o[1] = (char)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000)
        return o[0] = (char)(0xE0 | c >> 12), o[1] = (char)(0x80 | (c >> 6 & 0x3F)), o[2] = (char)(0x80 | (c & 0x3F)), 3;
    o[0] = (char)(0xF0 | c >> 18), o[1] = (char)(0x80 | (c >> 12 & 0x3F));
    o[2] = (char)(0x80 | (c >> 6 & 0x3F)), o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* Length of the valid UTF-8 sequence at p (1..4), or 0 (overlong, surrogate, > U+10FFFF,
 * truncated). */
static size_t utf8_len(const unsigned char *p, const unsigned char *end)
{
    unsigned c = p[0];
    size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!n || p + n > end)
        return 0;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3F);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

/* A string at j->p (the opening quote); returns its malloc'd, NUL-free text. */
static char *string(jp *j)
{
    const unsigned char *q = ++j->p, *open = q - 1;
    size_t n = 0;
    while (q < j->end && *q != '"') { /* bound the decoded length: never longer than the source */
        q += *q == '\\' && q + 1 < j->end ? 2 : 1;
        n += 2;
    }
    if (q >= j->end)
        return fail(j, open, "unterminated string"), NULL;
    char *out = malloc(n + 1), *o = out;
    if (!out)
        return fail(j, open, "out of memory"), NULL;
    while (j->p < q && !j->failed) {
        const unsigned char *at = j->p;
        unsigned c = *j->p;
        if (c < 0x20) {
            fail(j, at, "a control character (0x%02x) inside a string must be escaped", c);
        } else if (c != '\\') {
            size_t l = utf8_len(j->p, q);
            if (!l)
                fail(j, at, "invalid UTF-8 in a string");
            memcpy(o, j->p, l);
            o += l;
            j->p += l ? l : 1;
            continue;
        } else {
            unsigned e = j->p[1];
            j->p += 2;
            const char *simple = strchr("\"\\/bfnrt", (int)e);
            if (e && simple) {
                *o++ = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
                continue;
            }
            int u = e == 'u' && j->p + 4 <= q ? hex4(j->p) : -1;
            if (u < 0) {
                fail(j, at, "invalid escape in a string");
                break;
            }
            j->p += 4;
            uint32_t cp = (uint32_t)u;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                int lo = j->p + 6 <= q && j->p[0] == '\\' && j->p[1] == 'u' ? hex4(j->p + 2) : -1;
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    fail(j, at, "a lone UTF-16 surrogate (\\u%04x) in a string", cp);
                    break;
                }
                j->p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                fail(j, at, "a lone UTF-16 surrogate (\\u%04x) in a string", cp);
                break;
            } else if (cp == 0) {
                fail(j, at, "an escaped NUL (\\u0000) in a string: text cannot contain NUL");
                break;
            }
            o += put_utf8(o, cp);
        }
    }
    if (j->failed) {
        free(out);
        return NULL;
    }
    *o = 0;
    j->p = q + 1;
    return out;
}

static cJSON *number(jp *j)
{
    const unsigned char *s = j->p, *p = s;
    if (p < j->end && *p == '-')
        p++;
    if (p < j->end && *p == '0') {
        if (++p < j->end && *p >= '0' && *p <= '9')
            return fail(j, s, "invalid number: a leading zero"), NULL;
    } else if (p < j->end && *p >= '1' && *p <= '9')
        while (p < j->end && *p >= '0' && *p <= '9')
            p++;
    else
        return fail(j, s, "invalid number"), NULL;
    if (p < j->end && *p == '.') {
        if (++p >= j->end || *p < '0' || *p > '9')
            return fail(j, s, "invalid number: digits must follow '.'"), NULL;
        while (p < j->end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < j->end && (*p == 'e' || *p == 'E')) {
        if (++p < j->end && (*p == '+' || *p == '-'))
            p++;
        if (p >= j->end || *p < '0' || *p > '9')
            return fail(j, s, "invalid number: digits must follow the exponent"), NULL;
        while (p < j->end && *p >= '0' && *p <= '9')
            p++;
    }
    char buf[64];
    size_t n = (size_t)(p - s);
    if (n >= sizeof buf)
        return fail(j, s, "number too long (%zu characters)", n), NULL;
    memcpy(buf, s, n);
    buf[n] = 0;
    errno = 0;
    double v = strtod(buf, NULL);
    if (errno == ERANGE && (v > 1 || v < -1))
        return fail(j, s, "number out of range: %s", buf), NULL;
    j->p = p;
    cJSON *o = cJSON_CreateNumber(v);
    return o ? o : (fail(j, s, "out of memory"), NULL);
}

static int key_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Duplicate keys make an object mean two things: refused. O(k log k). */
static void check_duplicates(jp *j, const cJSON *o, const unsigned char *at)
{
    size_t k = 0;
    for (const cJSON *c = o->child; c; c = c->next)
        k++;
    if (k < 2)
        return;
    char **keys = malloc(k * sizeof *keys);
    if (!keys)
        return fail(j, at, "out of memory");
    k = 0;
    for (const cJSON *c = o->child; c; c = c->next)
        keys[k++] = c->string;
    qsort(keys, k, sizeof *keys, key_cmp);
    for (size_t i = 1; i < k; i++)
        if (!strcmp(keys[i - 1], keys[i])) {
            fail(j, at, "duplicate key \"%.40s\" in an object", keys[i]);
            break;
        }
    free(keys);
}

static cJSON *object(jp *j)
{
    const unsigned char *open = j->p++;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return fail(j, open, "out of memory"), NULL;
    skip_ws(j);
    if (j->p < j->end && *j->p == '}') {
        j->p++;
        return o;
    }
    while (!j->failed) {
        skip_ws(j);
        if (j->p >= j->end || *j->p != '"') {
            fail(j, j->p, "expected a key (a string) in an object");
            break;
        }
        char *key = string(j);
        if (!key)
            break;
        skip_ws(j);
        if (j->p >= j->end || *j->p != ':') {
            fail(j, j->p, "expected ':' after the key \"%.40s\"", key);
            free(key);
            break;
        }
        j->p++;
        bool top = j->depth == 1;
        if (top)
            j->top_key = key;
        cJSON *v = value(j);
        if (top && !j->failed)
            j->top_key = NULL;
        if (v)
            cJSON_AddItemToObject(o, key, v);
        free(key); /* fail() copied it into the error when this field failed */
        if (j->failed)
            break;
        skip_ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->end && *j->p == '}') {
            j->p++;
            check_duplicates(j, o, open);
            break;
        }
        fail(j, j->p, "expected ',' or '}' in an object");
    }
    if (j->failed) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static cJSON *array(jp *j)
{
    const unsigned char *open = j->p++;
    cJSON *a = cJSON_CreateArray();
    if (!a)
        return fail(j, open, "out of memory"), NULL;
    skip_ws(j);
    if (j->p < j->end && *j->p == ']') {
        j->p++;
        return a;
    }
    while (!j->failed) {
        cJSON *v = value(j);
        if (!v)
            break;
        cJSON_AddItemToArray(a, v);
        skip_ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->end && *j->p == ']') {
            j->p++;
            break;
        }
        fail(j, j->p, "expected ',' or ']' in an array");
    }
    if (j->failed) {
        cJSON_Delete(a);
        return NULL;
    }
    return a;
}

static cJSON *literal(jp *j, const char *word, cJSON *(*make)(void))
{
    size_t n = strlen(word);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n))
        return fail(j, j->p, "invalid value"), NULL;
    j->p += n;
    cJSON *o = make();
    return o ? o : (fail(j, j->p, "out of memory"), NULL);
}

static cJSON *make_true(void) { return cJSON_CreateTrue(); }
static cJSON *make_false(void) { return cJSON_CreateFalse(); }
static cJSON *make_null(void) { return cJSON_CreateNull(); }

static cJSON *value(jp *j)
{
    skip_ws(j);
    if (j->p >= j->end)
        return fail(j, j->p, "unexpected end of the body"), NULL;
    if (j->depth >= JSON_MAX_DEPTH)
        return fail(j, j->p, "nesting deeper than %d levels", JSON_MAX_DEPTH), NULL;
    j->depth++;
    cJSON *v;
    switch (*j->p) {
    case '{': v = object(j); break;
    case '[': v = array(j); break;
    case '"': {
        const unsigned char *at = j->p;
        char *s = string(j);
        v = s ? cJSON_CreateString(s) : NULL;
        if (s && !v)
            fail(j, at, "out of memory");
        free(s);
        break;
    }
    case 't': v = literal(j, "true", make_true); break;
    case 'f': v = literal(j, "false", make_false); break;
    case 'n': v = literal(j, "null", make_null); break;
    default: v = number(j); break;
    }
    j->depth--;
    return v;
}

cJSON *srv_json_parse(const char *text, size_t n, srv_json_err *err)
{
    srv_json_err scratch;
    jp j = {.p = (const unsigned char *)text, .end = (const unsigned char *)text + n,
            .start = (const unsigned char *)text, .err = err ? err : &scratch};
    memset(j.err, 0, sizeof *j.err);
    if (!text)
        return fail(&j, j.p, "no body"), NULL;
    cJSON *v = value(&j);
    if (v) {
        skip_ws(&j);
        if (j.p < j.end) {
            fail(&j, j.p, "unexpected data after the JSON value");
            cJSON_Delete(v);
            v = NULL;
        }
    }
    return v;
}
