/* The matcher: parse states of a gram_grammar over the bytes of a gram_vocab's tokens.
 *
 * Stacks. A pushdown stack is a chain of frames (pos, parent): pos is an element index, parent
 * the frame below. A stack's top frame always sits on a GE_CHAR element (the next character to
 * match); the frames below are return points. Frames are hash-consed, so a stack is one frame id
 * and two requests in the same place share it. Frame 0 is the empty stack (the grammar may end
 * here); frame 1 is the bottom of a "local" stack (below: an unknown context), see masks.
 * Calling a rule as the last element of an alternative pushes no return frame (a tail call), so
 * right recursion (x*, lists) keeps stacks flat and states repeat.
 *
 * Sets and states. A parse state is the sorted set of stacks that are still alive (the grammar
 * may be ambiguous), hash-consed too. A DFA state is a set plus a pending partial UTF-8
 * character (tokens are bytes and may end mid-character). Each DFA state has a 256-entry byte
 * transition table filled on first use: delta(q, b) decodes UTF-8 and, on a complete character
 * c, takes succ(s) of every stack s whose top class holds c (succ is memoised per stack). So
 * advancing by a sampled token is len(token) table reads once warm.
 *
 * Masks. Allowed tokens of a DFA state = union over its stacks (the stacks evolve independently).
 * For one stack (pos, parent), walk the vocabulary trie from the *local* stack (pos, 1): tokens
 * consumed without leaving the rule that pos is in are allowed whatever the parent is; a trie
 * node where the local stack pops out (its set holds frame 1) roots a subtree whose tokens
 * continue in the parent context. The local walk is done once per grammar position and kept
 * (accepted tokens + the popping nodes), shared by every stack with that top; the popping
 * subtrees are then walked from the real parent state, and they are small (inside a JSON string
 * only the tokens that start with '"'). Partial-character states are walked directly. Masks are
 * cached per DFA state. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/rng.h"
#include "host/grammar/gram_impl.h"

#define F_EMPTY 0u
#define F_POPPED 1u
#define NONE 0xffffffffu
#define TR_UNKNOWN (-2)
#define TR_REJECT (-1)
#define SET_EMPTY 1u  /* set flags */
#define SET_POPPED 2u
#define MAX_WORK (1u << 22) /* normalisation steps per call (ambiguity guard) */

typedef struct frame {
    uint32_t pos, parent;
} frame;

/* What the trie walk from a position's local stack found (see the header comment). */
typedef struct local_info {
    bool dense;               /* tokens as a bitset [words], else a list [n_tok] */
    uint32_t *tok;
    uint32_t n_tok;
    /* The children of the trie nodes where the local stack pops out, by edge byte: the tokens
     * below them continue in the parent context. dep_off[257] (NULL: none), dep_node[dep_off[256]]. */
    uint32_t *dep_off;
    uint32_t *dep_node;
} local_info;

typedef struct u32map { /* open addressing, values are ids + 1 (0 = empty slot) */
    uint32_t *slot;
    uint32_t cap;
} u32map;

struct gram_automaton {
    gram_grammar *g;
    const gram_vocab *v;
    gram_limits lim;
    uint32_t words;           /* mask words: ceil(n_vocab / 32) */
    uint64_t bytes;           /* memory held by the caches */
    uint64_t walk_nodes;      /* trie nodes visited by all walks */
    uint64_t walk_by[3];      /* ... by local walks, context walks, partial-character walks */
    uint32_t walk_kind;       /* which of those the current walk is */
    /* frames */
    frame *fr;                /* [cap_fr] */
    uint32_t *succ;           /* [cap_fr] set after the top character matched, NONE = unknown */
    uint32_t *resume;         /* [cap_fr] set when this frame is returned to, NONE = unknown */
    uint32_t *seen;           /* [cap_fr] generation marks for set unions */
    uint32_t n_fr, cap_fr, gen;
    u32map fr_map;
    /* sets */
    uint32_t *pool;           /* stack ids of every set, back to back */
    uint64_t n_pool, cap_pool;
    uint64_t *set_off;        /* [cap_sets] */
    uint32_t *set_len;        /* [cap_sets] */
    uint8_t *set_flags;       /* [cap_sets] SET_* */
    uint32_t n_sets, cap_sets;
    u32map set_map;
    /* DFA states */
    uint32_t *st_set, *st_part; /* [cap_st] the set and the partial character (0: none) */
    uint8_t *st_pop;          /* [cap_st] 1: no partial character and the set holds F_POPPED */
    int32_t *trans;           /* [cap_st][256] TR_UNKNOWN, TR_REJECT or a state */
    uint32_t **st_mask;       /* [cap_st] cached mask or NULL */
    uint32_t *st_allowed;     /* [cap_st] bits set in the cached mask */
    uint32_t n_st, cap_st;
    u32map st_map;
    local_info *loc;          /* [n_loc] local walks, by their local stack (loc_of) */
    uint32_t n_loc, cap_loc;
    uint32_t *loc_of;         /* [cap_fr] the local walk of a local stack's top frame, NONE = not yet */
    /* scratch */
    uint32_t *list;           /* a set being built */
    uint32_t n_list, cap_list;
    uint64_t *work;           /* normalisation work list of (pos, parent) */
    uint32_t n_work, cap_work;
    u32map visit;             /* (pos, parent) pairs expanded by the current normalisation */
    uint64_t *visit_key;
    uint32_t n_visit;
    int32_t *walk_st;         /* [max_depth + 1] DFA state per trie depth */
    uint32_t *deps;           /* (byte, node) pairs collected by a local walk */
    uint32_t n_deps, cap_deps;
    uint32_t *mask;           /* [words] the mask being built */
    char *err;
    size_t n_err;
};

gram_limits gram_default_limits(void) { return (gram_limits){.max_stacks = 4096, .max_bytes = 256ull << 20}; }

static vki_status fail(gram_automaton *a, vki_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static vki_status fail(gram_automaton *a, vki_status st, const char *fmt, ...)
{
    if (a->err && a->n_err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(a->err, a->n_err, fmt, ap);
        va_end(ap);
    }
    return st;
}

static vki_status oom(gram_automaton *a) { return fail(a, VKI_ERR_OUT_OF_HOST_MEMORY, "grammar: out of host memory"); }

/* Grows an array to hold `need` elements, counting the bytes. */
static bool grow_arr(gram_automaton *a, void **p, uint64_t *cap, uint64_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    uint64_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *np = realloc(*p, (size_t)(c * elem));
    if (!np)
        return false;
    a->bytes += (c - *cap) * elem;
    *p = np;
    *cap = c;
    return true;
}

/* ---- hash maps -------------------------------------------------------------------------------- */

static bool map_init(u32map *m, uint32_t cap)
{
    m->slot = calloc(cap, sizeof *m->slot);
    m->cap = cap;
    return m->slot != NULL;
}

/* Rehashes to twice the size when the load passes 1/2; key_of(id) recomputes hashes. */
static bool map_reserve(gram_automaton *a, u32map *m, uint32_t n, uint64_t (*hash_of)(const gram_automaton *, uint32_t))
{
    if ((uint64_t)n * 2 < m->cap)
        return true;
    uint32_t cap = m->cap * 2;
    uint32_t *s = calloc(cap, sizeof *s);
    if (!s)
        return false;
    for (uint32_t i = 0; i < m->cap; i++)
        if (m->slot[i]) {
            uint32_t j = (uint32_t)hash_of(a, m->slot[i] - 1) & (cap - 1);
            while (s[j])
                j = (j + 1) & (cap - 1);
            s[j] = m->slot[i];
        }
    a->bytes += (uint64_t)(cap - m->cap) * sizeof *s;
    free(m->slot);
    m->slot = s;
    m->cap = cap;
    return true;
}

static uint64_t frame_hash(const gram_automaton *a, uint32_t id)
{
    return vki_mix64(((uint64_t)a->fr[id].pos << 32) | a->fr[id].parent);
}

static uint64_t set_hash_of(const uint32_t *v, uint32_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (uint32_t i = 0; i < n; i++)
        h = vki_mix64(h ^ v[i]);
    return h;
}

static uint64_t set_hash(const gram_automaton *a, uint32_t id)
{
    return set_hash_of(a->pool + a->set_off[id], a->set_len[id]);
}

static uint64_t state_hash(const gram_automaton *a, uint32_t id)
{
    return vki_mix64(((uint64_t)a->st_set[id] << 32) | a->st_part[id]);
}

/* ---- frames ------------------------------------------------------------------------------------- */

static bool over_budget(const gram_automaton *a) { return a->bytes > a->lim.max_bytes; }

/* The frame (pos, parent); NONE when out of memory or over the budget (a->err says which). */
static uint32_t frame_id(gram_automaton *a, uint32_t pos, uint32_t parent)
{
    uint64_t h = vki_mix64(((uint64_t)pos << 32) | parent);
    uint32_t j = (uint32_t)h & (a->fr_map.cap - 1);
    for (; a->fr_map.slot[j]; j = (j + 1) & (a->fr_map.cap - 1)) {
        const frame *f = &a->fr[a->fr_map.slot[j] - 1];
        if (f->pos == pos && f->parent == parent)
            return a->fr_map.slot[j] - 1;
    }
    if (over_budget(a)) {
        fail(a, VKI_ERR_OUT_OF_HOST_MEMORY, "grammar: the matcher's caches passed their limit of %llu MiB",
             (unsigned long long)(a->lim.max_bytes >> 20));
        return NONE;
    }
    uint64_t cap = a->cap_fr, c2 = cap, c3 = cap, c4 = cap, c5 = cap;
    if (a->n_fr == cap && !(grow_arr(a, (void **)&a->fr, &cap, cap + 1, sizeof *a->fr) &&
                            grow_arr(a, (void **)&a->succ, &c2, c2 + 1, sizeof *a->succ) &&
                            grow_arr(a, (void **)&a->resume, &c3, c3 + 1, sizeof *a->resume) &&
                            grow_arr(a, (void **)&a->seen, &c4, c4 + 1, sizeof *a->seen) &&
                            grow_arr(a, (void **)&a->loc_of, &c5, c5 + 1, sizeof *a->loc_of))) {
        oom(a);
        return NONE;
    }
    if (cap > a->cap_fr) {
        for (uint64_t k = a->cap_fr; k < cap; k++)
            a->succ[k] = a->resume[k] = a->loc_of[k] = NONE, a->seen[k] = 0;
        a->cap_fr = (uint32_t)cap;
    }
    uint32_t id = a->n_fr++;
    a->fr[id] = (frame){pos, parent};
    a->fr_map.slot[j] = id + 1;
    if (!map_reserve(a, &a->fr_map, a->n_fr, frame_hash)) {
        oom(a);
        return NONE;
    }
    return id;
}

/* ---- sets --------------------------------------------------------------------------------------- */

static int u32_cmp(const void *x, const void *y)
{
    uint32_t p = *(const uint32_t *)x, q = *(const uint32_t *)y;
    return (p > q) - (p < q);
}

/* Interns a->list[0 .. n_list) (sorted here). NONE on failure. */
static uint32_t set_id(gram_automaton *a)
{
    uint32_t n = a->n_list, *v = a->list;
    qsort(v, n, sizeof *v, u32_cmp);
    uint64_t h = set_hash_of(v, n);
    uint32_t j = (uint32_t)h & (a->set_map.cap - 1);
    for (; a->set_map.slot[j]; j = (j + 1) & (a->set_map.cap - 1)) {
        uint32_t id = a->set_map.slot[j] - 1;
        if (a->set_len[id] == n && (!n || !memcmp(a->pool + a->set_off[id], v, (size_t)n * sizeof *v)))
            return id;
    }
    uint64_t cap = a->cap_sets, c2 = cap, c3 = cap;
    if (!grow_arr(a, (void **)&a->pool, &a->cap_pool, a->n_pool + n, sizeof *a->pool) ||
        (a->n_sets == cap && !(grow_arr(a, (void **)&a->set_off, &cap, cap + 1, sizeof *a->set_off) &&
                               grow_arr(a, (void **)&a->set_len, &c2, c2 + 1, sizeof *a->set_len) &&
                               grow_arr(a, (void **)&a->set_flags, &c3, c3 + 1, sizeof *a->set_flags)))) {
        oom(a);
        return NONE;
    }
    a->cap_sets = (uint32_t)cap;
    uint32_t id = a->n_sets++;
    a->set_off[id] = a->n_pool;
    a->set_len[id] = n;
    a->set_flags[id] = 0;
    for (uint32_t k = 0; k < n; k++)
        a->set_flags[id] |= v[k] == F_EMPTY ? SET_EMPTY : v[k] == F_POPPED ? SET_POPPED : 0;
    if (n)
        memcpy(a->pool + a->n_pool, v, (size_t)n * sizeof *v);
    a->n_pool += n;
    a->set_map.slot[j] = id + 1;
    if (!map_reserve(a, &a->set_map, a->n_sets, set_hash)) {
        oom(a);
        return NONE;
    }
    return id;
}

/* Adds stack s to a->list unless this generation has it. */
static bool list_add(gram_automaton *a, uint32_t s)
{
    if (a->seen[s] == a->gen)
        return true;
    a->seen[s] = a->gen;
    uint64_t cap = a->cap_list;
    if (!grow_arr(a, (void **)&a->list, &cap, a->n_list + 1, sizeof *a->list))
        return false;
    a->cap_list = (uint32_t)cap;
    a->list[a->n_list++] = s;
    return true;
}

static void list_reset(gram_automaton *a)
{
    a->n_list = 0;
    if (++a->gen == 0) { /* wrapped: forget every mark */
        memset(a->seen, 0, (size_t)a->cap_fr * sizeof *a->seen);
        a->gen = 1;
    }
}

/* ---- normalisation: expand rule calls and returns until every stack tops a character --------- */

/* Queues (pos, parent) unless this normalisation already expanded it. */
static bool work_push(gram_automaton *a, uint32_t pos, uint32_t parent)
{
    uint64_t key = ((uint64_t)pos << 32) | parent;
    uint32_t j = (uint32_t)vki_mix64(key) & (a->visit.cap - 1);
    for (; a->visit.slot[j]; j = (j + 1) & (a->visit.cap - 1))
        if (a->visit_key[a->visit.slot[j] - 1] == key)
            return true;
    if ((uint64_t)(a->n_visit + 1) * 2 >= a->visit.cap) { /* keep the load under 1/2 */
        uint32_t c = a->visit.cap * 2;
        uint32_t *sl = calloc(c, sizeof *sl);
        uint64_t *nk = realloc(a->visit_key, (size_t)c / 2 * sizeof *nk);
        if (!sl || !nk) {
            free(sl);
            if (nk)
                a->visit_key = nk;
            return false;
        }
        a->visit_key = nk;
        for (uint32_t i = 0; i < a->n_visit; i++) {
            uint32_t k = (uint32_t)vki_mix64(a->visit_key[i]) & (c - 1);
            while (sl[k])
                k = (k + 1) & (c - 1);
            sl[k] = i + 1;
        }
        free(a->visit.slot);
        a->visit.slot = sl;
        a->visit.cap = c;
        for (j = (uint32_t)vki_mix64(key) & (c - 1); sl[j]; j = (j + 1) & (c - 1))
            ;
    }
    a->visit_key[a->n_visit] = key;
    a->visit.slot[j] = ++a->n_visit;
    uint64_t wc = a->cap_work;
    if (!grow_arr(a, (void **)&a->work, &wc, a->n_work + 1, sizeof *a->work))
        return false;
    a->cap_work = (uint32_t)wc;
    a->work[a->n_work++] = key;
    return true;
}

static void visit_reset(gram_automaton *a)
{
    if (a->n_visit > 1024) {
        memset(a->visit.slot, 0, (size_t)a->visit.cap * sizeof *a->visit.slot);
    } else { /* newest first: an entry's probe chain only crosses entries older than it */
        for (uint32_t i = a->n_visit; i-- > 0;) {
            uint32_t j = (uint32_t)vki_mix64(a->visit_key[i]) & (a->visit.cap - 1);
            while (a->visit.slot[j] != i + 1)
                j = (j + 1) & (a->visit.cap - 1);
            a->visit.slot[j] = 0;
        }
    }
    a->n_visit = 0;
    a->n_work = 0;
}

/* Runs the queued work into a->list (the caller did list_reset and queued the starts). */
static vki_status normalize_run(gram_automaton *a)
{
    const gram_grammar *g = a->g;
    uint32_t steps = 0;
    vki_status st = VKI_OK;
    while (a->n_work && st == VKI_OK) {
        uint64_t w = a->work[--a->n_work];
        uint32_t pos = (uint32_t)(w >> 32), parent = (uint32_t)w;
        const gram_elem *e = &g->elems[pos];
        if (++steps > MAX_WORK)
            st = fail(a, VKI_ERR_INVALID_ARG, "grammar: too ambiguous (more than %u expansions at one point)", MAX_WORK);
        else if (e->kind == GE_END && parent <= F_POPPED)
            st = list_add(a, parent) ? VKI_OK : oom(a);
        else if (e->kind == GE_END)
            st = work_push(a, a->fr[parent].pos, a->fr[parent].parent) ? VKI_OK : oom(a);
        else if (e->kind == GE_CHAR) {
            uint32_t s = frame_id(a, pos, parent);
            st = s == NONE ? VKI_ERR_OUT_OF_HOST_MEMORY : list_add(a, s) ? VKI_OK : oom(a);
        } else { /* a call: return to pos + 1, or straight to parent when the call is last */
            uint32_t ret = g->elems[pos + 1].kind == GE_END ? parent : frame_id(a, pos + 1, parent);
            if (ret == NONE)
                st = VKI_ERR_OUT_OF_HOST_MEMORY;
            for (uint32_t k = g->rule_alt[e->arg]; k < g->rule_alt[e->arg + 1] && st == VKI_OK; k++)
                st = work_push(a, g->alts[k], ret) ? VKI_OK : oom(a);
        }
        if (st == VKI_OK && a->n_list > a->lim.max_stacks)
            st = fail(a, VKI_ERR_INVALID_ARG, "grammar: too ambiguous (more than %u parses alive at once)",
                      a->lim.max_stacks);
    }
    visit_reset(a);
    return st;
}

/* The set of normalize(pos, parent). */
static vki_status normalize(gram_automaton *a, uint32_t pos, uint32_t parent, uint32_t *set)
{
    list_reset(a);
    vki_status st = work_push(a, pos, parent) ? normalize_run(a) : oom(a);
    if (st == VKI_OK && (*set = set_id(a)) == NONE)
        st = VKI_ERR_OUT_OF_HOST_MEMORY;
    return st;
}

/* succ(s): the set after stack s matched its top character. Memoised. */
static vki_status succ_of(gram_automaton *a, uint32_t s, uint32_t *out)
{
    if (a->succ[s] == NONE) {
        uint32_t set;
        vki_status st = normalize(a, a->fr[s].pos + 1, a->fr[s].parent, &set);
        if (st != VKI_OK)
            return st;
        a->succ[s] = set;
    }
    *out = a->succ[s];
    return VKI_OK;
}

/* The set when frame f (a return point, >= 2) is resumed. Memoised. */
static vki_status resume_of(gram_automaton *a, uint32_t f, uint32_t *out)
{
    if (a->resume[f] == NONE) {
        uint32_t set;
        vki_status st = normalize(a, a->fr[f].pos, a->fr[f].parent, &set);
        if (st != VKI_OK)
            return st;
        a->resume[f] = set;
    }
    *out = a->resume[f];
    return VKI_OK;
}

/* ---- DFA states ----------------------------------------------------------------------------------- */

/* Partial character encoding: 0 = none; else len (2..4) << 29 | bytes still needed << 24 | the
 * value so far. PART_ANY: every stack of the set takes every character the bytes can still become,
 * so the value is dropped and all such states of one set are one state (inside a JSON string, one
 * state per byte position instead of one per prefix: the masks are shared). */
#define PART(len, need, val) ((uint32_t)(len) << 29 | (uint32_t)(need) << 24 | (val))
#define PART_ANY (1u << 28)
#define PART_LEN(p) ((p) >> 29)
#define PART_NEED(p) (((p) >> 24) & 0x7)
#define PART_VAL(p) ((p) & 0xFFFFFF)

static vki_status state_id(gram_automaton *a, uint32_t set, uint32_t part, uint32_t *out)
{
    uint64_t h = vki_mix64(((uint64_t)set << 32) | part);
    uint32_t j = (uint32_t)h & (a->st_map.cap - 1);
    for (; a->st_map.slot[j]; j = (j + 1) & (a->st_map.cap - 1)) {
        uint32_t id = a->st_map.slot[j] - 1;
        if (a->st_set[id] == set && a->st_part[id] == part) {
            *out = id;
            return VKI_OK;
        }
    }
    if (over_budget(a))
        return fail(a, VKI_ERR_OUT_OF_HOST_MEMORY, "grammar: the matcher's caches passed their limit of %llu MiB",
                    (unsigned long long)(a->lim.max_bytes >> 20));
    if (a->n_st == a->cap_st) {
        uint64_t c = a->cap_st, c1 = c, c2 = c, c3 = c, c4 = c, ct = c * 256;
        if (!grow_arr(a, (void **)&a->st_set, &c, c + 1, sizeof *a->st_set) ||
            !grow_arr(a, (void **)&a->st_pop, &c4, c4 + 1, sizeof *a->st_pop) ||
            !grow_arr(a, (void **)&a->st_part, &c1, c1 + 1, sizeof *a->st_part) ||
            !grow_arr(a, (void **)&a->st_mask, &c2, c2 + 1, sizeof *a->st_mask) ||
            !grow_arr(a, (void **)&a->st_allowed, &c3, c3 + 1, sizeof *a->st_allowed) ||
            !grow_arr(a, (void **)&a->trans, &ct, c * 256, sizeof *a->trans))
            return oom(a);
        a->cap_st = (uint32_t)c;
    }
    uint32_t id = a->n_st++;
    a->st_set[id] = set;
    a->st_part[id] = part;
    a->st_pop[id] = !part && (a->set_flags[set] & SET_POPPED);
    a->st_mask[id] = NULL;
    a->st_allowed[id] = 0;
    for (int b = 0; b < 256; b++)
        a->trans[(size_t)id * 256 + b] = TR_UNKNOWN;
    a->st_map.slot[j] = id + 1;
    if (!map_reserve(a, &a->st_map, a->n_st, state_hash))
        return oom(a);
    *out = id;
    return VKI_OK;
}

static const uint32_t *set_items(const gram_automaton *a, uint32_t set, uint32_t *n)
{
    *n = a->set_len[set];
    return a->pool + a->set_off[set];
}

/* The stacks of `set` whose top class holds cp (cp_hi == cp) or meets [cp, cp_hi]. */
static bool top_meets(const gram_automaton *a, uint32_t s, uint32_t lo, uint32_t hi)
{
    if (s <= F_POPPED)
        return false;
    const gram_elem *e = &a->g->elems[a->fr[s].pos];
    return lo == hi ? gram_class_has(a->g, e->arg, lo) : gram_class_meets(a->g, e->arg, lo, hi);
}

/* Set after a complete character: union of succ(s) over the stacks that take cp (all: every
 * stack, for a PART_ANY state). */
static vki_status step_cp(gram_automaton *a, uint32_t set, uint32_t cp, bool all, int32_t *out)
{
    uint32_t n, nx = 0;
    const uint32_t *items = set_items(a, set, &n);
    uint32_t take[n ? n : 1], succ[n ? n : 1];
    for (uint32_t k = 0; k < n; k++) /* pool may move while succ_of interns: copy first */
        if (items[k] > F_POPPED && (all || top_meets(a, items[k], cp, cp)))
            take[nx++] = items[k];
    for (uint32_t k = 0; k < nx; k++) {
        vki_status st = succ_of(a, take[k], &succ[k]);
        if (st != VKI_OK)
            return st;
    }
    if (!nx) {
        *out = TR_REJECT;
        return VKI_OK;
    }
    uint32_t ns = succ[0], q;
    if (nx > 1) { /* a union to intern; one stack (the common case) reuses its memoised set */
        list_reset(a);
        for (uint32_t k = 0; k < nx; k++) {
            uint32_t m;
            const uint32_t *s2 = set_items(a, succ[k], &m);
            for (uint32_t i = 0; i < m; i++)
                if (!list_add(a, s2[i]))
                    return oom(a);
        }
        ns = set_id(a);
    }
    if (ns == NONE)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    vki_status st = state_id(a, ns, 0, &q);
    *out = (int32_t)q;
    return st;
}

/* A partial character: keeps the stacks whose top class meets the code points the bytes so far
 * can still become. */
static vki_status step_partial(gram_automaton *a, uint32_t set, uint32_t len, uint32_t need, uint32_t val,
                               int32_t *out)
{
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000}, max_cp[5] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    uint32_t lo = val << (6 * need), hi = lo | ((1u << (6 * need)) - 1);
    if (lo < min_cp[len])
        lo = min_cp[len];
    if (hi > max_cp[len])
        hi = max_cp[len];
    *out = TR_REJECT;
    if (lo > hi || (len == 3 && lo >= 0xD800 && hi <= 0xDFFF)) /* overlong, or a surrogate */
        return VKI_OK;
    /* once the bytes so far can only become valid characters (after the lead byte of a 2-byte
     * character, after two bytes of longer ones), the value matters only if some stack takes
     * part of [lo, hi] */
    bool settled = len == 2 || need + 2 <= len, any = settled;
    uint32_t n;
    const uint32_t *items = set_items(a, set, &n);
    list_reset(a);
    for (uint32_t k = 0; k < n; k++) {
        if (!top_meets(a, items[k], lo, hi))
            continue;
        if (!list_add(a, items[k]))
            return oom(a);
        any = any && gram_class_covers(a->g, a->g->elems[a->fr[items[k]].pos].arg, lo, hi);
    }
    if (!a->n_list)
        return VKI_OK;
    uint32_t ns = set_id(a), q;
    if (ns == NONE)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    vki_status st = state_id(a, ns, any ? PART(len, need, 0) | PART_ANY : PART(len, need, val), &q);
    *out = (int32_t)q;
    return st;
}

static vki_status delta_compute(gram_automaton *a, uint32_t q, uint8_t b, int32_t *out)
{
    uint32_t set = a->st_set[q], part = a->st_part[q];
    *out = TR_REJECT;
    if (!part) {
        if (b < 0x80)
            return step_cp(a, set, b, false, out);
        uint32_t len = b >= 0xC2 && b < 0xE0 ? 2 : b >= 0xE0 && b < 0xF0 ? 3 : b >= 0xF0 && b < 0xF5 ? 4 : 0;
        return len ? step_partial(a, set, len, len - 1, b & (0x7Fu >> len), out) : VKI_OK;
    }
    if ((b & 0xC0) != 0x80)
        return VKI_OK;
    uint32_t len = PART_LEN(part), need = PART_NEED(part) - 1, val = PART_VAL(part) << 6 | (b & 0x3Fu);
    if (part & PART_ANY) { /* every continuation is valid and taken by every stack */
        if (!need)
            return step_cp(a, set, 0, true, out);
        uint32_t r;
        vki_status st = state_id(a, set, PART(len, need, 0) | PART_ANY, &r);
        *out = (int32_t)r;
        return st;
    }
    if (need)
        return step_partial(a, set, len, need, val, out);
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (val < min_cp[len] || val > GRAM_MAX_CP || (val >= 0xD800 && val < 0xE000))
        return VKI_OK;
    return step_cp(a, set, val, false, out);
}

/* delta(q, b), filled on first use. */
static inline vki_status delta(gram_automaton *a, uint32_t q, uint8_t b, int32_t *out)
{
    int32_t r = a->trans[(size_t)q * 256 + b];
    if (r != TR_UNKNOWN) {
        *out = r;
        return VKI_OK;
    }
    vki_status st = delta_compute(a, q, b, &r);
    if (st != VKI_OK)
        return st;
    a->trans[(size_t)q * 256 + b] = r;
    *out = r;
    return VKI_OK;
}

/* ---- masks ---------------------------------------------------------------------------------------- */

/* Walks trie nodes [i0, i1) (a subtree's descendants, at depths > d0) from state q0 at depth d0:
 * sets the bits of the tokens reached in mask; with `deps`, records the nodes whose state holds
 * the popped-out marker. One pass; a rejected node skips its whole subtree. */
static vki_status walk(gram_automaton *a, uint32_t q0, uint32_t i0, uint32_t i1, uint32_t d0, uint32_t *mask, bool deps)
{
    const gram_vocab *v = a->v;
    const uint8_t *byte = v->byte;
    const uint16_t *depth = v->depth;
    const uint32_t *next = v->next, *n_tok = v->n_tok, *tok0 = v->tok0;
    const int32_t *ids = v->tok_ids;
    int32_t *st = a->walk_st;
    st[d0] = (int32_t)q0;
    uint32_t i = i0, visited = 0;
    while (i < i1) {
        visited++;
        uint32_t d = depth[i];
        int32_t r = a->trans[(size_t)st[d - 1] * 256 + byte[i]];
        if (r == TR_UNKNOWN) {
            vki_status s = delta(a, (uint32_t)st[d - 1], byte[i], &r);
            if (s != VKI_OK)
                return s;
        }
        if (r < 0) {
            i = next[i];
            continue;
        }
        st[d] = r;
        for (uint32_t k = 0, n = n_tok[i]; k < n; k++) {
            uint32_t id = (uint32_t)ids[tok0[i] + k];
            mask[id >> 5] |= 1u << (id & 31);
        }
        if (deps && a->st_pop[r]) {
            for (uint32_t c = i + 1; c < next[i]; c = next[c]) { /* the node's children */
                uint64_t cap = a->cap_deps;
                if (!grow_arr(a, (void **)&a->deps, &cap, (uint64_t)a->n_deps * 2 + 2, sizeof *a->deps))
                    return oom(a);
                a->cap_deps = (uint32_t)cap;
                a->deps[2 * a->n_deps] = byte[c];
                a->deps[2 * a->n_deps++ + 1] = c;
            }
        }
        i++;
    }
    a->walk_nodes += visited;
    a->walk_by[a->walk_kind] += visited;
    return VKI_OK;
}

/* Bits set in x. SWAR, because the portable build has no POPCNT instruction and the compiler's
 * fallback is a table call per word (measured: 4x slower over a 128k-token mask). */
static inline uint32_t pop32(uint32_t x)
{
    x = x - ((x >> 1) & 0x55555555u);
    x = (x & 0x33333333u) + ((x >> 2) & 0x33333333u);
    return (((x + (x >> 4)) & 0x0F0F0F0Fu) * 0x01010101u) >> 24;
}

static uint32_t popcount_words(const uint32_t *m, uint32_t words)
{
    uint32_t n = 0;
    for (uint32_t w = 0; w < words; w++)
        n += pop32(m[w]);
    return n;
}

/* Sorts the collected (byte, node) pairs into L's per-byte lists (a counting sort). */
static vki_status deps_by_byte(gram_automaton *a, local_info *L)
{
    L->dep_off = calloc(257, sizeof *L->dep_off);
    L->dep_node = malloc((size_t)a->n_deps * sizeof *L->dep_node);
    if (!L->dep_off || !L->dep_node)
        return oom(a);
    for (uint32_t k = 0; k < a->n_deps; k++)
        L->dep_off[a->deps[2 * k] + 1]++;
    for (int b = 0; b < 256; b++)
        L->dep_off[b + 1] += L->dep_off[b];
    uint32_t fill[256];
    memcpy(fill, L->dep_off, sizeof fill);
    for (uint32_t k = 0; k < a->n_deps; k++)
        L->dep_node[fill[a->deps[2 * k]]++] = a->deps[2 * k + 1];
    return VKI_OK;
}

/* Walks the trie from the local stack `key` (a chain of frames ending in F_POPPED, or a whole
 * stack ending in F_EMPTY) and keeps what it found. Once per local stack and automaton. */
static vki_status local_walk(gram_automaton *a, uint32_t key, local_info *L)
{
    uint32_t set, q;
    list_reset(a);
    if (!list_add(a, key))
        return oom(a);
    if ((set = set_id(a)) == NONE)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    vki_status st = state_id(a, set, 0, &q);
    uint32_t *m = calloc(a->words, sizeof *m);
    if (st == VKI_OK && !m)
        st = oom(a);
    a->n_deps = 0;
    a->walk_kind = 0;
    if (st == VKI_OK)
        st = walk(a, q, 0, a->v->n_nodes, 0, m, true);
    if (st != VKI_OK) {
        free(m);
        return st;
    }
    uint32_t n = popcount_words(m, a->words);
    L->dense = (uint64_t)n * 32 >= a->v->n_vocab;
    if (!L->dense) { /* sparse: the ids, smaller than the bitset */
        uint32_t *ids = malloc((n ? n : 1) * sizeof *ids), k = 0;
        if (!ids) {
            free(m);
            return oom(a);
        }
        for (uint32_t w = 0; w < a->words; w++)
            for (uint32_t bits = m[w]; bits; bits &= bits - 1)
                ids[k++] = w * 32 + (uint32_t)__builtin_ctz(bits);
        free(m);
        m = ids;
    }
    L->tok = m;
    L->n_tok = n;
    if (a->n_deps && (st = deps_by_byte(a, L)) != VKI_OK)
        return st;
    a->bytes += (L->dense ? (uint64_t)a->words : n) * 4 + (a->n_deps ? 257 + (uint64_t)a->n_deps : 0) * 4;
    return VKI_OK;
}

/* How many frames of a stack the local walks keep. The walk is shared by every stack whose top
 * LOCAL_DEPTH frames are the same, and it stops (records a dependency) where the stack pops below
 * them. 3 frames hold a whole JSON string (character class, the repetition's return point, the
 * closing quote), so a string's content is one walk for every string of the grammar and only the
 * tokens that close the string depend on the context; fewer frames would make every multi-
 * character token inside a string context-dependent. */
#define LOCAL_DEPTH 3

/* The local stack of s: its top LOCAL_DEPTH positions over F_POPPED (or s itself when it is not
 * deeper than that); *below = the real frame under them (<= F_POPPED: none). */
static vki_status local_key(gram_automaton *a, uint32_t s, uint32_t *key, uint32_t *below)
{
    uint32_t pos[LOCAL_DEPTH], k = 0, f = s;
    for (; k < LOCAL_DEPTH && f > F_POPPED; k++, f = a->fr[f].parent)
        pos[k] = a->fr[f].pos;
    *below = f;
    if (f <= F_POPPED) { /* the whole stack fits: the walk is exact */
        *key = s;
        return VKI_OK;
    }
    uint32_t l = F_POPPED;
    while (k-- > 0)
        if ((l = frame_id(a, pos[k], l)) == NONE)
            return VKI_ERR_OUT_OF_HOST_MEMORY;
    *key = l;
    return VKI_OK;
}

static vki_status local_of(gram_automaton *a, uint32_t key, const local_info **out)
{
    if (a->loc_of[key] == NONE) {
        uint64_t cap = a->cap_loc;
        if (!grow_arr(a, (void **)&a->loc, &cap, a->n_loc + 1, sizeof *a->loc))
            return oom(a);
        a->cap_loc = (uint32_t)cap;
        local_info *L = &a->loc[a->n_loc];
        memset(L, 0, sizeof *L);
        vki_status st = local_walk(a, key, L);
        if (st != VKI_OK) {
            free(L->tok);
            free(L->dep_off);
            free(L->dep_node);
            return st;
        }
        a->loc_of[key] = a->n_loc++;
    }
    *out = &a->loc[a->loc_of[key]];
    return VKI_OK;
}

/* The mask of one stack s (>= 2), ORed into a->mask. */
static vki_status stack_mask(gram_automaton *a, uint32_t s)
{
    const local_info *L = NULL;
    uint32_t key, below;
    vki_status st = local_key(a, s, &key, &below);
    if (st == VKI_OK)
        st = local_of(a, key, &L);
    if (st != VKI_OK)
        return st;
    if (L->dense)
        for (uint32_t w = 0; w < a->words; w++)
            a->mask[w] |= L->tok[w];
    else
        for (uint32_t k = 0; k < L->n_tok; k++)
            a->mask[L->tok[k] >> 5] |= 1u << (L->tok[k] & 31);
    if (!L->dep_off || below <= F_POPPED)
        return VKI_OK;
    uint32_t set, q;
    if ((st = resume_of(a, below, &set)) != VKI_OK || (st = state_id(a, set, 0, &q)) != VKI_OK)
        return st;
    /* Only the bytes the context below takes next: inside a JSON string value, only the tokens
     * that close the string and go on with ',' '}' or whitespace are walked. */
    const gram_vocab *v = a->v;
    for (int b = 0; b < 256 && st == VKI_OK; b++) {
        int32_t r;
        if (L->dep_off[b] == L->dep_off[b + 1])
            continue;
        if ((st = delta(a, q, (uint8_t)b, &r)) != VKI_OK || r < 0)
            continue;
        for (uint32_t k = L->dep_off[b]; k < L->dep_off[b + 1] && st == VKI_OK; k++) {
            uint32_t c = L->dep_node[k];
            for (uint32_t t = 0; t < v->n_tok[c]; t++) {
                uint32_t id = (uint32_t)v->tok_ids[v->tok0[c] + t];
                a->mask[id >> 5] |= 1u << (id & 31);
            }
            a->walk_kind = 1;
            st = walk(a, (uint32_t)r, c + 1, v->next[c], v->depth[c], a->mask, false);
        }
    }
    return st;
}

vki_status gram_mask(gram_automaton *a, gram_state q, const uint32_t **mask, uint32_t *n_allowed, char *err,
                     size_t n_err)
{
    a->err = err;
    a->n_err = n_err;
    if (q >= a->n_st)
        return fail(a, VKI_ERR_INVALID_ARG, "grammar: state %u does not exist", q);
    if (a->st_mask[q]) {
        *mask = a->st_mask[q];
        *n_allowed = a->st_allowed[q];
        return VKI_OK;
    }
    memset(a->mask, 0, (size_t)a->words * sizeof *a->mask);
    vki_status st = VKI_OK;
    if (a->st_part[q]) {
        a->walk_kind = 2;
        st = walk(a, q, 0, a->v->n_nodes, 0, a->mask, false);
    } else {
        uint32_t n, set = a->st_set[q];
        set_items(a, set, &n);
        for (uint32_t k = 0; k < n && st == VKI_OK; k++) {
            uint32_t s = a->pool[a->set_off[set] + k]; /* re-read: the pool may move */
            if (s > F_POPPED)
                st = stack_mask(a, s);
        }
    }
    if (st != VKI_OK)
        return st;
    uint32_t n = popcount_words(a->mask, a->words);
    *mask = a->mask;
    *n_allowed = n;
    uint64_t mb = (uint64_t)a->words * 4;
    if (a->bytes + mb <= a->lim.max_bytes / 2) { /* cache while half the budget is free */
        uint32_t *c = malloc((size_t)mb);
        if (c) {
            memcpy(c, a->mask, (size_t)mb);
            a->st_mask[q] = c;
            a->st_allowed[q] = n;
            a->bytes += mb;
            *mask = c;
        }
    }
    return VKI_OK;
}

/* ---- states: start, advance, queries --------------------------------------------------------------- */

vki_status gram_start(gram_automaton *a, gram_state *out, char *err, size_t n_err)
{
    a->err = err;
    a->n_err = n_err;
    const gram_grammar *g = a->g;
    list_reset(a);
    vki_status st = VKI_OK;
    for (uint32_t k = g->rule_alt[g->root]; k < g->rule_alt[g->root + 1] && st == VKI_OK; k++)
        st = work_push(a, g->alts[k], F_EMPTY) ? VKI_OK : oom(a);
    if (st == VKI_OK)
        st = normalize_run(a);
    uint32_t set = NONE;
    if (st == VKI_OK && (set = set_id(a)) == NONE)
        st = VKI_ERR_OUT_OF_HOST_MEMORY;
    return st == VKI_OK ? state_id(a, set, 0, out) : st;
}

bool gram_can_end(const gram_automaton *a, gram_state q)
{
    return q < a->n_st && !a->st_part[q] && (a->set_flags[a->st_set[q]] & SET_EMPTY);
}

bool gram_is_final(const gram_automaton *a, gram_state q)
{
    return gram_can_end(a, q) && a->set_len[a->st_set[q]] == 1;
}

vki_status gram_advance_bytes(gram_automaton *a, gram_state q, const void *bytes, size_t n, gram_state *out,
                              char *err, size_t n_err)
{
    a->err = err;
    a->n_err = n_err;
    const uint8_t *b = bytes;
    if (q >= a->n_st)
        return fail(a, VKI_ERR_INVALID_ARG, "grammar: state %u does not exist", q);
    for (size_t i = 0; i < n; i++) {
        int32_t r;
        vki_status st = delta(a, q, b[i], &r);
        if (st != VKI_OK)
            return st;
        if (r < 0)
            return fail(a, VKI_ERR_INVALID_ARG, "grammar: byte %zu (0x%02x) of the text does not match the grammar",
                        i, b[i]);
        q = (uint32_t)r;
    }
    *out = q;
    return VKI_OK;
}

vki_status gram_advance(gram_automaton *a, gram_state q, int32_t id, gram_state *out, char *err, size_t n_err)
{
    uint32_t len;
    const uint8_t *p = gram_vocab_piece(a->v, id, &len);
    if (!len) {
        if (err && n_err)
            snprintf(err, n_err, "grammar: token %d has no text the grammar could match", id);
        return VKI_ERR_INVALID_ARG;
    }
    vki_status st = gram_advance_bytes(a, q, p, len, out, err, n_err);
    if (st == VKI_ERR_INVALID_ARG && err && n_err)
        snprintf(err, n_err, "grammar: token %d (\"%.*s\") is not allowed here", id, (int)(len < 40 ? len : 40), p);
    return st;
}

bool gram_accepts(gram_automaton *a, const char *text, size_t n)
{
    gram_state q;
    return gram_start(a, &q, NULL, 0) == VKI_OK && gram_advance_bytes(a, q, text, n, &q, NULL, 0) == VKI_OK &&
           gram_can_end(a, q);
}

void gram_automaton_stats(const gram_automaton *a, gram_stats *o)
{
    uint32_t masks = 0, positions = 0;
    for (uint32_t q = 0; q < a->n_st; q++)
        masks += a->st_mask[q] != NULL;
    positions = a->n_loc;
    *o = (gram_stats){.frames = a->n_fr, .sets = a->n_sets, .states = a->n_st, .masks = masks,
                      .positions = positions, .bytes = a->bytes, .walk_nodes = a->walk_nodes,
                      .walk_local = a->walk_by[0], .walk_context = a->walk_by[1], .walk_partial = a->walk_by[2]};
}

/* ---- one request ------------------------------------------------------------------------------------ */

vki_status gram_req_init(gram_req *r, gram_automaton *a, const int32_t *end_ids, uint32_t n_end, char *err,
                         size_t n_err)
{
    *r = (gram_req){.a = a, .end_ids = end_ids, .n_end = n_end};
    r->mask = malloc((size_t)a->words * sizeof *r->mask);
    if (!r->mask)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    vki_status st = gram_start(a, &r->q, err, n_err);
    if (st != VKI_OK)
        gram_req_free(r);
    return st;
}

void gram_req_free(gram_req *r)
{
    free(r->mask);
    r->mask = NULL;
}

vki_status gram_req_mask(gram_req *r, uint32_t *n_allowed, char *err, size_t n_err)
{
    const uint32_t *m = NULL;
    uint32_t n = 0;
    vki_status st = gram_mask(r->a, r->q, &m, &n, err, n_err);
    if (st != VKI_OK)
        return st;
    memcpy(r->mask, m, (size_t)r->a->words * sizeof *m);
    if (gram_can_end(r->a, r->q))
        for (uint32_t k = 0; k < r->n_end; k++) {
            uint32_t id = (uint32_t)r->end_ids[k];
            if (id < r->a->v->n_vocab && !(r->mask[id >> 5] >> (id & 31) & 1)) {
                r->mask[id >> 5] |= 1u << (id & 31);
                n++;
            }
        }
    *n_allowed = n;
    return VKI_OK;
}

vki_status gram_req_accept(gram_req *r, int32_t token, bool *ended, char *err, size_t n_err)
{
    *ended = false;
    for (uint32_t k = 0; k < r->n_end && gram_can_end(r->a, r->q); k++)
        if (r->end_ids[k] == token) {
            *ended = true;
            return VKI_OK;
        }
    return gram_advance(r->a, r->q, token, &r->q, err, n_err);
}

bool gram_req_complete(const gram_req *r) { return gram_is_final(r->a, r->q); }

/* ---- lifetime -------------------------------------------------------------------------------------- */

void gram_automaton_free(gram_automaton *a)
{
    if (!a)
        return;
    for (uint32_t q = 0; q < a->n_st; q++)
        free(a->st_mask[q]);
    for (uint32_t p = 0; p < a->n_loc; p++) {
        free(a->loc[p].tok);
        free(a->loc[p].dep_off);
        free(a->loc[p].dep_node);
    }
    free(a->loc);
    free(a->fr), free(a->succ), free(a->resume), free(a->seen), free(a->loc_of), free(a->fr_map.slot);
    free(a->pool), free(a->set_off), free(a->set_len), free(a->set_flags), free(a->set_map.slot);
    free(a->st_set), free(a->st_part), free(a->st_pop), free(a->trans), free(a->st_mask), free(a->st_allowed), free(a->st_map.slot);
    free(a->list), free(a->work), free(a->visit.slot), free(a->visit_key), free(a->walk_st), free(a->deps);
    free(a->mask);
    gram_grammar_free(a->g);
    free(a);
}

vki_status gram_automaton_create(gram_grammar *g, const gram_vocab *v, const gram_limits *lim, gram_automaton **out)
{
    *out = NULL;
    gram_automaton *a = calloc(1, sizeof *a);
    if (!a) {
        gram_grammar_free(g);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    a->g = g;
    a->v = v;
    a->lim = lim ? *lim : gram_default_limits();
    a->words = (v->n_vocab + 31) / 32;
    a->walk_st = malloc(((size_t)v->max_depth + 2) * sizeof *a->walk_st);
    a->mask = malloc((size_t)a->words * sizeof *a->mask);
    a->visit_key = malloc(128 * sizeof *a->visit_key); /* half the visit map's 256 slots */
    bool ok = a->walk_st && a->mask && a->visit_key && map_init(&a->fr_map, 256) && map_init(&a->set_map, 256) &&
              map_init(&a->st_map, 256) && map_init(&a->visit, 256);
    /* frames 0 (empty) and 1 (popped) exist before anything else */
    ok = ok && frame_id(a, NONE, F_EMPTY) == 0 && frame_id(a, NONE, F_POPPED) == 1;
    a->gen = 1;
    if (!ok) {
        gram_automaton_free(a);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    a->bytes += (uint64_t)a->words * 4;
    *out = a;
    return VKI_OK;
}
