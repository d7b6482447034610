/* GBNF text -> gram_grammar (see grammar.h for the syntax).
 *
 * The parser builds each rule's alternatives as element runs; groups and repetitions become
 * synthesized rules named after their rule ("value-3"), the way llama.cpp lowers them:
 *   x*      -> S ::= x S | ""            (right recursion: the matcher's tail calls keep the
 *   x+      -> x S                        stack flat)
 *   x?      -> O ::= x | ""
 *   x{m,n}  -> x ... x (m times) O_{n-m},  O_k ::= x O_{k-1} | ""
 *   x{m,}   -> x ... x (m times) S
 * After parsing: every referenced rule must be defined, `root` must exist, and no rule may reach
 * itself before consuming a character (left recursion would loop the matcher forever). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/grammar/gram_impl.h"
#include "host/util/json.h"

typedef struct evec {
    gram_elem *v;
    uint32_t n, cap;
} evec;

typedef struct trule {
    char *name;
    bool defined;
    size_t ref_at;            /* source offset of the first reference (undefined-rule errors) */
    evec *alts;
    uint32_t n_alts, cap_alts;
    uint32_t n_synth;         /* rules synthesized from this one, for their names */
} trule;

typedef struct gp {
    const char *s;
    size_t n, i;
    trule *rules;
    uint32_t n_rules, cap_rules;
    uint32_t *hash;           /* [hash_cap] named rule ids + 1, open addressing */
    uint32_t hash_cap;
    gram_range *ranges;
    uint32_t n_ranges, cap_ranges;
    uint32_t *cls;            /* class c's first range; cls[n_classes] is n_ranges when done */
    uint32_t n_classes, cap_classes;
    uint64_t n_elems;         /* lowered elements so far (GRAM_MAX_ELEMS) */
    char *err;
    size_t n_err;
    vki_status st;
} gp;

/* ---- errors and buffers ------------------------------------------------------------------- */

static bool fail_at(gp *p, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail_at(gp *p, size_t at, const char *fmt, ...)
{
    if (p->st != VKI_OK)
        return false;
    p->st = VKI_ERR_INVALID_ARG;
    if (!p->err || !p->n_err)
        return false;
    size_t line = 1, col = 1;
    for (size_t k = 0; k < at && k < p->n; k++) {
        if (p->s[k] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    int k = snprintf(p->err, p->n_err, "grammar: line %zu, column %zu: ", line, col);
    va_list ap;
    va_start(ap, fmt);
    if (k >= 0 && (size_t)k < p->n_err)
        vsnprintf(p->err + k, p->n_err - (size_t)k, fmt, ap);
    va_end(ap);
    return false;
}

#define FAIL(p, ...) fail_at((p), (p)->i, __VA_ARGS__)

static bool oom(gp *p)
{
    if (p->st == VKI_OK)
        p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
    return false;
}

/* Grows *v (of *cap elements of size elem) to hold need elements. */
static bool grow(gp *p, void **v, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    uint32_t c = *cap ? *cap : 8;
    while (c < need)
        c = c > UINT32_MAX / 2 ? need : c * 2;
    void *nv = realloc(*v, (size_t)c * elem);
    if (!nv)
        return oom(p);
    *v = nv;
    *cap = c;
    return true;
}

static bool push(gp *p, evec *e, uint32_t kind, uint32_t arg)
{
    if (++p->n_elems > GRAM_MAX_ELEMS)
        return FAIL(p, "the grammar expands to more than %u elements (repetition bounds too large?)",
                    GRAM_MAX_ELEMS);
    if (!grow(p, (void **)&e->v, &e->cap, e->n + 1, sizeof *e->v))
        return false;
    e->v[e->n++] = (gram_elem){kind, arg};
    return true;
}

/* ---- rules ---------------------------------------------------------------------------------- */

static uint32_t name_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static bool new_rule(gp *p, const char *name, size_t len, uint32_t *id)
{
    if (!grow(p, (void **)&p->rules, &p->cap_rules, p->n_rules + 1, sizeof *p->rules))
        return false;
    char *nm = malloc(len + 1);
    if (!nm)
        return oom(p);
    memcpy(nm, name, len);
    nm[len] = 0;
    p->rules[p->n_rules] = (trule){.name = nm, .ref_at = SIZE_MAX};
    *id = p->n_rules++;
    return true;
}

/* The rule with this name, created at its first mention. */
static bool symbol(gp *p, const char *name, size_t len, uint32_t *id)
{
    if (p->n_rules * 2 + 2 > p->hash_cap) { /* rehash the named rules */
        uint32_t cap = p->hash_cap ? p->hash_cap * 2 : 64;
        uint32_t *h = calloc(cap, sizeof *h);
        if (!h)
            return oom(p);
        for (uint32_t k = 0; k < p->hash_cap; k++)
            if (p->hash[k]) {
                const char *nm = p->rules[p->hash[k] - 1].name;
                uint32_t j = name_hash(nm, strlen(nm)) & (cap - 1);
                while (h[j])
                    j = (j + 1) & (cap - 1);
                h[j] = p->hash[k];
            }
        free(p->hash);
        p->hash = h;
        p->hash_cap = cap;
    }
    uint32_t j = name_hash(name, len) & (p->hash_cap - 1);
    for (; p->hash[j]; j = (j + 1) & (p->hash_cap - 1)) {
        const char *nm = p->rules[p->hash[j] - 1].name;
        if (strlen(nm) == len && !memcmp(nm, name, len)) {
            *id = p->hash[j] - 1;
            return true;
        }
    }
    if (!new_rule(p, name, len, id))
        return false;
    p->hash[j] = *id + 1;
    return true;
}

/* A rule synthesized from `parent` (a group or a repetition), named "parent-k". */
static bool synth_rule(gp *p, uint32_t parent, uint32_t *id)
{
    char nm[160];
    int k = snprintf(nm, sizeof nm, "%.120s-%u", p->rules[parent].name, ++p->rules[parent].n_synth);
    return new_rule(p, nm, (size_t)k, id);
}

/* Moves e into rule r as a new alternative (e is emptied). */
static bool add_alt(gp *p, uint32_t r, evec *e)
{
    trule *t = &p->rules[r];
    if (!grow(p, (void **)&t->alts, &t->cap_alts, t->n_alts + 1, sizeof *t->alts))
        return false;
    t->alts[t->n_alts++] = *e;
    *e = (evec){0};
    return true;
}

/* ---- lexing --------------------------------------------------------------------------------- */

static bool at_end(const gp *p) { return p->i >= p->n; }
static char cur(const gp *p) { return p->i < p->n ? p->s[p->i] : 0; }

static bool is_word(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Spaces, tabs, carriage returns and comments; newlines too when `lines`. */
static void skip_space(gp *p, bool lines)
{
    while (!at_end(p)) {
        char c = cur(p);
        if (c == ' ' || c == '\t' || c == '\r' || (lines && c == '\n')) {
            p->i++;
        } else if (c == '#') {
            while (!at_end(p) && cur(p) != '\n')
                p->i++;
        } else {
            break;
        }
    }
}

/* One UTF-8 character of the source into *cp. */
static bool decode_utf8(gp *p, uint32_t *cp)
{
    uint8_t b = (uint8_t)p->s[p->i];
    uint32_t len = b < 0x80 ? 1 : b >= 0xC2 && b < 0xE0 ? 2 : b >= 0xE0 && b < 0xF0 ? 3 : b >= 0xF0 && b < 0xF5 ? 4 : 0;
    if (!len || p->n - p->i < len)
        return FAIL(p, "invalid UTF-8 in the grammar text");
    uint32_t c = len == 1 ? b : b & (0x7F >> len);
    for (uint32_t k = 1; k < len; k++) {
        uint8_t x = (uint8_t)p->s[p->i + k];
        if ((x & 0xC0) != 0x80)
            return FAIL(p, "invalid UTF-8 in the grammar text");
        c = c << 6 | (x & 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min_cp[len] || c > GRAM_MAX_CP || (c >= 0xD800 && c < 0xE000))
        return FAIL(p, "invalid UTF-8 in the grammar text");
    p->i += len;
    *cp = c;
    return true;
}

/* One character of a literal or class: an escape or a UTF-8 character. */
static bool parse_char(gp *p, uint32_t *cp)
{
    if (at_end(p))
        return FAIL(p, "unexpected end of the grammar");
    if (cur(p) != '\\')
        return decode_utf8(p, cp);
    size_t at = p->i++;
    if (at_end(p))
        return FAIL(p, "unexpected end of the grammar after '\\'");
    char e = cur(p);
    p->i++;
    int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (!digits) {
        const char *from = "nrt\\\"[]-", *to = "\n\r\t\\\"[]-";
        const char *k = e ? strchr(from, e) : NULL;
        if (!k)
            return fail_at(p, at, "unknown escape '\\%c'", e ? e : ' ');
        *cp = (uint8_t)to[k - from];
        return true;
    }
    uint32_t v = 0;
    for (int k = 0; k < digits; k++, p->i++) {
        int h = json_hexval(cur(p));
        if (h < 0)
            return fail_at(p, at, "escape '\\%c' needs %d hex digits", e, digits);
        v = v << 4 | (uint32_t)h;
    }
    if (v > GRAM_MAX_CP)
        return fail_at(p, at, "escape beyond U+10FFFF");
    *cp = v;
    return true;
}

/* ---- character classes ------------------------------------------------------------------------ */

static int range_cmp(const void *a, const void *b)
{
    const gram_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Closes the class whose ranges start at `first`: sorts and merges them, complements when
 * negated, and records it. *id = its class id. */
static bool close_class(gp *p, uint32_t first, bool negate, uint32_t *id)
{
    gram_range *r = p->ranges ? p->ranges + first : NULL; /* NULL: an empty class before any other */
    uint32_t n = p->n_ranges - first, m = 0;
    if (n)
        qsort(r, n, sizeof *r, range_cmp);
    for (uint32_t k = 0; k < n; k++) {
        if (m && r[k].lo <= r[m - 1].hi + 1) {
            if (r[k].hi > r[m - 1].hi)
                r[m - 1].hi = r[k].hi;
        } else {
            r[m++] = r[k];
        }
    }
    if (negate) { /* the gaps of [0, max] between the merged ranges: at most m + 1 */
        gram_range *tmp = malloc((m ? m : 1) * sizeof *tmp);
        if (!tmp)
            return oom(p);
        if (m)
            memcpy(tmp, r, m * sizeof *r);
        uint32_t lo = 0, k = 0;
        p->n_ranges = first;
        if (!grow(p, (void **)&p->ranges, &p->cap_ranges, first + m + 1, sizeof *p->ranges)) {
            free(tmp);
            return false;
        }
        r = p->ranges + first;
        for (uint32_t j = 0; j < m; j++) {
            if (tmp[j].lo > lo)
                r[k++] = (gram_range){lo, tmp[j].lo - 1};
            lo = tmp[j].hi + 1;
        }
        if (lo <= GRAM_MAX_CP && !(m && tmp[m - 1].hi == GRAM_MAX_CP))
            r[k++] = (gram_range){lo, GRAM_MAX_CP};
        m = k;
        free(tmp);
    }
    p->n_ranges = first + m;
    if (!grow(p, (void **)&p->cls, &p->cap_classes, p->n_classes + 2, sizeof *p->cls))
        return false;
    p->cls[p->n_classes] = first;
    *id = p->n_classes++;
    return true;
}

static bool add_range(gp *p, uint32_t lo, uint32_t hi)
{
    if (!grow(p, (void **)&p->ranges, &p->cap_ranges, p->n_ranges + 1, sizeof *p->ranges))
        return false;
    p->ranges[p->n_ranges++] = (gram_range){lo, hi};
    return true;
}

static bool char_elem(gp *p, evec *out, uint32_t lo, uint32_t hi)
{
    uint32_t first = p->n_ranges, id;
    return add_range(p, lo, hi) && close_class(p, first, false, &id) && push(p, out, GE_CHAR, id);
}

/* "[...]" at p->i. */
static bool parse_class(gp *p, evec *out)
{
    size_t open = p->i++;
    bool negate = cur(p) == '^';
    p->i += negate;
    uint32_t first = p->n_ranges, id;
    while (!at_end(p) && cur(p) != ']') {
        uint32_t lo, hi;
        if (!parse_char(p, &lo))
            return false;
        hi = lo;
        if (cur(p) == '-' && p->i + 1 < p->n && p->s[p->i + 1] != ']') {
            p->i++;
            size_t at = p->i;
            if (!parse_char(p, &hi))
                return false;
            if (hi < lo)
                return fail_at(p, at, "character range ends below its start (U+%04X-U+%04X)", lo, hi);
        }
        if (!add_range(p, lo, hi))
            return false;
    }
    if (at_end(p))
        return fail_at(p, open, "unterminated character class");
    p->i++;
    return close_class(p, first, negate, &id) && push(p, out, GE_CHAR, id);
}

/* ---- sequences and alternatives ----------------------------------------------------------------- */

static bool parse_alternates(gp *p, uint32_t rule, bool nested);

static bool parse_count(gp *p, uint32_t *v)
{
    size_t at = p->i;
    uint64_t x = 0;
    if (cur(p) < '0' || cur(p) > '9')
        return FAIL(p, "expected a number in a repetition bound");
    while (cur(p) >= '0' && cur(p) <= '9') {
        x = x * 10 + (uint64_t)(cur(p) - '0');
        p->i++;
        if (x > GRAM_MAX_REPEAT)
            return fail_at(p, at, "repetition bound above %u", GRAM_MAX_REPEAT);
    }
    *v = (uint32_t)x;
    return true;
}

/* The postfix operator at p->i: *min / *max (UINT32_MAX: unbounded). */
static bool parse_postfix(gp *p, uint32_t *min, uint32_t *max)
{
    char c = cur(p);
    p->i++;
    if (c != '{') {
        *min = c == '+';
        *max = c == '?' ? 1 : UINT32_MAX;
        return true;
    }
    skip_space(p, false);
    if (!parse_count(p, min))
        return false;
    skip_space(p, false);
    *max = *min;
    if (cur(p) == ',') {
        p->i++;
        skip_space(p, false);
        *max = UINT32_MAX;
        if (cur(p) != '}') {
            size_t at = p->i;
            if (!parse_count(p, max))
                return false;
            if (*max < *min)
                return fail_at(p, at, "repetition {%u,%u}: the maximum is below the minimum", *min, *max);
            skip_space(p, false);
        }
    }
    if (cur(p) != '}')
        return FAIL(p, "expected '}' to close a repetition");
    p->i++;
    return true;
}

/* Adds the alternatives "a tail" (tail omitted when UINT32_MAX) and "" to rule r. */
static bool add_opt(gp *p, uint32_t r, gram_elem a, uint32_t tail)
{
    evec alt = {0}, none = {0};
    bool ok = push(p, &alt, a.kind, a.arg) && (tail == UINT32_MAX || push(p, &alt, GE_RULE, tail)) &&
              add_alt(p, r, &alt) && add_alt(p, r, &none);
    free(alt.v);
    return ok;
}

/* Replaces the atom out[start..] by its repetition {min, max}. */
static bool repeat(gp *p, uint32_t rule, evec *out, uint32_t start, uint32_t min, uint32_t max)
{
    if (start == out->n)
        return true; /* "" repeated is "" */
    gram_elem a = out->v[start];
    if (out->n - start > 1) { /* a multi-character literal repeats as a unit */
        uint32_t r;
        evec atom = {0};
        bool ok = true;
        for (uint32_t k = start; k < out->n && ok; k++)
            ok = push(p, &atom, out->v[k].kind, out->v[k].arg);
        ok = ok && synth_rule(p, rule, &r) && add_alt(p, r, &atom);
        free(atom.v);
        if (!ok)
            return false;
        a = (gram_elem){GE_RULE, r};
    }
    out->n = start;
    for (uint32_t k = 0; k < min; k++)
        if (!push(p, out, a.kind, a.arg))
            return false;
    uint32_t tail = UINT32_MAX;
    if (max == UINT32_MAX) { /* S ::= a S | "" */
        if (!synth_rule(p, rule, &tail) || !add_opt(p, tail, a, tail))
            return false;
    } else {
        for (uint32_t k = min; k < max; k++) { /* O_k ::= a O_{k-1} | "" */
            uint32_t o;
            if (!synth_rule(p, rule, &o) || !add_opt(p, o, a, tail))
                return false;
            tail = o;
        }
    }
    return tail == UINT32_MAX || push(p, out, GE_RULE, tail);
}

/* One atom at p->i, appended to out. */
static bool parse_atom(gp *p, uint32_t rule, evec *out)
{
    char c = cur(p);
    if (c == '"') {
        size_t open = p->i++;
        while (!at_end(p) && cur(p) != '"') {
            uint32_t cp;
            if (!parse_char(p, &cp) || !char_elem(p, out, cp, cp))
                return false;
        }
        if (at_end(p))
            return fail_at(p, open, "unterminated string literal");
        p->i++;
        return true;
    }
    if (c == '[')
        return parse_class(p, out);
    if (c == '.') {
        p->i++;
        return char_elem(p, out, 0, GRAM_MAX_CP);
    }
    if (c == '(') {
        size_t open = p->i++;
        uint32_t sub;
        if (!synth_rule(p, rule, &sub) || !parse_alternates(p, sub, true))
            return false;
        if (cur(p) != ')')
            return fail_at(p, open, "unclosed '('");
        p->i++;
        return push(p, out, GE_RULE, sub);
    }
    if (is_word(c)) {
        size_t a = p->i;
        while (is_word(cur(p)))
            p->i++;
        uint32_t id;
        if (!symbol(p, p->s + a, p->i - a, &id))
            return false;
        if (p->rules[id].ref_at == SIZE_MAX)
            p->rules[id].ref_at = a;
        return push(p, out, GE_RULE, id);
    }
    if (c == '<')
        return FAIL(p, "token references (<...>) are not supported; write the token's text as a literal");
    return FAIL(p, "unexpected character '%c'", c);
}

static bool parse_sequence(gp *p, uint32_t rule, bool nested, evec *out)
{
    uint32_t last = UINT32_MAX; /* start of the last atom, for a postfix operator */
    for (;;) {
        skip_space(p, nested);
        char c = cur(p);
        if (at_end(p) || c == '|' || c == ')' || c == '\n')
            return true;
        if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last == UINT32_MAX)
                return FAIL(p, "'%c' has nothing before it to repeat", c);
            uint32_t min, max;
            if (!parse_postfix(p, &min, &max) || !repeat(p, rule, out, last, min, max))
                return false;
            last = UINT32_MAX;
            continue;
        }
        last = out->n;
        if (!parse_atom(p, rule, out))
            return false;
    }
}

static bool parse_alternates(gp *p, uint32_t rule, bool nested)
{
    for (;;) {
        evec seq = {0};
        bool ok = parse_sequence(p, rule, nested, &seq) && add_alt(p, rule, &seq);
        free(seq.v);
        if (!ok)
            return false;
        if (cur(p) != '|')
            return true;
        p->i++;
        skip_space(p, true);
    }
}

static bool parse_rule(gp *p)
{
    size_t a = p->i;
    while (is_word(cur(p)))
        p->i++;
    if (p->i == a)
        return FAIL(p, "expected a rule name");
    size_t len = p->i - a;
    skip_space(p, false);
    if (p->n - p->i < 3 || memcmp(p->s + p->i, "::=", 3))
        return FAIL(p, "expected '::=' after the rule name '%.*s'", (int)(len < 64 ? len : 64), p->s + a);
    p->i += 3;
    skip_space(p, true);
    uint32_t id;
    if (!symbol(p, p->s + a, len, &id))
        return false;
    if (p->rules[id].defined)
        return fail_at(p, a, "rule '%s' is defined twice", p->rules[id].name);
    p->rules[id].defined = true;
    if (!parse_alternates(p, id, false))
        return false;
    skip_space(p, false);
    if (!at_end(p) && cur(p) != '\n')
        return FAIL(p, "unexpected '%c' (a rule ends at the end of its line)", cur(p));
    return true;
}

/* ---- checks and the final layout ------------------------------------------------------------------ */

/* The first range of class c that ends at or after cp (cls[c + 1] when none). O(log ranges). */
static uint32_t range_at(const gram_grammar *g, uint32_t c, uint32_t cp)
{
    uint32_t lo = g->cls[c], hi = g->cls[c + 1];
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (g->ranges[mid].hi < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

bool gram_class_has(const gram_grammar *g, uint32_t c, uint32_t cp)
{
    uint32_t r = range_at(g, c, cp);
    return r < g->cls[c + 1] && g->ranges[r].lo <= cp;
}

bool gram_class_meets(const gram_grammar *g, uint32_t c, uint32_t lo, uint32_t hi)
{
    uint32_t r = range_at(g, c, lo);
    return r < g->cls[c + 1] && g->ranges[r].lo <= hi;
}

bool gram_class_covers(const gram_grammar *g, uint32_t c, uint32_t lo, uint32_t hi)
{
    uint32_t r = range_at(g, c, lo);
    return r < g->cls[c + 1] && g->ranges[r].lo <= lo && g->ranges[r].hi >= hi;
}

/* Rules that may match the empty string (fixpoint; a few passes in practice). */
static void nullable_rules(const gram_grammar *g, uint8_t *nul)
{
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t r = 0; r < g->n_rules; r++) {
            if (nul[r])
                continue;
            for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1] && !nul[r]; a++) {
                const gram_elem *e = g->elems + g->alts[a];
                while (e->kind == GE_RULE && nul[e->arg])
                    e++;
                if (e->kind == GE_END)
                    nul[r] = changed = true;
            }
        }
    }
}

/* Left recursion: a cycle of "r may call s before consuming a character". Iterative DFS with
 * colours (0 new, 1 on the path, 2 done). O(elements). */
static bool check_left_recursion(gp *p, const gram_grammar *g)
{
    uint32_t R = g->n_rules;
    uint8_t *nul = calloc(R, 1), *color = calloc(R, 1);
    uint32_t *stack = malloc(2 * (size_t)R * sizeof *stack); /* (rule, next alternative-element cursor) */
    if (!nul || !color || !stack) {
        free(nul), free(color), free(stack);
        return oom(p);
    }
    nullable_rules(g, nul);
    bool ok = true;
    for (uint32_t r0 = 0; r0 < R && ok; r0++) {
        if (color[r0])
            continue;
        uint32_t sp = 0;
        stack[sp++] = r0;
        stack[sp++] = 0; /* cursor: index into the rule's left-callable references */
        color[r0] = 1;
        while (sp && ok) {
            uint32_t r = stack[sp - 2], k = stack[sp - 1]++, seen = 0, next = UINT32_MAX;
            /* the k-th left-callable reference of r */
            for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1] && next == UINT32_MAX; a++)
                for (const gram_elem *e = g->elems + g->alts[a]; e->kind == GE_RULE; e++) {
                    if (seen++ == k) {
                        next = e->arg;
                        break;
                    }
                    if (!nul[e->arg])
                        break;
                }
            if (next == UINT32_MAX) {
                color[r] = 2;
                sp -= 2;
            } else if (color[next] == 1) {
                ok = fail_at(p, p->rules[next].ref_at == SIZE_MAX ? 0 : p->rules[next].ref_at,
                             "rule '%s' can reach itself without consuming a character (left recursion, or a "
                             "repetition of something that can be empty)", g->names[next]);
            } else if (color[next] == 0) {
                color[next] = 1;
                stack[sp++] = next;
                stack[sp++] = 0;
            }
        }
    }
    free(nul), free(color), free(stack);
    return ok;
}

void gram_grammar_free(gram_grammar *g)
{
    if (!g)
        return;
    for (uint32_t r = 0; g->names && r < g->n_rules; r++)
        free(g->names[r]);
    free(g->names);
    free(g->elems);
    free(g->alts);
    free(g->rule_alt);
    free(g->ranges);
    free(g->cls);
    free(g);
}

uint32_t gram_grammar_rules(const gram_grammar *g) { return g->n_rules; }

/* Moves the parsed rules into the flat layout. */
static bool flatten(gp *p, gram_grammar *g)
{
    uint64_t ne = 0, na = 0;
    for (uint32_t r = 0; r < p->n_rules; r++)
        for (uint32_t a = 0; a < p->rules[r].n_alts; a++, na++)
            ne += p->rules[r].alts[a].n + 1;
    g->n_rules = p->n_rules;
    g->elems = malloc(ne * sizeof *g->elems);
    g->alts = malloc((na ? na : 1) * sizeof *g->alts);
    g->rule_alt = malloc((p->n_rules + 1) * sizeof *g->rule_alt);
    g->names = calloc(p->n_rules, sizeof *g->names);
    if (!g->elems || !g->alts || !g->rule_alt || !g->names)
        return oom(p);
    uint32_t e = 0, ai = 0;
    for (uint32_t r = 0; r < p->n_rules; r++) {
        trule *t = &p->rules[r];
        g->rule_alt[r] = ai;
        for (uint32_t a = 0; a < t->n_alts; a++) {
            g->alts[ai++] = e;
            if (t->alts[a].n) /* an empty alternative has no buffer */
                memcpy(g->elems + e, t->alts[a].v, t->alts[a].n * sizeof *g->elems);
            e += t->alts[a].n;
            g->elems[e++] = (gram_elem){GE_END, r};
        }
        g->names[r] = t->name;
        t->name = NULL;
    }
    g->rule_alt[p->n_rules] = ai;
    g->n_elems = e;
    g->n_alts = ai;
    p->cls[p->n_classes] = p->n_ranges;
    g->ranges = p->ranges;
    g->cls = p->cls;
    g->n_classes = p->n_classes;
    p->ranges = NULL;
    p->cls = NULL;
    return true;
}

static void gp_free(gp *p)
{
    for (uint32_t r = 0; r < p->n_rules; r++) {
        for (uint32_t a = 0; a < p->rules[r].n_alts; a++)
            free(p->rules[r].alts[a].v);
        free(p->rules[r].alts);
        free(p->rules[r].name);
    }
    free(p->rules);
    free(p->hash);
    free(p->ranges);
    free(p->cls);
}

/* Every referenced rule is defined and root exists. */
static bool check_rules(gp *p, uint32_t *root)
{
    for (uint32_t r = 0; r < p->n_rules; r++)
        if (!p->rules[r].defined && p->rules[r].ref_at != SIZE_MAX)
            return fail_at(p, p->rules[r].ref_at, "undefined rule '%s'", p->rules[r].name);
    for (uint32_t r = 0; r < p->n_rules; r++)
        if (!strcmp(p->rules[r].name, "root") && p->rules[r].defined) {
            *root = r;
            return true;
        }
    return fail_at(p, 0, "no rule named 'root' (the start rule)");
}

vki_status gram_parse(const char *text, size_t len, gram_grammar **out, char *err, size_t n_err)
{
    *out = NULL;
    if (err && n_err)
        err[0] = 0;
    gp p = {.s = text ? text : "", .n = text ? len : 0, .err = err, .n_err = n_err};
    gram_grammar *g = calloc(1, sizeof *g);
    if (!g)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    skip_space(&p, true);
    while (p.st == VKI_OK && !at_end(&p)) {
        parse_rule(&p);
        skip_space(&p, true);
    }
    /* one spare slot for the classes' closing offset */
    if (p.st == VKI_OK && check_rules(&p, &g->root))
        grow(&p, (void **)&p.cls, &p.cap_classes, p.n_classes + 1, sizeof *p.cls);
    if (p.st == VKI_OK && flatten(&p, g))
        check_left_recursion(&p, g);
    gp_free(&p);
    if (p.st != VKI_OK) {
        gram_grammar_free(g);
        return p.st;
    }
    *out = g;
    return VKI_OK;
}
