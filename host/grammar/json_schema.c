/* JSON Schema -> GBNF. The grammar's language is a subset of the JSON texts the schema accepts
 * (never a superset): what cannot be expressed is an error naming the keyword and the schema
 * path, never a silent widening.
 *
 * Keywords: type (one or a list), properties, required, additionalProperties (false, true or a
 * schema; ABSENT MEANS FALSE here, as in xgrammar's strict mode and OpenAI's strict schemas: the
 * model cannot pad an object with keys nobody asked for; say `true` to allow them), enum,
 * const, items, minItems, maxItems, anyOf, oneOf (as anyOf: exclusivity is not enforced, so a
 * value matching two branches is possible), nullable (OpenAPI), $ref to "#", "#/$defs/..." or
 * "#/definitions/..." (recursion allowed), minLength, maxLength, pattern and format (date, time,
 * date-time, uuid; json_pattern.c), and for integers and numbers minimum, maximum,
 * exclusiveMinimum, exclusiveMaximum (draft 6 numbers; exact decimal ranges, see gen_integer and
 * gen_number). Annotations are ignored (title, description, default, examples, $schema, $id,
 * $comment, deprecated, readOnly, writeOnly, x-*). Anything else (allOf, not, uniqueItems, other
 * formats, ...) is refused.
 *
 * Layout: properties in schema order; between tokens a bounded whitespace rule `ws` (up to one
 * newline and 20 indentation characters, so a model cannot loop on whitespace); numbers with at
 * most 16 integer digits, 16 fraction digits and 3 exponent digits (finite JSON, and integers
 * that round-trip through a double). Extra keys under additionalProperties are written without
 * escapes and differ from every declared name (a trie of the names becomes rules). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/grammar/grammar.h"
#include "host/util/json.h"

#define MAX_DEPTH 128

typedef struct ref_entry {
    char *ref;                /* "#/$defs/x" */
    char name[48];            /* its rule */
} ref_entry;

typedef struct conv {
    strbuf *out;              /* the rules, one per line */
    const json_value *root;
    strbuf path;              /* JSON pointer of the schema being converted */
    uint32_t n_rules;
    uint32_t prims;           /* shared rules already written (PRIM_*) */
    ref_entry *refs;
    uint32_t n_refs, cap_refs;
    int depth;
    char *err;
    size_t n_err;
    vki_status st;
} conv;

enum { PRIM_WS = 1, PRIM_STRING = 2, PRIM_NUMBER = 4, PRIM_INTEGER = 8, PRIM_VALUE = 16, PRIM_KEYCHAR = 32 };

static bool cfail(conv *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool cfail(conv *c, const char *fmt, ...)
{
    if (c->st != VKI_OK)
        return false;
    c->st = VKI_ERR_INVALID_ARG;
    if (c->err && c->n_err) {
        int k = snprintf(c->err, c->n_err, "json_schema: %s: ", c->path.len ? c->path.p : "(root)");
        va_list ap;
        va_start(ap, fmt);
        if (k >= 0 && (size_t)k < c->n_err)
            vsnprintf(c->err + k, c->n_err - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return false;
}

static bool coom(conv *c)
{
    if (c->st == VKI_OK)
        c->st = VKI_ERR_OUT_OF_HOST_MEMORY;
    return false;
}

static bool put(conv *c, strbuf *b, const char *s) { return strbuf_put(b, s, strlen(s)) || coom(c); }

/* ---- names, literals, shared rules ------------------------------------------------------------- */

/* A fresh rule name "s<N>-hint" (hint sanitised to [a-z0-9-], at most 24 characters). */
static void rule_name(conv *c, const char *hint, size_t hint_len, char name[48])
{
    int k = snprintf(name, 48, "s%u-", ++c->n_rules);
    for (size_t i = 0; i < hint_len && k < 46 && i < 24; i++) {
        char ch = hint[i];
        if ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-')
            name[k++] = ch;
        else if (ch >= 'A' && ch <= 'Z')
            name[k++] = (char)(ch - 'A' + 'a');
        else if (k && name[k - 1] != '-')
            name[k++] = '-';
    }
    name[k] = 0;
}

/* Appends "name ::= body\n". */
static bool emit_rule(conv *c, const char *name, const char *body)
{
    return put(c, c->out, name) && put(c, c->out, " ::= ") && put(c, c->out, body) && put(c, c->out, "\n");
}

/* Appends text as a GBNF string literal (the bytes must be UTF-8). */
/* Whether s[0, n) is UTF-8 (shortest forms, no surrogates): grammars are UTF-8 text. */
static bool utf8_ok(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char b = (unsigned char)s[i];
        size_t len = b < 0x80 ? 1 : b >= 0xC2 && b < 0xE0 ? 2 : b >= 0xE0 && b < 0xF0 ? 3 : b >= 0xF0 && b < 0xF5 ? 4 : 0;
        if (!len || n - i < len)
            return false;
        uint32_t cp = len == 1 ? b : b & (0x7Fu >> len);
        for (size_t k = 1; k < len; k++) {
            if (((unsigned char)s[i + k] & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | ((unsigned char)s[i + k] & 0x3Fu);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000))
            return false;
        i += len;
    }
    return true;
}

static bool literal(conv *c, strbuf *e, const char *s, size_t n)
{
    if (!utf8_ok(s, n))
        return cfail(c, "a name or value is not valid UTF-8");
    bool ok = strbuf_put(e, "\"", 1);
    for (size_t i = 0; i < n && ok; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            ok = strbuf_put(e, "\\", 1) && strbuf_put(e, s + i, 1);
        else if (ch < 0x20 || ch == 0x7F)
            ok = strbuf_printf(e, "\\x%02X", ch);
        else
            ok = strbuf_put(e, s + i, 1);
    }
    return (ok && strbuf_put(e, "\"", 1)) || coom(c);
}

/* v as compact JSON text (no spaces). */
static bool compact(strbuf *t, const json_value *v)
{
    if (v->type != JSON_ARRAY && v->type != JSON_OBJECT)
        return json_write(t, v);
    bool obj = v->type == JSON_OBJECT, ok = strbuf_put(t, obj ? "{" : "[", 1);
    for (size_t i = 0; i < v->n && ok; i++) {
        if (i)
            ok = strbuf_put(t, ",", 1);
        if (ok && obj)
            ok = json_write_str(t, v->members[i].key, v->members[i].key_len) && strbuf_put(t, ":", 1);
        ok = ok && compact(t, obj ? &v->members[i].value : &v->items[i]);
    }
    return ok && strbuf_put(t, obj ? "}" : "]", 1);
}

/* A JSON value, written compactly, as a literal: enum and const members. */
static bool value_literal(conv *c, strbuf *e, const json_value *v)
{
    strbuf t = {0};
    bool ok = compact(&t, v) ? literal(c, e, t.p, t.len) : coom(c);
    free(t.p);
    return ok;
}

/* The shared rules, written once each on first use. */
static bool prim(conv *c, uint32_t which)
{
    if (c->prims & which)
        return true;
    c->prims |= which;
    switch (which) {
    case PRIM_WS:
        return emit_rule(c, "ws", "( [ \\t] | \"\\n\" [ \\t]{0,20} )?");
    case PRIM_STRING:
        return emit_rule(c, "json-char", "[^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )") &&
               emit_rule(c, "json-string", "\"\\\"\" json-char* \"\\\"\"");
    case PRIM_NUMBER:
        return emit_rule(c, "json-number", "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?");
    case PRIM_INTEGER:
        return emit_rule(c, "json-integer", "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} )");
    case PRIM_KEYCHAR:
        return emit_rule(c, "json-keychar", "[^\"\\\\\\x7F\\x00-\\x1F]");
    case PRIM_VALUE:
        return prim(c, PRIM_WS) && prim(c, PRIM_STRING) && prim(c, PRIM_NUMBER) &&
               emit_rule(c, "json-value", "json-object | json-array | json-string | json-number | \"true\" | \"false\" | \"null\"") &&
               emit_rule(c, "json-object", "\"{\" ws ( json-string ws \":\" ws json-value ( ws \",\" ws json-string ws \":\" ws json-value )* )? ws \"}\"") &&
               emit_rule(c, "json-array", "\"[\" ws ( json-value ( ws \",\" ws json-value )* )? ws \"]\"");
    }
    return false;
}

/* ---- keywords -------------------------------------------------------------------------------- */

static const char *const supported[] = {"type", "properties", "required", "additionalProperties", "enum", "const",
                                        "items", "minItems", "maxItems", "anyOf", "oneOf", "nullable", "$ref",
                                        "$defs", "definitions", "minLength", "maxLength", "minimum", "maximum",
                                        "exclusiveMinimum", "exclusiveMaximum", "pattern", "format"};
static const char *const annotations[] = {"title", "description", "default", "examples", "$schema", "$id",
                                          "$comment", "deprecated", "readOnly", "writeOnly"};

static bool in_list(const char *k, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(k, list[i]))
            return true;
    return false;
}

static bool check_keywords(conv *c, const json_value *s)
{
    for (size_t i = 0; i < s->n; i++) {
        const char *k = s->members[i].key;
        if (in_list(k, supported, sizeof supported / sizeof *supported) ||
            in_list(k, annotations, sizeof annotations / sizeof *annotations) || !strncmp(k, "x-", 2))
            continue;
        return cfail(c, "keyword '%s' is not supported (see the supported keywords in the README)", k);
    }
    return true;
}

/* A non-negative integer keyword, or *v unchanged when absent. */
static bool count_kw(conv *c, const json_value *s, const char *kw, uint32_t *v, uint32_t limit)
{
    const json_value *x = json_get(s, kw);
    if (!x)
        return true;
    if (x->type != JSON_NUMBER || x->num < 0 || x->num != (double)(uint64_t)x->num)
        return cfail(c, "'%s' must be a non-negative integer", kw);
    if (x->num > limit)
        return cfail(c, "'%s' %.0f is above the supported %u", kw, x->num, limit);
    *v = (uint32_t)x->num;
    return true;
}

/* ---- integer ranges ------------------------------------------------------------------------------ */

/* minimum / maximum / exclusiveMinimum / exclusiveMaximum of an integer, as the decimal texts of
 * exactly the integers in [lo, hi]: per digit count, the classic split of a same-length range
 * into a prefix that runs along the low bound, a free middle and a prefix along the high bound
 * (O(digits^2) grammar text). Bounds beyond json-integer's 16 digits are clamped to them (the
 * language stays a subset of the schema's). */
#define INT_LIMIT 9999999999999999LL /* 16 digits */

static const char *const numeric_kw[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};

static bool all_digit(const char *p, size_t n, char d)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != d)
            return false;
    return true;
}

/* Texts of equal length n from x to y (x <= y digit-wise), leading zeros allowed (a suffix). */
static bool same_len(conv *c, strbuf *e, const char *x, const char *y, size_t n)
{
    if (!n)
        return put(c, e, "\"\"");
    if (!memcmp(x, y, n)) {
        return put(c, e, "\"") && (strbuf_put(e, x, n) || coom(c)) && put(c, e, "\"");
    }
    if (x[0] == y[0])
        return (strbuf_printf(e, "\"%c\" ", x[0]) || coom(c)) && same_len(c, e, x + 1, y + 1, n - 1);
    char nines[20], zeros[20];
    memset(nines, '9', n - 1);
    memset(zeros, '0', n - 1);
    char d0 = x[0], d1 = y[0];
    bool ok = put(c, e, "( "), first = true;
    if (!all_digit(x + 1, n - 1, '0')) { /* x[0] then at least x's rest */
        ok = ok && (strbuf_printf(e, "\"%c\" ( ", x[0]) || coom(c)) && same_len(c, e, x + 1, nines, n - 1) &&
             put(c, e, " )");
        d0++;
        first = false;
    }
    if (!all_digit(y + 1, n - 1, '9')) { /* y[0] then at most y's rest */
        ok = ok && (first || put(c, e, " | ")) && (strbuf_printf(e, "\"%c\" ( ", y[0]) || coom(c)) &&
             same_len(c, e, zeros, y + 1, n - 1) && put(c, e, " )");
        d1--;
        first = false;
    }
    if (d0 <= d1) { /* a free first digit in [d0, d1], any rest */
        ok = ok && (first || put(c, e, " | ")) && (strbuf_printf(e, "[%c-%c]", d0, d1) || coom(c));
        if (n > 2)
            ok = ok && (strbuf_printf(e, " [0-9]{%zu}", n - 1) || coom(c));
        else if (n == 2)
            ok = ok && put(c, e, " [0-9]");
    }
    return ok && put(c, e, " )");
}

/* The decimal texts of a..b, 0 <= a <= b <= INT_LIMIT, without leading zeros. */
static bool nonneg_range(conv *c, strbuf *e, long long a, long long b)
{
    char sa[24], sb[24];
    int la = snprintf(sa, sizeof sa, "%lld", a), lb = snprintf(sb, sizeof sb, "%lld", b);
    bool ok = put(c, e, "( ");
    for (int len = la; len <= lb && ok; len++) {
        char lo[24], hi[24];
        if (len == la)
            memcpy(lo, sa, (size_t)la);
        else {
            lo[0] = '1';
            memset(lo + 1, '0', (size_t)len - 1);
        }
        if (len == lb)
            memcpy(hi, sb, (size_t)lb);
        else
            memset(hi, '9', (size_t)len);
        ok = (len == la || put(c, e, " | ")) && same_len(c, e, lo, hi, (size_t)len);
    }
    return ok && put(c, e, " )");
}

/* One numeric bound: *v (an integer bound, inward: ceil for lower, floor for upper; exclusive
 * ones one step further in) when the keyword is present. */
static bool int_bound(conv *c, const json_value *s, const char *kw, bool lower, bool exclusive, long long *v,
                      bool *has)
{
    const json_value *x = json_get(s, kw);
    if (!x)
        return true;
    if (x->type != JSON_NUMBER)
        return cfail(c, "'%s' must be a number", kw);
    double d = lower ? ceil(x->num) : floor(x->num);
    if (exclusive && d == x->num)
        d += lower ? 1 : -1;
    /* (double)INT_LIMIT rounds up to 1e16: clamp in integers */
    long long b = d <= -1e16 ? -INT_LIMIT : d >= 1e16 ? INT_LIMIT : (long long)d;
    if (!*has || (lower ? b > *v : b < *v))
        *v = b;
    *has = true;
    return true;
}

static bool gen_integer(conv *c, const json_value *s, strbuf *e)
{
    long long lo = -INT_LIMIT, hi = INT_LIMIT;
    bool has_lo = false, has_hi = false;
    if (!int_bound(c, s, "minimum", true, false, &lo, &has_lo) ||
        !int_bound(c, s, "exclusiveMinimum", true, true, &lo, &has_lo) ||
        !int_bound(c, s, "maximum", false, false, &hi, &has_hi) ||
        !int_bound(c, s, "exclusiveMaximum", false, true, &hi, &has_hi))
        return false;
    if (!has_lo && !has_hi)
        return prim(c, PRIM_INTEGER) && put(c, e, "json-integer");
    if (lo > hi)
        return cfail(c, "no integer lies between the minimum and the maximum");
    bool ok = put(c, e, "( ");
    if (lo < 0) /* negatives: "-" and the magnitudes, never "-0" */
        ok = ok && put(c, e, "\"-\" ") && nonneg_range(c, e, hi < 0 ? -hi : 1, -lo);
    if (hi >= 0)
        ok = ok && (lo >= 0 || put(c, e, " | ")) && nonneg_range(c, e, lo > 0 ? lo : 0, hi);
    return ok && put(c, e, " )");
}

/* ---- number ranges ------------------------------------------------------------------------------- */

/* minimum / maximum / exclusiveMinimum / exclusiveMaximum of a number: the texts of exactly the
 * decimals in the range that have at most 16 integer and 16 fraction digits and no exponent (a
 * subset of json-number's texts). Every such text lies on the grid of multiples of 1e-16, so a
 * bound becomes the nearest grid value inside it, computed in exact decimal from the bound's
 * shortest round-trip digits (the "0.1" the schema's author wrote, not the double's
 * 0.1000000000000000055...). A value is fx: ip + fp * 1e-16 with 0 <= fp < 1e16 (floor form, so
 * -0.5 is {-1, 5e15}); the texts of a range of magnitudes are an integer-part range (gen_integer's
 * nonneg_range) beside a fraction language per end digit by digit (frac_suffix). */
#define FX_ONE 10000000000000000LL /* 1e16: one unit of ip in fp */

typedef struct fx {
    long long ip, fp;
} fx;

static int fx_cmp(fx a, fx b) { return a.ip != b.ip ? (a.ip < b.ip ? -1 : 1) : a.fp != b.fp ? (a.fp < b.fp ? -1 : 1) : 0; }
static fx fx_neg(fx a) { return a.fp ? (fx){-a.ip - 1, FX_ONE - a.fp} : (fx){-a.ip, 0}; }
static fx fx_up(fx a) { return a.fp + 1 == FX_ONE ? (fx){a.ip + 1, 0} : (fx){a.ip, a.fp + 1}; }
static fx fx_down(fx a) { return a.fp ? (fx){a.ip, a.fp - 1} : (fx){a.ip - 1, FX_ONE - 1}; }

/* |x| truncated to the grid (saturated at 1e16 beyond the texts' 16 integer digits), and whether
 * digits were cut (x lies strictly between two grid values). */
static fx fx_trunc_abs(double x, bool *more)
{
    *more = false;
    if (!(fabs(x) < 1e16)) /* also inf (a bound like 1e400) */
        return (fx){FX_ONE, 0};
    char t[40];
    int p = 0;
    for (; p < 17; p++) { /* shortest digits that read back as x */
        snprintf(t, sizeof t, "%.*e", p, fabs(x));
        if (strtod(t, NULL) == fabs(x))
            break;
    }
    char digits[24];
    int n = 0;
    for (const char *q = t; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9')
            digits[n++] = *q;
    int e = atoi(strchr(t, 'e') + 1); /* digits[i] weighs 10^(e - i); e < 16 */
    fx r = {0, 0};
    for (int i = 0; i < n; i++) {
        int w = e - i; /* weight 10^w */
        int d = digits[i] - '0';
        if (w >= 0)
            r.ip = r.ip * 10 + d; /* the integer digits come first, each once */
        else if (w >= -16) {
            long long m = 1;
            for (int k = 0; k < 16 + w; k++)
                m *= 10;
            r.fp += d * m;
        } else if (d)
            *more = true;
        if (w > 0 && i == n - 1) /* trailing zeros of the integer part */
            for (int k = 0; k < w; k++)
                r.ip *= 10;
    }
    return r;
}

/* One numeric bound of a number (as int_bound): lower bounds rise to the grid, upper ones fall. */
static bool num_bound(conv *c, const json_value *s, const char *kw, bool lower, bool exclusive, fx *v, bool *has)
{
    const json_value *x = json_get(s, kw);
    if (!x)
        return true;
    if (x->type != JSON_NUMBER || isnan(x->num))
        return cfail(c, "'%s' must be a number", kw);
    bool more;
    fx t = fx_trunc_abs(x->num, &more), b;
    bool neg = x->num < 0;
    if (lower) /* ceil: up when digits were cut from a positive value; a negative one truncates up */
        b = neg ? fx_neg(t) : more ? fx_up(t) : t;
    else
        b = neg ? fx_neg(more ? fx_up(t) : t) : t;
    if (exclusive && !more) /* on the grid: one step inside */
        b = lower ? fx_up(b) : fx_down(b);
    if (!*has || (lower ? fx_cmp(b, *v) > 0 : fx_cmp(b, *v) < 0))
        *v = b;
    *has = true;
    return true;
}

static void frac_digits(long long fp, char out[17])
{
    snprintf(out, 17, "%016lld", fp);
}

/* The fraction digits from position p on (after p digits already matched, at least one digit
 * when p == 0) whose zero-padded value lies in [lo, hi] (16-digit strings), while tl / th say the
 * digits so far equal lo's / hi's. */
static bool frac_suffix(conv *c, strbuf *e, const char *lo, const char *hi, int p, bool tl, bool th)
{
    tl = tl && !all_digit(lo + p, (size_t)(16 - p), '0'); /* padding with zeros already reaches lo */
    th = th && !all_digit(hi + p, (size_t)(16 - p), '9');
    if (!tl && !th)
        return p == 16 ? put(c, e, "\"\"") : (strbuf_printf(e, "[0-9]{%d,%d}", p ? 0 : 1, 16 - p) || coom(c));
    bool ok = put(c, e, "( "), first = true;
    if (p && !tl) { /* end here: the rest reads as zeros, at most hi */
        ok = ok && put(c, e, "\"\"");
        first = false;
    }
    char l = tl ? lo[p] : '0', h = th ? hi[p] : '9';
    if (tl && th && l == h)
        return ok && (first || put(c, e, " | ")) && (strbuf_printf(e, "\"%c\" ", l) || coom(c)) &&
               frac_suffix(c, e, lo, hi, p + 1, true, true) && put(c, e, " )");
    if (tl) {
        ok = ok && (first || put(c, e, " | ")) && (strbuf_printf(e, "\"%c\" ", l) || coom(c)) &&
             frac_suffix(c, e, lo, hi, p + 1, true, false);
        l++;
        first = false;
    }
    if (th) {
        ok = ok && (first || put(c, e, " | ")) && (strbuf_printf(e, "\"%c\" ", h) || coom(c)) &&
             frac_suffix(c, e, lo, hi, p + 1, false, true);
        h--;
        first = false;
    }
    if (l <= h) {
        ok = ok && (first || put(c, e, " | ")) && (strbuf_printf(e, "[%c-%c]", l, h) || coom(c));
        if (p < 15)
            ok = ok && (strbuf_printf(e, " [0-9]{0,%d}", 15 - p) || coom(c));
    }
    return ok && put(c, e, " )");
}

/* No fraction (when lo is zero) or "." and fraction digits in [lo, hi]. */
static bool frac_range(conv *c, strbuf *e, long long lo, long long hi)
{
    char sl[17], sh[17];
    frac_digits(lo, sl);
    frac_digits(hi, sh);
    return put(c, e, lo ? "( \".\" " : "( \"\" | \".\" ") && frac_suffix(c, e, sl, sh, 0, true, true) &&
           put(c, e, " )");
}

/* The texts of the magnitudes a..b (0 <= a <= b < 1e16, on the grid). */
static bool magnitudes(conv *c, strbuf *e, fx a, fx b)
{
    if (a.ip == b.ip)
        return (strbuf_printf(e, "( \"%lld\" ", a.ip) || coom(c)) && frac_range(c, e, a.fp, b.fp) &&
               put(c, e, " )");
    bool ok = put(c, e, "( "), first = true;
    long long i0 = a.ip, i1 = b.ip;
    if (a.fp) { /* a's integer part, fractions from a's up */
        ok = ok && (strbuf_printf(e, "\"%lld\" ", a.ip) || coom(c)) && frac_range(c, e, a.fp, FX_ONE - 1);
        i0++, first = false;
    }
    if (b.fp != FX_ONE - 1) { /* b's integer part, fractions up to b's */
        ok = ok && (first || put(c, e, " | ")) && (strbuf_printf(e, "\"%lld\" ", b.ip) || coom(c)) &&
             frac_range(c, e, 0, b.fp);
        i1--, first = false;
    }
    if (i0 <= i1) /* whole integer parts between, any fraction */
        ok = ok && (first || put(c, e, " | ")) && nonneg_range(c, e, i0, i1) &&
             put(c, e, " ( \".\" [0-9]{1,16} )?");
    return ok && put(c, e, " )");
}

static bool gen_number(conv *c, const json_value *s, strbuf *e)
{
    const fx max = {INT_LIMIT, FX_ONE - 1}, min = fx_neg(max);
    fx lo = min, hi = max;
    bool has_lo = false, has_hi = false;
    if (!num_bound(c, s, "minimum", true, false, &lo, &has_lo) ||
        !num_bound(c, s, "exclusiveMinimum", true, true, &lo, &has_lo) ||
        !num_bound(c, s, "maximum", false, false, &hi, &has_hi) ||
        !num_bound(c, s, "exclusiveMaximum", false, true, &hi, &has_hi))
        return false;
    if (!has_lo && !has_hi)
        return prim(c, PRIM_NUMBER) && put(c, e, "json-number");
    lo = fx_cmp(lo, min) < 0 ? min : lo;
    hi = fx_cmp(hi, max) > 0 ? max : hi;
    if (fx_cmp(lo, hi) > 0)
        return cfail(c, "no number lies between the minimum and the maximum (16 fraction digits at most)");
    const fx zero = {0, 0}, ulp = {0, 1};
    bool ok = put(c, e, "( ");
    if (lo.ip < 0) /* negatives: "-" and magnitudes above zero, never "-0" */
        ok = ok && put(c, e, "\"-\" ") && magnitudes(c, e, hi.ip < 0 ? fx_neg(hi) : ulp, fx_neg(lo));
    if (hi.ip >= 0)
        ok = ok && (lo.ip >= 0 || put(c, e, " | ")) && magnitudes(c, e, lo.ip >= 0 ? lo : zero, hi);
    return ok && put(c, e, " )");
}

/* ---- the converter ------------------------------------------------------------------------------- */

static bool gen(conv *c, const json_value *s, strbuf *e);

/* Path push/pop around a child schema. */
static size_t path_push(conv *c, const char *a, const char *b)
{
    size_t len = c->path.len;
    if (!strbuf_put(&c->path, "/", 1) || !put(c, &c->path, a) || (b && (!strbuf_put(&c->path, "/", 1) || !put(c, &c->path, b))))
        coom(c);
    return len;
}

static void path_pop(conv *c, size_t len)
{
    c->path.len = len;
    if (c->path.p)
        c->path.p[len] = 0;
}

static bool gen_child(conv *c, const json_value *s, strbuf *e, const char *a, const char *b)
{
    size_t saved = path_push(c, a, b);
    bool ok = c->st == VKI_OK && gen(c, s, e);
    path_pop(c, saved);
    return ok;
}

/* A string under "pattern" or "format" (json_pattern.c). */
static bool gen_pattern(conv *c, const json_value *s, strbuf *e)
{
    const json_value *pat = json_get(s, "pattern"), *fmt = json_get(s, "format");
    if (pat && fmt)
        return cfail(c, "'pattern' together with 'format' is not supported");
    if (json_get(s, "minLength") || json_get(s, "maxLength"))
        return cfail(c, "'%s' together with minLength or maxLength is not supported", pat ? "pattern" : "format");
    const json_value *v = pat ? pat : fmt;
    if (v->type != JSON_STRING)
        return cfail(c, "'%s' must be a string", pat ? "pattern" : "format");
    char msg[160];
    vki_status st = pat ? gram_pattern_gbnf(v->s, v->len, e, msg, sizeof msg) : gram_format_gbnf(v->s, e);
    if (st == VKI_ERR_OUT_OF_HOST_MEMORY)
        return coom(c);
    if (st != VKI_OK)
        return pat ? cfail(c, "pattern \"%s\": %s", v->s, msg)
                   : cfail(c, "keyword 'format': \"%s\" is not supported (date, time, date-time and uuid are)", v->s);
    return true;
}

static bool gen_string(conv *c, const json_value *s, strbuf *e)
{
    if (json_get(s, "pattern") || json_get(s, "format"))
        return prim(c, PRIM_STRING) && put(c, e, "( \"\\\"\" ") && gen_pattern(c, s, e) && put(c, e, " \"\\\"\" )");
    uint32_t lo = 0, hi = UINT32_MAX;
    if (!count_kw(c, s, "minLength", &lo, GRAM_MAX_REPEAT) || !count_kw(c, s, "maxLength", &hi, GRAM_MAX_REPEAT) ||
        !prim(c, PRIM_STRING))
        return false;
    if (hi != UINT32_MAX && hi < lo)
        return cfail(c, "maxLength %u is below minLength %u", hi, lo);
    if (!lo && hi == UINT32_MAX)
        return put(c, e, "json-string");
    bool ok = hi == UINT32_MAX ? strbuf_printf(e, "( \"\\\"\" json-char{%u,} \"\\\"\" )", lo)
                               : strbuf_printf(e, "( \"\\\"\" json-char{%u,%u} \"\\\"\" )", lo, hi);
    return ok || coom(c);
}

static bool gen_array(conv *c, const json_value *s, strbuf *e)
{
    uint32_t lo = 0, hi = UINT32_MAX;
    if (!count_kw(c, s, "minItems", &lo, GRAM_MAX_REPEAT) || !count_kw(c, s, "maxItems", &hi, GRAM_MAX_REPEAT) ||
        !prim(c, PRIM_WS))
        return false;
    if (hi != UINT32_MAX && hi < lo)
        return cfail(c, "maxItems %u is below minItems %u", hi, lo);
    const json_value *items = json_get(s, "items");
    strbuf it = {0}, body = {0};
    bool ok = items ? gen_child(c, items, &it, "items", NULL) : prim(c, PRIM_VALUE) && put(c, &it, "json-value");
    char name[48];
    rule_name(c, "array", 5, name);
    if (ok && hi == 0) {
        ok = put(c, &body, "\"[\" ws \"]\"");
    } else if (ok) {
        char rep[48];
        uint32_t more_lo = lo ? lo - 1 : 0;
        if (hi == UINT32_MAX)
            snprintf(rep, sizeof rep, "{%u,}", more_lo);
        else
            snprintf(rep, sizeof rep, "{%u,%u}", more_lo, hi - 1);
        ok = strbuf_printf(&body, "\"[\" ws %s%s ( ws \",\" ws %s )%s%s ws \"]\"", lo ? "" : "( ", it.p, it.p, rep,
                           lo ? "" : " )?") || coom(c);
    }
    ok = ok && emit_rule(c, name, body.p) && put(c, e, name);
    free(it.p);
    free(body.p);
    return ok;
}

/* ---- objects ------------------------------------------------------------------------------------- */

typedef struct prop {
    const char *name;
    size_t len;
    strbuf value;             /* expression of its value */
    bool required;
} prop;

/* Extra keys: escape-free strings that differ from every declared name. Writes rules for the
 * trie of the names (node = a prefix) and appends the key expression to e. */
static bool extra_key(conv *c, const prop *props, size_t n, strbuf *e, const char *prefix, size_t plen)
{
    /* children of this prefix: the distinct next bytes of the names extending it */
    bool is_name = false, seen[256] = {false};
    char name[48];
    rule_name(c, "key", 3, name);
    strbuf body = {0}, cls = {0};
    bool ok = put(c, &cls, "[^\"\\\\\\x7F\\x00-\\x1F");
    for (size_t i = 0; i < n && ok; i++) {
        if (props[i].len < plen || memcmp(props[i].name, prefix, plen))
            continue;
        if (props[i].len == plen) {
            is_name = true;
            continue;
        }
        unsigned char b = (unsigned char)props[i].name[plen];
        if (seen[b])
            continue;
        seen[b] = true;
        if (b >= 0x80) { /* the trie works on bytes; classes on characters */
            ok = cfail(c, "property names with non-ASCII characters cannot be told apart from extra keys "
                       "(set additionalProperties to false)");
            break;
        }
        strbuf child = {0};
        ok = extra_key(c, props, n, &child, props[i].name, plen + 1) && (body.len ? put(c, &body, " | ") : true) &&
             literal(c, &body, (const char *)&b, 1) && put(c, &body, " ") && put(c, &body, child.p);
        if (ok && (b == ']' || b == '-' || b == '\\' || b == '"'))
            ok = strbuf_printf(&cls, "\\%c", b) || coom(c);
        else if (ok && b >= 0x20 && b != 0x7F) /* control characters are excluded already */
            ok = strbuf_put(&cls, (const char *)&b, 1) || coom(c);
        free(child.p);
    }
    ok = ok && put(c, &cls, "]") && prim(c, PRIM_KEYCHAR);
    if (ok && !is_name)
        ok = (body.len ? put(c, &body, " | ") : true) && put(c, &body, "\"\\\"\"");
    ok = ok && (body.len ? put(c, &body, " | ") : true) && put(c, &body, cls.p) && put(c, &body, " json-keychar* \"\\\"\"");
    ok = ok && emit_rule(c, name, body.p) && put(c, e, name);
    free(body.p);
    free(cls.p);
    return ok;
}

/* T_i / S_i chains (see gen_object): rule names t[i], s[i]; kv[i] the member expressions. */
static bool emit_chain(conv *c, prop *p, size_t n, char (*kv)[48], const char *extra)
{
    char (*t)[48] = malloc((n + 1) * sizeof *t), (*s)[48] = malloc((n + 1) * sizeof *s);
    bool ok = t && s;
    for (size_t i = 0; i <= n && ok; i++) {
        rule_name(c, "first", 5, t[i]);
        rule_name(c, "rest", 4, s[i]);
    }
    for (size_t i = n + 1; i-- > 0 && ok;) {
        strbuf tb = {0}, sb = {0};
        if (i == n) {
            ok = extra ? strbuf_printf(&tb, "( %s ( ws \",\" ws %s )* )?", extra, extra) &&
                             strbuf_printf(&sb, "( ws \",\" ws %s )*", extra)
                       : put(c, &tb, "\"\"") && put(c, &sb, "\"\"");
        } else {
            ok = strbuf_printf(&tb, "%s %s", kv[i], s[i + 1]) && strbuf_printf(&sb, "ws \",\" ws %s %s", kv[i], s[i + 1]);
            if (ok && !p[i].required)
                ok = strbuf_printf(&tb, " | %s", t[i + 1]) && strbuf_printf(&sb, " | %s", s[i + 1]);
        }
        ok = (ok || coom(c)) && emit_rule(c, t[i], tb.p) && emit_rule(c, s[i], sb.p);
        free(tb.p);
        free(sb.p);
    }
    if (ok)
        memcpy(kv[0], t[0], 48); /* the caller reads the chain's head from kv[0] */
    free(t);
    free(s);
    return ok || coom(c);
}

static bool collect_props(conv *c, const json_value *s, prop **out, size_t *n_out)
{
    const json_value *props = json_get(s, "properties"), *req = json_get(s, "required");
    if (props && props->type != JSON_OBJECT)
        return cfail(c, "'properties' must be an object");
    if (req && req->type != JSON_ARRAY)
        return cfail(c, "'required' must be an array of strings");
    size_t np = props ? props->n : 0, nr = req ? req->n : 0, n = 0;
    prop *p = calloc(np + nr + 1, sizeof *p);
    if (!p)
        return coom(c);
    *out = p;
    for (size_t i = 0; i < np; i++)
        p[n++] = (prop){props->members[i].key, props->members[i].key_len, {0}, false};
    for (size_t i = 0; i < nr; i++) {
        const json_value *r = &req->items[i];
        if (r->type != JSON_STRING)
            return cfail(c, "'required' must be an array of strings");
        size_t k = 0;
        while (k < n && !(p[k].len == r->len && !memcmp(p[k].name, r->s, r->len)))
            k++;
        if (k == n) /* required but not declared: any value */
            p[n++] = (prop){r->s, r->len, {0}, false};
        p[k].required = true;
    }
    *n_out = n;
    for (size_t i = 0; i < n; i++) {
        const json_value *ps = props ? json_get(props, p[i].name) : NULL;
        bool ok = ps ? gen_child(c, ps, &p[i].value, "properties", p[i].name)
                     : prim(c, PRIM_VALUE) && put(c, &p[i].value, "json-value");
        if (!ok)
            return false;
    }
    return true;
}

static bool gen_object(conv *c, const json_value *s, strbuf *e)
{
    const json_value *ap = json_get(s, "additionalProperties");
    if (!prim(c, PRIM_WS) || !prim(c, PRIM_STRING))
        return false;
    if (!json_get(s, "properties") && !json_get(s, "required") && !ap) /* {"type": "object"} */
        return prim(c, PRIM_VALUE) && put(c, e, "json-object");
    prop *p = NULL;
    size_t n = 0;
    strbuf extra = {0}, body = {0};
    char name[48];
    bool ok = collect_props(c, s, &p, &n);
    if (ok && ap && ap->type != JSON_FALSE) { /* extra members: key ws ":" ws value */
        strbuf val = {0}, key = {0};
        ok = ap->type == JSON_TRUE ? prim(c, PRIM_VALUE) && put(c, &val, "json-value")
                                   : gen_child(c, ap, &val, "additionalProperties", NULL);
        ok = ok && extra_key(c, p, n, &key, "", 0);
        rule_name(c, "extra", 5, name);
        ok = ok && (strbuf_printf(&extra, "\"\\\"\" %s ws \":\" ws %s", key.p, val.p) || coom(c)) &&
             emit_rule(c, name, extra.p);
        strbuf_clear(&extra);
        ok = ok && put(c, &extra, name);
        free(val.p);
        free(key.p);
    }
    char (*kv)[48] = ok ? malloc((n + 1) * sizeof *kv) : NULL;
    ok = ok && (kv || coom(c));
    for (size_t i = 0; i < n && ok; i++) { /* "name" ws ":" ws value, one rule each */
        strbuf m = {0}, k = {0};
        rule_name(c, p[i].name, p[i].len, kv[i]);
        ok = (json_write_str(&k, p[i].name, p[i].len) || coom(c)) && literal(c, &m, k.p, k.len) &&
             put(c, &m, " ws \":\" ws ") && put(c, &m, p[i].value.p) && emit_rule(c, kv[i], m.p);
        free(k.p);
        free(m.p);
    }
    bool all_req = true;
    for (size_t i = 0; i < n; i++)
        all_req &= p[i].required;
    if (ok && all_req && !extra.len) { /* the common strict case: one fixed sequence */
        ok = put(c, &body, "\"{\" ws");
        for (size_t i = 0; i < n && ok; i++)
            ok = put(c, &body, i ? " ws \",\" ws " : " ") && put(c, &body, kv[i]);
        ok = ok && put(c, &body, " ws \"}\"");
    } else if (ok) {
        ok = emit_chain(c, p, n, kv, extra.len ? extra.p : NULL) &&
             (strbuf_printf(&body, "\"{\" ws %s ws \"}\"", kv[0]) || coom(c));
    }
    rule_name(c, "object", 6, name);
    ok = ok && emit_rule(c, name, body.p) && put(c, e, name);
    for (size_t i = 0; i < n; i++)
        free(p[i].value.p);
    free(p);
    free(kv);
    free(extra.p);
    free(body.p);
    return ok;
}

/* ---- references, alternatives, types ------------------------------------------------------------ */

/* "#/$defs/a~1b" -> the schema it names in the root document. */
static const json_value *resolve(conv *c, const char *ref)
{
    if (ref[0] != '#')
        return cfail(c, "$ref \"%s\": only references inside this schema (\"#...\") are supported", ref), NULL;
    const json_value *v = c->root;
    const char *p = ref + 1;
    while (*p == '/' && v) {
        p++;
        char seg[256];
        size_t k = 0;
        for (; *p && *p != '/' && k + 1 < sizeof seg; p++) {
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1'))
                seg[k++] = *++p == '0' ? '~' : '/';
            else
                seg[k++] = *p;
        }
        seg[k] = 0;
        v = json_get(v, seg);
    }
    if (!v || *p)
        return cfail(c, "$ref \"%s\" does not name a schema in this document", ref), NULL;
    return v;
}

static bool gen_ref(conv *c, const json_value *r, strbuf *e)
{
    if (r->type != JSON_STRING)
        return cfail(c, "'$ref' must be a string");
    for (uint32_t i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ref, r->s))
            return put(c, e, c->refs[i].name);
    const json_value *target = resolve(c, r->s);
    if (!target)
        return false;
    if (c->n_refs == c->cap_refs) {
        uint32_t cap = c->cap_refs ? c->cap_refs * 2 : 8;
        ref_entry *nr = realloc(c->refs, cap * sizeof *nr);
        if (!nr)
            return coom(c);
        c->refs = nr;
        c->cap_refs = cap;
    }
    ref_entry *re = &c->refs[c->n_refs];
    if (!(re->ref = strdup(r->s)))
        return coom(c);
    const char *slash = strrchr(r->s, '/');
    rule_name(c, slash ? slash + 1 : "root", strlen(slash ? slash + 1 : "root"), re->name);
    char name[48];
    memcpy(name, re->name, sizeof name);
    c->n_refs++; /* named before its body: a recursive reference finds it */
    strbuf body = {0};
    bool ok = gen_child(c, target, &body, "$ref", NULL) && emit_rule(c, name, body.p) && put(c, e, name);
    free(body.p);
    return ok;
}

/* Alternatives: anyOf / oneOf / enum. */
static bool gen_alts(conv *c, const json_value *list, const char *kw, bool values, strbuf *e)
{
    if (list->type != JSON_ARRAY || !list->n)
        return cfail(c, "'%s' must be a non-empty array", kw);
    bool ok = put(c, e, "( ");
    for (size_t i = 0; i < list->n && ok; i++) {
        char idx[24];
        snprintf(idx, sizeof idx, "%zu", i);
        ok = (!i || put(c, e, " | ")) &&
             (values ? value_literal(c, e, &list->items[i]) : gen_child(c, &list->items[i], e, kw, idx));
    }
    return ok && put(c, e, " )");
}

static bool gen_type(conv *c, const json_value *s, const char *t, strbuf *e)
{
    if (!strcmp(t, "string"))
        return gen_string(c, s, e);
    if (!strcmp(t, "integer"))
        return gen_integer(c, s, e);
    if (!strcmp(t, "number"))
        return gen_number(c, s, e);
    if (!strcmp(t, "boolean"))
        return put(c, e, "( \"true\" | \"false\" )");
    if (!strcmp(t, "null"))
        return put(c, e, "\"null\"");
    if (!strcmp(t, "object"))
        return gen_object(c, s, e);
    if (!strcmp(t, "array"))
        return gen_array(c, s, e);
    return cfail(c, "unknown type \"%s\"", t);
}

/* The schema without anyOf/oneOf/enum/const/$ref: by its type(s). */
static bool gen_typed(conv *c, const json_value *s, strbuf *e)
{
    const json_value *t = json_get(s, "type");
    if (!t) { /* untyped: by the keywords present, else any value */
        const char *k = json_get(s, "properties") || json_get(s, "additionalProperties") || json_get(s, "required")
                            ? "object" : json_get(s, "items") || json_get(s, "minItems") || json_get(s, "maxItems")
                            ? "array" : json_get(s, "minLength") || json_get(s, "maxLength") || json_get(s, "pattern") ||
                                  json_get(s, "format") ? "string" : NULL;
        for (size_t i = 0; !k && i < sizeof numeric_kw / sizeof *numeric_kw; i++)
            if (json_get(s, numeric_kw[i])) /* any value, but a number must be in range: not expressible */
                return cfail(c, "keyword '%s' needs \"type\": \"number\" or \"integer\"", numeric_kw[i]);
        return k ? gen_type(c, s, k, e) : prim(c, PRIM_VALUE) && put(c, e, "json-value");
    }
    if (t->type == JSON_STRING)
        return gen_type(c, s, t->s, e);
    if (t->type != JSON_ARRAY || !t->n)
        return cfail(c, "'type' must be a string or a non-empty array of strings");
    bool ok = put(c, e, "( ");
    for (size_t i = 0; i < t->n && ok; i++) {
        if (t->items[i].type != JSON_STRING)
            return cfail(c, "'type' must be a string or a non-empty array of strings");
        ok = (!i || put(c, e, " | ")) && gen_type(c, s, t->items[i].s, e);
    }
    return ok && put(c, e, " )");
}

static bool gen(conv *c, const json_value *s, strbuf *e)
{
    if (s->type == JSON_TRUE)
        return prim(c, PRIM_VALUE) && put(c, e, "json-value");
    if (s->type == JSON_FALSE)
        return cfail(c, "the schema false admits no value");
    if (s->type != JSON_OBJECT)
        return cfail(c, "a schema must be an object or a boolean");
    if (++c->depth > MAX_DEPTH) {
        c->depth--;
        return cfail(c, "schemas nested deeper than %d levels", MAX_DEPTH);
    }
    const json_value *nul = json_get(s, "nullable"), *x;
    bool nullable = nul && nul->type == JSON_TRUE, ok = check_keywords(c, s);
    if (ok && nullable)
        ok = put(c, e, "( \"null\" | ");
    if (!ok)
        ;
    else if ((x = json_get(s, "$ref")))
        ok = gen_ref(c, x, e);
    else if ((x = json_get(s, "const")))
        ok = value_literal(c, e, x);
    else if ((x = json_get(s, "enum")))
        ok = gen_alts(c, x, "enum", true, e);
    else if ((x = json_get(s, "anyOf")) || (x = json_get(s, "oneOf")))
        ok = json_get(s, "type") && json_get(s, "anyOf") && json_get(s, "oneOf")
                 ? cfail(c, "anyOf together with oneOf is not supported")
                 : gen_alts(c, x, json_get(s, "anyOf") ? "anyOf" : "oneOf", false, e);
    else
        ok = gen_typed(c, s, e);
    if (ok && nullable)
        ok = put(c, e, " )");
    c->depth--;
    return ok;
}

vki_status gram_schema_rule(gram_schema_ctx *ctx, const json_value *schema, const char *rule, const char *path,
                            strbuf *out, char *err, size_t n_err)
{
    conv c = {.out = out, .root = schema, .err = err, .n_err = n_err, .prims = ctx->prims, .n_rules = ctx->n_rules};
    strbuf e = {0};
    size_t start = out->len;
    if (path && *path && !put(&c, &c.path, path))
        coom(&c);
    if (c.st == VKI_OK && gen(&c, schema, &e))
        emit_rule(&c, rule, e.p);
    for (uint32_t i = 0; i < c.n_refs; i++)
        free(c.refs[i].ref);
    free(c.refs);
    free(e.p);
    free(c.path.p);
    if (c.st != VKI_OK) {
        out->len = start;
        if (out->p)
            out->p[start] = 0;
        return c.st;
    }
    ctx->prims = c.prims;
    ctx->n_rules = c.n_rules;
    return VKI_OK;
}

vki_status gram_schema_to_gbnf(const char *schema, size_t len, strbuf *out, char *err, size_t n_err)
{
    json_doc *doc;
    char jerr[160];
    vki_status st = json_parse(schema, len, &doc, jerr, sizeof jerr);
    if (st != VKI_OK) {
        if (err && n_err)
            snprintf(err, n_err, "json_schema: not valid JSON: %s", jerr);
        return st;
    }
    gram_schema_ctx ctx = {0};
    st = gram_schema_rule(&ctx, json_root(doc), "root", NULL, out, err, n_err);
    json_free(doc);
    return st;
}
