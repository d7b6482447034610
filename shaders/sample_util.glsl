// Helpers of the sampling kernel, mirrored bit for bit by engine/sample_ref.c:
//  - 64-bit unsigned arithmetic on uvec2 (x = low word, y = high word), so the kernel needs
//    neither shaderInt64 nor 64-bit atomics;
//  - the order key of a logit (unsigned compare = float compare, -0 folded into +0);
//  - Philox4x32-10 (Salmon et al., SC'11), the counter-based generator keyed by the seed.

uvec2 add64(uvec2 a, uvec2 b)
{
    uint c;
    uint lo = uaddCarry(a.x, b.x, c);
    return uvec2(lo, a.y + b.y + c);
}

uvec2 sub64(uvec2 a, uvec2 b)
{
    uint br;
    uint lo = usubBorrow(a.x, b.x, br);
    return uvec2(lo, a.y - b.y - br);
}

bool gt64(uvec2 a, uvec2 b) { return a.y > b.y || (a.y == b.y && a.x > b.x); }
bool ge64(uvec2 a, uvec2 b) { return a.y > b.y || (a.y == b.y && a.x >= b.x); }

// a * b mod 2^64
uvec2 mul64x32(uvec2 a, uint b)
{
    uint hi, lo;
    umulExtended(a.x, b, hi, lo);
    return uvec2(lo, hi + a.y * b);
}

// floor(a * b / 2^32)
uvec2 mulhi64x32(uvec2 a, uint b)
{
    uint h0, l0, h1, l1, c;
    umulExtended(a.x, b, h0, l0);
    umulExtended(a.y, b, h1, l1);
    uint mid = uaddCarry(l1, h0, c);
    return uvec2(mid, h1 + c);
}

// floor(a * b / 2^64): the high half of the 128-bit product
uvec2 mulhi64(uvec2 a, uvec2 b)
{
    uint h00, l00, h01, l01, h10, l10, h11, l11, c0, c1, c2, c3, c4;
    umulExtended(a.x, b.x, h00, l00);
    umulExtended(a.x, b.y, h01, l01);
    umulExtended(a.y, b.x, h10, l10);
    umulExtended(a.y, b.y, h11, l11);
    uint s = uaddCarry(h00, l01, c0); // bits 32..63 (only the carries matter)
    s = uaddCarry(s, l10, c1);
    uint lo = uaddCarry(h01, h10, c2);
    lo = uaddCarry(lo, l11, c3);
    lo = uaddCarry(lo, c0 + c1, c4);
    return uvec2(lo, h11 + c2 + c3 + c4);
}

// f >= 0 and < 2^64, integral part as uvec2 (f has 24 significant bits, so both steps are exact)
uvec2 f_to_u64(float f)
{
    uint hi = uint(f * 2.3283064365386963e-10);
    return uvec2(uint(f - float(hi) * 4294967296.0), hi);
}

// Unsigned order key: key_of(a) < key_of(b) <=> a < b for non-NaN floats; -0 and +0 share a key.
uint key_of(float z)
{
    uint u = floatBitsToUint(z);
    if (u == 0x80000000u)
        u = 0u;
    return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

float z_of_key(uint k) { return uintBitsToFloat((k & 0x80000000u) != 0u ? (k & 0x7fffffffu) : ~k); }

uvec4 philox4x32_10(uvec4 c, uvec2 k)
{
    [[unroll]] for (int i = 0; i < 10; i++) {
        uint hi0, lo0, hi1, lo1;
        umulExtended(0xD2511F53u, c.x, hi0, lo0);
        umulExtended(0xCD9E8D57u, c.z, hi1, lo1);
        c = uvec4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
        k += uvec2(0x9E3779B9u, 0xBB67AE85u);
    }
    return c;
}
