// Paged KV pool access shared by kv_write and the attention kernels (layout: vki_shared.h).
// A chunk is 8 consecutive dims of one K or V row: one uvec4 of packed halves (KV_F16) or two
// vec4 (F32). Chunk index of (page, kv head, slot, c):
//     ((page * n_kv_heads + kvh) * page_size + slot) * (head_dim / 8) + c
// Indices fit 32 bits because one pool is one binding (<= 4 GiB = 2^28 chunks of 16 bytes).
#ifdef KV_F16
#define KV_T uvec4
#define KV_LOAD(arr, ci, lo, hi)                                                              \
    {                                                                                         \
        uvec4 u_ = arr[ci];                                                                   \
        lo = vec4(unpackHalf2x16(u_.x), unpackHalf2x16(u_.y));                                \
        hi = vec4(unpackHalf2x16(u_.z), unpackHalf2x16(u_.w));                                \
    }
#else
#define KV_T vec4
#define KV_LOAD(arr, ci, lo, hi)                                                              \
    {                                                                                         \
        lo = arr[2u * (ci)];                                                                  \
        hi = arr[2u * (ci) + 1u];                                                             \
    }
#endif

#define NEG_INF uintBitsToFloat(0xff800000u)

// Chunk index of dims [8c, 8c + 8) of position pos's row for kv head kvh, through the page table.
#define KV_ROW_CHUNK(page, kvh, slot, n_kv, page_size, d8) ((((page) * (n_kv) + (kvh)) * (page_size) + (slot)) * (d8))
