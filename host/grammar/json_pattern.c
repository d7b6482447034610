/* JSON Schema "pattern" and "format" of a string -> GBNF over the string's JSON text (what stands
 * between its quotes). As for the rest of json_schema.c the language is a subset of what the
 * keyword accepts, never a superset:
 *
 *   pattern   an ECMA-262 regular expression, matched anywhere in the string unless anchored:
 *             literals, escapes (\d \w \s \D \W \S, \n \r \t \f \v \0 \b in classes, \xHH,
 *             \uHHHH, \cX, identity escapes), `.`, classes [..] / [^..] with ranges, groups
 *             ( ), (?: ), (?<name> ), alternation, quantifiers * + ? {n} {n,} {n,m} (lazy or
 *             not: the same language), `^` at the start and `$` at the end of a top-level
 *             alternative. Refused with a message: lookarounds, backreferences, word
 *             boundaries, anchors elsewhere, a class that matches nothing.
 *   format    date, time, date-time (RFC 3339: real calendar days, 29 February left out), uuid.
 *
 * A character c of the string is written as JSON writes it: \" and \\ for the quote and the
 * backslash, \b \t \n \f \r for those controls and \u00XX for the others (and for DEL),
 * everything else as itself (UTF-8). Other spellings JSON allows (\/, \u0041 for A) are left
 * out: a subset. Unanchored ends match json-char*, the JSON text of any characters. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/grammar/grammar.h"
#include "host/util/json.h"

#define CP_MAX 0x10FFFFu

typedef struct rx_range {
    uint32_t lo, hi;
} rx_range;

/* A set of code points: sorted, disjoint, non-adjacent ranges once normalised. */
typedef struct rx_set {
    rx_range *r;
    uint32_t n, cap;
} rx_set;

typedef struct rx {
    const char *s;
    size_t n, i;
    int depth;
    char *err;
    size_t n_err;
    bool failed, oom;
} rx;

static bool rfail(rx *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool rfail(rx *r, const char *fmt, ...)
{
    if (r->failed)
        return false;
    r->failed = true;
    if (r->err && r->n_err) {
        int k = snprintf(r->err, r->n_err, "at offset %zu: ", r->i);
        va_list ap;
        va_start(ap, fmt);
        if (k >= 0 && (size_t)k < r->n_err)
            vsnprintf(r->err + k, r->n_err - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return false;
}

static bool room(rx *r)
{
    r->failed = r->oom = true;
    return false;
}

static bool rput(rx *r, strbuf *b, const char *s) { return strbuf_put(b, s, strlen(s)) || room(r); }

/* ---- code point sets ------------------------------------------------------------------------ */

static bool set_add(rx *r, rx_set *s, uint32_t lo, uint32_t hi)
{
    if (s->n == s->cap) {
        uint32_t cap = s->cap ? 2 * s->cap : 8;
        rx_range *p = realloc(s->r, cap * sizeof *p);
        if (!p)
            return room(r);
        s->r = p, s->cap = cap;
    }
    s->r[s->n++] = (rx_range){lo, hi};
    return true;
}

static int range_cmp(const void *a, const void *b)
{
    const rx_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void set_norm(rx_set *s)
{
    if (!s->n)
        return;
    qsort(s->r, s->n, sizeof *s->r, range_cmp);
    uint32_t m = 0;
    for (uint32_t k = 0; k < s->n; k++) {
        if (m && s->r[k].lo <= s->r[m - 1].hi + 1) {
            if (s->r[k].hi > s->r[m - 1].hi)
                s->r[m - 1].hi = s->r[k].hi;
        } else {
            s->r[m++] = s->r[k];
        }
    }
    s->n = m;
}

/* s = [0, CP_MAX] minus s (s normalised). */
static bool set_complement(rx *r, rx_set *s)
{
    rx_set c = {0};
    uint32_t next = 0;
    bool ok = true;
    for (uint32_t k = 0; k < s->n && ok; k++) {
        if (s->r[k].lo > next)
            ok = set_add(r, &c, next, s->r[k].lo - 1);
        next = s->r[k].hi + 1;
    }
    if (ok && next <= CP_MAX)
        ok = set_add(r, &c, next, CP_MAX);
    free(s->r);
    *s = c;
    return ok;
}

static bool set_has(const rx_set *s, uint32_t cp)
{
    for (uint32_t k = 0; k < s->n; k++)
        if (cp >= s->r[k].lo && cp <= s->r[k].hi)
            return true;
    return false;
}

/* \d \w \s and their complements (upper case) into s. */
static bool set_class_escape(rx *r, rx_set *s, char e)
{
    rx_set t = {0};
    bool ok = true;
    switch (e | 0x20) {
    case 'd':
        ok = set_add(r, &t, '0', '9');
        break;
    case 'w':
        ok = set_add(r, &t, '0', '9') && set_add(r, &t, 'A', 'Z') && set_add(r, &t, 'a', 'z') && set_add(r, &t, '_', '_');
        break;
    case 's': { /* ECMA-262 WhiteSpace and LineTerminator */
        static const uint32_t ws[][2] = {{0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                                         {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
                                         {0xFEFF, 0xFEFF}};
        for (size_t k = 0; k < sizeof ws / sizeof *ws && ok; k++)
            ok = set_add(r, &t, ws[k][0], ws[k][1]);
        break;
    }
    }
    set_norm(&t);
    if (ok && e >= 'A' && e <= 'Z')
        ok = set_complement(r, &t);
    for (uint32_t k = 0; k < t.n && ok; k++)
        ok = set_add(r, s, t.r[k].lo, t.r[k].hi);
    free(t.r);
    return ok;
}

/* ---- emitting characters as JSON text ------------------------------------------------------- */

/* Code points written as themselves inside a JSON string (ours: no quote, backslash, control
 * character, DEL nor surrogate). */
static bool plain_cp(uint32_t cp)
{
    return cp >= 0x20 && cp != '"' && cp != '\\' && cp != 0x7F && (cp < 0xD800 || cp > 0xDFFF);
}

/* One code point inside a GBNF literal or class: printable ASCII as itself (escaped where GBNF
 * needs it), the rest as \xHH / \uHHHH / \UHHHHHHHH. */
static bool put_gbnf_cp(rx *r, strbuf *b, uint32_t cp, bool in_class)
{
    bool ok;
    if (cp >= 0x20 && cp < 0x7F && !strchr(in_class ? "\\]-^\"[" : "\\\"", (int)cp)) {
        char c = (char)cp;
        ok = strbuf_put(b, &c, 1);
    } else if (cp < 0x80) {
        ok = strbuf_printf(b, "\\x%02X", cp);
    } else if (cp <= 0xFFFF) {
        ok = strbuf_printf(b, "\\u%04X", cp);
    } else {
        ok = strbuf_printf(b, "\\U%08X", cp);
    }
    return ok || room(r);
}

/* The JSON text of one character that is not plain: a GBNF literal of its escape. */
static bool put_escaped_cp(rx *r, strbuf *b, uint32_t cp)
{
    static const char short_esc[] = {['"'] = '"', ['\\'] = '\\', [8] = 'b', [9] = 't', [10] = 'n', [12] = 'f', [13] = 'r'};
    if (cp < sizeof short_esc && short_esc[cp])
        return strbuf_printf(b, "\"\\\\%s%c\"", short_esc[cp] == '"' || short_esc[cp] == '\\' ? "\\" : "",
                             short_esc[cp]) || room(r);
    return strbuf_printf(b, "\"\\\\u%04x\"", cp) || room(r);
}

/* A literal character of the string. */
static bool put_char(rx *r, strbuf *b, uint32_t cp)
{
    if (!plain_cp(cp))
        return (cp < 0xD800 || cp > 0xDFFF) ? put_escaped_cp(r, b, cp) : rfail(r, "a lone surrogate");
    return rput(r, b, "\"") && put_gbnf_cp(r, b, cp, false) && rput(r, b, "\"");
}

/* Any one character of the set s (normalised): a class of its plain members, and the escapes of
 * the others. */
static bool put_set(rx *r, strbuf *b, const rx_set *s)
{
    strbuf cls = {0};
    bool ok = true, any_plain = false;
    uint32_t alts = 0;
    for (uint32_t k = 0; k < s->n && ok; k++) { /* the plain part: ranges cut around the non-plain */
        uint32_t lo = s->r[k].lo, hi = s->r[k].hi;
        while (lo <= hi && ok) {
            while (lo <= hi && !plain_cp(lo))
                lo = lo >= 0xD800 && lo <= 0xDFFF ? 0xE000 : lo + 1;
            if (lo > hi)
                break;
            uint32_t end = lo;
            while (end < hi && plain_cp(end + 1))
                end++;
            ok = put_gbnf_cp(r, &cls, lo, true) && (end == lo || (rput(r, &cls, "-") && put_gbnf_cp(r, &cls, end, true)));
            any_plain = true;
            lo = end + 1;
        }
    }
    ok = ok && rput(r, b, "( ");
    if (ok && any_plain) {
        ok = rput(r, b, "[") && rput(r, b, cls.p) && rput(r, b, "]");
        alts++;
    }
    for (uint32_t cp = 0; cp <= 0x7F && ok; cp = cp == 0x1F ? '"' : cp == '"' ? '\\' : cp == '\\' ? 0x7F : cp + 1)
        if (set_has(s, cp)) {
            ok = (!alts || rput(r, b, " | ")) && put_escaped_cp(r, b, cp);
            alts++;
        }
    free(cls.p);
    if (ok && !alts)
        return rfail(r, "a character class that matches nothing");
    return ok && rput(r, b, " )");
}

/* ---- the regular expression ----------------------------------------------------------------- */

static bool at_end(const rx *r) { return r->i >= r->n; }
static char cur(const rx *r) { return at_end(r) ? 0 : r->s[r->i]; }

static bool utf8_cp(rx *r, uint32_t *cp)
{
    const unsigned char *p = (const unsigned char *)r->s + r->i;
    size_t left = r->n - r->i;
    uint32_t c = p[0], len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!len || len > left)
        return rfail(r, "invalid UTF-8");
    c = len == 1 ? c : c & (0x7F >> len);
    for (uint32_t k = 1; k < len; k++) {
        if ((p[k] & 0xC0) != 0x80)
            return rfail(r, "invalid UTF-8");
        c = c << 6 | (p[k] & 0x3F);
    }
    if (c > CP_MAX || (c >= 0xD800 && c <= 0xDFFF))
        return rfail(r, "invalid UTF-8");
    r->i += len;
    *cp = c;
    return true;
}

static bool hex_digits(rx *r, int n, uint32_t *v)
{
    *v = 0;
    for (int k = 0; k < n; k++, r->i++) {
        int h = json_hexval(cur(r));
        if (h < 0)
            return rfail(r, "an escape needs %d hex digits", n);
        *v = *v << 4 | (uint32_t)h;
    }
    return true;
}

/* After a backslash: a single character (*cp) or, for \d \w \s \D \W \S, a set (*is_set, into
 * set). in_class: \b is backspace there (a word boundary elsewhere, refused). */
static bool parse_escape(rx *r, bool in_class, uint32_t *cp, rx_set *set, bool *is_set)
{
    *is_set = false;
    if (at_end(r))
        return rfail(r, "a pattern ending in a backslash");
    char e = cur(r);
    r->i++;
    if (e && strchr("dwsDWS", e)) {
        *is_set = true;
        return set_class_escape(r, set, e);
    }
    switch (e) {
    case 'n': *cp = '\n'; return true;
    case 'r': *cp = '\r'; return true;
    case 't': *cp = '\t'; return true;
    case 'f': *cp = '\f'; return true;
    case 'v': *cp = '\v'; return true;
    case '0':
        if (json_hexval(cur(r)) >= 0 && cur(r) <= '9')
            return rfail(r, "octal escapes are not supported");
        *cp = 0;
        return true;
    case 'x': return hex_digits(r, 2, cp);
    case 'u':
        if (cur(r) == '{')
            return rfail(r, "\\u{...} is not supported (write \\uHHHH)");
        if (!hex_digits(r, 4, cp))
            return false;
        if (*cp >= 0xD800 && *cp <= 0xDBFF && r->i + 6 <= r->n && r->s[r->i] == '\\' && r->s[r->i + 1] == 'u') {
            uint32_t lo = 0; /* a surrogate pair */
            for (int k = 2; k < 6 && json_hexval(r->s[r->i + k]) >= 0; k++)
                lo = lo << 4 | (uint32_t)json_hexval(r->s[r->i + k]);
            if (lo >= 0xDC00 && lo <= 0xDFFF && json_hexval(r->s[r->i + 5]) >= 0) {
                *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
                r->i += 6;
            }
        }
        return true;
    case 'c':
        if (!((cur(r) | 0x20) >= 'a' && (cur(r) | 0x20) <= 'z'))
            return rfail(r, "\\c needs a letter");
        *cp = (uint32_t)(cur(r) & 0x1F);
        r->i++;
        return true;
    case 'b':
        if (in_class) {
            *cp = 8;
            return true;
        }
        return rfail(r, "word boundaries (\\b) are not supported");
    case 'B': return rfail(r, "word boundaries (\\B) are not supported");
    case 'k': return rfail(r, "backreferences are not supported");
    case 'p':
    case 'P': return rfail(r, "Unicode property escapes are not supported");
    default:
        if (e >= '1' && e <= '9')
            return rfail(r, "backreferences are not supported");
        r->i--; /* an identity escape: the character itself */
        return utf8_cp(r, cp);
    }
}

/* [...] after the '[' into set. */
static bool parse_class(rx *r, rx_set *set)
{
    bool negate = cur(r) == '^';
    r->i += negate;
    bool ok = true;
    while (ok && !at_end(r) && cur(r) != ']') {
        uint32_t lo, hi;
        bool is_set;
        if (cur(r) == '\\') {
            r->i++;
            ok = parse_escape(r, true, &lo, set, &is_set);
            if (!ok || is_set)
                continue;
        } else if (!utf8_cp(r, &lo)) {
            return false;
        }
        hi = lo;
        if (cur(r) == '-' && r->i + 1 < r->n && r->s[r->i + 1] != ']') {
            r->i++;
            if (cur(r) == '\\') {
                r->i++;
                if (!parse_escape(r, true, &hi, set, &is_set))
                    return false;
                if (is_set)
                    return rfail(r, "a range ending in a class escape");
            } else if (!utf8_cp(r, &hi)) {
                return false;
            }
            if (hi < lo)
                return rfail(r, "a range out of order in a class");
        }
        ok = set_add(r, set, lo, hi);
    }
    if (!ok)
        return false;
    if (at_end(r))
        return rfail(r, "an unterminated character class");
    r->i++;
    set_norm(set);
    return !negate || set_complement(r, set);
}

static bool parse_alt(rx *r, strbuf *out, bool top, bool *nullable);

/* An optional quantifier after an atom; *q = its GBNF suffix ("" if none). */
static bool parse_quant(rx *r, char q[32])
{
    q[0] = 0;
    char c = cur(r);
    if (c == '*' || c == '+' || c == '?') {
        q[0] = c, q[1] = 0;
        r->i++;
    } else if (c == '{') {
        size_t at = r->i++;
        unsigned long lo = 0, hi = 0;
        bool digits = false, comma = false, hi_digits = false;
        while (cur(r) >= '0' && cur(r) <= '9' && lo <= GRAM_MAX_REPEAT)
            lo = lo * 10 + (unsigned long)(cur(r) - '0'), r->i++, digits = true;
        if (cur(r) == ',') {
            comma = true;
            r->i++;
            while (cur(r) >= '0' && cur(r) <= '9' && hi <= GRAM_MAX_REPEAT)
                hi = hi * 10 + (unsigned long)(cur(r) - '0'), r->i++, hi_digits = true;
        }
        if (!digits || cur(r) != '}') { /* not a quantifier: a literal '{' (ECMA-262 Annex B) */
            r->i = at;
            return true;
        }
        r->i++;
        if (lo > GRAM_MAX_REPEAT || hi > GRAM_MAX_REPEAT)
            return rfail(r, "a repetition bound above %u", GRAM_MAX_REPEAT);
        if (hi_digits && hi < lo)
            return rfail(r, "a repetition {%lu,%lu} out of order", lo, hi);
        if (!comma)
            snprintf(q, 32, "{%lu}", lo);
        else if (!hi_digits)
            snprintf(q, 32, "{%lu,}", lo);
        else
            snprintf(q, 32, "{%lu,%lu}", lo, hi);
    } else {
        return true;
    }
    if (cur(r) == '?') /* lazy: the same language */
        r->i++;
    if ((cur(r) && strchr("*+?", cur(r))) || (cur(r) == '{' && r->i + 1 < r->n && r->s[r->i + 1] >= '0' && r->s[r->i + 1] <= '9'))
        return rfail(r, "a quantifier after a quantifier");
    return true;
}

/* One atom into out (a parenthesised GBNF element); *nullable: it can match the empty string
 * (a group). False at an error. */
static bool parse_atom(rx *r, strbuf *out, bool *nullable)
{
    char c = cur(r);
    rx_set set = {0};
    bool ok;
    uint32_t cp;
    *nullable = false;
    if (c == '(') {
        r->i++;
        if (cur(r) == '?') {
            char k = r->i + 1 < r->n ? r->s[r->i + 1] : 0, k2 = r->i + 2 < r->n ? r->s[r->i + 2] : 0;
            if (k == ':') {
                r->i += 2;
            } else if (k == '<' && k2 != '=' && k2 != '!') { /* a named group */
                const char *gt = memchr(r->s + r->i, '>', r->n - r->i);
                if (!gt)
                    return rfail(r, "an unterminated group name");
                r->i = (size_t)(gt - r->s) + 1;
            } else {
                return rfail(r, "(?%c groups are not supported (lookarounds, flags): only (?: ) and (?<name> )",
                             k ? k : ' ');
            }
        }
        if (++r->depth > 64)
            return rfail(r, "groups nested deeper than 64");
        ok = parse_alt(r, out, false, nullable);
        r->depth--;
        if (ok && cur(r) != ')')
            return rfail(r, "an unclosed group");
        r->i++;
        return ok;
    }
    if (c == '[') {
        r->i++;
        ok = parse_class(r, &set) && put_set(r, out, &set);
    } else if (c == '.') { /* any character but a line terminator */
        r->i++;
        ok = set_add(r, &set, '\n', '\n') && set_add(r, &set, '\r', '\r') && set_add(r, &set, 0x2028, 0x2029);
        set_norm(&set);
        ok = ok && set_complement(r, &set) && put_set(r, out, &set);
    } else if (c == '\\') {
        bool is_set;
        r->i++;
        ok = parse_escape(r, false, &cp, &set, &is_set);
        if (ok && is_set) {
            set_norm(&set);
            ok = put_set(r, out, &set);
        } else if (ok) {
            ok = rput(r, out, "( ") && put_char(r, out, cp) && rput(r, out, " )");
        }
    } else if (c == '*' || c == '+' || c == '?') {
        return rfail(r, "nothing to repeat");
    } else if (c == ')') {
        return rfail(r, "an unmatched ')'");
    } else if (c == '^' || c == '$') {
        return rfail(r, "'%c' is supported only at the start ('^') or end ('$') of the pattern or of a top-level "
                        "alternative", c);
    } else {
        ok = utf8_cp(r, &cp) && rput(r, out, "( ") && put_char(r, out, cp) && rput(r, out, " )");
    }
    free(set.r);
    return ok;
}

/* seq ('|' seq)* up to ')' or the end, as "( a | b )"; top: the pattern itself, whose
 * alternatives may be anchored (else json-char* stands at the open end). *nullable: it can match
 * the empty string. An unbounded repetition of something that can (a?)* is refused: GBNF has no
 * such loop, and taking the empty match out of a group is not done here. */
static bool parse_alt(rx *r, strbuf *out, bool top, bool *nullable)
{
    bool ok = rput(r, out, "( ");
    *nullable = false;
    for (bool first = true; ok; first = false) {
        if (!first)
            ok = rput(r, out, " | ");
        bool start = top && cur(r) == '^', end = false;
        r->i += start;
        if (top && !start)
            ok = ok && rput(r, out, "json-char* ");
        ok = ok && rput(r, out, "\"\"");
        bool seq_nullable = true;
        while (ok && !at_end(r) && cur(r) != '|' && cur(r) != ')') {
            if (top && cur(r) == '$' && (r->i + 1 == r->n || r->s[r->i + 1] == '|')) {
                r->i++;
                end = true;
                break;
            }
            char q[32];
            bool atom_nullable;
            size_t at = r->i;
            ok = rput(r, out, " ") && parse_atom(r, out, &atom_nullable) && parse_quant(r, q) && rput(r, out, q);
            bool unbounded = q[0] == '*' || q[0] == '+' || (q[0] == '{' && q[strlen(q) - 2] == ',');
            if (ok && atom_nullable && unbounded) {
                r->i = at;
                return rfail(r, "an unbounded repetition of a group that can match the empty string (as (a?)* or "
                                "(a|)+) is not supported: write it without the empty match");
            }
            seq_nullable &= ok && (atom_nullable || q[0] == '*' || q[0] == '?' || !strncmp(q, "{0", 2));
        }
        *nullable |= seq_nullable;
        if (top && !end)
            ok = ok && rput(r, out, " json-char*");
        if (!ok || cur(r) != '|')
            break;
        r->i++;
    }
    if (ok && top && !at_end(r))
        return rfail(r, "an unmatched ')'");
    return ok && rput(r, out, " )");
}

vki_status gram_pattern_gbnf(const char *re, size_t len, strbuf *out, char *err, size_t n_err)
{
    rx r = {.s = re, .n = len, .err = err, .n_err = n_err};
    strbuf e = {0};
    bool nullable, ok = parse_alt(&r, &e, true, &nullable) && rput(&r, out, e.p);
    free(e.p);
    return ok ? VKI_OK : r.oom ? VKI_ERR_OUT_OF_HOST_MEMORY : VKI_ERR_INVALID_ARG;
}

/* ---- formats ---------------------------------------------------------------------------------- */

/* RFC 3339 full-date with real days (no 29 February: a subset), partial-time with time-offset. */
#define FMT_DATE                                                                                            \
    "[0-9]{4} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) | "      \
    "( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | \"02-\" ( \"0\" [1-9] | \"1\" "   \
    "[0-9] | \"2\" [0-8] ) )"
#define FMT_TIME                                                                                            \
    "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,9} )? ( \"Z\" | "    \
    "[+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )"

vki_status gram_format_gbnf(const char *format, strbuf *out)
{
    static const struct {
        const char *name, *gbnf;
    } formats[] = {
        {"date", "( " FMT_DATE " )"},
        {"time", "( " FMT_TIME " )"},
        {"date-time", "( ( " FMT_DATE " ) \"T\" ( " FMT_TIME " ) )"},
        {"uuid", "( [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
                 "[0-9a-fA-F]{12} )"},
    };
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++)
        if (!strcmp(format, formats[i].name))
            return strbuf_put(out, formats[i].gbnf, strlen(formats[i].gbnf)) ? VKI_OK : VKI_ERR_OUT_OF_HOST_MEMORY;
    return VKI_ERR_UNSUPPORTED;
}
