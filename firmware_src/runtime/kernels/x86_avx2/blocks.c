/* The x86_avx2 set's kernels for the GGUF block types kept as the file holds them (Q5_0, Q5_1,
 * Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, IQ4_NL, IQ4_XS, MXFP4): the matvec and the batched product token by
 * token, on the groups of blocks blocks.h decodes (the lanes kernel for eight tokens and more:
 * blocks_lanes.c). Called by set.c's entry points when the CPU has AVX2 and F16C and a row fits the
 * activation sums' arrays. */
#include "x86_avx2.h"
#include "blocks.h"

X86_AVX2_BEGIN /* from here to X86_AVX2_END: compiled for AVX2 and F16C */

/* The GGUF block types kept as the file holds them (kernels.h, "GGUF block types"): decode kernels
 * that read each weight byte once, with the bits of kernels/scalar.c. For every type a block of 32
 * values is turned into 32 unsigned bytes u (the quants, or the quants plus a bias the type's
 * formula takes off again as bias * sum(x), an exact integer identity), and maddubs + madd give
 * the exact int32 sums (no pair of products can saturate int16: the largest u is 63, Q6_K's, and
 * 2 * 63 * 127 = 16002; IQ4's and MXFP4's signed table values go through the sign trick with
 * |v| <= 127, at most 2 * 127 * 127 = 32258). A 256-value superblock is exactly eight 32-value blocks, so its
 * eight block terms are one float vector whose lane j is block 8s + j: it is added to the row's
 * eight partials as it stands (block b -> partial b % 8, in block order). The 32-value types take
 * eight blocks per vector, the q8_0 way. Every term is the contract's formula, a separate
 * multiply or add per step in its order, lane by lane. Activation sums (whole blocks and their
 * halves) are made once per call. The matvec and the short batches take the maddubs path; the
 * lanes kernel for eight tokens and more (blocks_lanes) takes vpdpbusd where the CPU has it (the
 * same exact sums; the tests run both paths). Measured against the scalar kernels (thread CPU time, rows of 2048 values held in L2,
 * an AMD EPYC KVM guest): 10x (Q4_K, Q5_K) to 45x (Q6_K, Q2_K); from memory Q4_K, Q5_K, Q6_K and
 * Q5_0 read 7-8 GB/s where the q8_0 kernel reads 10, while Q3_K, Q2_K and IQ4_XS stay compute bound
 * at 4-6 GB/s. Q5_0 (the Gemma 3 270M file's rows of 640 values) cost ~1.7x q8_0's time per byte
 * while its matvec decoded eight blocks before multiplying them (they spilled to the stack); each
 * block multiplied as soon as it is decoded, and its nibbles spread by one broadcast and one
 * shift, it ran 1.2-1.4x faster (2048 x 640 from memory, thread CPU time, alternating builds). */

/* The q8_0 input's quant sums per 32-value block b: whole, values 0-15 and values 16-31. Lanes
 * past the last block up to a multiple of eight are 0, so eight blocks' sums load as one vector. */
struct block_input {
    int32_t sum[MAX_BLOCKS];
    int32_t lo[MAX_BLOCKS];
    int32_t hi[MAX_BLOCKS];
};

static void block_input_prepare(struct block_input *in, const int8_t *x_qs, int nb)
{
    for (int b = 0; b < nb; b++) {
        const int8_t *x = x_qs + b * KERNEL_QK;
        int32_t lo = 0, hi = 0;
        for (int l = 0; l < 16; l++) {
            lo += x[l];
            hi += x[16 + l];
        }
        in->lo[b] = lo;
        in->hi[b] = hi;
        in->sum[b] = lo + hi;
    }
    for (int b = nb; b % 8 != 0; b++) {
        in->lo[b] = in->hi[b] = in->sum[b] = 0;
    }
}

/* Lanes 0 .. n - 1 set (n <= 8). */
__attribute__((always_inline)) static inline __m256i lane_mask(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* u: unsigned bytes (each <= 63 here), x: q8_0 quants; 8 int32 lanes, lanes 0-3 the products of
 * values 0-15, lanes 4-7 of values 16-31. */
__attribute__((always_inline)) static inline __m256i dot_block(__m256i u, const int8_t *x)
{
    return dot_u8s8(u, _mm256_loadu_si256((const __m256i *)x), 0);
}

/* Signed values v (|v| <= 127, IQ4's table) times x: |v| unsigned, x taking v's sign. */
__attribute__((always_inline)) static inline __m256i dot_block_signed(__m256i v, const int8_t *x)
{
    const __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    return dot_u8s8(_mm256_sign_epi8(v, v), _mm256_sign_epi8(xv, v), 0);
}

/* u (unsigned bytes <= 31) times x: 16 int16 lanes, each the sum of two products (lanes 0-7 values
 * 0-15, lanes 8-15 values 16-31); none saturates (2 * 31 * 128 = 7936). */
__attribute__((always_inline)) static inline __m256i pairs_block(__m256i u, const int8_t *x)
{
    return _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)x));
}

/* Signed values v (|v| <= 31, MXFP4's table) times x, as pairs_block's: |v| unsigned, x taking v's sign. */
__attribute__((always_inline)) static inline __m256i pairs_block_signed(__m256i v, const int8_t *x)
{
    const __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    return _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(xv, v));
}

/* Eight blocks' pair sums totalled: lane i of the result is the sum of p[i]'s 16 int16 lanes. The
 * first two steps add in int16, which stays exact for bytes <= 31: a sum of eight products is at
 * most 8 * 31 * 128 = 31744 in size. Two horizontal steps fewer than widening each block to int32
 * first (block_sums8), and integer adds: the same sums in any order. */
__attribute__((always_inline)) static inline __m256i pair_sums8(const __m256i p[8])
{
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i q0123 = _mm256_hadd_epi16(_mm256_hadd_epi16(p[0], p[1]), _mm256_hadd_epi16(p[2], p[3]));
    const __m256i q4567 = _mm256_hadd_epi16(_mm256_hadd_epi16(p[4], p[5]), _mm256_hadd_epi16(p[6], p[7]));
    const __m256i h0123 = _mm256_madd_epi16(q0123, ones); /* lanes 0-3 values 0-15 of blocks 0-3, 4-7 values 16-31 */
    const __m256i h4567 = _mm256_madd_epi16(q4567, ones);
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                            _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

/* Eight blocks' lane sums split by halves: lane j of *a is the total of v[j]'s lanes 0-3 (values
 * 0-15), of *b its lanes 4-7 (values 16-31); block_sums8 without its last add. */
__attribute__((always_inline)) static inline void half_sums8(const __m256i v[8], __m256i *a, __m256i *b)
{
    const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    *a = _mm256_permute2x128_si256(h0123, h4567, 0x20);
    *b = _mm256_permute2x128_si256(h0123, h4567, 0x31);
}

/* The terms of a group of blocks from their integer products v (kind_dot's; lane k = block b + k),
 * each the contract's formula in its order (kernel_unpacked_term); lanes past n are -0.0f, which
 * leaves a partial as it was.
 *   one scale:  (float)isum * (s * x_d) [+ (float)xsum * (o * x_d)]
 *   two scales: (float)isum_a * (s_a * x_d) + (float)isum_b * (s_b * x_d)
 *               [+ (float)xsum_a * (o_a * x_d)] [+ (float)xsum_b * (o_b * x_d)] */
__attribute__((always_inline)) static inline __m256 dots_terms(enum block_kind kind, const __m256i v[8],
                                                               const struct group8 *g, const float *x_d,
                                                               const struct block_input *in, int b, int n)
{
    const int shift = kind_bias_shift(kind);
    const __m256i mask = lane_mask(n);
    const __m256 xd = n == 8 ? _mm256_loadu_ps(x_d + b) : _mm256_maskload_ps(x_d + b, mask);
    __m256 terms;
    if (kind_two_scales(kind)) {
        __m256i ia, ib;
        half_sums8(v, &ia, &ib);
        if (shift) {
            ia = _mm256_sub_epi32(ia, _mm256_slli_epi32(load8_i32(in->lo + b), shift));
            ib = _mm256_sub_epi32(ib, _mm256_slli_epi32(load8_i32(in->hi + b), shift));
        }
        terms = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(ia), _mm256_mul_ps(g->sa, xd)),
                              _mm256_mul_ps(_mm256_cvtepi32_ps(ib), _mm256_mul_ps(g->sb, xd)));
        if (kind_affine(kind)) {
            terms = _mm256_add_ps(terms, _mm256_mul_ps(_mm256_cvtepi32_ps(load8_i32(in->lo + b)), _mm256_mul_ps(g->oa, xd)));
            terms = _mm256_add_ps(terms, _mm256_mul_ps(_mm256_cvtepi32_ps(load8_i32(in->hi + b)), _mm256_mul_ps(g->ob, xd)));
        }
    } else {
        __m256i isums = kind_int16_sums(kind) ? pair_sums8(v) : block_sums8(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
        if (shift) {
            isums = _mm256_sub_epi32(isums, _mm256_slli_epi32(load8_i32(in->sum + b), shift));
        }
        terms = _mm256_mul_ps(_mm256_cvtepi32_ps(isums), _mm256_mul_ps(g->sa, xd));
        if (kind_affine(kind)) {
            terms = _mm256_add_ps(terms, _mm256_mul_ps(_mm256_cvtepi32_ps(load8_i32(in->sum + b)), _mm256_mul_ps(g->oa, xd)));
        }
    }
    if (n < 8) {
        terms = _mm256_blendv_ps(_mm256_set1_ps(-0.0f), terms, _mm256_castsi256_ps(mask));
    }
    return terms;
}

/* Block k's quants (or table values) times token's x: 16 int16 pair sums for the kinds of
 * kind_int16_sums (pairs_block's), 8 int32 lanes for the others (dot_block's); dots_terms totals
 * either. */
__attribute__((always_inline)) static inline __m256i kind_dot(enum block_kind kind, __m256i u, const int8_t *x)
{
    if (kind_int16_sums(kind)) {
        return kind_signed(kind) ? pairs_block_signed(u, x) : pairs_block(u, x);
    }
    return kind_signed(kind) ? dot_block_signed(u, x) : dot_block(u, x);
}

/* A decoded group's terms against one token's input (x_qs, x_d, its sums). */
__attribute__((always_inline)) static inline __m256 group_terms(enum block_kind kind, const struct group8 *g,
                                                                const int8_t *x_qs, const float *x_d,
                                                                const struct block_input *in, int b, int n)
{
    __m256i v[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        v[k] = k < n ? kind_dot(kind, g->u[k], x_qs + (b + k) * KERNEL_QK) : _mm256_setzero_si256();
    }
    return dots_terms(kind, v, g, x_d, in, b, n);
}

/* The same terms for a 32-value type's group in the matvec, each block multiplied as soon as it
 * is decoded: holding eight decoded blocks for the product spilled them to the stack, and Q5_0
 * (rows of 640 values in the Gemma 3 270M file) ran slower per value than q8_0. */
__attribute__((always_inline)) static inline __m256 small_group_terms(enum block_kind kind, const uint8_t *row,
                                                                      const int8_t *x_qs, const float *x_d,
                                                                      const struct block_input *in, int b, int n)
{
    const int bytes = kind_bytes(kind);
    prefetch_ahead(row + (int64_t)b * bytes, (8 * bytes + 63) / 64);
    struct small_scales sc = {{0}, {0}, {0}};
    __m256i v[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        v[k] = k < n ? kind_dot(kind, small_block(kind, row + (int64_t)(b + k) * bytes, &sc, k), x_qs + (b + k) * KERNEL_QK)
                     : _mm256_setzero_si256();
    }
    struct group8 g;
    small_scales_set(kind, &sc, &g);
    return dots_terms(kind, v, &g, x_d, in, b, n);
}

/* One row's eight partials: group after group, in block order. */
__attribute__((always_inline)) static inline __m256 row_group(enum block_kind kind, __m256 acc, const uint8_t *row,
                                                              const int8_t *x_qs, const float *x_d,
                                                              const struct block_input *in, int b, int n)
{
    if (kind_values(kind) == 32) {
        return _mm256_add_ps(acc, small_group_terms(kind, row, x_qs, x_d, in, b, n));
    }
    struct group8 g;
    group_decode(kind, row, b, n, &g);
    return _mm256_add_ps(acc, group_terms(kind, &g, x_qs, x_d, in, b, n));
}

__attribute__((always_inline)) static inline __m256 blocks_row(enum block_kind kind, const uint8_t *row,
                                                               const int8_t *x_qs, const float *x_d,
                                                               const struct block_input *in, int nb)
{
    __m256 acc = _mm256_set1_ps(-0.0f);
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        acc = row_group(kind, acc, row, x_qs, x_d, in, b, 8);
    }
    /* A 32-value type's last 1-7 blocks (a superblock type has none), their count a constant in
     * each case: a variable count cost a branch per block, and rows of 640 values (20 blocks, the
     * Gemma 3 270M shape) ran at 2/3 of the speed of rows of 2048. */
    switch (kind_values(kind) == 32 ? nb - b : 0) {
    case 1: acc = row_group(kind, acc, row, x_qs, x_d, in, b, 1); break;
    case 2: acc = row_group(kind, acc, row, x_qs, x_d, in, b, 2); break;
    case 3: acc = row_group(kind, acc, row, x_qs, x_d, in, b, 3); break;
    case 4: acc = row_group(kind, acc, row, x_qs, x_d, in, b, 4); break;
    case 5: acc = row_group(kind, acc, row, x_qs, x_d, in, b, 5); break;
    case 6: acc = row_group(kind, acc, row, x_qs, x_d, in, b, 6); break;
    case 7: acc = row_group(kind, acc, row, x_qs, x_d, in, b, 7); break;
    default: break;
    }
    return acc;
}

/* A kept GGUF type's matvec: eight rows at a time (a short last group repeats its first row,
 * computed and dropped), each row's blocks streamed in order, the eight rows' partials combined by
 * sum_partials8 (the tree of kernels.h). cols / 32 <= MAX_BLOCKS. */
__attribute__((always_inline)) static inline void blocks_matvec(enum block_kind kind, float *out, const uint8_t *w,
                                                                const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    const int64_t row_bytes = (int64_t)(cols / kind_values(kind)) * kind_bytes(kind);
    struct block_input in;
    block_input_prepare(&in, x_qs, nb);
    for (int r = 0; r < rows; r += 8) {
        const int n = rows - r < 8 ? rows - r : 8;
        int row[8];
        group_rows8(row, r, n);
        __m256 acc[8];
        for (int i = 0; i < 8; i++) {
            acc[i] = blocks_row(kind, w + (int64_t)row[i] * row_bytes, x_qs, x_d, &in, nb);
        }
        store_rows(out + r, sum_partials8(acc), n);
    }
}

/* Batched (prefill): each weight row is read and decoded once per pass of up to BLOCKS_TOKENS
 * tokens, and every group of it, once decoded, serves all of them: token t's eight partials are
 * acc[t] (lane k = partial k), the same additions in the same order as the matvec's, so the same
 * bits; eight tokens' partials are combined together by sum_partials8 (lane t = token t). A pass's
 * token count is rounded up to eight with repeats of its first token (computed and dropped). */
#define BLOCKS_TOKENS 16

struct blocks_batch {
    struct block_input in[BLOCKS_TOKENS];
};

/* One per thread: each thread of the pool runs the kernel on its own rows. */
static _Thread_local struct blocks_batch blocks_batch;

/* Blocks b .. b + n - 1 of a row decoded once, their terms added to every token's partials. */
__attribute__((always_inline)) static inline void matmul_group(enum block_kind kind, __m256 *acc, int lanes,
                                                               const uint8_t *row, int b, int n,
                                                               const int8_t *const *xq, const float *const *xd,
                                                               const struct block_input *in)
{
    struct group8 g;
    group_decode(kind, row, b, n, &g);
    for (int t = 0; t < lanes; t++) {
        acc[t] = _mm256_add_ps(acc[t], group_terms(kind, &g, xq[t], xd[t], &in[t], b, n));
    }
}

__attribute__((always_inline)) static inline void blocks_matmul(enum block_kind kind, float *out, int out_stride,
                                                                const uint8_t *w, const int8_t *x_qs, const float *x_d,
                                                                int n_tok, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    const int64_t row_bytes = (int64_t)(cols / kind_values(kind)) * kind_bytes(kind);
    struct blocks_batch *bt = &blocks_batch;
    for (int t0 = 0; t0 < n_tok; t0 += BLOCKS_TOKENS) {
        const int nt = n_tok - t0 < BLOCKS_TOKENS ? n_tok - t0 : BLOCKS_TOKENS;
        const int lanes = (nt + 7) / 8 * 8;
        const int8_t *xq[BLOCKS_TOKENS];
        const float *xd[BLOCKS_TOKENS];
        for (int t = 0; t < lanes; t++) {
            const int tok = t0 + (t < nt ? t : 0);
            xq[t] = x_qs + (int64_t)tok * cols;
            xd[t] = x_d + (int64_t)tok * nb;
            block_input_prepare(&bt->in[t], xq[t], nb);
        }
        for (int r = 0; r < rows; r++) {
            const uint8_t *row = w + (int64_t)r * row_bytes;
            __m256 acc[BLOCKS_TOKENS];
            for (int t = 0; t < lanes; t++) {
                acc[t] = _mm256_set1_ps(-0.0f);
            }
            int b = 0;
            for (; b + 8 <= nb; b += 8) {
                matmul_group(kind, acc, lanes, row, b, 8, xq, xd, bt->in);
            }
            switch (kind_values(kind) == 32 ? nb - b : 0) { /* the last 1-7 blocks, as blocks_row's */
            case 1: matmul_group(kind, acc, lanes, row, b, 1, xq, xd, bt->in); break;
            case 2: matmul_group(kind, acc, lanes, row, b, 2, xq, xd, bt->in); break;
            case 3: matmul_group(kind, acc, lanes, row, b, 3, xq, xd, bt->in); break;
            case 4: matmul_group(kind, acc, lanes, row, b, 4, xq, xd, bt->in); break;
            case 5: matmul_group(kind, acc, lanes, row, b, 5, xq, xd, bt->in); break;
            case 6: matmul_group(kind, acc, lanes, row, b, 6, xq, xd, bt->in); break;
            case 7: matmul_group(kind, acc, lanes, row, b, 7, xq, xd, bt->in); break;
            default: break;
            }
            for (int t = 0; t < lanes; t += 8) {
                float sums[8];
                _mm256_storeu_ps(sums, sum_partials8(acc + t));
                for (int i = 0; i < 8 && t + i < nt; i++) {
                    out[(int64_t)(t0 + t + i) * out_stride + r] = sums[i];
                }
            }
        }
    }
}

/* The batched product of a kept type: the lanes kernel (blocks_lanes.c) from BLOCKS_LANES_FROM
 * tokens on for the unsigned types, the per-token one otherwise. */
__attribute__((always_inline)) static inline void blocks_batched(enum block_kind kind, float *out, int out_stride,
                                                                 const uint8_t *w, const int8_t *x_qs, const float *x_d,
                                                                 int n_tok, int rows, int cols)
{
    if (n_tok < BLOCKS_LANES_FROM || kind_signed(kind)) {
        blocks_matmul(kind, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
        return;
    }
    blocks_lanes_batched(kind, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

/* Each kept type's own kernels, compiled with its kind a constant. */
void matvec_q5_0_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_Q5_0, out, w, x_qs, x_d, rows, cols);
}

void matmul_q5_0_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                    int rows, int cols)
{
    blocks_batched(KIND_Q5_0, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

void matvec_q5_1_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_Q5_1, out, w, x_qs, x_d, rows, cols);
}

void matmul_q5_1_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                    int rows, int cols)
{
    blocks_batched(KIND_Q5_1, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

void matvec_q4_k_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_Q4_K, out, w, x_qs, x_d, rows, cols);
}

void matmul_q4_k_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                    int rows, int cols)
{
    blocks_batched(KIND_Q4_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

void matvec_q5_k_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_Q5_K, out, w, x_qs, x_d, rows, cols);
}

void matmul_q5_k_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                    int rows, int cols)
{
    blocks_batched(KIND_Q5_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

void matvec_q6_k_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_Q6_K, out, w, x_qs, x_d, rows, cols);
}

void matmul_q6_k_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                    int rows, int cols)
{
    blocks_batched(KIND_Q6_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

void matvec_q3_k_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_Q3_K, out, w, x_qs, x_d, rows, cols);
}

void matmul_q3_k_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                    int rows, int cols)
{
    blocks_batched(KIND_Q3_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

void matvec_q2_k_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_Q2_K, out, w, x_qs, x_d, rows, cols);
}

void matmul_q2_k_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                    int rows, int cols)
{
    blocks_batched(KIND_Q2_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

void matvec_iq4_nl_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_IQ4_NL, out, w, x_qs, x_d, rows, cols);
}

void matmul_iq4_nl_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                    int rows, int cols)
{
    blocks_matmul(KIND_IQ4_NL, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

void matvec_mxfp4_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_MXFP4, out, w, x_qs, x_d, rows, cols);
}

void matmul_mxfp4_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                       int rows, int cols)
{
    blocks_matmul(KIND_MXFP4, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

void matvec_iq4_xs_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_IQ4_XS, out, w, x_qs, x_d, rows, cols);
}

void matmul_iq4_xs_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                    int rows, int cols)
{
    blocks_matmul(KIND_IQ4_XS, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

X86_AVX2_END
