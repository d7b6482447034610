/* A streaming 64-bit hash of bytes: the model fingerprint (gguf_fingerprint) and the checksum of
 * session files (host/batch/batch_session_file.c). Not cryptographic: it detects accidents
 * (truncation, flipped bits, another model's file), not an attacker who forges a file.
 *
 * Each 8-byte little-endian word w goes through h = ((h ^ w) * odd) ^ (... >> 29): for fixed
 * words elsewhere every step is a bijection of w and of h, so changing any single word always
 * changes the result; the length is folded in at the end, so a truncation does too. Costs one
 * multiply per 8 bytes (several GB/s); the result does not depend on how the bytes are split
 * across vki_hash_update calls. Header-only: a few lines that callers want inlined. */
#ifndef VKI_ENGINE_HASH_H
#define VKI_ENGINE_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "engine/rng.h"

typedef struct vki_hash {
    uint64_t h;
    uint64_t n;       /* bytes hashed */
    uint8_t tail[8];  /* bytes of the current partial word: n % 8 of them */
} vki_hash;

static inline void vki_hash_init(vki_hash *s, uint64_t seed)
{
    *s = (vki_hash){.h = vki_mix64(seed)};
}

static inline uint64_t vki_hash_word_(uint64_t h, const uint8_t *p)
{
    uint64_t w = (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
                 (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29);
}

static inline void vki_hash_update(vki_hash *s, const void *data, size_t n)
{
    const uint8_t *p = data;
    uint32_t t = (uint32_t)(s->n & 7);
    s->n += n;
    if (t) { /* complete the partial word first */
        while (n && t < 8) {
            s->tail[t++] = *p++;
            n--;
        }
        if (t < 8)
            return;
        s->h = vki_hash_word_(s->h, s->tail);
    }
    for (; n >= 8; n -= 8, p += 8)
        s->h = vki_hash_word_(s->h, p);
    memcpy(s->tail, p, n);
}

static inline void vki_hash_u64(vki_hash *s, uint64_t v) /* a value, as its little-endian bytes */
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    vki_hash_update(s, b, 8);
}

static inline uint64_t vki_hash_final(const vki_hash *s)
{
    uint64_t h = s->h;
    uint32_t t = (uint32_t)(s->n & 7);
    if (t) {
        uint8_t last[8] = {0};
        memcpy(last, s->tail, t);
        h = vki_hash_word_(h, last);
    }
    return vki_mix64_fin(h ^ s->n);
}

#endif
