/* The helpers the two files of the x86_avx2 kernel set share (x86_avx2.c, x86_avx2_blocks.c):
 * static inline functions for the AVX2 region of each, so each file includes this header inside
 * its region (after its `#pragma GCC target("avx2,f16c")`), where they are compiled for AVX2 and
 * F16C; and the CPU check, compiled for baseline x86-64 in x86_avx2.c. */
#ifndef COLIBRI_KERNELS_X86_AVX2_H
#define COLIBRI_KERNELS_X86_AVX2_H

#include <immintrin.h>
#include <string.h>

#include "x86_vnni.h"

#include "kernels.h"

/* 1 when the CPU has AVX2 and F16C (cpuid, checked once): only then may a kernel of an AVX2
 * region run. */
int x86_avx2_usable(void);
/* The per-thread scratch of the batched kernels in lanes: x86_avx2.c's (q8_0, q4_0, q4_1) and
 * x86_avx2_blocks.c's (the GGUF types) lay their tokens and rows out in the same bytes, since a
 * thread runs one product at a time. A buffer each would cost every thread of the firmware that much
 * more resident memory (the C runtime zeroes thread-local storage when a thread starts), which a run
 * under a memory budget does not have to spare. X86_LANES_SCRATCH_BYTES is x86_avx2.c's layout's
 * size (asserted there); x86_avx2_blocks.c asserts that its own fits. */
#define X86_LANES_SCRATCH_BYTES 1392640
void *x86_lanes_scratch(void);
/* How this CPU reaches vpdpbusd (x86_vnni.h: KERNEL_VNNI_VEX, KERNEL_VNNI_EVEX, or 0 for maddubs +
 * madd; always 0 in a KERNEL_NO_VNNI build), checked once. */
int x86_avx2_vnni(void);

#define MAX_BLOCKS 512 /* the batched kernels and the q4_0 activation layout: rows of up to 16384 values */

/* acc + the four adjacent u8 x s8 products of a and b per int32 lane (vpdpbusd, encoded as `vnni`
 * says). Written as one instruction of inline assembly so that every function here is compiled
 * for AVX2 and F16C alone: the compiler cannot then use VNNI or AVX-512 anywhere the CPU was not
 * checked for it. */
__attribute__((always_inline)) static inline __m256i vpdpbusd(__m256i acc, __m256i a, __m256i b, int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        __asm__("%{evex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
    } else {
        __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
    }
    return acc;
}

/* Unsigned a times signed b, four adjacent products per int32 lane: vpdpbusd, or maddubs + madd
 * (whose int16 pair sums cannot saturate here: |a| <= 127 with q8_0 quants, a <= 15 with nibbles,
 * |b| <= 127). `vnni` is a constant in every caller, so each path compiles to straight code. */
__attribute__((always_inline)) static inline __m256i dot_u8s8(__m256i a, __m256i b, int vnni)
{
    if (vnni) {
        return vpdpbusd(_mm256_setzero_si256(), a, b, vnni);
    }
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
}

/* The 8 int32 lanes of each of v0..v7 summed: lane i of the result is the total of v_i (integer
 * adds: exact in any order). */
static inline __m256i block_sums8(__m256i v0, __m256i v1, __m256i v2, __m256i v3,
                                  __m256i v4, __m256i v5, __m256i v6, __m256i v7)
{
    __m256i h01 = _mm256_hadd_epi32(v0, v1);
    __m256i h23 = _mm256_hadd_epi32(v2, v3);
    __m256i h45 = _mm256_hadd_epi32(v4, v5);
    __m256i h67 = _mm256_hadd_epi32(v6, v7);
    __m256i h0123 = _mm256_hadd_epi32(h01, h23);
    __m256i h4567 = _mm256_hadd_epi32(h45, h67);
    __m256i lo = _mm256_permute2x128_si256(h0123, h4567, 0x20);
    __m256i hi = _mm256_permute2x128_si256(h0123, h4567, 0x31);
    return _mm256_add_epi32(lo, hi);
}

/* An 8x8 transpose: afterwards r[k] lane i is what r[i] lane k was. */
__attribute__((always_inline)) static inline void transpose8(__m256 r[8])
{
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    /* u_k: elements k (low half) and k + 4 (high half) of rows 0-3 (u0..u3) or 4-7 (u4..u7) */
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* The combine of the reduction tree (kernels.h) for eight rows at once: acc[i] holds row i's eight
 * partials; the result's lane i is ((p0 + p1) + p2) + ... + p7 of row i. The 8x8 transpose puts
 * partial k of every row in col[k]; then seven vertical adds in order. (The q4_1 and any later
 * block type reuse this.) */
static inline __m256 sum_partials8(const __m256 acc[8])
{
    __m256 col[8];
    for (int k = 0; k < 8; k++) {
        col[k] = acc[k];
    }
    transpose8(col);
    __m256 sum = col[0];
    for (int k = 1; k < 8; k++) {
        sum = _mm256_add_ps(sum, col[k]);
    }
    return sum;
}

/* Decoding streams every weight once from memory. Asking for the lines that lie PREFETCH_BYTES
 * ahead of the ones being used keeps more requests in flight than the hardware prefetcher does on
 * its own: the SmolLM2-135M shape's q8_0 matrices took 19 ms per token without it, 13 ms at 2 KiB
 * and 11-12 ms at 6-8 KiB ahead (thread CPU time, an Intel Xeon KVM guest, alternating builds;
 * the scales were float32 then). The distance is counted in quant bytes, which binary16 scales did
 * not change; the scales are a stream of their own, 2 bytes per 32 weights (1/16 of q8_0's quants,
 * 1/8 of q4's), sequential across a matrix's rows, which the hardware prefetcher keeps up with.
 * It crosses rows and matrices freely; a prefetch never faults. always_inline: a function that
 * only prefetches looks side-effect free to GCC, which then deleted every call to it (the kernels
 * before this one had no software prefetch at all, whatever their source said). */
#define PREFETCH_BYTES 8192

__attribute__((always_inline)) static inline void prefetch_ahead(const void *p, int lines)
{
    const char *c = (const char *)p + PREFETCH_BYTES;
    for (int i = 0; i < lines; i++) {
        _mm_prefetch(c + 64 * i, _MM_HINT_T0);
    }
}

/* Rows r .. r + n - 1 of a matrix as the eight rows of a group; rows past n repeat row r and are
 * computed and dropped, so that a short last group takes the same code. */
static inline void group_rows8(int *row, int r, int n)
{
    for (int i = 0; i < 8; i++) {
        row[i] = r + (i < n ? i : 0);
    }
}

/* The lanes layout of the batched kernels (x86_avx2.c's matmul_lanes, x86_avx2_blocks.c's
 * blocks_lanes): block b of eight tokens' q8_0 inputs x[0..7] as eight steps of 32 bytes at xt,
 * step k lane t = token t's values 4k .. 4k + 3, made by one 8x8 transpose of 4-byte groups.
 * Returns each token's quant sums (exact int32, lane t) of the block's values 0-15 in *lo and
 * 16-31 in *hi. */
__attribute__((always_inline)) static inline void lanes_block(int8_t *xt, const int8_t *const x[8], int b, __m256i *lo,
                                                              __m256i *hi)
{
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    __m256 r[8];
#pragma GCC unroll 8
    for (int t = 0; t < 8; t++) {
        r[t] = _mm256_loadu_ps((const float *)(x[t] + b * KERNEL_QK));
    }
    transpose8(r);
    __m256i sums[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const __m256i step = _mm256_castps_si256(r[k]);
        _mm256_storeu_si256((__m256i *)(xt + 32 * k), step);
        sums[k / 4] = _mm256_add_epi32(sums[k / 4], _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, step), ones16));
    }
    *lo = sums[0];
    *hi = sums[1];
}

/* Group g of the tokens t0 .. t0 + nt - 1 (eight of them; a short last group repeats its first
 * token, computed and dropped): their q8_0 rows into x, and their block scales into xd in the lanes
 * layout (block b: the eight tokens' x_d at xd + 8 b). */
static inline void lanes_group_inputs(const int8_t *x[8], float *xd, const int8_t *x_qs, const float *x_d, int t0,
                                      int nt, int g, int nb)
{
    for (int t = 0; t < 8; t++) {
        const int tok = t0 + 8 * g + (8 * g + t < nt ? t : 0);
        x[t] = x_qs + (int64_t)tok * nb * KERNEL_QK;
        for (int b = 0; b < nb; b++) {
            xd[b * 8 + t] = x_d[(int64_t)tok * nb + b];
        }
    }
}

/* The combine of the reduction tree for R rows of eight tokens in lanes: part[i][k] holds row i's
 * partial k of every token (lane t); each row's total, ((p0 + p1) + p2) + ... + p7 lane by lane,
 * goes to out[t * out_stride + i] for the n_valid tokens. */
__attribute__((always_inline)) static inline void lanes_store_rows(float *out, int out_stride, int n_valid,
                                                                   __m256 part[4][8], int R)
{
    for (int i = 0; i < R; i++) {
        __m256 sum = part[i][0];
        for (int k = 1; k < 8; k++) {
            sum = _mm256_add_ps(sum, part[i][k]);
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, sum);
        for (int t = 0; t < n_valid; t++) {
            out[(int64_t)t * out_stride + i] = lanes[t];
        }
    }
}

/* acc + the four adjacent u8 x s8 products of u and x per int32 lane, exact: vpdpbusd, or maddubs +
 * madd, whose int16 pair sums cannot saturate when u <= 128 (2 * 128 * 127 < 32768). */
__attribute__((always_inline)) static inline __m256i lanes_step(__m256i acc, __m256i u, __m256i x, int vnni)
{
    if (vnni) {
        return vpdpbusd(acc, u, x, vnni);
    }
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
}

/* Four bytes at p broadcast to every int32 lane. */
__attribute__((always_inline)) static inline __m256i bcast4(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

static inline void store_rows(float *out, __m256 v, int n)
{
    if (n == 8) {
        _mm256_storeu_ps(out, v);
    } else {
        float lanes[8];
        _mm256_storeu_ps(lanes, v);
        for (int i = 0; i < n; i++) {
            out[i] = lanes[i];
        }
    }
}

#endif
