/* JSON reader and writer (see json.h). The parser is recursive descent over the RFC 8259
 * grammar, allocating from one arena of growing blocks: a document is freed with one call. */
#include "host/util/json.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    max_align_t data[];
} arena_block;

struct json_doc {
    arena_block *blocks;
    json_value root;
};

static void *arena_alloc(json_doc *d, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    arena_block *b = d->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 16384 ? n : 16384;
        if (b && b->cap * 2 > cap && b->cap < ((size_t)1 << 26))
            cap = b->cap * 2;
        arena_block *nb = malloc(sizeof *nb + cap);
        if (!nb)
            return NULL;
        nb->next = b;
        nb->used = 0;
        nb->cap = cap;
        d->blocks = b = nb;
    }
    void *p = (char *)b->data + b->used;
    b->used += n;
    return p;
}

void json_free(json_doc *d)
{
    if (!d)
        return;
    for (arena_block *b = d->blocks, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    free(d);
}

const json_value *json_root(const json_doc *d) { return &d->root; }

/* ---- parser ----------------------------------------------------------------------------------- */

typedef struct parser {
    json_doc *d;
    const char *s;
    size_t n, i;
    char *err;
    size_t n_err;
    vki_status st;
} parser;

static bool perr(parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool perr(parser *p, const char *fmt, ...)
{
    if (p->st != VKI_OK)
        return false;
    p->st = VKI_ERR_INVALID_ARG;
    if (p->err && p->n_err) {
        int k = snprintf(p->err, p->n_err, "at byte %zu: ", p->i);
        va_list ap;
        va_start(ap, fmt);
        if (k >= 0 && (size_t)k < p->n_err)
            vsnprintf(p->err + k, p->n_err - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return false;
}

static bool oom(parser *p)
{
    if (p->st == VKI_OK)
        p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
    return false;
}

static void skip_ws(parser *p)
{
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

int json_hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static bool hex4(parser *p, uint32_t *v)
{
    *v = 0;
    if (p->n - p->i < 4)
        return perr(p, "truncated \\u escape");
    for (int k = 0; k < 4; k++) {
        int h = json_hexval(p->s[p->i + k]);
        if (h < 0)
            return perr(p, "bad hex digit in \\u escape");
        *v = *v << 4 | (uint32_t)h;
    }
    p->i += 4;
    return true;
}

static size_t put_utf8(char *o, uint32_t c)
{
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xC0 | c >> 6);
        o[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | c >> 12);
        o[1] = (char)(0x80 | (c >> 6 & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | c >> 18);
    o[1] = (char)(0x80 | (c >> 12 & 0x3F));
    o[2] = (char)(0x80 | (c >> 6 & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* One escape after the backslash into o; returns bytes written (0 on error). A lone surrogate
 * becomes U+FFFD, as JSON.parse keeps it and UTF-8 cannot. */
static size_t escape(parser *p, char *o)
{
    char c = p->s[p->i++];
    switch (c) {
    case '"': case '\\': case '/': o[0] = c; return 1;
    case 'b': o[0] = '\b'; return 1;
    case 'f': o[0] = '\f'; return 1;
    case 'n': o[0] = '\n'; return 1;
    case 'r': o[0] = '\r'; return 1;
    case 't': o[0] = '\t'; return 1;
    case 'u': break;
    default: p->i--; perr(p, "invalid escape '\\%c'", c); return 0;
    }
    uint32_t u, lo;
    if (!hex4(p, &u))
        return 0;
    if (u >= 0xD800 && u < 0xDC00 && p->n - p->i >= 6 && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
        size_t save = p->i;
        p->i += 2;
        if (!hex4(p, &lo))
            return 0;
        if (lo >= 0xDC00 && lo < 0xE000)
            return put_utf8(o, 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00));
        p->i = save;
    }
    return put_utf8(o, u >= 0xD800 && u < 0xE000 ? 0xFFFD : u);
}

/* A string at p->i (the opening quote). Decoded output is never longer than the source. */
static bool parse_string(parser *p, const char **out, size_t *out_len)
{
    size_t start = ++p->i, end = start;
    while (end < p->n && p->s[end] != '"')
        end += p->s[end] == '\\' ? 2 : 1;
    if (end >= p->n) {
        p->i = p->n;
        return perr(p, "unterminated string");
    }
    char *o = arena_alloc(p->d, end - start + 1);
    if (!o)
        return oom(p);
    size_t k = 0;
    while (p->i < end) {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c < 0x20)
            return perr(p, "control character 0x%02x in a string (escape it)", c);
        if (c != '\\') {
            o[k++] = (char)c;
            p->i++;
            continue;
        }
        p->i++;
        size_t w = escape(p, o + k);
        if (!w)
            return false;
        k += w;
    }
    p->i = end + 1;
    o[k] = 0;
    *out = o;
    *out_len = k;
    return true;
}

static bool digits(parser *p)
{
    size_t a = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
        p->i++;
    return p->i > a;
}

static bool parse_number(parser *p, json_value *v)
{
    size_t a = p->i;
    if (p->s[p->i] == '-')
        p->i++;
    if (p->i < p->n && p->s[p->i] == '0')
        p->i++;
    else if (!digits(p))
        return perr(p, "expected a digit");
    if (p->i < p->n && p->s[p->i] == '.') {
        p->i++;
        if (!digits(p))
            return perr(p, "expected a digit after '.'");
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-'))
            p->i++;
        if (!digits(p))
            return perr(p, "expected a digit in the exponent");
    }
    char *t = arena_alloc(p->d, p->i - a + 1);
    if (!t)
        return oom(p);
    memcpy(t, p->s + a, p->i - a);
    t[p->i - a] = 0;
    v->type = JSON_NUMBER;
    v->s = t;
    v->len = p->i - a;
    v->num = strtod(t, NULL);
    return true;
}

static bool parse_value(parser *p, json_value *v, int depth);

/* Items or members are collected in a growing temporary array, then copied into the arena. */
typedef struct growbuf {
    void *v;
    size_t n, cap, elem;
} growbuf;

static void *grow_push(parser *p, growbuf *g)
{
    if (g->n == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 8;
        void *nv = realloc(g->v, cap * g->elem);
        if (!nv) {
            oom(p);
            return NULL;
        }
        g->v = nv;
        g->cap = cap;
    }
    return (char *)g->v + g->n++ * g->elem;
}

static const void *grow_finish(parser *p, growbuf *g)
{
    void *o = g->n ? arena_alloc(p->d, g->n * g->elem) : NULL;
    if (g->n && !o)
        oom(p);
    else if (g->n)
        memcpy(o, g->v, g->n * g->elem);
    free(g->v);
    return o;
}

static bool parse_array(parser *p, json_value *v, int depth)
{
    growbuf g = {.elem = sizeof(json_value)};
    p->i++;
    skip_ws(p);
    bool ok = true;
    if (p->i < p->n && p->s[p->i] == ']') {
        p->i++;
    } else {
        for (;;) {
            json_value *it = grow_push(p, &g);
            if (!(ok = it && parse_value(p, it, depth + 1)))
                break;
            skip_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == ']') {
                p->i++;
                break;
            }
            ok = perr(p, "expected ',' or ']' in an array");
            break;
        }
    }
    v->type = JSON_ARRAY;
    v->n = g.n;
    v->items = grow_finish(p, &g);
    return ok && p->st == VKI_OK;
}

static bool parse_object(parser *p, json_value *v, int depth)
{
    growbuf g = {.elem = sizeof(json_member)};
    p->i++;
    skip_ws(p);
    bool ok = true;
    if (p->i < p->n && p->s[p->i] == '}') {
        p->i++;
    } else {
        for (;;) {
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != '"') {
                ok = perr(p, "expected a string key in an object");
                break;
            }
            json_member *m = grow_push(p, &g);
            size_t key_at = p->i;
            if (!(ok = m && parse_string(p, &m->key, &m->key_len)))
                break;
            for (size_t j = 0; j + 1 < g.n && ok; j++) {
                const json_member *o = (const json_member *)g.v + j;
                if (o->key_len == m->key_len && !memcmp(o->key, m->key, m->key_len)) {
                    p->i = key_at;
                    ok = perr(p, "duplicate key \"%s\"", m->key);
                }
            }
            skip_ws(p);
            if (ok && (p->i >= p->n || p->s[p->i] != ':'))
                ok = perr(p, "expected ':' after an object key");
            if (!ok)
                break;
            p->i++;
            if (!(ok = parse_value(p, &m->value, depth + 1)))
                break;
            skip_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == '}') {
                p->i++;
                break;
            }
            ok = perr(p, "expected ',' or '}' in an object");
            break;
        }
    }
    v->type = JSON_OBJECT;
    v->n = g.n;
    v->members = grow_finish(p, &g);
    return ok && p->st == VKI_OK;
}

static bool literal(parser *p, const char *word, json_type t, json_value *v)
{
    size_t k = strlen(word);
    if (p->n - p->i < k || memcmp(p->s + p->i, word, k))
        return perr(p, "invalid literal (expected %s)", word);
    p->i += k;
    v->type = t;
    return true;
}

static bool parse_value(parser *p, json_value *v, int depth)
{
    memset(v, 0, sizeof *v);
    skip_ws(p);
    v->off = p->i;
    if (depth > JSON_MAX_DEPTH)
        return perr(p, "nested deeper than %d levels", JSON_MAX_DEPTH);
    if (p->i >= p->n)
        return perr(p, "unexpected end of input");
    char c = p->s[p->i];
    switch (c) {
    case '{': return parse_object(p, v, depth);
    case '[': return parse_array(p, v, depth);
    case '"': v->type = JSON_STRING; return parse_string(p, &v->s, &v->len);
    case 't': return literal(p, "true", JSON_TRUE, v);
    case 'f': return literal(p, "false", JSON_FALSE, v);
    case 'n': return literal(p, "null", JSON_NULL, v);
    default:
        if (c == '-' || (c >= '0' && c <= '9'))
            return parse_number(p, v);
        return perr(p, "unexpected character '%c'", c);
    }
}

vki_status json_parse(const char *text, size_t len, json_doc **out, char *err, size_t n_err)
{
    *out = NULL;
    if (err && n_err)
        err[0] = 0;
    json_doc *d = calloc(1, sizeof *d);
    if (!d)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    parser p = {.d = d, .s = text, .n = text ? len : 0, .err = err, .n_err = n_err};
    if (parse_value(&p, &d->root, 0)) {
        skip_ws(&p);
        if (p.i < p.n)
            perr(&p, "unexpected data after the JSON value");
    }
    if (p.st == VKI_OK && !p.i)
        perr(&p, "empty input");
    if (p.st != VKI_OK) {
        json_free(d);
        return p.st;
    }
    *out = d;
    return VKI_OK;
}

/* ---- queries ------------------------------------------------------------------------------------ */

const json_value *json_get(const json_value *v, const char *key)
{
    if (!v || v->type != JSON_OBJECT)
        return NULL;
    size_t k = strlen(key);
    for (size_t i = 0; i < v->n; i++)
        if (v->members[i].key_len == k && !memcmp(v->members[i].key, key, k))
            return &v->members[i].value;
    return NULL;
}

bool json_is_str(const json_value *v, const char *s)
{
    return v && v->type == JSON_STRING && v->len == strlen(s) && !memcmp(v->s, s, v->len);
}

bool json_equal(const json_value *a, const json_value *b)
{
    if (a->type != b->type)
        return false;
    switch (a->type) {
    case JSON_NUMBER: return a->num == b->num;
    case JSON_STRING: return a->len == b->len && !memcmp(a->s, b->s, a->len);
    case JSON_ARRAY:
        if (a->n != b->n)
            return false;
        for (size_t i = 0; i < a->n; i++)
            if (!json_equal(&a->items[i], &b->items[i]))
                return false;
        return true;
    case JSON_OBJECT:
        if (a->n != b->n)
            return false;
        for (size_t i = 0; i < a->n; i++) {
            const json_value *o = NULL;
            for (size_t j = 0; j < b->n && !o; j++)
                if (b->members[j].key_len == a->members[i].key_len &&
                    !memcmp(b->members[j].key, a->members[i].key, a->members[i].key_len))
                    o = &b->members[j].value;
            if (!o || !json_equal(&a->members[i].value, o))
                return false;
        }
        return true;
    default: return true;
    }
}

/* ---- writer ------------------------------------------------------------------------------------- */

bool json_write_str(strbuf *b, const char *s, size_t n)
{
    bool ok = strbuf_put(b, "\"", 1);
    size_t run = 0; /* bytes copied as they are, flushed in one put */
    for (size_t i = 0; i < n && ok; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        if (!esc && c >= 0x20)
            continue;
        ok = strbuf_put(b, s + run, i - run);
        if (ok && esc)
            ok = strbuf_put(b, esc, 2);
        else if (ok)
            ok = strbuf_printf(b, "\\u%04x", c);
        run = i + 1;
    }
    return ok && strbuf_put(b, s + run, n - run) && strbuf_put(b, "\"", 1);
}

static bool newline(strbuf *b, int indent, int depth)
{
    if (!strbuf_put(b, "\n", 1))
        return false;
    for (int i = 0; i < indent * depth; i++)
        if (!strbuf_put(b, " ", 1))
            return false;
    return true;
}

/* indent < 0: one line with ", " / ": " separators; else Python's indent layout. */
static bool write_value(strbuf *b, const json_value *v, int indent, int depth)
{
    const char *sep = indent < 0 ? ", " : ",";
    switch (v->type) {
    case JSON_NULL: return strbuf_put(b, "null", 4);
    case JSON_FALSE: return strbuf_put(b, "false", 5);
    case JSON_TRUE: return strbuf_put(b, "true", 4);
    case JSON_NUMBER: return strbuf_put(b, v->s, v->len);
    case JSON_STRING: return json_write_str(b, v->s, v->len);
    case JSON_ARRAY: {
        bool ok = strbuf_put(b, "[", 1);
        for (size_t i = 0; i < v->n && ok; i++) {
            if (i)
                ok = strbuf_put(b, sep, strlen(sep));
            if (ok && indent >= 0)
                ok = newline(b, indent, depth + 1);
            ok = ok && write_value(b, &v->items[i], indent, depth + 1);
        }
        if (ok && indent >= 0 && v->n)
            ok = newline(b, indent, depth);
        return ok && strbuf_put(b, "]", 1);
    }
    case JSON_OBJECT: {
        bool ok = strbuf_put(b, "{", 1);
        for (size_t i = 0; i < v->n && ok; i++) {
            if (i)
                ok = strbuf_put(b, sep, strlen(sep));
            if (ok && indent >= 0)
                ok = newline(b, indent, depth + 1);
            ok = ok && json_write_str(b, v->members[i].key, v->members[i].key_len) && strbuf_put(b, ": ", 2) &&
                 write_value(b, &v->members[i].value, indent, depth + 1);
        }
        if (ok && indent >= 0 && v->n)
            ok = newline(b, indent, depth);
        return ok && strbuf_put(b, "}", 1);
    }
    }
    return false;
}

bool json_write(strbuf *b, const json_value *v) { return write_value(b, v, -1, 0); }

bool json_write_indent(strbuf *b, const json_value *v, int indent) { return write_value(b, v, indent, 0); }
