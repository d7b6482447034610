/* KV block manager: accounting of the engine's KV page pool in fixed-size blocks (one block =
 * one engine page of `block_size` tokens). Pure bookkeeping: no Vulkan, no threads.
 *
 * Every block is in exactly one state:
 *   free    ref 0, not cached: on the free list;
 *   cached  ref 0, holds the KV of a full block that a finished (or paused) sequence left
 *           behind: in the hash table and on the LRU list, evicted only when the free list is
 *           empty;
 *   used    ref > 0: in the block tables of `ref` live sequences.
 * A block is shared by several sequences (ref > 1) only when it is full and sealed: its KV is
 * immutable from then on, so nobody ever writes a shared block.
 *
 * Prefix reuse: a sealed block is keyed by a 64-bit hash chained over (parent block's hash,
 * the block's tokens). A hit is confirmed by comparing the tokens and the physical parent
 * block together with the parent's generation (bumped whenever a block is evicted), so by
 * induction over the chain a matched prefix holds exactly the tokens asked for: a hash
 * collision costs a miss, never wrong KV.
 *
 * Costs: alloc, take, release, seal are O(1) plus O(block_size) for hashing/comparing tokens;
 * lookup is O(matched blocks * block_size). Nothing scans the pool except sched_kv_check. */
#ifndef VKI_SCHED_KV_BLOCKS_H
#define VKI_SCHED_KV_BLOCKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vkinfer.h"

#define SCHED_KV_NONE UINT32_MAX

typedef struct sched_kv sched_kv;

typedef struct sched_kv_stats {
    uint32_t max_blocks;       /* pool size */
    uint32_t free_blocks;      /* on the free list */
    uint32_t cached_blocks;    /* ref 0 but kept for reuse (evictable) */
    uint32_t used_blocks;      /* ref > 0 */
    uint32_t tokens_per_block;
    uint64_t reused_blocks;    /* cumulative lookups' matched blocks that were taken */
    uint64_t evicted_blocks;   /* cumulative cached blocks evicted to satisfy an allocation */
} sched_kv_stats;

/* n_blocks >= 1, block_size >= 1. reuse = false: no hashing, released blocks go straight to the
 * free list. */
vki_status sched_kv_create(uint32_t n_blocks, uint32_t block_size, bool reuse, sched_kv **out);
void sched_kv_destroy(sched_kv *kv);

/* Blocks an allocation can get now: free + cached. O(1). */
uint32_t sched_kv_avail(const sched_kv *kv);

/* A block with ref 1 and undefined contents: from the free list, else the least recently
 * released cached block (evicted: it leaves the hash table). SCHED_KV_NONE when none is left. */
uint32_t sched_kv_alloc(sched_kv *kv);

/* Drops one reference of each of blocks[0..n), last first, so that the deeper blocks of a chain
 * become least recently used before their parents (a child without its parent is unreachable). */
void sched_kv_release(sched_kv *kv, const uint32_t *blocks, uint32_t n);

/* Longest cached prefix of tokens[0 .. max_blocks * block_size) in whole blocks, without taking
 * it: writes the blocks to out[0..ret) and how many of them are cached (ref 0: taking them
 * lowers sched_kv_avail) to *n_cached. Always 0 when reuse is off. */
uint32_t sched_kv_lookup(const sched_kv *kv, const int32_t *tokens, uint32_t max_blocks, uint32_t *out,
                         uint32_t *n_cached);

/* Takes one reference of each of blocks[0..n) found by sched_kv_lookup (no other call in
 * between). Adds n * block_size to the reused-token count. */
void sched_kv_take(sched_kv *kv, const uint32_t *blocks, uint32_t n);

/* One more reference of each of blocks[0..n) (sealed, or held by someone): a block table copied
 * into another (beam search; full blocks only: nobody writes a shared block) or a holder outside
 * any sequence (a pinned session). Not counted as reuse. O(n). */
void sched_kv_retain(sched_kv *kv, const uint32_t *blocks, uint32_t n);

/* Block `b` (ref 1, owned by one sequence) is now full of the KV of `tokens[0..block_size)`,
 * after the chain ending at `parent` (a sealed block, or SCHED_KV_NONE for the first block).
 * Returns the block the sequence keeps: `b`, now sealed and reusable, or an identical block that
 * was already sealed (then `b` is released and the chains of the sequences that computed the same
 * prefix at the same time converge). Returns `b` unchanged when reuse is off. */
uint32_t sched_kv_seal(sched_kv *kv, uint32_t b, uint32_t parent, const int32_t *tokens);

/* References beyond the first, summed over blocks: what releasing shared blocks while their
 * sequences run (sliding windows) takes back from the reservations (sched.c). O(1). */
uint64_t sched_kv_shared(const sched_kv *kv);

/* Block tables release blocks before their sequences end (sliding windows): a block in use may
 * then outlive its evicted parent (it only becomes unreachable for prefix lookups), which
 * sched_kv_check otherwise reports. */
void sched_kv_set_windowed(sched_kv *kv);

bool sched_kv_is_sealed(const sched_kv *kv, uint32_t b);
uint32_t sched_kv_ref(const sched_kv *kv, uint32_t b);
void sched_kv_get_stats(const sched_kv *kv, sched_kv_stats *st);

/* Test/debug: checks every invariant in O(pool): the state partition and counters, the lists, the
 * hash table (every sealed block findable under its recomputed hash), and that ref[b] equals
 * expected_ref[b] (the number of live block tables holding b, counted by the caller). Returns
 * VKI_OK or VKI_ERR_INTERNAL with a message in msg. */
vki_status sched_kv_check(const sched_kv *kv, const uint32_t *expected_ref, char *msg, size_t msg_cap);

#endif
