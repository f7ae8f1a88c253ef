/* The x86_avx2 set's batched product of the unsigned kept GGUF types (Q5_0, Q5_1, Q4_K, Q5_K,
 * Q6_K, Q3_K, Q2_K) from eight tokens on: matmul.c's lanes layout (x86_avx2.h) over the groups of
 * blocks blocks.h decodes, in the same per-thread scratch as matmul.c's lanes kernels. Called by
 * blocks.c's batched products. */
#include "x86_avx2.h"
#include "blocks.h"

X86_AVX2_BEGIN /* from here to X86_AVX2_END: compiled for AVX2 and F16C */

/* Batched (prefill) from eight tokens on, the unsigned types (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q3_K,
 * Q2_K: u <= 63): matmul.c's lanes layout for the GGUF blocks. The tokens of a pass are laid out
 * once (lanes_block: lane t = token t, with each token's half-block sums); the rows of a tile are
 * decoded once per pass into their bytes u (group_decode's) and each block's float32 scales and
 * offsets; then, for each group of eight tokens, four rows' block sums accumulate with a row's four
 * bytes broadcast to every lane (vpdpbusd, or maddubs + madd), a block's two halves apart for the
 * two-scale types. Each lane's terms are dots_terms's formula (blocks.c) in its order and go to
 * the partials of the reduction tree as the matvec's do (block b -> partial b % 8, then the
 * sequential combine), so every token gets the matvec's bits; no horizontal sums are left.
 * blocks.c's per-token kernel (blocks_matmul) keeps the short batches and the signed types (IQ4's
 * and MXFP4's table values). */
#define BLOCKS_LANE_TOKENS 32      /* tokens per pass; longer batches take several */
#define BLOCKS_LANE_TILE_BYTES 16384 /* decoded bytes of a row tile, kept in L1 while every token passes */
#define BLOCKS_LANE_TILE_MAX (4 * MAX_BLOCKS * KERNEL_QK > BLOCKS_LANE_TILE_BYTES ? 4 * MAX_BLOCKS * KERNEL_QK \
                                                                                  : BLOCKS_LANE_TILE_BYTES)

struct blocks_lanes {
    int8_t xt[BLOCKS_LANE_TOKENS * MAX_BLOCKS * KERNEL_QK]; /* group g, block b: eight steps of 8 tokens x 4 values */
    float xd[BLOCKS_LANE_TOKENS * MAX_BLOCKS];              /* group g, block b: 8 tokens' x_d */
    int32_t lo[BLOCKS_LANE_TOKENS * MAX_BLOCKS];            /* and their quant sums of values 0-15, */
    int32_t hi[BLOCKS_LANE_TOKENS * MAX_BLOCKS];            /* 16-31, */
    int32_t sum[BLOCKS_LANE_TOKENS * MAX_BLOCKS];           /* and all 32 */
    uint8_t u[BLOCKS_LANE_TILE_MAX];                        /* the tile's decoded bytes, row after row */
    float scales[BLOCKS_LANE_TILE_MAX / KERNEL_QK * 4];     /* per block of the tile: sa, sb, oa, ob */
};

_Static_assert(sizeof(struct blocks_lanes) <= X86_LANES_SCRATCH_BYTES, "the layout fits the set's lanes scratch");

/* Tokens t0 .. t0 + nt - 1 laid out; a short last group repeats its first token (computed and
 * dropped). */
static void blocks_lanes_tokens(struct blocks_lanes *bt, const int8_t *x_qs, const float *x_d, int t0, int nt, int nb)
{
    for (int g = 0; g * 8 < nt; g++) {
        const int8_t *x[8];
        lanes_group_inputs(x, bt->xd + (int64_t)g * nb * 8, x_qs, x_d, t0, nt, g, nb);
        for (int b = 0; b < nb; b++) {
            const int64_t gb = (int64_t)g * nb + b;
            __m256i lo, hi;
            lanes_block(bt->xt + gb * 8 * 32, x, b, &lo, &hi);
            _mm256_storeu_si256((__m256i *)(bt->lo + gb * 8), lo);
            _mm256_storeu_si256((__m256i *)(bt->hi + gb * 8), hi);
            _mm256_storeu_si256((__m256i *)(bt->sum + gb * 8), _mm256_add_epi32(lo, hi));
        }
    }
}

/* Rows r .. r + n - 1 decoded: their bytes u in value order and each block's sa, sb, oa, ob. */
__attribute__((always_inline)) static inline void blocks_lanes_rows(struct blocks_lanes *bt, enum block_kind kind,
                                                                    const uint8_t *w, int64_t row_bytes, int r, int n,
                                                                    int nb)
{
    for (int i = 0; i < n; i++) {
        const uint8_t *row = w + (int64_t)(r + i) * row_bytes;
        for (int b = 0; b < nb; b += 8) {
            const int m = nb - b < 8 ? nb - b : 8; /* below 8 only for a 32-value type's last group */
            struct group8 g;
            group_decode(kind, row, b, m, &g);
            float sa[8], sb[8], oa[8] = {0}, ob[8] = {0}; /* the offsets: the affine types' only */
            _mm256_storeu_ps(sa, g.sa);
            _mm256_storeu_ps(sb, g.sb);
            if (kind_affine(kind)) {
                _mm256_storeu_ps(oa, g.oa);
                _mm256_storeu_ps(ob, g.ob);
            }
            for (int k = 0; k < m; k++) {
                const int64_t blk = (int64_t)i * nb + b + k;
                _mm256_storeu_si256((__m256i *)(bt->u + blk * KERNEL_QK), g.u[k]);
                float *s = bt->scales + blk * 4;
                s[0] = sa[k], s[1] = sb[k], s[2] = oa[k], s[3] = ob[k];
            }
        }
    }
}

/* Block b's term for the eight tokens of a group (lane t), from its half sums ia, ib: dots_terms's
 * formula lane by lane, s = the block's sa, sb, oa, ob. */
__attribute__((always_inline)) static inline __m256 lanes_term(enum block_kind kind, __m256i ia, __m256i ib,
                                                               const float *s, __m256 xd, const int32_t *lo,
                                                               const int32_t *hi, const int32_t *sum)
{
    const int shift = kind_bias_shift(kind);
    if (kind_two_scales(kind)) {
        if (shift) {
            ia = _mm256_sub_epi32(ia, _mm256_slli_epi32(load8_i32(lo), shift));
            ib = _mm256_sub_epi32(ib, _mm256_slli_epi32(load8_i32(hi), shift));
        }
        __m256 terms = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(ia), _mm256_mul_ps(_mm256_set1_ps(s[0]), xd)),
                                     _mm256_mul_ps(_mm256_cvtepi32_ps(ib), _mm256_mul_ps(_mm256_set1_ps(s[1]), xd)));
        if (kind_affine(kind)) {
            terms = _mm256_add_ps(terms, _mm256_mul_ps(_mm256_cvtepi32_ps(load8_i32(lo)),
                                                       _mm256_mul_ps(_mm256_set1_ps(s[2]), xd)));
            terms = _mm256_add_ps(terms, _mm256_mul_ps(_mm256_cvtepi32_ps(load8_i32(hi)),
                                                       _mm256_mul_ps(_mm256_set1_ps(s[3]), xd)));
        }
        return terms;
    }
    __m256i isum = _mm256_add_epi32(ia, ib);
    if (shift) {
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(load8_i32(sum), shift));
    }
    __m256 terms = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(_mm256_set1_ps(s[0]), xd));
    if (kind_affine(kind)) {
        terms = _mm256_add_ps(terms, _mm256_mul_ps(_mm256_cvtepi32_ps(load8_i32(sum)),
                                                   _mm256_mul_ps(_mm256_set1_ps(s[2]), xd)));
    }
    return terms;
}

/* R (1 or 4) decoded rows against one group of eight tokens (gb: the group's first block index). */
__attribute__((always_inline)) static inline void blocks_lanes_group(float *out, int out_stride, int n_valid,
                                                                     const struct blocks_lanes *bt, enum block_kind kind,
                                                                     int vnni, int r, int64_t gb, int nb, int R)
{
    const int cols = nb * KERNEL_QK;
    __m256 part[4][8];
    for (int i = 0; i < R; i++) {
        for (int k = 0; k < 8; k++) {
            part[i][k] = _mm256_set1_ps(-0.0f);
        }
    }
    for (int b = 0; b < nb; b++) {
        const uint8_t *ub = bt->u + (int64_t)r * cols + b * KERNEL_QK;
        const int8_t *xb = bt->xt + (gb + b) * 8 * 32;
        /* named, to stay in registers: row i's sums of the block's values 0-15 (lo_i) and 16-31 (hi_i) */
        __m256i lo0 = _mm256_setzero_si256(), lo1 = lo0, lo2 = lo0, lo3 = lo0;
        __m256i hi0 = lo0, hi1 = lo0, hi2 = lo0, hi3 = lo0;
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m256i xl = _mm256_loadu_si256((const __m256i *)(xb + 32 * k));
            const __m256i xh = _mm256_loadu_si256((const __m256i *)(xb + 32 * (k + 4)));
            lo0 = lanes_step(lo0, bcast4(ub + 4 * k), xl, vnni);
            hi0 = lanes_step(hi0, bcast4(ub + 16 + 4 * k), xh, vnni);
            if (R == 4) {
                lo1 = lanes_step(lo1, bcast4(ub + cols + 4 * k), xl, vnni);
                hi1 = lanes_step(hi1, bcast4(ub + cols + 16 + 4 * k), xh, vnni);
                lo2 = lanes_step(lo2, bcast4(ub + 2 * cols + 4 * k), xl, vnni);
                hi2 = lanes_step(hi2, bcast4(ub + 2 * cols + 16 + 4 * k), xh, vnni);
                lo3 = lanes_step(lo3, bcast4(ub + 3 * cols + 4 * k), xl, vnni);
                hi3 = lanes_step(hi3, bcast4(ub + 3 * cols + 16 + 4 * k), xh, vnni);
            }
        }
        const __m256i lo[4] = {lo0, lo1, lo2, lo3}, hi[4] = {hi0, hi1, hi2, hi3};
        const __m256 xd = _mm256_loadu_ps(bt->xd + (gb + b) * 8);
        const int32_t *tlo = bt->lo + (gb + b) * 8, *thi = bt->hi + (gb + b) * 8, *tsum = bt->sum + (gb + b) * 8;
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            const float *s = bt->scales + ((int64_t)(r + i) * nb + b) * 4;
            part[i][b % 8] = _mm256_add_ps(part[i][b % 8], lanes_term(kind, lo[i], hi[i], s, xd, tlo, thi, tsum));
        }
    }
    lanes_store_rows(out, out_stride, n_valid, part, R);
}

__attribute__((always_inline)) static inline void blocks_lanes(enum block_kind kind, int vnni, float *out,
                                                               int out_stride, const uint8_t *w, const int8_t *x_qs,
                                                               const float *x_d, int n_tok, int rows, int cols)
{
    struct blocks_lanes *bt = x86_lanes_scratch(); /* this thread's, shared with matmul.c's lanes kernel */
    const int nb = cols / KERNEL_QK;
    const int64_t row_bytes = (int64_t)(cols / kind_values(kind)) * kind_bytes(kind);
    int tile = BLOCKS_LANE_TILE_BYTES / cols / 4 * 4;
    tile = tile < 4 ? 4 : tile;
    for (int t0 = 0; t0 < n_tok; t0 += BLOCKS_LANE_TOKENS) {
        const int nt = n_tok - t0 < BLOCKS_LANE_TOKENS ? n_tok - t0 : BLOCKS_LANE_TOKENS;
        blocks_lanes_tokens(bt, x_qs, x_d, t0, nt, nb);
        for (int r0 = 0; r0 < rows; r0 += tile) {
            const int nr = rows - r0 < tile ? rows - r0 : tile;
            blocks_lanes_rows(bt, kind, w, row_bytes, r0, nr, nb);
            for (int g = 0; g * 8 < nt; g++) {
                const int n_valid = nt - 8 * g < 8 ? nt - 8 * g : 8;
                float *o = out + (int64_t)(t0 + 8 * g) * out_stride + r0;
                int r = 0;
                for (; r + 4 <= nr; r += 4) {
                    blocks_lanes_group(o + r, out_stride, n_valid, bt, kind, vnni, r, (int64_t)g * nb, nb, 4);
                }
                for (; r < nr; r++) {
                    blocks_lanes_group(o + r, out_stride, n_valid, bt, kind, vnni, r, (int64_t)g * nb, nb, 1);
                }
            }
        }
    }
}

/* Each way to vpdpbusd compiled apart. */
__attribute__((always_inline)) static inline void blocks_lanes_vnni(enum block_kind kind, float *out, int out_stride,
                                                                    const uint8_t *w, const int8_t *x_qs,
                                                                    const float *x_d, int n_tok, int rows, int cols)
{
    switch (x86_avx2_vnni()) {
    case KERNEL_VNNI_VEX: blocks_lanes(kind, KERNEL_VNNI_VEX, out, out_stride, w, x_qs, x_d, n_tok, rows, cols); break;
    case KERNEL_VNNI_EVEX: blocks_lanes(kind, KERNEL_VNNI_EVEX, out, out_stride, w, x_qs, x_d, n_tok, rows, cols); break;
    default: blocks_lanes(kind, 0, out, out_stride, w, x_qs, x_d, n_tok, rows, cols); break;
    }
}

/* The unsigned kept types' batched product (blocks.h), each type compiled with its kind a constant. */
void blocks_lanes_batched(enum block_kind kind, float *out, int out_stride, const uint8_t *w, const int8_t *x_qs,
                          const float *x_d, int n_tok, int rows, int cols)
{
    switch (kind) {
    case KIND_Q5_0: blocks_lanes_vnni(KIND_Q5_0, out, out_stride, w, x_qs, x_d, n_tok, rows, cols); break;
    case KIND_Q5_1: blocks_lanes_vnni(KIND_Q5_1, out, out_stride, w, x_qs, x_d, n_tok, rows, cols); break;
    case KIND_Q4_K: blocks_lanes_vnni(KIND_Q4_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols); break;
    case KIND_Q5_K: blocks_lanes_vnni(KIND_Q5_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols); break;
    case KIND_Q6_K: blocks_lanes_vnni(KIND_Q6_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols); break;
    case KIND_Q3_K: blocks_lanes_vnni(KIND_Q3_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols); break;
    case KIND_Q2_K: blocks_lanes_vnni(KIND_Q2_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols); break;
    default: break; /* the signed types (IQ4_NL, IQ4_XS, MXFP4): blocks.c's blocks_matmul */
    }
}

X86_AVX2_END
