/* The arm_neon set's f32 products, the matvec and the batched one. A row's sum is one chain of
 * dependent float32 additions in column order (docs/numerics.md), which no vector can shorten; so
 * the vectors run across rows instead: lane i holds row i's running sum, and step j adds w[i][j] *
 * x[j] in all four lanes at once. Each lane does exactly the scalar kernel's multiplications and
 * additions in its order, so the bits are the same. The weights are stored row after row, so every
 * 4x4 tile (4 rows, 4 columns) is transposed in registers first. vmulq and vaddq, never vfmaq or
 * vmlaq (which may be fused), and the build's -ffp-contract=off keeps the compiler from fusing
 * them into fmla itself. */
#include "arm_neon.h"

/* Rows r .. r + n - 1 of w as the `lanes` lanes of a row group; lanes past n repeat row r, are
 * computed and dropped, so that a short last group takes the same code. */
static inline void group_rows(const float **p, int lanes, const float *w, int r, int n, int cols)
{
    for (int i = 0; i < lanes; i++) {
        p[i] = w + (int64_t)(r + (i < n ? i : 0)) * cols;
    }
}

/* The tile of rows p[0..3] at columns c .. c + 3, transposed: col[j] lane i = p[i][c + j]. */
static inline void transpose_tile(float32x4_t col[4], const float *const p[4], int c)
{
    const float32x4_t r[4] = {vld1q_f32(p[0] + c), vld1q_f32(p[1] + c), vld1q_f32(p[2] + c), vld1q_f32(p[3] + c)};
    transpose4(col, r);
}

/* The last k < 4 columns of the rows p[0..3], from column c: copied into a zero-padded 4x4 tile so
 * that the same transpose applies. Only col[0 .. k-1] are used; the padding is never added. */
static void transpose_partial_tile(float32x4_t col[4], const float *const p[4], int c, int k)
{
    float tile[4][4] = {{0.0f}};
    const float *q[4];
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < k; j++) {
            tile[i][j] = p[i][c + j];
        }
        q[i] = tile[i];
    }
    transpose_tile(col, q, 0);
}

/* Lane i: acc = acc + col[j] * x[j] for j = 0 .. k-1 in order, the scalar kernel's chain for four
 * rows at once. With `first` (column 0 is col[0]) the sum starts from the first product itself, as
 * the scalar kernel does: 0.0f + (-0.0f) would be +0.0f, so a row of -0.0 products would differ. */
static inline float32x4_t add_products(float32x4_t acc, const float32x4_t col[4], const float *x, int k, int first)
{
    int j = 0;
    if (first) {
        acc = vmulq_n_f32(col[0], x[0]);
        j = 1;
    }
#pragma GCC unroll 4
    for (; j < k; j++) {
        acc = vaddq_f32(acc, vmulq_n_f32(col[j], x[j]));
    }
    return acc;
}

/* Sixteen rows at a time, as four groups of four whose additions are independent chains, so that
 * the latency of one is hidden behind the others. The next sixteen rows are asked for while these
 * are summed, as in the x86_avx2 set, where that made decoding ~25 % faster (sixteen rows are sixteen
 * streams, which hardware prefetchers follow poorly); not measured on an aarch64 board. */
void kernel_matvec_f32(float *out, const float *w, const float *x, int rows, int cols)
{
    for (int r = 0; r < rows; r += 16) {
        const int n = rows - r < 16 ? rows - r : 16;
        const float *p[16];
        group_rows(p, 16, w, r, n, cols);
        float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
        int c = 0;
        if (cols >= 4) {
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                float32x4_t col[4];
                transpose_tile(col, p + 4 * g, 0);
                acc[g] = add_products(acc[g], col, x, 4, 1);
            }
            c = 4;
        }
        for (; c + 4 <= cols; c += 4) {
            /* The next sixteen rows are one block of 64 * cols bytes; each step asks for the next
             * 256 bytes of it, into L2. */
            const char *next = (const char *)(w + (int64_t)(r + 16) * cols) + (int64_t)c * 64;
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                __builtin_prefetch(next + 64 * i, 0, 2);
            }
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                float32x4_t col[4];
                transpose_tile(col, p + 4 * g, c);
                acc[g] = add_products(acc[g], col, x + c, 4, 0);
            }
        }
        if (c < cols) {
            for (int g = 0; g < 4; g++) {
                float32x4_t col[4];
                transpose_partial_tile(col, p + 4 * g, c, cols - c);
                acc[g] = add_products(acc[g], col, x + c, cols - c, c == 0);
            }
        }
        if (n == 16) {
            for (int g = 0; g < 4; g++) {
                vst1q_f32(out + r + 4 * g, acc[g]);
            }
        } else {
            float lanes[16];
            for (int g = 0; g < 4; g++) {
                vst1q_f32(lanes + 4 * g, acc[g]);
            }
            for (int i = 0; i < n; i++) {
                out[r + i] = lanes[i];
            }
        }
    }
}

/* Batched f32: tokens per pass over the weights; their partial sums wait in a stack array. */
#define F32_TOKENS 64

/* Eight rows at a time (two 4x4 tiles, two independent chains per token): each tile is transposed
 * once and then serves every token of the pass (token t's running sums of the eight rows are
 * sums[t], kept between tiles), so the weights are read once per pass. Each lane is the matvec
 * kernel's chain for its (row, token), so the bits are the same. */
static void matmul_f32_neon(float *out, int out_stride, const float *w, const float *x, int n_tok, int rows,
                            int cols)
{
    float32x4_t sums[F32_TOKENS][2];
    for (int t0 = 0; t0 < n_tok; t0 += F32_TOKENS) {
        const int nt = n_tok - t0 < F32_TOKENS ? n_tok - t0 : F32_TOKENS;
        const float *xt = x + (int64_t)t0 * cols;
        for (int r = 0; r < rows; r += 8) {
            const int n = rows - r < 8 ? rows - r : 8;
            const float *p[8];
            group_rows(p, 8, w, r, n, cols);
            for (int c = 0; c < cols; c += 4) {
                const int k = cols - c < 4 ? cols - c : 4;
                float32x4_t lo[4], hi[4];
                if (k == 4) {
                    transpose_tile(lo, p, c);
                    transpose_tile(hi, p + 4, c);
                } else {
                    transpose_partial_tile(lo, p, c, k);
                    transpose_partial_tile(hi, p + 4, c, k);
                }
                if (k == 4 && c > 0) {
                    for (int t = 0; t < nt; t++) {
                        const float *xc = xt + (int64_t)t * cols + c;
                        sums[t][0] = add_products(sums[t][0], lo, xc, 4, 0);
                        sums[t][1] = add_products(sums[t][1], hi, xc, 4, 0);
                    }
                } else {
                    for (int t = 0; t < nt; t++) {
                        const float *xc = xt + (int64_t)t * cols + c;
                        sums[t][0] = add_products(sums[t][0], lo, xc, k, c == 0);
                        sums[t][1] = add_products(sums[t][1], hi, xc, k, c == 0);
                    }
                }
            }
            for (int t = 0; t < nt; t++) {
                float lanes[8];
                vst1q_f32(lanes, sums[t][0]);
                vst1q_f32(lanes + 4, sums[t][1]);
                for (int i = 0; i < n; i++) {
                    out[(int64_t)(t0 + t) * out_stride + r + i] = lanes[i];
                }
            }
        }
    }
}

void kernel_matmul_f32(float *out, int out_stride, const float *w, const float *x, int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_f32(out, w, x, rows, cols);
    } else {
        matmul_f32_neon(out, out_stride, w, x, n_tok, rows, cols);
    }
}
