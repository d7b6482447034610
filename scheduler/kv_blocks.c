/* KV block manager (see kv_blocks.h for the states and the reuse rule). Indices, not pointers:
 * the lists and hash chains are intrusive uint32 links in the block array, so no call allocates
 * after sched_kv_create. */
#include "scheduler/kv_blocks.h"

#include "engine/rng.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE SCHED_KV_NONE
#define ROOT_HASH 0x6a09e667f3bcc908ull /* parent hash of a chain's first block */

typedef struct kv_block {
    uint64_t hash;       /* chained hash; valid while sealed */
    uint32_t ref;        /* live block tables holding this block */
    uint32_t gen;        /* bumped on eviction: children sealed under an older gen are stale */
    uint32_t parent;     /* physical parent when sealed (NONE: first block of a chain) */
    uint32_t parent_gen; /* the parent's gen when this block was sealed */
    uint32_t prev, next; /* free list (next only) or LRU list links */
    uint32_t hprev, hnext; /* hash bucket chain links */
    bool sealed;         /* full, immutable, in the hash table */
} kv_block;

struct sched_kv {
    uint32_t n_blocks, block_size;
    bool reuse;
    kv_block *b;         /* [n_blocks] */
    int32_t *tokens;     /* [n_blocks][block_size] tokens of sealed blocks, to confirm hits */
    uint32_t *buckets;   /* [bucket_mask + 1] first block of each hash chain */
    uint32_t bucket_mask;
    uint32_t free_head, n_free;
    uint32_t lru_head, lru_tail, n_cached; /* head = least recently released */
    uint64_t reused_blocks, evicted_blocks;
    uint64_t shared_refs; /* sum over blocks of max(0, ref - 1): references beyond the first */
    bool windowed;        /* tables release blocks mid-run: a child may outlive its parent */
};


/* Order-sensitive 64-bit hash of (parent hash, tokens): a multiply-xorshift step per token (3
 * operations; this runs for every token that fills a block) and a full avalanche at the end. It
 * only has to spread keys over buckets: a hit is always confirmed by comparing tokens. O(n). */
static uint64_t block_hash(uint64_t parent_hash, const int32_t *t, uint32_t n)
{
    uint64_t h = parent_hash ^ 0x9e3779b97f4a7c15ull;
    for (uint32_t i = 0; i < n; i++) {
        h = (h ^ (uint32_t)t[i]) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    return vki_mix64_fin(h ^ n);
}

vki_status sched_kv_create(uint32_t n_blocks, uint32_t block_size, bool reuse, sched_kv **out)
{
    *out = NULL;
    if (n_blocks == 0 || n_blocks == NONE || block_size == 0)
        return VKI_ERR_INVALID_ARG;
    uint64_t n_tok = (uint64_t)n_blocks * block_size;
    if (n_tok > SIZE_MAX / sizeof(int32_t))
        return VKI_ERR_INVALID_ARG;
    uint32_t nb = 1;
    while (nb < n_blocks && nb < (1u << 31))
        nb <<= 1;
    sched_kv *kv = calloc(1, sizeof *kv);
    if (!kv)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    kv->b = calloc(n_blocks, sizeof *kv->b);
    kv->tokens = reuse ? malloc((size_t)n_tok * sizeof(int32_t)) : NULL;
    kv->buckets = reuse ? malloc((size_t)nb * sizeof(uint32_t)) : NULL;
    if (!kv->b || (reuse && (!kv->tokens || !kv->buckets))) {
        sched_kv_destroy(kv);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    kv->reuse = reuse;
    kv->bucket_mask = nb - 1;
    if (reuse)
        for (uint32_t i = 0; i < nb; i++)
            kv->buckets[i] = NONE;
    /* Free list in ascending order, so a fresh manager hands out blocks 0, 1, 2, ... */
    for (uint32_t i = 0; i < n_blocks; i++) {
        kv->b[i] = (kv_block){.parent = NONE, .prev = NONE, .next = i + 1 < n_blocks ? i + 1 : NONE,
                              .hprev = NONE, .hnext = NONE};
    }
    kv->free_head = 0;
    kv->n_free = n_blocks;
    kv->lru_head = kv->lru_tail = NONE;
    *out = kv;
    return VKI_OK;
}

void sched_kv_destroy(sched_kv *kv)
{
    if (!kv)
        return;
    free(kv->b);
    free(kv->tokens);
    free(kv->buckets);
    free(kv);
}

uint32_t sched_kv_avail(const sched_kv *kv) { return kv->n_free + kv->n_cached; }

static void lru_remove(sched_kv *kv, uint32_t x)
{
    kv_block *b = &kv->b[x];
    if (b->prev != NONE)
        kv->b[b->prev].next = b->next;
    else
        kv->lru_head = b->next;
    if (b->next != NONE)
        kv->b[b->next].prev = b->prev;
    else
        kv->lru_tail = b->prev;
    b->prev = b->next = NONE;
    kv->n_cached--;
}

static void lru_push_tail(sched_kv *kv, uint32_t x)
{
    kv_block *b = &kv->b[x];
    b->next = NONE;
    b->prev = kv->lru_tail;
    if (kv->lru_tail != NONE)
        kv->b[kv->lru_tail].next = x;
    else
        kv->lru_head = x;
    kv->lru_tail = x;
    kv->n_cached++;
}

static void table_insert(sched_kv *kv, uint32_t x)
{
    uint32_t *head = &kv->buckets[kv->b[x].hash & kv->bucket_mask];
    kv->b[x].hprev = NONE;
    kv->b[x].hnext = *head;
    if (*head != NONE)
        kv->b[*head].hprev = x;
    *head = x;
    kv->b[x].sealed = true;
}

static void table_remove(sched_kv *kv, uint32_t x)
{
    kv_block *b = &kv->b[x];
    if (b->hprev != NONE)
        kv->b[b->hprev].hnext = b->hnext;
    else
        kv->buckets[b->hash & kv->bucket_mask] = b->hnext;
    if (b->hnext != NONE)
        kv->b[b->hnext].hprev = b->hprev;
    b->hprev = b->hnext = NONE;
    b->sealed = false;
}

/* The sealed block holding exactly `t` after the chain ending at `parent`, or NONE. The hash
 * only narrows the search; parent identity (block + gen) and tokens decide. */
static uint32_t table_find(const sched_kv *kv, uint64_t h, uint32_t parent, const int32_t *t)
{
    size_t bytes = (size_t)kv->block_size * sizeof(int32_t);
    for (uint32_t x = kv->buckets[h & kv->bucket_mask]; x != NONE; x = kv->b[x].hnext) {
        const kv_block *b = &kv->b[x];
        if (b->hash != h || b->parent != parent)
            continue;
        if (parent != NONE && b->parent_gen != kv->b[parent].gen)
            continue;
        if (!memcmp(kv->tokens + (size_t)x * kv->block_size, t, bytes))
            return x;
    }
    return NONE;
}

uint32_t sched_kv_alloc(sched_kv *kv)
{
    uint32_t x = kv->free_head;
    if (x != NONE) {
        kv->free_head = kv->b[x].next;
        kv->b[x].next = NONE;
        kv->n_free--;
    } else if (kv->lru_head != NONE) {
        x = kv->lru_head;
        lru_remove(kv, x);
        table_remove(kv, x);
        kv->b[x].gen++;
        kv->evicted_blocks++;
    } else {
        return NONE;
    }
    kv->b[x].ref = 1;
    kv->b[x].parent = NONE;
    return x;
}

static void release_one(sched_kv *kv, uint32_t x)
{
    kv_block *b = &kv->b[x];
    kv->shared_refs -= b->ref > 1;
    if (b->ref == 0 || --b->ref > 0)
        return;
    if (b->sealed) {
        lru_push_tail(kv, x);
    } else {
        b->next = kv->free_head;
        kv->free_head = x;
        kv->n_free++;
    }
}

void sched_kv_release(sched_kv *kv, const uint32_t *blocks, uint32_t n)
{
    for (uint32_t i = n; i-- > 0;)
        release_one(kv, blocks[i]);
}

uint32_t sched_kv_lookup(const sched_kv *kv, const int32_t *tokens, uint32_t max_blocks, uint32_t *out,
                         uint32_t *n_cached)
{
    *n_cached = 0;
    if (!kv->reuse)
        return 0;
    uint32_t parent = NONE, n = 0;
    uint64_t ph = ROOT_HASH;
    for (; n < max_blocks; n++) {
        const int32_t *t = tokens + (size_t)n * kv->block_size;
        uint64_t h = block_hash(ph, t, kv->block_size);
        uint32_t x = table_find(kv, h, parent, t);
        if (x == NONE)
            break;
        out[n] = x;
        *n_cached += kv->b[x].ref == 0;
        parent = x;
        ph = h;
    }
    return n;
}

static void take_one(sched_kv *kv, uint32_t x)
{
    if (kv->b[x].ref == 0)
        lru_remove(kv, x);
    kv->shared_refs += kv->b[x].ref > 0;
    kv->b[x].ref++;
}

uint64_t sched_kv_shared(const sched_kv *kv) { return kv->shared_refs; }

void sched_kv_set_windowed(sched_kv *kv) { kv->windowed = true; }

void sched_kv_take(sched_kv *kv, const uint32_t *blocks, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        take_one(kv, blocks[i]);
    kv->reused_blocks += n;
}

void sched_kv_retain(sched_kv *kv, const uint32_t *blocks, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        take_one(kv, blocks[i]);
}

uint32_t sched_kv_seal(sched_kv *kv, uint32_t b, uint32_t parent, const int32_t *tokens)
{
    if (!kv->reuse || kv->b[b].sealed || kv->b[b].ref != 1)
        return b;
    if (parent != NONE && !kv->b[parent].sealed)
        return b; /* an unsealed parent cannot anchor a chain: leave b private */
    uint64_t h = block_hash(parent == NONE ? ROOT_HASH : kv->b[parent].hash, tokens, kv->block_size);
    uint32_t x = table_find(kv, h, parent, tokens);
    if (x != NONE) {
        take_one(kv, x);
        release_one(kv, b);
        return x;
    }
    kv_block *blk = &kv->b[b];
    blk->hash = h;
    blk->parent = parent;
    blk->parent_gen = parent == NONE ? 0 : kv->b[parent].gen;
    memcpy(kv->tokens + (size_t)b * kv->block_size, tokens, (size_t)kv->block_size * sizeof(int32_t));
    table_insert(kv, b);
    return b;
}

bool sched_kv_is_sealed(const sched_kv *kv, uint32_t b) { return b < kv->n_blocks && kv->b[b].sealed; }

uint32_t sched_kv_ref(const sched_kv *kv, uint32_t b) { return b < kv->n_blocks ? kv->b[b].ref : 0; }

void sched_kv_get_stats(const sched_kv *kv, sched_kv_stats *st)
{
    *st = (sched_kv_stats){
        .max_blocks = kv->n_blocks,
        .free_blocks = kv->n_free,
        .cached_blocks = kv->n_cached,
        .used_blocks = kv->n_blocks - kv->n_free - kv->n_cached,
        .tokens_per_block = kv->block_size,
        .reused_blocks = kv->reused_blocks,
        .evicted_blocks = kv->evicted_blocks,
    };
}

/* ---- invariant check (tests; O(pool)) ----------------------------------------------------- */

#define CHECK(cond, ...)                                                                         \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            snprintf(msg, msg_cap, __VA_ARGS__);                                                 \
            free(mark);                                                                          \
            return VKI_ERR_INTERNAL;                                                             \
        }                                                                                        \
    } while (0)

vki_status sched_kv_check(const sched_kv *kv, const uint32_t *expected_ref, char *msg, size_t msg_cap)
{
    uint32_t n = kv->n_blocks;
    uint8_t *mark = calloc(n, 1); /* 1 = on the free list, 2 = on the LRU list */
    CHECK(mark, "out of memory");
    uint32_t cnt = 0;
    for (uint32_t x = kv->free_head; x != NONE; x = kv->b[x].next) {
        CHECK(x < n && !mark[x] && cnt < n, "free list corrupt at block %u", x);
        mark[x] = 1;
        cnt++;
    }
    CHECK(cnt == kv->n_free, "free list holds %u blocks, counter says %u", cnt, kv->n_free);
    cnt = 0;
    uint32_t prev = NONE;
    for (uint32_t x = kv->lru_head; x != NONE; x = kv->b[x].next) {
        CHECK(x < n && !mark[x] && cnt < n && kv->b[x].prev == prev, "LRU list corrupt at block %u", x);
        mark[x] = 2;
        prev = x;
        cnt++;
    }
    CHECK(prev == kv->lru_tail, "LRU tail is %u, list ends at %u", kv->lru_tail, prev);
    CHECK(cnt == kv->n_cached, "LRU list holds %u blocks, counter says %u", cnt, kv->n_cached);
    uint32_t n_sealed = 0;
    uint64_t shared = 0;
    for (uint32_t x = 0; x < n; x++) {
        const kv_block *b = &kv->b[x];
        shared += b->ref > 1 ? b->ref - 1 : 0;
        CHECK(b->ref == expected_ref[x], "block %u has ref %u, %u block tables hold it", x, b->ref, expected_ref[x]);
        if (b->ref == 0)
            CHECK(mark[x] == (b->sealed ? 2 : 1), "block %u: ref 0, sealed %d, but list mark %d", x, b->sealed, mark[x]);
        else
            CHECK(mark[x] == 0, "block %u: ref %u but on a %s list", x, b->ref, mark[x] == 1 ? "free" : "LRU");
        CHECK(!b->sealed || kv->reuse, "block %u sealed with reuse off", x);
        if (!b->sealed)
            continue;
        n_sealed++;
        const int32_t *t = kv->tokens + (size_t)x * kv->block_size;
        uint32_t y = kv->buckets[b->hash & kv->bucket_mask];
        while (y != NONE && y != x)
            y = kv->b[y].hnext;
        CHECK(y == x, "sealed block %u is not in its hash bucket", x);
        bool live_parent = b->parent == NONE ||
                           (kv->b[b->parent].sealed && kv->b[b->parent].gen == b->parent_gen);
        if (live_parent) {
            uint64_t ph = b->parent == NONE ? ROOT_HASH : kv->b[b->parent].hash;
            CHECK(block_hash(ph, t, kv->block_size) == b->hash, "block %u: stored hash is not the chain hash", x);
            CHECK(table_find(kv, b->hash, b->parent, t) == x, "sealed block %u is shadowed by a duplicate", x);
        } else {
            CHECK(b->ref == 0 || kv->windowed, "block %u is in use but its parent %u was evicted", x, b->parent);
        }
    }
    if (kv->reuse) {
        cnt = 0;
        for (uint32_t i = 0; i <= kv->bucket_mask; i++)
            for (uint32_t x = kv->buckets[i]; x != NONE && cnt <= n; x = kv->b[x].hnext) {
                CHECK(kv->b[x].sealed && (kv->b[x].hash & kv->bucket_mask) == i, "bucket %u holds block %u wrongly", i, x);
                cnt++;
            }
        CHECK(cnt == n_sealed, "hash table holds %u blocks, %u are sealed", cnt, n_sealed);
    }
    CHECK(shared == kv->shared_refs, "%llu references beyond the first, counter %llu", (unsigned long long)shared,
          (unsigned long long)kv->shared_refs);
    free(mark);
    return VKI_OK;
}
