/* splitmix64 (Steele, Lea, Flood 2014): the one generator behind every seeded draw in the project
 * (synthetic weights, workloads, request seeds, benchmarks, tests). One copy, so that a seed means
 * the same sequence everywhere; header-only because it is three multiplies and callers want it
 * inlined. Not cryptographic. */
#ifndef VKI_ENGINE_RNG_H
#define VKI_ENGINE_RNG_H

#include <stdint.h>

/* The finaliser alone: a bijective 64-bit avalanche (every input bit flips about half of the
 * output bits). Hash tables use it to spread keys over buckets. */
static inline uint64_t vki_mix64_fin(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Stateless: the draw that follows state x, i.e. the finaliser of x + golden gamma. */
static inline uint64_t vki_mix64(uint64_t x) { return vki_mix64_fin(x + 0x9e3779b97f4a7c15ull); }

/* Next draw of the sequence; advances *state by the golden gamma. */
static inline uint64_t vki_splitmix64(uint64_t *state) { return vki_mix64_fin(*state += 0x9e3779b97f4a7c15ull); }

#endif
