// AVX-512 VBMI + BITALG products of the i-quants with 2-bit grids (iq2_xxs, iq2_xs, iq2_s) for up to 15 tokens
// (iq2_s: 9); the only file compiled with -mavx512vbmi -mavx512bitalg. The AVX-512 table takes them on CPUs that
// report both (AMD Zen 4 and later, Intel Ice Lake and later) below its vpdpbusd lane tiles' thresholds (up to
// 7 / 5 / 4 tokens: kernels_avx512.cpp's use_lanes_vnni).
//
// Every byte of these grids is 8, 25 or 43, so an entry of 8 magnitudes is 16 bits of 2-bit codes. Per super-block
// and row the kernel unpacks in registers, with no scalar table loads (the AVX2 kernel's 32 grid and 32 sign
// loads per super-block bound it at ~17 ns per super-block row on Zen 4, a quarter of the memory's rate):
// - two super-blocks at a time (super-block s of two rows): their 64 grid indices as bytes, the 16-bit code words'
//   low and high bytes by vpermt2b from the code table as two byte planes (128 entries a lookup: iq2_xxs's 256
//   entries 2 lookups and a blend per plane, iq2_xs's 512 4 and 3, both in registers; iq2_s's 1024 8 and 7, from
//   memory), interleaved back to words by vpunpck{l,h}bw (16-bit lookups by vpermt2w cover 64 entries: twice the
//   lookups and blends per index);
// - vector r of the super-block takes the groups 4 k + r (k = 0 .. 7; iq2_s: the groups 8 r + k, the weights'
//   own order, by the order of its lookups): one vpmultishiftqb moves their 2-bit codes from the code words to
//   bytes, vpermb turns codes into magnitudes; the activations are put in that order once per call (XP);
// - the sign bytes (iq2_xxs / iq2_xs: ksigns_iq2xs by vpermt2b on the 7-bit fields) to one 64-bit mask per vector
//   by vpshufbitqmb (iq2_s: its sign bytes as stored are the masks), which negates the token's activations
//   (masked vpsubb);
// - vpdpbusd of magnitudes and signed activations, two vectors' int32 sums packed to int16 (|sum| <= 4 x 43 x
//   127) and vpdpwssd with the groups' scales 2 s + 1; one float multiply-add per super-block and token.
// Integer sums are exact, so results equal the scalar kernels' up to float summation order. Measured against
// the AVX2 kernels and llama.cpp's: bench/NOTES.md, "AVX-512 VBMI kernels for the IQ2 types" and "the IQ2 types
// looked up as two byte planes".
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "iq_tables.h"
#include "kernel_tiles.h"
#include "kernels.h"

namespace clover {
namespace {

// A grid of N entries as 16-bit code words (bits 2j, 2j + 1: the code of byte j; 8 -> 0, 25 -> 1, 43 -> 2; the
// grids hold no other byte: tests/test_lowbit.py's test_iq2_every_grid_entry multiplies every entry).
template <int N>
struct Codes {
    alignas(64) uint16_t w[N];
    explicit Codes(const uint64_t* grid) {
        for (int i = 0; i < N; i++) w[i] = 0;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < 8; j++) {
                const int v = (int)((grid[i] >> (8 * j)) & 0xff);
                w[i] = (uint16_t)(w[i] | ((v == 8 ? 0 : v == 25 ? 1 : 2) << (2 * j)));
            }
    }
};

// Vector r of a super-block holds the groups of 8 weights 4 k + r, k = 0 .. 7 (qword k: group 4 k + r), the order
// in which vpmultishiftqb takes them from the code words (qword k of the code vector: groups 4 k .. 4 k + 3) with
// no other shuffle; the activations are put in the same order once per call (XP). iq2_s orders its code words
// for the weights' own order instead (U::NATURAL: XP is the activations as they are).
struct alignas(64) XP {
    int8_t qs[QK_K];  // vector r, qword k: the token's activations 8 (4 k + r) .. + 7 (U::NATURAL: 8 (8 r + k) ..)
    float d;
};

// The constant vectors, built once.
struct Consts {
    __m512i codes_at[4];  // vector r: per qword, byte j at bit offset 16 r + 2 j (code j of group 4 k + r)
    __m512i values;       // byte i: the magnitude of code i & 3
    __m512i sign8[4];     // vector r, byte 8 k + j: bit 8 r + j of qword k (sign bytes 8 apart per group)
    __m512i sign16[4];    // the same with the sign bytes 16 apart (bit 16 r + j)
    __m512i ks0, ks1;     // ksigns_iq2xs, bytes 0-63 and 64-127
    __m512i sc_pair[2];   // vectors (2 p, 2 p + 1) packed: the group of 16 of each int16 lane's sum
    Consts() {
        alignas(64) uint16_t w[32];
        alignas(64) uint8_t b[64];
        for (int r = 0; r < 4; r++) {
            for (int i = 0; i < 64; i++) b[i] = (uint8_t)(16 * r + 2 * (i % 8));
            codes_at[r] = _mm512_load_si512(b);
            for (int i = 0; i < 64; i++) b[i] = (uint8_t)(8 * r + i % 8);
            sign8[r] = _mm512_load_si512(b);
            for (int i = 0; i < 64; i++) b[i] = (uint8_t)(16 * r + i % 8);
            sign16[r] = _mm512_load_si512(b);
        }
        const uint8_t mags[4] = {8, 25, 43, 0};
        for (int i = 0; i < 64; i++) b[i] = mags[i & 3];
        values = _mm512_load_si512(b);
        ks0 = _mm512_loadu_si512(ksigns_iq2xs);
        ks1 = _mm512_loadu_si512(ksigns_iq2xs + 64);
        // vpackssdw(s_a, s_b) holds, in 128-bit lane L, s_a's int32 lanes 4 L .. 4 L + 3, then s_b's. Lane i of
        // vector r's sum covers group of 8 G = 4 (i / 2) + r, so group of 16 G / 2 = 2 (i / 2) + r / 2.
        for (int p = 0; p < 2; p++) {
            for (int i = 0; i < 32; i++) {
                const int lane = i / 8, r = 2 * p + (i % 8) / 4, dword = 4 * lane + i % 4;
                w[i] = (uint16_t)(2 * (dword / 2) + r / 2);
            }
            sc_pair[p] = _mm512_load_si512(w);
        }
    }
};

const Consts& consts() {
    static const Consts c;
    return c;
}
const Codes<256>& codes_xxs() {
    static const Codes<256> c(iq2xxs_grid);
    return c;
}
const Codes<512>& codes_xs() {
    static const Codes<512> c(iq2xs_grid);
    return c;
}
const Codes<1024>& codes_s() {
    static const Codes<1024> c(iq2s_grid);
    return c;
}

// A grid's code words as two byte planes (plane P: byte P of every entry), for vpermt2b: its 128-byte tables take
// an index's low 7 bits, so a lookup covers 128 entries, where vpermt2w's cover 64.
template <int N>
struct Planes {
    alignas(64) uint8_t b[2][N];
    explicit Planes(const Codes<N>& c) {
        for (int e = 0; e < N; e++) {
            b[0][e] = (uint8_t)(c.w[e] & 0xff);
            b[1][e] = (uint8_t)(c.w[e] >> 8);
        }
    }
};
const Planes<256>& planes_xxs() {
    static const Planes<256> p(codes_xxs());
    return p;
}
const Planes<512>& planes_xs() {
    static const Planes<512> p(codes_xs());
    return p;
}
const Planes<1024>& planes_s() {
    static const Planes<1024> p(codes_s());
    return p;
}

// The code words of 64 grid indices, two super-blocks' 32 each: idx holds the indices' low bytes (byte 16 j + i:
// the first super-block's group 8 j + i for i < 8, the second's group 8 j + i - 8 after), sel[b] bit b of the
// index's table number (index / 128). Each plane by T lookups (tab: a Planes' vectors, registers or memory) and
// T - 1 blends; vpunpcklbw then gives the first super-block's 32 words in group order, vpunpckhbw the second's.
template <int T>
inline void lookup_pair(__m512i idx, const __mmask64* sel, const __m512i* tab, __m512i& wa, __m512i& wb) {
    __m512i plane[2];
    for (int P = 0; P < 2; P++) {
        __m512i part[T];
        for (int t = 0; t < T; t++)
            part[t] = _mm512_permutex2var_epi8(tab[2 * T * P + 2 * t], idx, tab[2 * T * P + 2 * t + 1]);
        for (int bit = 0, n = T; n > 1; bit++, n /= 2)
            for (int t = 0; t < n / 2; t++) part[t] = _mm512_mask_blend_epi8(sel[bit], part[2 * t], part[2 * t + 1]);
        plane[P] = part[0];
    }
    wa = _mm512_unpacklo_epi8(plane[0], plane[1]);
    wb = _mm512_unpackhi_epi8(plane[0], plane[1]);
}

// A constant vector's 64 bytes; each type builds its selectors once (Sel) and every call loads them.
struct alignas(64) Bytes64 {
    uint8_t b[64];
};

// The vpermt2b selector that gathers lookup_pair's idx from two blocks' bytes (the first block's bytes 0-63, the
// second's 64-127): the byte for slot g of a block (byte 16 (g / 8) + g % 8 of idx, + 8 for the second block) is
// its block's byte at(g); slot g holds group g's index unless a type orders its groups otherwise (iq2_s)
template <class F>
Bytes64 pair_order(F at) {
    Bytes64 v;
    for (int i = 0; i < 64; i++) v.b[i] = (uint8_t)((i % 16 < 8 ? 0 : 64) + at(8 * (i / 16) + i % 8));
    return v;
}

inline __m512i load(const Bytes64& v) { return _mm512_load_si512(v.b); }

// The constants a row's super-blocks use, copied into locals once per call (the compiler keeps what fits in
// registers: loaded from memory at every super-block, the ~20 constant vectors and the code tables were as many
// 512-bit loads as the rest of the work's operations).
struct ConstRegs {
    Consts c;
    ConstRegs() : c(consts()) {}
};
// ... and a code table held in registers (TABLE_VECTORS vectors of a Planes)
template <int TABLE_VECTORS>
struct Regs : ConstRegs {
    __m512i tab[TABLE_VECTORS];
    explicit Regs(const uint8_t* planes) {
        for (int i = 0; i < TABLE_VECTORS; i++) tab[i] = _mm512_load_si512(planes + 64 * i);
    }
};

// One super-block of one row, unpacked: four 64-weight vectors of magnitudes (in XP's order) with their sign
// masks, and the 16 groups' scales 2 s + 1 as int16 lanes in the order vpackssdw leaves two vectors' sums
// (pair p: vectors 2 p, 2 p + 1).
struct Unpacked {
    __m512i mag[4];
    __mmask64 neg[4];
    __m512i sc[2];
    float d;  // d / 8
};

// codes: word g = group g's 8 codes; sc16: int16 lane h = the scale of group of 16 h
inline void finish(const Consts& c, __m512i codes, __m512i sc16, Unpacked& u) {
    for (int r = 0; r < 4; r++)
        u.mag[r] = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(c.codes_at[r], codes), c.values);
    for (int p = 0; p < 2; p++) u.sc[p] = _mm512_permutexvar_epi16(c.sc_pair[p], sc16);
}

// scales 2 s + 1 for the 16 groups of 16 from the nibbles of scales[8] (iq2_xs, iq2_s), as int16 lanes 0-15 (the
// AVX2 kernels' prepare_nibble_scales, kernel_low256_avx2.h, which this file does not include)
inline __m512i nibble_scales(const uint8_t* scales8) {
    const __m128i raw = _mm_loadl_epi64((const __m128i*)scales8);
    const __m128i nib = _mm_and_si128(_mm_unpacklo_epi8(raw, _mm_srli_epi16(raw, 4)), _mm_set1_epi8(0x0f));
    const __m256i s = _mm256_cvtepu8_epi16(nib);
    return _mm512_castsi256_si512(_mm256_add_epi16(_mm256_add_epi16(s, s), _mm256_set1_epi16(1)));
}

struct IQ2XXS {
    using Block = block_iq2_xxs;
    static constexpr int LANES_FROM = 16;  // (gemm_iq2)
    static constexpr bool NATURAL = false;  // (XP's order)
    // qword ib of qs: grid indices in bytes 0-3, then 4 x 7 sign bits and the scale in bits 60-63
    struct Sel {
        Bytes64 idx, sgn_shift;
        alignas(64) uint32_t sc[16];
        Sel() : idx(pair_order([](int g) { return 8 * (g / 4) + g % 4; })) {
            for (int i = 0; i < 64; i++) sgn_shift.b[i] = (uint8_t)(32 + 7 * (i % 4));  // the 7-bit sign fields at bits 32, 39, 46, 53
            for (int g = 0; g < 16; g++) sc[g] = (uint32_t)(2 * (g / 2));  // dword of qword g / 2's scale
        }
    };
    static const Sel& sel() {
        static const Sel s;
        return s;
    }
    struct R : Regs<8> {
        __m512i idx, sgn_shift, sc;
        R() : Regs<8>(&planes_xxs().b[0][0]), idx(load(sel().idx)), sgn_shift(load(sel().sgn_shift)),
              sc(_mm512_load_si512(sel().sc)) {}
    };
    static void finish_one(const Block& b, __m512i v, const R& k, __m512i codes, Unpacked& u) {
        const Consts& c = k.c;
        // group 4 k + l's sign byte at byte l of qword k (bytes 4-7 repeat 0-3)
        const __m512i signs = _mm512_permutex2var_epi8(c.ks0, _mm512_multishift_epi64_epi8(k.sgn_shift, v), c.ks1);
        for (int r = 0; r < 4; r++) u.neg[r] = _mm512_bitshuffle_epi64_mask(signs, c.sign8[r]);
        const __m512i s = _mm512_permutexvar_epi32(k.sc, _mm512_srli_epi64(v, 60));
        const __m512i s32 = _mm512_add_epi32(_mm512_add_epi32(s, s), _mm512_set1_epi32(1));
        finish(c, codes, _mm512_castsi256_si512(_mm512_cvtepi32_epi16(s32)), u);
        u.d = _cvtsh_ss(b.d) * 0.125f;
    }
    static void unpack2(const Block& a, const Block& b, const R& k, Unpacked& ua, Unpacked& ub) {
        const __m512i va = _mm512_loadu_si512(a.qs), vb = _mm512_loadu_si512(b.qs);
        const __m512i idx = _mm512_permutex2var_epi8(va, k.idx, vb);
        const __mmask64 sel[1] = {_mm512_movepi8_mask(idx)};  // table: bit 7 of the index
        __m512i ca, cb;
        lookup_pair<2>(idx, sel, k.tab, ca, cb);
        finish_one(a, va, k, ca, ua);
        finish_one(b, vb, k, cb, ub);
    }
};

// iq2_xs: word i of qs = 9-bit grid index | 7 sign bits << 9
struct IQ2XS {
    using Block = block_iq2_xs;
    static constexpr int LANES_FROM = 16;  // (gemm_iq2)
    static constexpr bool NATURAL = false;  // (XP's order)
    struct Sel {
        Bytes64 lo = pair_order([](int g) { return 2 * g; }), hi = pair_order([](int g) { return 2 * g + 1; });
    };
    static const Sel& sel() {
        static const Sel s;
        return s;
    }
    struct R : Regs<16> {
        __m512i lo, hi;
        R() : Regs<16>(&planes_xs().b[0][0]), lo(load(sel().lo)), hi(load(sel().hi)) {}
    };
    static void finish_one(const Block& b, __m512i v, const R& k, __m512i codes, Unpacked& u) {
        const Consts& c = k.c;
        const __m512i signs = _mm512_permutex2var_epi8(c.ks0, _mm512_srli_epi16(v, 9), c.ks1);  // byte 2 g
        for (int r = 0; r < 4; r++) u.neg[r] = _mm512_bitshuffle_epi64_mask(signs, c.sign16[r]);
        finish(c, codes, nibble_scales(b.scales), u);
        u.d = _cvtsh_ss(b.d) * 0.125f;
    }
    static void unpack2(const Block& a, const Block& b, const R& k, Unpacked& ua, Unpacked& ub) {
        const __m512i va = _mm512_loadu_si512(a.qs), vb = _mm512_loadu_si512(b.qs);
        const __m512i lo = _mm512_permutex2var_epi8(va, k.lo, vb), hi = _mm512_permutex2var_epi8(va, k.hi, vb);
        // table: bit 7 of the index's low byte + 2 x its bit 8
        const __mmask64 sel[2] = {_mm512_movepi8_mask(lo), _mm512_test_epi8_mask(hi, _mm512_set1_epi8(1))};
        __m512i ca, cb;
        lookup_pair<4>(lo, sel, k.tab, ca, cb);
        finish_one(a, va, k, ca, ua);
        finish_one(b, vb, k, cb, ub);
    }
};

// iq2_s: 10-bit indices (low 8 bits in qs[0..31], 2 in qh), plain sign bytes in qs[32..63]. Its code words come in
// the weights' own order (NATURAL), so that the sign bytes as stored are the vectors' masks.
struct IQ2S {
    using Block = block_iq2_s;
    static constexpr int LANES_FROM = 10;  // (gemm_iq2)
    static constexpr bool NATURAL = true;  // (XP's order)
    // Slot g of a super-block in lookup_pair's idx (its byte 16 j + 4 h + i, j = g / 8, h = g % 8 / 4, i = g % 4)
    // takes group 8 i + 2 j + h: after the lookups vpunpcklbw gives the first super-block's code words in the order
    // vpmultishiftqb wants for the weights' own order (qword k: groups k, 8 + k, 16 + k, 24 + k; vector r takes
    // word r of each: groups 8 r + k), and vpunpckhbw the second's.
    static int slot_group(int g) { return 8 * (g % 4) + 2 * (g / 8) + g % 8 / 4; }
    struct Sel {
        // order: the groups' low index bytes (qs[g]); qh_at: the bit offset 2 g of group g's two high bits within
        // its block's 8 qh bytes, where qword 2 j of hq holds the first block's qh and 2 j + 1 the second's
        // (vpmultishiftqb reads a selector byte's low 6 bits, so pair_order's + 64 for the second block drops out)
        Bytes64 order = pair_order(slot_group), qh_at = pair_order([](int g) { return 2 * slot_group(g); });
        // vpackssdw(s_a, s_b) of vectors 2 p, 2 p + 1 holds, in 128-bit lane L, s_a's int32 lanes 4 L .. 4 L + 3,
        // then s_b's; int32 lane i of vector r sums weights 64 r + 4 i .. + 3: the group of 16 4 r + L
        alignas(64) uint16_t sc_pair[2][32];
        Sel() {
            for (int p = 0; p < 2; p++)
                for (int i = 0; i < 32; i++) sc_pair[p][i] = (uint16_t)(4 * (2 * p + (i % 8) / 4) + i / 8);
        }
    };
    static const Sel& sel() {
        static const Sel s;
        return s;
    }
    struct R : ConstRegs {  // (the 32 table vectors stay in memory: they do not fit in registers with the rest)
        __m512i order = load(sel().order), qh_at = load(sel().qh_at);
        __m512i sc_pair[2] = {_mm512_load_si512(sel().sc_pair[0]), _mm512_load_si512(sel().sc_pair[1])};
        const __m512i* mem_tab = (const __m512i*)&planes_s().b[0][0];
    };
    // The weights in their own order (vector r: weights 64 r .. 64 r + 63): sign byte 8 r + k is bits 8 k .. 8 k + 7
    // of vector r's mask as stored.
    static void finish_one(const Block& b, const R& k, __m512i codes, Unpacked& u) {
        const Consts& c = k.c;
        for (int r = 0; r < 4; r++) {
            uint64_t m;
            std::memcpy(&m, b.qs + 32 + 8 * r, 8);
            u.neg[r] = (__mmask64)m;
            u.mag[r] = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(c.codes_at[r], codes), c.values);
        }
        const __m512i sc16 = nibble_scales(b.scales);
        for (int p = 0; p < 2; p++) u.sc[p] = _mm512_permutexvar_epi16(k.sc_pair[p], sc16);
        u.d = _cvtsh_ss(b.d) * 0.125f;
    }
    static void unpack2(const Block& a, const Block& b, const R& k, Unpacked& ua, Unpacked& ub) {
        const __m512i lo = _mm512_permutex2var_epi8(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)a.qs)),
                                                    k.order,
                                                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)b.qs)));
        uint64_t qa, qb;
        std::memcpy(&qa, a.qh, 8);
        std::memcpy(&qb, b.qh, 8);
        const __m512i hq = _mm512_multishift_epi64_epi8(k.qh_at, _mm512_broadcast_i32x4(_mm_set_epi64x((long long)qb, (long long)qa)));
        // table: bit 7 of the low byte + 2 x the two high bits
        const __mmask64 sel[3] = {_mm512_movepi8_mask(lo), _mm512_test_epi8_mask(hq, _mm512_set1_epi8(1)),
                                  _mm512_test_epi8_mask(hq, _mm512_set1_epi8(2))};
        __m512i ca, cb;
        lookup_pair<8>(lo, sel, k.mem_tab, ca, cb);
        finish_one(a, k, ca, ua);
        finish_one(b, k, cb, ub);
    }
};

// acc + one unpacked super-block of one row against one token's activations, as 16 float lanes
inline __m512 dot_add(const Unpacked& u, const XP& x, __m512 acc) {
    __m512i isum = _mm512_setzero_si512();
    for (int p = 0; p < 2; p++) {
        __m512i dot[2];
        for (int h = 0; h < 2; h++) {
            const int r = 2 * p + h;
            const __m512i xv = _mm512_load_si512(x.qs + 64 * r);
            const __m512i xs = _mm512_mask_sub_epi8(xv, u.neg[r], _mm512_setzero_si512(), xv);
            dot[h] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u.mag[r], xs);
        }
        isum = _mm512_dpwssd_epi32(isum, _mm512_packs_epi32(dot[0], dot[1]), u.sc[p]);
    }
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(u.d * x.d), acc);
}

// Rows n .. n + ROWS - 1 (ROWS = 2 P, or 1 for the last row of an odd count, which then stands in for the missing
// one and is written once) against RN tokens: super-block s of rows n + 2 j and n + 2 j + 1 unpacked
// together (U::unpack2). a.X holds XP blocks, k the constants (loaded once per call: with 2-8 super-blocks per
// row, as the experts' products have, loading them per row cost more than the row's work).
template <class U, int P, int RN, int ROWS = 2 * P>
inline void row_pairs(const Args& a, int64_t n, int m, const typename U::R& k) {
    using Block = typename U::Block;
    __m512 acc[2 * P][RN];
    for (int j = 0; j < 2 * P; j++)
        for (int t = 0; t < RN; t++) acc[j][t] = _mm512_setzero_ps();
    const Block* w[2 * P];
    for (int j = 0; j < 2 * P; j++) w[j] = (const Block*)(a.W + (n + (j < ROWS ? j : ROWS - 1)) * a.wrb);
    const int64_t nsb = a.K / QK_K;
    for (int64_t s = 0; s < nsb; s++) {
        Unpacked u[2 * P];
        for (int j = 0; j < P; j++) {
            prefetch_block(w[2 * j] + s, sizeof(Block));
            prefetch_block(w[2 * j + 1] + s, sizeof(Block));
            U::unpack2(w[2 * j][s], w[2 * j + 1][s], k, u[2 * j], u[2 * j + 1]);
        }
        for (int t = 0; t < RN; t++) {
            const XP& x = ((const XP*)(a.X + (m + t) * a.xrb))[s];
            for (int j = 0; j < 2 * P; j++) acc[j][t] = dot_add(u[j], x, acc[j][t]);
        }
    }
    for (int j = 0; j < ROWS; j++)
        for (int t = 0; t < RN; t++) a.Y[(m + t) * a.ldy + n + j] = _mm512_reduce_add_ps(acc[j][t]);
}

// Rows n .. n + ROWS - 1 (ROWS 1 or 2) against all M tokens, 4 at a time
template <class U, int ROWS>
inline void pair_rows(const Args& a, int64_t n, int M, const typename U::R& k) {
    int m = 0;
    for (; m + 4 <= M; m += 4) row_pairs<U, 1, 4, ROWS>(a, n, m, k);
    switch (M - m) {
        case 3: row_pairs<U, 1, 3, ROWS>(a, n, m, k); break;
        case 2: row_pairs<U, 1, 2, ROWS>(a, n, m, k); break;
        case 1: row_pairs<U, 1, 1, ROWS>(a, n, m, k); break;
    }
}

// Up to U::LANES_FROM - 1 tokens here (a row unpacked once per 4 tokens), more by the AVX2 table's lane tiles,
// which unpack a row once for every token. kbench, one thread, 512 x 2048, ns per super-block row and token, these
// tiles at 8 / 15 tokens against the lane tiles at 16 / 64: IQ2_XXS 4.62-4.88 / 4.69-4.70 against 4.72-4.81 /
// 3.78-4.87, IQ2_XS 4.79-5.21 / 4.89-5.31 against 4.85-6.32 / 3.88-4.18; IQ2_S at 8 / 12 tokens 5.37-5.77 /
// 5.36-5.65 against the lane tiles' 5.77-6.09 / 5.07-5.20 (2026-12-07, a noisy hour: ranges of two or three runs).
// Since then the AVX-512 table sends 5-8 tokens and more to its own lane tiles with vpdpbusd (faster than these
// from there; kernels_avx512.cpp, use_lanes_vnni), so in the table this runs below those counts only.
template <class U, gemm_fn Kernels::*LANES>
void gemm_iq2(const uint8_t* W, size_t wrb, const uint8_t* X, size_t xrb, int64_t K, int M, float* Y, int64_t ldy,
              int64_t n0, int64_t n1) {
    if (M >= U::LANES_FROM) return (kernels_avx2()->*LANES)(W, wrb, X, xrb, K, M, Y, ldy, n0, n1);
    const int64_t nsb = K / QK_K;
    thread_local std::vector<XP> xp;
    xp.resize((size_t)(M * nsb));
    // qword k of vector r = qword 4 k + r of the 256 activations: lanes 0-3 from qwords 0-15, lanes 4-7 from 16-31
    const __m512i pick = _mm512_setr_epi64(0, 4, 8, 12, 0, 4, 8, 12);
    for (int m = 0; m < M; m++)
        for (int64_t s = 0; s < nsb; s++) {
            const block_q8_K& x = ((const block_q8_K*)(X + m * xrb))[s];
            XP& o = xp[(size_t)(m * nsb + s)];
            o.d = x.d;
            if constexpr (U::NATURAL) {
                std::memcpy(o.qs, x.qs, QK_K);
                continue;
            }
            __m512i q[4];
            for (int i = 0; i < 4; i++) q[i] = _mm512_loadu_si512(x.qs + 64 * i);
            for (int r = 0; r < 4; r++) {
                const __m512i idx = _mm512_add_epi64(pick, _mm512_set1_epi64(r));
                const __m512i lo = _mm512_permutex2var_epi64(q[0], idx, q[1]), hi = _mm512_permutex2var_epi64(q[2], idx, q[3]);
                _mm512_store_si512(o.qs + 64 * r, _mm512_mask_blend_epi64(0xF0, lo, hi));
            }
        }
    const Args a{W, wrb, (const uint8_t*)xp.data(), (size_t)nsb * sizeof(XP), K, Y, ldy};
    const typename U::R k;
    int64_t n = n0;
    // one token on short rows (the experts' down projections: 2 super-blocks): four rows at a time, more
    // independent work around each row's final sum (kbench, iq2_s 2048 x 512: 16.8 -> 14.8 ns per super-block
    // row); on long rows four rows' unpacked blocks spill registers (4096 x 14336: 11.3 -> 13.1)
    if (M == 1 && nsb <= 4)
        for (; n + 4 <= n1; n += 4) row_pairs<U, 2, 1>(a, n, 0, k);
    for (; n + 2 <= n1; n += 2) pair_rows<U, 2>(a, n, M, k);
    if (n < n1) pair_rows<U, 1>(a, n, M, k);
}

}  // namespace

void add_avx512_vbmi(Kernels& k) {
    k.gemm_iq2_xxs = gemm_iq2<IQ2XXS, &Kernels::gemm_iq2_xxs>;
    k.gemm_iq2_xs = gemm_iq2<IQ2XS, &Kernels::gemm_iq2_xs>;
    k.gemm_iq2_s = gemm_iq2<IQ2S, &Kernels::gemm_iq2_s>;
}

}  // namespace clover
