/* The x86_avx2 set's f32 products, the matvec and the batched one: vectors across rows (lane i
 * carries row i's chain of column-order additions, the scalar kernel's bit for bit), each 8x8 tile
 * of weights transposed in registers. Called by set.c's entry points once the CPU was checked. */
#include "x86_avx2.h"

X86_AVX2_BEGIN /* from here to X86_AVX2_END: compiled for AVX2 and F16C */

/* f32 products. A row's sum is one chain of dependent float32 additions in column order
 * (docs/numerics.md), which no vector can shorten; so the vectors run across rows instead: lane i
 * holds row i's running sum, and step j adds w[i][j] * x[j] in all eight lanes at once. Each lane
 * does exactly the scalar kernel's multiplications and additions in its order, so the bits are
 * the same. The weights are stored row after row, so every 8x8 tile (8 rows, 8 columns) is
 * transposed in registers first. The functions are compiled for avx2 without fma: the compiler
 * has no fused multiply-add to turn a _mm256_mul_ps and _mm256_add_ps into. */

/* Rows r .. r + n - 1 of w as the `lanes` lanes of a row group; lanes past n repeat row r, are
 * computed and dropped, so that a short last group takes the same code. */
static inline void group_rows(const float **p, int lanes, const float *w, int r, int n, int cols)
{
    for (int i = 0; i < lanes; i++) {
        p[i] = w + (int64_t)(r + (i < n ? i : 0)) * cols;
    }
}

/* The tile of rows p[0..7] at columns c .. c + 7, transposed: col[j] lane i = p[i][c + j]. Rows i
 * and i + 4 are loaded into the two 128-bit halves of one register, so that the rest of the
 * transpose (unpack, shuffle) stays within the halves, where shuffles are cheap. */
__attribute__((always_inline)) static inline void transpose_tile(__m256 col[8], const float *const p[8], int c)
{
#pragma GCC unroll 2
    for (int h = 0; h < 8; h += 4) {
        __m256 r[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            r[i] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(p[i] + c + h)), _mm_loadu_ps(p[i + 4] + c + h),
                                        1);
        }
        const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]); /* rows 0 1 0 1, columns h h h+1 h+1 */
        const __m256 t1 = _mm256_unpackhi_ps(r[0], r[1]); /* columns h+2 h+2 h+3 h+3 */
        const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]);
        const __m256 t3 = _mm256_unpackhi_ps(r[2], r[3]);
        col[h] = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
        col[h + 1] = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
        col[h + 2] = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
        col[h + 3] = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    }
}

/* The last k < 8 columns of the rows p[0..7], from column c: copied into a zero-padded 8x8 tile so
 * that the same transpose applies. Only col[0 .. k-1] are used; the padding is never added. */
static void transpose_partial_tile(__m256 col[8], const float *const p[8], int c, int k)
{
    float tile[8][8] = {{0.0f}};
    const float *q[8];
    for (int i = 0; i < 8; i++) {
        for (int j = 0; j < k; j++) {
            tile[i][j] = p[i][c + j];
        }
        q[i] = tile[i];
    }
    transpose_tile(col, q, 0);
}

/* Lane i: acc = acc + col[j] * x[j] for j = 0 .. k-1 in order, the scalar kernel's chain for eight
 * rows at once. With `first` (column 0 is col[0]) the sum starts from the first product itself, as
 * the scalar kernel does: 0.0f + (-0.0f) would be +0.0f, so a row of -0.0 products would differ. */
__attribute__((always_inline)) static inline __m256 add_products(__m256 acc, const __m256 col[8], const float *x, int k,
                                                                 int first)
{
    int j = 0;
    if (first) {
        acc = _mm256_mul_ps(col[0], _mm256_broadcast_ss(x));
        j = 1;
    }
#pragma GCC unroll 8
    for (; j < k; j++) {
        acc = _mm256_add_ps(acc, _mm256_mul_ps(col[j], _mm256_broadcast_ss(x + j)));
    }
    return acc;
}

/* Sixteen rows at a time, as two groups of eight whose additions are independent chains, so that
 * one chain's latency is hidden behind the other's. One group's transposed tile (8 registers) is
 * used up before the other's is made: both at once would not fit the 16 registers. The sixteen
 * rows are sixteen streams through memory, which the hardware prefetcher follows poorly; asking for
 * the next group of rows while this one is summed, into L2 (_MM_HINT_T1: 36-96 KB ahead on the
 * SmolLM2 shapes, more than L1 holds), made decoding ~25 % faster than no prefetch and 10-25 %
 * faster than asking for each row's line 1-2 KiB ahead as the q8_0 kernel does, whose last
 * requests in a row fetch the next row, already being read (an Intel Xeon host, 538 MB of f32
 * weights per token). Past the last row it asks for whatever follows; a prefetch never faults. */
void matvec_f32_avx2(float *out, const float *w, const float *x, int rows, int cols)
{
    for (int r = 0; r < rows; r += 16) {
        const int n = rows - r < 16 ? rows - r : 16;
        const float *p[16];
        group_rows(p, 16, w, r, n, cols);
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        int c = 0;
        if (cols >= 8) {
            __m256 col[8];
            transpose_tile(col, p, 0);
            acc0 = add_products(acc0, col, x, 8, 1);
            transpose_tile(col, p + 8, 0);
            acc1 = add_products(acc1, col, x, 8, 1);
            c = 8;
        }
        for (; c + 8 <= cols; c += 8) {
            /* The next sixteen rows are one block of 64 * cols bytes; each step asks for the next
             * 512 bytes of it, so the whole block is requested while this group is summed. */
            const char *next = (const char *)(w + (int64_t)(r + 16) * cols) + (int64_t)c * 64;
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                _mm_prefetch(next + 64 * i, _MM_HINT_T1);
            }
            __m256 col[8];
            transpose_tile(col, p, c);
            acc0 = add_products(acc0, col, x + c, 8, 0);
            transpose_tile(col, p + 8, c);
            acc1 = add_products(acc1, col, x + c, 8, 0);
        }
        if (c < cols) {
            __m256 col[8];
            transpose_partial_tile(col, p, c, cols - c);
            acc0 = add_products(acc0, col, x + c, cols - c, c == 0);
            transpose_partial_tile(col, p + 8, c, cols - c);
            acc1 = add_products(acc1, col, x + c, cols - c, c == 0);
        }
        if (n == 16) {
            _mm256_storeu_ps(out + r, acc0);
            _mm256_storeu_ps(out + r + 8, acc1);
        } else {
            float lanes[16];
            _mm256_storeu_ps(lanes, acc0);
            _mm256_storeu_ps(lanes + 8, acc1);
            for (int i = 0; i < n; i++) {
                out[r + i] = lanes[i];
            }
        }
    }
}

/* Batched f32: tokens per pass over the weights; their partial sums wait in a stack array. */
#define F32_TOKENS 64

/* sums[t] lanes: acc + col[j] * x_t[j] for j < k, x_t = x + t * cols, for the nt tokens. */
__attribute__((always_inline)) static inline void
add_products_tokens(__m256 *sums, const __m256 col[8], const float *x, int cols, int nt, int k, int first)
{
    for (int t = 0; t < nt; t++) {
        sums[t] = add_products(sums[t], col, x + (int64_t)t * cols, k, first);
    }
}

/* Eight rows at a time: each 8x8 tile is transposed once and then serves every token of the pass
 * (token t's running sums of the eight rows are sums[t], kept between tiles), so the weights are
 * read once per pass and a transpose costs 1/n_tok of what it does when decoding. Eight rows, not
 * sixteen: the tile, a token's sums and x[j] then fit the 16 registers. Each lane is the matvec
 * kernel's chain for its (row, token), so the bits are the same. */
void matmul_f32_avx2(float *out, int out_stride, const float *w, const float *x, int n_tok, int rows, int cols)
{
    __m256 sums[F32_TOKENS];
    for (int t0 = 0; t0 < n_tok; t0 += F32_TOKENS) {
        const int nt = n_tok - t0 < F32_TOKENS ? n_tok - t0 : F32_TOKENS;
        const float *xt = x + (int64_t)t0 * cols;
        for (int r = 0; r < rows; r += 8) {
            const int n = rows - r < 8 ? rows - r : 8;
            const float *p[8];
            group_rows(p, 8, w, r, n, cols);
            int c = 0;
            if (cols >= 8) {
                __m256 col[8];
                transpose_tile(col, p, 0);
                add_products_tokens(sums, col, xt, cols, nt, 8, 1);
                c = 8;
            }
            for (; c + 8 <= cols; c += 8) {
                __m256 col[8];
                transpose_tile(col, p, c);
                add_products_tokens(sums, col, xt + c, cols, nt, 8, 0);
            }
            if (c < cols) {
                __m256 col[8];
                transpose_partial_tile(col, p, c, cols - c);
                add_products_tokens(sums, col, xt + c, cols, nt, cols - c, c == 0);
            }
            for (int t = 0; t < nt; t++) {
                float lanes[8];
                _mm256_storeu_ps(lanes, sums[t]);
                for (int i = 0; i < n; i++) {
                    out[(int64_t)(t0 + t) * out_stride + r + i] = lanes[i];
                }
            }
        }
    }
}

X86_AVX2_END
