/* The x86_avx2 set's quantized matvec (decoding: one token against every row), q8_0, q4_0 and
 * q4_1: eight rows at a time, a row's eight partials the lanes of one vector (kernels.h's
 * reduction tree), its blocks' integer sums by maddubs + madd or vpdpbusd. Called by set.c's entry
 * points once the CPU was checked; x86_avx2.h holds the helpers matmul.c's short batches share. */
#include "x86_avx2.h"

X86_AVX2_BEGIN /* from here to X86_AVX2_END: compiled for AVX2 and F16C */

/* One q8_0 row's eight partials (reduction tree, kernels.h). */
__attribute__((always_inline)) static inline __m256
q8_row(const int8_t *wq, const KernelHalf *wd, const int8_t *x_qs, const float *x_d, int nb, int vnni)
{
    __m256 acc = _mm256_set1_ps(-0.0f);
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        const int8_t *w = wq + b * KERNEL_QK, *x = x_qs + b * KERNEL_QK;
        prefetch_ahead(w, 4);
        const __m256i isums = block_sums8(q8_block(w, x, vnni), q8_block(w + 32, x + 32, vnni),
                                          q8_block(w + 64, x + 64, vnni), q8_block(w + 96, x + 96, vnni),
                                          q8_block(w + 128, x + 128, vnni), q8_block(w + 160, x + 160, vnni),
                                          q8_block(w + 192, x + 192, vnni), q8_block(w + 224, x + 224, vnni));
        acc = add_terms(acc, isums, wd + b, x_d + b, 8);
    }
    if (b < nb) { /* unrolled, so the blocks stay in registers (a 640-value row's last 4 of 20) */
        __m256i v[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            v[k] = b + k < nb ? q8_block(wq + (b + k) * KERNEL_QK, x_qs + (b + k) * KERNEL_QK, vnni)
                              : _mm256_setzero_si256();
        }
        const __m256i isums = block_sums8(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
        acc = add_terms(acc, isums, wd + b, x_d + b, nb - b);
    }
    return acc;
}

/* Eight rows at a time, each row's blocks streamed in order (one stream per row for the hardware
 * prefetcher, plus the software prefetch); their partials combined together. */
__attribute__((always_inline)) static inline void
matvec_q8_0_rows(float *out, const int8_t *w_qs, const KernelHalf *w_d, const int8_t *x_qs, const float *x_d,
                 int rows, int cols, int vnni)
{
    const int nb = cols / KERNEL_QK;
    for (int r = 0; r < rows; r += 8) {
        const int n = rows - r < 8 ? rows - r : 8;
        int row[8];
        group_rows8(row, r, n);
        __m256 acc[8];
        for (int i = 0; i < 8; i++) {
            acc[i] = q8_row(w_qs + (int64_t)row[i] * cols, w_d + (int64_t)row[i] * nb, x_qs, x_d, nb, vnni);
        }
        store_rows(out + r, sum_partials8(acc), n);
    }
}

void matvec_q8_0_vnni(float *out, const int8_t *w_qs, const KernelHalf *w_d, const int8_t *x_qs,
                      const float *x_d, int rows, int cols, int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        matvec_q8_0_rows(out, w_qs, w_d, x_qs, x_d, rows, cols, KERNEL_VNNI_EVEX);
    } else {
        matvec_q8_0_rows(out, w_qs, w_d, x_qs, x_d, rows, cols, KERNEL_VNNI_VEX);
    }
}

void matvec_q8_0_avx2(float *out, const int8_t *w_qs, const KernelHalf *w_d, const int8_t *x_qs,
                      const float *x_d, int rows, int cols)
{
    matvec_q8_0_rows(out, w_qs, w_d, x_qs, x_d, rows, cols, 0);
}


/* The q4_0 activations of one call (x86_avx2.h: struct q4_input) in pair layout. */
void q4_prepare(struct q4_input *in, const int8_t *x_qs, int nb)
{
    for (int b = 0; b < nb; b++) {
        const int8_t *x = x_qs + b * KERNEL_QK;
        int8_t *p = in->pairs + (b & ~1) * KERNEL_QK + (b & 1) * 16;
        int32_t s = 0;
        for (int i = 0; i < 16; i++) {
            p[i] = x[i];
            p[32 + i] = x[16 + i];
            s += x[i] + x[16 + i];
        }
        in->sum8[b] = 8 * s;
    }
    if (nb & 1) { /* the odd last block's missing partner: zeros, whose products are 0 */
        memset(in->pairs + (nb - 1) * KERNEL_QK + 16, 0, 16);
        memset(in->pairs + (nb - 1) * KERNEL_QK + 48, 0, 16);
    }
}


/* One q4_0 row's eight partials. */
__attribute__((always_inline)) static inline __m256
q4_row(const uint8_t *wq, const KernelHalf *wd, const struct q4_input *in, const float *x_d, int nb, int vnni)
{
    __m256 acc = _mm256_set1_ps(-0.0f);
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        const __m256i s = q4_nibble_sums8(wq, in, b, vnni);
        const __m256i isums = _mm256_sub_epi32(s, _mm256_loadu_si256((const __m256i *)(in->sum8 + b)));
        acc = add_terms(acc, isums, wd + b, x_d + b, 8);
    }
    if (b < nb) {
        __m256i v[4];
        q4_tail_pairs(v, wq, in, b, nb, vnni);
        const int n = nb - b;
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256i sum8 = _mm256_maskload_epi32(in->sum8 + b, mask);
        acc = add_terms(acc, _mm256_sub_epi32(q4_pair_sums8(v[0], v[1], v[2], v[3]), sum8), wd + b, x_d + b, n);
    }
    return acc;
}

/* One q4_1 row's eight partials, read as q4_row reads q4_0: two blocks' nibbles per 32-byte load
 * against the pair-laid-out activations, the unsigned nibble products being isum itself; xsum is
 * q4_prepare's 8 * sum(x) shifted back (an exact multiple of 8). */
__attribute__((always_inline)) static inline __m256
q4_1_row(const uint8_t *wq, const KernelHalf *wd, const KernelHalf *wm, const struct q4_input *in, const float *x_d,
         int nb, int vnni)
{
    __m256 acc = _mm256_set1_ps(-0.0f);
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        const __m256i isums = q4_nibble_sums8(wq, in, b, vnni);
        const __m256i xsums = _mm256_srai_epi32(_mm256_loadu_si256((const __m256i *)(in->sum8 + b)), 3);
        acc = add_q4_1_terms(acc, isums, xsums, wd + b, wm + b, x_d + b, 8);
    }
    if (b < nb) {
        __m256i v[4];
        q4_tail_pairs(v, wq, in, b, nb, vnni);
        const int n = nb - b;
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256i xsums = _mm256_srai_epi32(_mm256_maskload_epi32(in->sum8 + b, mask), 3);
        acc = add_q4_1_terms(acc, q4_pair_sums8(v[0], v[1], v[2], v[3]), xsums, wd + b, wm + b, x_d + b, n);
    }
    return acc;
}

/* q4_0 and q4_1 decoding, eight rows at a time: each row's partials in the lanes of one vector,
 * eight rows combined by sum_partials8. w_m is NULL for q4_0 (a constant in every caller, so each
 * compiles to its own straight loop). */
__attribute__((always_inline)) static inline void
matvec_q4_rows(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m, const int8_t *x_qs,
               const float *x_d, int rows, int cols, int vnni)
{
    const int nb = cols / KERNEL_QK;
    struct q4_input in;
    q4_prepare(&in, x_qs, nb);
    for (int r = 0; r < rows; r += 8) {
        const int n = rows - r < 8 ? rows - r : 8;
        int row[8];
        group_rows8(row, r, n);
        __m256 acc[8];
        for (int i = 0; i < 8; i++) {
            const uint8_t *wq = w_q4 + (int64_t)row[i] * (cols / 2);
            const int64_t first_block = (int64_t)row[i] * nb;
            acc[i] = w_m == NULL ? q4_row(wq, w_d + first_block, &in, x_d, nb, vnni)
                                 : q4_1_row(wq, w_d + first_block, w_m + first_block, &in, x_d, nb, vnni);
        }
        store_rows(out + r, sum_partials8(acc), n);
    }
}

void matvec_q4_0_vnni(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const int8_t *x_qs,
                      const float *x_d, int rows, int cols, int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        matvec_q4_rows(out, w_q4, w_d, NULL, x_qs, x_d, rows, cols, KERNEL_VNNI_EVEX);
    } else {
        matvec_q4_rows(out, w_q4, w_d, NULL, x_qs, x_d, rows, cols, KERNEL_VNNI_VEX);
    }
}

void matvec_q4_0_avx2(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const int8_t *x_qs,
                      const float *x_d, int rows, int cols)
{
    matvec_q4_rows(out, w_q4, w_d, NULL, x_qs, x_d, rows, cols, 0);
}

/* q4_1 products. The quants are unsigned (0..15), which is what maddubs (and vpdpbusd) take as
 * their first operand: each pair of quant * int8 activation products sums to at most 2 * 15 * 127
 * in magnitude, well inside int16, and madd widens them to int32, so isum is exact without the
 * sign trick of q8_0. The minimum's part needs xsum, the sum of each activation block's 32 quants,
 * which does not depend on the row: it is computed once per call, for all the rows (decoding:
 * q4_prepare's sums; batched: matmul.c's lanes kernel's per-token sums; rows of up to 16384 values,
 * longer rows take the scalar kernel). The terms are kernel_q4_1_term's operations, eight blocks
 * (or eight tokens) per vector, on the binary16 scales and minimums widened by F16C, and they go
 * to the partials of the reduction tree (kernels.h) lane by lane. Decoding reads the nibbles as
 * q4_0's kernel does, two blocks per load, with a row's partials in vector lanes: 1.3-2.1 times
 * the decode speed of one block per load with its terms added block by block (SmolLM2-135M
 * shape, one thread, four alternating runs of each build). */
void matvec_q4_1_vnni(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                      const int8_t *x_qs, const float *x_d, int rows, int cols, int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        matvec_q4_rows(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols, KERNEL_VNNI_EVEX);
    } else {
        matvec_q4_rows(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols, KERNEL_VNNI_VEX);
    }
}

void matvec_q4_1_avx2(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                      const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    matvec_q4_rows(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols, 0);
}

X86_AVX2_END
