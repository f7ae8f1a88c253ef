/* The x86_avx2 set's batched products of q8_0, q4_0 and q4_1 (prefill, speculative passes):
 * from five tokens on the lanes kernels (eight tokens in the lanes of one vector, each row's
 * prepared weights broadcast to them), below five the short batches (each group of rows under
 * every token while it sits in L1). Every (row, token) sum is the matvec's, bit for bit. Called by
 * set.c's entry points once the CPU was checked. */
#include "x86_avx2.h"

X86_AVX2_BEGIN /* from here to X86_AVX2_END: compiled for AVX2 and F16C */

/* dst[i] = src[i] widened, i < n: for the batched kernels, which broadcast one block's scale to
 * every token lane and so want float32s in memory. */
static void widen_halves(float *dst, const KernelHalf *src, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(dst + i, load_halves8(src + i));
    }
    if (i < n) {
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - i), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(dst + i, mask, load_halves(src + i, n - i));
    }
}

/* Batched (prefill), q8_0, q4_0 and q4_1, for eight tokens and more: no horizontal sums at all. The
 * activations of up to LANE_TOKENS tokens are transposed once per call so that one vector holds
 * the same four values of a block for each of eight tokens (lane t: token t's values 4k .. 4k + 3 of
 * the block); a row's four weights 4k .. 4k + 3 are broadcast to every lane, and the eight k of a
 * block accumulate into lane t: token t's whole block sum, exact, in one lane. Four rows share each
 * activation vector. The rows of a tile are prepared once for every token that passes over it:
 *   without AVX-VNNI, q8_0: |w| (maddubs' unsigned operand; the activations take w's sign from the
 *     row itself), four products a step, madd to int32;
 *   without AVX-VNNI, q4_0 and q4_1: the nibble q (q4_0's value q - 8); a block's eight steps of
 *     pair sums stay int16 (8 * 2 * 15 * 127 = 30480), one madd a block; q4_0 takes 8 * sum(x)
 *     off, q4_1's term takes sum(x) as its xsum (kernel_q4_1_term);
 *   with it: vpdpbusd on u = w + 128 (q8_0) or q, 128 (q8_0) or 8 (q4_0) times sum(x) taken off.
 * Each lane then follows the reduction tree exactly as the matvec kernel does, so the bits are the
 * same. It replaced one weight row at a time against eight tokens' lanes, whose block sums took
 * seven hadds per eight blocks and token: 1,536 x 576 weights x 64 tokens, one thread, alternating
 * builds, q8_0 22-35 -> 34-45 G multiply-adds a second, q4_0 20-28 -> 39-72, q4_1 20-27 -> 38-69. */
#define LANE_TOKENS 64 /* tokens per pass; longer batches take several */
enum lane_kind { LANE_Q8_0, LANE_Q4_0, LANE_Q4_1 };
#define LANE_TILE_BYTES 16384 /* prepared weights of a row tile, kept in L1 while every token passes */
/* the largest tile: LANE_TILE_BYTES, or four rows when they are longer */
#define LANE_TILE_MAX (4 * MAX_BLOCKS * KERNEL_QK > LANE_TILE_BYTES ? 4 * MAX_BLOCKS * KERNEL_QK : LANE_TILE_BYTES)

struct lane_batch {
    int8_t xt[LANE_TOKENS * MAX_BLOCKS * KERNEL_QK]; /* group g, block b, k: 8 tokens x 4 values */
    float scales[LANE_TOKENS * MAX_BLOCKS];           /* group g, block b: 8 tokens' x_d */
    int32_t bias_sums[LANE_TOKENS * MAX_BLOCKS];      /* group g, block b: 8 tokens' bias * sum(x) */
    uint8_t u[LANE_TILE_MAX];
    float wd[LANE_TILE_MAX / KERNEL_QK]; /* the tile's weight scales widened, once for every token */
    float wm[LANE_TILE_MAX / KERNEL_QK]; /* and q4_1's minimums */
};

_Static_assert(sizeof(struct lane_batch) == X86_LANES_SCRATCH_BYTES, "the lanes scratch x86_avx2.h states");

/* One per thread: each thread of the pool runs the kernel on its own rows; the GGUF types' lanes
 * kernel (blocks_lanes.c) uses the same bytes. */
static _Thread_local struct lane_batch lane_batch;

void *x86_lanes_scratch(void)
{
    return &lane_batch;
}

/* Tokens t0 .. t0 + nt - 1 in the transposed layout; a short last group repeats its first token
 * (lanes computed and dropped). A block of eight tokens is an 8 x 8 matrix of 4-byte groups, so one
 * transpose8 lays it out; each token's quant sum (exact in int32) is the byte pairs' sums of its
 * lane, added over the eight steps. */
static void lane_prepare_tokens(struct lane_batch *bt, const int8_t *x_qs, const float *x_d, int t0, int nt, int nb,
                                int bias)
{
    for (int g = 0; g * 8 < nt; g++) {
        const int8_t *x[8];
        lanes_group_inputs(x, bt->scales + (int64_t)g * nb * 8, x_qs, x_d, t0, nt, g, nb);
        for (int b = 0; b < nb; b++) {
            const int64_t gb = (int64_t)g * nb + b;
            __m256i lo, hi;
            lanes_block(bt->xt + gb * 8 * 32, x, b, &lo, &hi);
            const __m256i sum = _mm256_add_epi32(lo, hi);
            _mm256_storeu_si256((__m256i *)(bt->bias_sums + gb * 8), _mm256_mullo_epi32(sum, _mm256_set1_epi32(bias)));
        }
    }
}

/* Rows r .. r + n - 1 as unsigned bytes in value order: q8_0 |w| (w + 128 with VNNI), q4_0 the
 * nibbles. */
static void lane_prepare_rows(uint8_t *restrict u, const uint8_t *restrict w, enum lane_kind kind, int vnni, int r, int n,
                              int cols)
{
    const int64_t blocks = (int64_t)n * cols / KERNEL_QK;
    if (kind == LANE_Q8_0) {
        const uint8_t *src = w + (int64_t)r * cols;
        for (int64_t blk = 0; blk < blocks; blk++) { /* two's complement w + 128: the sign bit flipped */
            const __m256i v = _mm256_loadu_si256((const __m256i *)(src + blk * 32));
            const __m256i prepared = vnni ? _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)) : _mm256_sign_epi8(v, v);
            _mm256_storeu_si256((__m256i *)(u + blk * 32), prepared);
        }
        return;
    }
    const uint8_t *src = w + (int64_t)r * (cols / 2);
    const __m128i low4 = _mm_set1_epi8(0x0F);
    for (int64_t blk = 0; blk < blocks; blk++) {
        const __m128i packed = _mm_loadu_si128((const __m128i *)(src + blk * 16));
        _mm_storeu_si128((__m128i *)(u + blk * 32), _mm_and_si128(packed, low4));
        _mm_storeu_si128((__m128i *)(u + blk * 32 + 16), _mm_and_si128(_mm_srli_epi16(packed, 4), low4));
    }
}

/* Step k of a block for one row: acc + the products of the row's four prepared weights at u (its
 * signed q8_0 quants at w) with the eight tokens' four values xv. q4_0 without VNNI accumulates
 * int16 pair sums (madd once a block, in lane_block_sum). */
__attribute__((always_inline)) static inline __m256i lane_step(__m256i acc, const uint8_t *u, const uint8_t *w,
                                                               __m256i xv, enum lane_kind kind, int vnni)
{
    if (vnni) {
        return vpdpbusd(acc, bcast4(u), xv, vnni);
    }
    if (kind != LANE_Q8_0) {
        return _mm256_add_epi16(acc, _mm256_maddubs_epi16(bcast4(u), xv));
    }
    const __m256i signed_x = _mm256_sign_epi8(xv, bcast4(w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(bcast4(u), signed_x), _mm256_set1_epi16(1)));
}

/* A block's sum from its even and odd steps' accumulators. */
__attribute__((always_inline)) static inline __m256i lane_block_sum(__m256i even, __m256i odd, enum lane_kind kind,
                                                                    int vnni)
{
    if (kind != LANE_Q8_0 && !vnni) { /* int16 pair sums: each half widened, then added */
        const __m256i ones = _mm256_set1_epi16(1);
        return _mm256_add_epi32(_mm256_madd_epi16(even, ones), _mm256_madd_epi16(odd, ones));
    }
    return _mm256_add_epi32(even, odd);
}

/* R (1 or 4) rows of the tile against one group of eight tokens; w: the first row's q8_0 quants
 * as the file holds them (read for their signs without VNNI). */
__attribute__((always_inline)) static inline void
lane_rows(float *out, int out_stride, int n_valid, const uint8_t *u, const uint8_t *w, int cols, const float *wd,
          const float *wm, int nb, const int8_t *xt, const float *scales, const int32_t *bias_sums, int R,
          enum lane_kind kind, int vnni)
{
    __m256 part[4][8];
    for (int i = 0; i < R; i++) {
        for (int k = 0; k < 8; k++) {
            part[i][k] = _mm256_set1_ps(-0.0f);
        }
    }
    for (int b = 0; b < nb; b++) {
        const uint8_t *ub = u + b * KERNEL_QK, *wb = w + b * KERNEL_QK;
        const int8_t *xb = xt + (int64_t)b * 8 * 32;
        __m256i acc[4];
        /* named: kept in registers. Each row's even and odd steps go to their own accumulator
         * (integer sums, exact in any order): eight dependency chains of four steps instead of
         * four of eight, as vpdpbusd's latency is several of its issue slots. */
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
        __m256i b0 = a0, b1 = a0, b2 = a0, b3 = a0;
#pragma GCC unroll 1
        for (int k = 0; k < 8; k += 2) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xb + 32 * k));
            const __m256i xw = _mm256_loadu_si256((const __m256i *)(xb + 32 * k + 32));
            a0 = lane_step(a0, ub + 4 * k, wb + 4 * k, xv, kind, vnni);
            b0 = lane_step(b0, ub + 4 * k + 4, wb + 4 * k + 4, xw, kind, vnni);
            if (R == 4) {
                a1 = lane_step(a1, ub + cols + 4 * k, wb + cols + 4 * k, xv, kind, vnni);
                b1 = lane_step(b1, ub + cols + 4 * k + 4, wb + cols + 4 * k + 4, xw, kind, vnni);
                a2 = lane_step(a2, ub + 2 * cols + 4 * k, wb + 2 * cols + 4 * k, xv, kind, vnni);
                b2 = lane_step(b2, ub + 2 * cols + 4 * k + 4, wb + 2 * cols + 4 * k + 4, xw, kind, vnni);
                a3 = lane_step(a3, ub + 3 * cols + 4 * k, wb + 3 * cols + 4 * k, xv, kind, vnni);
                b3 = lane_step(b3, ub + 3 * cols + 4 * k + 4, wb + 3 * cols + 4 * k + 4, xw, kind, vnni);
            }
        }
        acc[0] = lane_block_sum(a0, b0, kind, vnni);
        acc[1] = lane_block_sum(a1, b1, kind, vnni);
        acc[2] = lane_block_sum(a2, b2, kind, vnni);
        acc[3] = lane_block_sum(a3, b3, kind, vnni);
        const __m256i bias = _mm256_loadu_si256((const __m256i *)(bias_sums + b * 8));
        const __m256 xs = _mm256_loadu_ps(scales + b * 8);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            const __m256 d = _mm256_set1_ps(wd[(int64_t)i * nb + b]);
            const __m256 terms =
                kind == LANE_Q4_1 ? q4_1_terms(acc[i], bias, d, _mm256_set1_ps(wm[(int64_t)i * nb + b]), xs)
                                  : _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[i], bias)), _mm256_mul_ps(d, xs));
            part[i][b % 8] = _mm256_add_ps(part[i][b % 8], terms);
        }
    }
    lanes_store_rows(out, out_stride, n_valid, part, R);
}

/* w_m: q4_1's minimums (NULL for the others). */
__attribute__((always_inline)) static inline void matmul_lanes(float *out, int out_stride, const uint8_t *w,
                                                               enum lane_kind kind, int vnni, const KernelHalf *w_d,
                                                               const KernelHalf *w_m, const int8_t *x_qs,
                                                               const float *x_d, int n_tok, int rows, int cols)
{
    struct lane_batch *bt = &lane_batch;
    const int nb = cols / KERNEL_QK;
    const int row_bytes = kind == LANE_Q8_0 ? cols : cols / 2;
    const int bias = kind == LANE_Q4_0 ? 8 : kind == LANE_Q4_1 ? 1 : vnni ? 128 : 0; /* q4_1: its xsum */
    int tile = LANE_TILE_BYTES / cols / 4 * 4;
    tile = tile < 4 ? 4 : tile;
    for (int t0 = 0; t0 < n_tok; t0 += LANE_TOKENS) {
        const int nt = n_tok - t0 < LANE_TOKENS ? n_tok - t0 : LANE_TOKENS;
        lane_prepare_tokens(bt, x_qs, x_d, t0, nt, nb, bias);
        for (int r0 = 0; r0 < rows; r0 += tile) {
            const int nr = rows - r0 < tile ? rows - r0 : tile;
            lane_prepare_rows(bt->u, w, kind, vnni, r0, nr, cols);
            widen_halves(bt->wd, w_d + (int64_t)r0 * nb, nr * nb);
            if (kind == LANE_Q4_1) {
                widen_halves(bt->wm, w_m + (int64_t)r0 * nb, nr * nb);
            }
            /* The next tile's weights are asked for into L2 a slice per token group while this
             * tile is computed: otherwise preparing it would wait on memory for all of them. */
            const int next_rows = rows - r0 - nr < tile ? rows - r0 - nr : tile;
            const uint8_t *next = w + (int64_t)(r0 + nr) * row_bytes;
            const int64_t next_bytes = (int64_t)next_rows * row_bytes;
            const int groups = (nt + 7) / 8;
            for (int g = 0; g * 8 < nt; g++) {
                const int n_valid = nt - 8 * g < 8 ? nt - 8 * g : 8;
                for (int64_t off = next_bytes * g / groups & ~63; off < next_bytes * (g + 1) / groups; off += 64) {
                    _mm_prefetch((const char *)next + off, _MM_HINT_T1);
                }
                const int64_t gb = (int64_t)g * nb;
                float *o = out + (int64_t)(t0 + 8 * g) * out_stride + r0;
                const uint8_t *wr = w + (int64_t)r0 * row_bytes; /* the signs: q8_0 without VNNI only */
                int r = 0;
                for (; r + 4 <= nr; r += 4) {
                    lane_rows(o + r, out_stride, n_valid, bt->u + (int64_t)r * cols, wr + (int64_t)r * cols, cols,
                              bt->wd + (int64_t)r * nb, bt->wm + (int64_t)r * nb, nb, bt->xt + gb * 8 * 32,
                              bt->scales + gb * 8, bt->bias_sums + gb * 8, 4, kind, vnni);
                }
                for (; r < nr; r++) {
                    lane_rows(o + r, out_stride, n_valid, bt->u + (int64_t)r * cols, wr + (int64_t)r * cols, cols,
                              bt->wd + (int64_t)r * nb, bt->wm + (int64_t)r * nb, nb, bt->xt + gb * 8 * 32,
                              bt->scales + gb * 8, bt->bias_sums + gb * 8, 1, kind, vnni);
                }
            }
        }
    }
}

void matmul_q8_0_avx2(float *out, int out_stride, const int8_t *w_qs, const KernelHalf *w_d, const int8_t *x_qs,
                      const float *x_d, int n_tok, int rows, int cols)
{
    matmul_lanes(out, out_stride, (const uint8_t *)w_qs, LANE_Q8_0, 0, w_d, NULL, x_qs, x_d, n_tok, rows, cols);
}

void matmul_q8_0_vnni(float *out, int out_stride, const int8_t *w_qs, const KernelHalf *w_d, const int8_t *x_qs,
                      const float *x_d, int n_tok, int rows, int cols, int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        matmul_lanes(out, out_stride, (const uint8_t *)w_qs, LANE_Q8_0, KERNEL_VNNI_EVEX, w_d, NULL, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_lanes(out, out_stride, (const uint8_t *)w_qs, LANE_Q8_0, KERNEL_VNNI_VEX, w_d, NULL, x_qs, x_d, n_tok, rows, cols);
    }
}

void matmul_q4_0_avx2(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d, const int8_t *x_qs,
                      const float *x_d, int n_tok, int rows, int cols)
{
    matmul_lanes(out, out_stride, w_q4, LANE_Q4_0, 0, w_d, NULL, x_qs, x_d, n_tok, rows, cols);
}

void matmul_q4_0_vnni(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d, const int8_t *x_qs,
                      const float *x_d, int n_tok, int rows, int cols, int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        matmul_lanes(out, out_stride, w_q4, LANE_Q4_0, KERNEL_VNNI_EVEX, w_d, NULL, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_lanes(out, out_stride, w_q4, LANE_Q4_0, KERNEL_VNNI_VEX, w_d, NULL, x_qs, x_d, n_tok, rows, cols);
    }
}

/* Short batches (a speculative pass checks 2 to 8 tokens): up to PASS_TOKENS tokens against the
 * same rows in one pass. Each weight block comes from memory once and is multiplied into every
 * token's partials while it sits in L1, so the later tokens' arithmetic runs under the memory
 * stream of the first. Tiles of the matvec (the tokens one after another over a tile of rows) left
 * the memory idle while the later tokens computed: a pass of 2 tokens cost 1.65 single-token
 * passes on the SmolLM2-135M shape. Each (row, token) sum is the matvec kernel's: the same terms
 * into the same partials, eight rows combined by sum_partials8. */
#define PASS_TOKENS 4

/* One q8_0 row against nt tokens: acc[t] gets token t's eight partials, as q8_row makes them. */
__attribute__((always_inline)) static inline void
q8_row_tokens(__m256 acc[PASS_TOKENS], const int8_t *wq, const KernelHalf *wd, const int8_t *const x_qs[],
              const float *const x_d[], int nt, int nb, int vnni)
{
    for (int t = 0; t < nt; t++) {
        acc[t] = _mm256_set1_ps(-0.0f);
    }
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        const int8_t *w = wq + b * KERNEL_QK;
        prefetch_ahead(w, 4);
        for (int t = 0; t < nt; t++) {
            const int8_t *x = x_qs[t] + b * KERNEL_QK;
            const __m256i isums = block_sums8(q8_block(w, x, vnni), q8_block(w + 32, x + 32, vnni),
                                              q8_block(w + 64, x + 64, vnni), q8_block(w + 96, x + 96, vnni),
                                              q8_block(w + 128, x + 128, vnni), q8_block(w + 160, x + 160, vnni),
                                              q8_block(w + 192, x + 192, vnni), q8_block(w + 224, x + 224, vnni));
            acc[t] = add_terms(acc[t], isums, wd + b, x_d[t] + b, 8);
        }
    }
    if (b < nb) {
        for (int t = 0; t < nt; t++) {
            __m256i v[8];
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                v[k] = b + k < nb ? q8_block(wq + (b + k) * KERNEL_QK, x_qs[t] + (b + k) * KERNEL_QK, vnni)
                                  : _mm256_setzero_si256();
            }
            const __m256i isums = block_sums8(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
            acc[t] = add_terms(acc[t], isums, wd + b, x_d[t] + b, nb - b);
        }
    }
}

/* One q4_0 (w_m NULL) or q4_1 row against nt tokens, as q4_row and q4_1_row make each. */
__attribute__((always_inline)) static inline void
q4_row_tokens(__m256 acc[PASS_TOKENS], const uint8_t *wq, const KernelHalf *wd, const KernelHalf *wm,
              const struct q4_input *const in[], const float *const x_d[], int nt, int nb, int vnni)
{
    for (int t = 0; t < nt; t++) {
        acc[t] = _mm256_set1_ps(-0.0f);
    }
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        for (int t = 0; t < nt; t++) {
            const __m256i s = q4_nibble_sums8(wq, in[t], b, vnni);
            const __m256i sum8 = _mm256_loadu_si256((const __m256i *)(in[t]->sum8 + b));
            acc[t] = wm == NULL ? add_terms(acc[t], _mm256_sub_epi32(s, sum8), wd + b, x_d[t] + b, 8)
                                : add_q4_1_terms(acc[t], s, _mm256_srai_epi32(sum8, 3), wd + b, wm + b, x_d[t] + b, 8);
        }
    }
    if (b < nb) {
        const int n = nb - b;
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int t = 0; t < nt; t++) {
            __m256i v[4];
            q4_tail_pairs(v, wq, in[t], b, nb, vnni);
            const __m256i s = q4_pair_sums8(v[0], v[1], v[2], v[3]);
            const __m256i sum8 = _mm256_maskload_epi32(in[t]->sum8 + b, mask);
            acc[t] = wm == NULL ? add_terms(acc[t], _mm256_sub_epi32(s, sum8), wd + b, x_d[t] + b, n)
                                : add_q4_1_terms(acc[t], s, _mm256_srai_epi32(sum8, 3), wd + b, wm + b, x_d[t] + b, n);
        }
    }
}

/* The nt tokens' sums of rows r .. r + n - 1 (a group of eight, rows past n repeating row r) into
 * out, token t's at out + t * out_stride. `q4` and `w_m == NULL` are constants in every caller. */
__attribute__((always_inline)) static inline void
short_pass(float *out, int out_stride, const uint8_t *w, int q4, const KernelHalf *w_d, const KernelHalf *w_m,
           const int8_t *const x_qs[], const struct q4_input *const in[], const float *const x_d[], int nt, int r,
           int n, int cols, int vnni)
{
    const int nb = cols / KERNEL_QK;
    const int64_t row_bytes = q4 ? cols / 2 : cols;
    int row[8];
    group_rows8(row, r, n);
    __m256 acc[8][PASS_TOKENS];
    for (int i = 0; i < 8; i++) {
        const uint8_t *wq = w + (int64_t)row[i] * row_bytes;
        const int64_t first_block = (int64_t)row[i] * nb;
        if (q4) {
            q4_row_tokens(acc[i], wq, w_d + first_block, w_m == NULL ? NULL : w_m + first_block, in, x_d, nt, nb, vnni);
        } else {
            q8_row_tokens(acc[i], (const int8_t *)wq, w_d + first_block, x_qs, x_d, nt, nb, vnni);
        }
    }
    for (int t = 0; t < nt; t++) {
        __m256 token[8];
        for (int i = 0; i < 8; i++) {
            token[i] = acc[i][t];
        }
        store_rows(out + (int64_t)t * out_stride + r, sum_partials8(token), n);
    }
}

/* The q4 activations of a short batch, laid out once per call (q4_prepare), per thread. */
static _Thread_local struct q4_input short_batch_q4[SHORT_BATCH_MAX];

/* 2 .. SHORT_BATCH_MAX tokens: each group of eight rows passes under every token, PASS_TOKENS at a
 * time (a second pass finds the group's weights in L1), with nt a constant in each copy. */
__attribute__((always_inline)) static inline void
matmul_short(float *out, int out_stride, const uint8_t *w, int q4, const KernelHalf *w_d, const KernelHalf *w_m,
             const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols, int vnni)
{
    const int nb = cols / KERNEL_QK;
    const int8_t *xq[SHORT_BATCH_MAX];
    const float *xd[SHORT_BATCH_MAX];
    const struct q4_input *in[SHORT_BATCH_MAX];
    for (int t = 0; t < n_tok; t++) {
        xq[t] = x_qs + (int64_t)t * cols;
        xd[t] = x_d + (int64_t)t * nb;
        in[t] = &short_batch_q4[t];
        if (q4) {
            q4_prepare(&short_batch_q4[t], xq[t], nb);
        }
    }
    for (int r = 0; r < rows; r += 8) {
        const int n = rows - r < 8 ? rows - r : 8;
        for (int t0 = 0; t0 < n_tok; t0 += PASS_TOKENS) {
            const int nt = n_tok - t0 < PASS_TOKENS ? n_tok - t0 : PASS_TOKENS;
            float *o = out + (int64_t)t0 * out_stride;
            switch (nt) {
            case 1:
                short_pass(o, out_stride, w, q4, w_d, w_m, xq + t0, in + t0, xd + t0, 1, r, n, cols, vnni);
                break;
            case 2:
                short_pass(o, out_stride, w, q4, w_d, w_m, xq + t0, in + t0, xd + t0, 2, r, n, cols, vnni);
                break;
            case 3:
                short_pass(o, out_stride, w, q4, w_d, w_m, xq + t0, in + t0, xd + t0, 3, r, n, cols, vnni);
                break;
            default:
                short_pass(o, out_stride, w, q4, w_d, w_m, xq + t0, in + t0, xd + t0, PASS_TOKENS, r, n, cols, vnni);
                break;
            }
        }
    }
}

void matmul_short_q8_0(float *out, int out_stride, const int8_t *w_qs, const KernelHalf *w_d,
                       const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols, int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        matmul_short(out, out_stride, (const uint8_t *)w_qs, 0, w_d, NULL, x_qs, x_d, n_tok, rows, cols, KERNEL_VNNI_EVEX);
    } else if (vnni) {
        matmul_short(out, out_stride, (const uint8_t *)w_qs, 0, w_d, NULL, x_qs, x_d, n_tok, rows, cols, KERNEL_VNNI_VEX);
    } else {
        matmul_short(out, out_stride, (const uint8_t *)w_qs, 0, w_d, NULL, x_qs, x_d, n_tok, rows, cols, 0);
    }
}

void matmul_short_q4_0(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d,
                       const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols, int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        matmul_short(out, out_stride, w_q4, 1, w_d, NULL, x_qs, x_d, n_tok, rows, cols, KERNEL_VNNI_EVEX);
    } else if (vnni) {
        matmul_short(out, out_stride, w_q4, 1, w_d, NULL, x_qs, x_d, n_tok, rows, cols, KERNEL_VNNI_VEX);
    } else {
        matmul_short(out, out_stride, w_q4, 1, w_d, NULL, x_qs, x_d, n_tok, rows, cols, 0);
    }
}

void matmul_short_q4_1(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d,
                       const KernelHalf *w_m, const int8_t *x_qs, const float *x_d, int n_tok, int rows,
                       int cols, int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        matmul_short(out, out_stride, w_q4, 1, w_d, w_m, x_qs, x_d, n_tok, rows, cols, KERNEL_VNNI_EVEX);
    } else if (vnni) {
        matmul_short(out, out_stride, w_q4, 1, w_d, w_m, x_qs, x_d, n_tok, rows, cols, KERNEL_VNNI_VEX);
    } else {
        matmul_short(out, out_stride, w_q4, 1, w_d, w_m, x_qs, x_d, n_tok, rows, cols, 0);
    }
}

void matmul_q4_1_avx2(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d,
                      const KernelHalf *w_m, const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    matmul_lanes(out, out_stride, w_q4, LANE_Q4_1, 0, w_d, w_m, x_qs, x_d, n_tok, rows, cols);
}

void matmul_q4_1_vnni(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d,
                      const KernelHalf *w_m, const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols,
                      int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        matmul_lanes(out, out_stride, w_q4, LANE_Q4_1, KERNEL_VNNI_EVEX, w_d, w_m, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_lanes(out, out_stride, w_q4, LANE_Q4_1, KERNEL_VNNI_VEX, w_d, w_m, x_qs, x_d, n_tok, rows, cols);
    }
}

X86_AVX2_END
