/* KV block manager, white-box: the file includes kv_blocks.c to reach its statics (forcing a
 * hash collision, reordering the LRU list). Free list, ref counts, sealing and deduplication,
 * prefix lookup, LRU eviction order, stale children after a parent's eviction, a collision that
 * must miss, and reuse turned off. sched_kv_check runs after every step. */
#include "support/vt.h"

#include "scheduler/kv_blocks.c"

#define BS 4

static uint32_t g_ref[64]; /* expected ref per block, maintained by the tests */

static void check(const sched_kv *kv)
{
    char msg[256];
    if (sched_kv_check(kv, g_ref, msg, sizeof msg) != VKI_OK)
        fail_msg("%s", msg);
}

static uint32_t alloc1(sched_kv *kv)
{
    uint32_t b = sched_kv_alloc(kv);
    assert_true(b != SCHED_KV_NONE);
    g_ref[b]++;
    return b;
}

static void release1(sched_kv *kv, uint32_t b)
{
    sched_kv_release(kv, &b, 1);
    g_ref[b]--;
}

/* Allocates and seals a chain over tokens[0 .. n * BS). */
static void seal_chain(sched_kv *kv, const int32_t *tokens, uint32_t n, uint32_t *blocks)
{
    for (uint32_t i = 0; i < n; i++) {
        uint32_t b = alloc1(kv);
        uint32_t kept = sched_kv_seal(kv, b, i ? blocks[i - 1] : SCHED_KV_NONE, tokens + i * BS);
        if (kept != b) {
            g_ref[b]--;
            g_ref[kept]++;
        }
        blocks[i] = kept;
        check(kv);
    }
}

static void release_chain(sched_kv *kv, const uint32_t *blocks, uint32_t n)
{
    sched_kv_release(kv, blocks, n);
    for (uint32_t i = 0; i < n; i++)
        g_ref[blocks[i]]--;
    check(kv);
}

static sched_kv *mk(uint32_t n, bool reuse)
{
    memset(g_ref, 0, sizeof g_ref);
    sched_kv *kv;
    assert_int_equal(sched_kv_create(n, BS, reuse, &kv), VKI_OK);
    check(kv);
    return kv;
}

static void test_alloc_release(void **state)
{
    (void)state;
    sched_kv *kv = mk(8, true);
    uint32_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = alloc1(kv);
    assert_int_equal(sched_kv_alloc(kv), SCHED_KV_NONE);
    assert_int_equal(sched_kv_avail(kv), 0);
    check(kv);
    for (int i = 0; i < 8; i += 2)
        release1(kv, b[i]);
    check(kv);
    sched_kv_stats st;
    sched_kv_get_stats(kv, &st);
    assert_int_equal(st.free_blocks, 4);
    assert_int_equal(st.used_blocks, 4);
    assert_int_equal(st.cached_blocks, 0);
    assert_int_equal(st.tokens_per_block, BS);
    sched_kv_destroy(kv);
    assert_int_equal(sched_kv_create(0, BS, true, &kv), VKI_ERR_INVALID_ARG);
    assert_int_equal(sched_kv_create(4, 0, true, &kv), VKI_ERR_INVALID_ARG);
}

static void test_seal_lookup_take(void **state)
{
    (void)state;
    sched_kv *kv = mk(16, true);
    int32_t t[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    uint32_t a[3], found[3], n_cached;
    seal_chain(kv, t, 3, a);
    assert_int_equal(sched_kv_lookup(kv, t, 3, found, &n_cached), 3);
    assert_int_equal(n_cached, 0); /* all in use */
    assert_memory_equal(found, a, sizeof a);
    assert_int_equal(sched_kv_lookup(kv, t, 2, found, &n_cached), 2);
    int32_t u[12];
    memcpy(u, t, sizeof u);
    u[5] = 99; /* second block differs: only the first matches */
    assert_int_equal(sched_kv_lookup(kv, u, 3, found, &n_cached), 1);
    u[5] = 6;
    u[1] = 99; /* the first differs: the same later blocks must not match (chained) */
    assert_int_equal(sched_kv_lookup(kv, u, 3, found, &n_cached), 0);
    release_chain(kv, a, 3);
    assert_int_equal(sched_kv_lookup(kv, t, 3, found, &n_cached), 3);
    assert_int_equal(n_cached, 3);
    sched_kv_take(kv, found, 3);
    for (int i = 0; i < 3; i++)
        g_ref[found[i]]++;
    check(kv);
    sched_kv_stats st;
    sched_kv_get_stats(kv, &st);
    assert_int_equal(st.reused_blocks, 3);
    assert_int_equal(st.cached_blocks, 0);
    release_chain(kv, found, 3);
    sched_kv_destroy(kv);
}

/* Two sequences computing the same block converge on the first sealed copy. */
static void test_seal_dedup(void **state)
{
    (void)state;
    sched_kv *kv = mk(8, true);
    int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint32_t a[2], b[2];
    seal_chain(kv, t, 2, a);
    seal_chain(kv, t, 2, b);
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(sched_kv_ref(kv, a[0]), 2);
    sched_kv_stats st;
    sched_kv_get_stats(kv, &st);
    assert_int_equal(st.used_blocks, 2);
    assert_int_equal(st.free_blocks, 6);
    release_chain(kv, a, 2);
    release_chain(kv, b, 2);
    sched_kv_get_stats(kv, &st);
    assert_int_equal(st.cached_blocks, 2);
    sched_kv_destroy(kv);
}

/* Evicted only when the free list is empty; least recently released first; within a chain
 * the deepest block first. */
static void test_lru_order(void **state)
{
    (void)state;
    sched_kv *kv = mk(6, true);
    int32_t ta[8] = {1, 1, 1, 1, 2, 2, 2, 2}, tb[8] = {3, 3, 3, 3, 4, 4, 4, 4};
    uint32_t a[2], b[2], found[2], n_cached;
    seal_chain(kv, ta, 2, a);
    seal_chain(kv, tb, 2, b);
    release_chain(kv, a, 2);
    release_chain(kv, b, 2);
    uint32_t x = alloc1(kv), y = alloc1(kv); /* the two free blocks: nothing evicted */
    sched_kv_stats st;
    sched_kv_get_stats(kv, &st);
    assert_int_equal(st.evicted_blocks, 0);
    assert_int_equal(st.cached_blocks, 4);
    uint32_t e1 = alloc1(kv);
    assert_int_equal(e1, a[1]); /* A was released first, its child goes first */
    assert_int_equal(sched_kv_lookup(kv, ta, 2, found, &n_cached), 1);
    uint32_t e2 = alloc1(kv);
    assert_int_equal(e2, a[0]);
    assert_int_equal(sched_kv_lookup(kv, ta, 2, found, &n_cached), 0);
    assert_int_equal(sched_kv_lookup(kv, tb, 2, found, &n_cached), 2);
    uint32_t e3 = alloc1(kv);
    assert_int_equal(e3, b[1]);
    sched_kv_get_stats(kv, &st);
    assert_int_equal(st.evicted_blocks, 3);
    release1(kv, x);
    release1(kv, y);
    release1(kv, e1);
    release1(kv, e2);
    release1(kv, e3);
    check(kv);
    sched_kv_destroy(kv);
}

/* A parent evicted before its child leaves the child stale: re-sealing the parent's block with
 * the same tokens (new generation) must not revive the old child. */
static void test_stale_child(void **state)
{
    (void)state;
    sched_kv *kv = mk(2, true);
    int32_t t[8] = {5, 6, 7, 8, 9, 10, 11, 12};
    uint32_t a[2], found[2], n_cached;
    seal_chain(kv, t, 2, a);
    release_chain(kv, a, 2);
    lru_remove(kv, a[1]); /* put the child behind its parent */
    lru_push_tail(kv, a[1]);
    check(kv);
    uint32_t x = alloc1(kv);
    assert_int_equal(x, a[0]); /* the parent went first */
    check(kv);
    uint32_t kept = sched_kv_seal(kv, x, SCHED_KV_NONE, t); /* same tokens, same physical block */
    assert_int_equal(kept, x);
    check(kv);
    assert_int_equal(sched_kv_lookup(kv, t, 2, found, &n_cached), 1); /* the old child is stale */
    release1(kv, x);
    sched_kv_destroy(kv);
}

/* Force two different token blocks under one hash: the lookup must compare tokens and miss. */
static void test_hash_collision_misses(void **state)
{
    (void)state;
    sched_kv *kv = mk(4, true);
    int32_t t1[4] = {1, 2, 3, 4}, t2[4] = {9, 9, 9, 9};
    uint32_t a[1], found[1], n_cached;
    seal_chain(kv, t1, 1, a);
    table_remove(kv, a[0]);
    kv->b[a[0]].hash = block_hash(ROOT_HASH, t2, BS); /* t1's block now sits under t2's hash */
    table_insert(kv, a[0]);
    assert_int_equal(sched_kv_lookup(kv, t2, 1, found, &n_cached), 0);
    release1(kv, a[0]);
    sched_kv_destroy(kv);
}

static void test_reuse_off(void **state)
{
    (void)state;
    sched_kv *kv = mk(4, false);
    int32_t t[4] = {1, 2, 3, 4};
    uint32_t a[1], found[1], n_cached;
    seal_chain(kv, t, 1, a);
    assert_false(sched_kv_is_sealed(kv, a[0]));
    release_chain(kv, a, 1);
    assert_int_equal(sched_kv_lookup(kv, t, 1, found, &n_cached), 0);
    sched_kv_stats st;
    sched_kv_get_stats(kv, &st);
    assert_int_equal(st.free_blocks, 4);
    assert_int_equal(st.cached_blocks, 0);
    sched_kv_destroy(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_release),
        cmocka_unit_test(test_seal_lookup_take),
        cmocka_unit_test(test_seal_dedup),
        cmocka_unit_test(test_lru_order),
        cmocka_unit_test(test_stale_child),
        cmocka_unit_test(test_hash_collision_misses),
        cmocka_unit_test(test_reuse_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
