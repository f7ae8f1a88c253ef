/* The rv32 set's batched products (several tokens at once, prefill): tiles of rows that stay in
 * cache while every token passes over them, each token through matvec.c's product. */
#include "rv32.h"

/* Batched products (prefill) as fallback.h's tiled ones, tiles of rows that stay in cache
 * while every token passes over them, but a multiple of 16 rows each, so that all of a tile goes
 * through the 16-row passes. */
__attribute__((noinline)) static void matmul_q8_0_tiles(float *out, int out_stride, const int8_t *w_qs,
                                                        const KernelHalf *w_d, const int8_t *x_qs, const float *x_d,
                                                        int n_tok, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    int tile = 16384 / (cols + nb * (int)sizeof(KernelHalf)) / 16 * 16;
    tile = tile < 16 ? 16 : tile;
    for (int r = 0; r < rows; r += tile) {
        const int n = rows - r < tile ? rows - r : tile;
        for (int t = 0; t < n_tok; t++) {
            kernel_matvec_q8_0(out + (int64_t)t * out_stride + r, w_qs + (int64_t)r * cols, w_d + (int64_t)r * nb,
                               x_qs + (int64_t)t * cols, x_d + (int64_t)t * nb, n, cols);
        }
    }
}

/* One token (decode) is the product itself: a jump, no frame of this function's own. */
void kernel_matmul_q8_0(float *out, int out_stride, const int8_t *w_qs, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q8_0(out, w_qs, w_d, x_qs, x_d, rows, cols);
    } else {
        matmul_q8_0_tiles(out, out_stride, w_qs, w_d, x_qs, x_d, n_tok, rows, cols);
    }
}

/* Batched q4_1 as the q8_0 one above: tiles of a multiple of 8 rows that stay in cache while
 * every token passes over them. */
__attribute__((noinline)) static void matmul_q4_1_tiles(float *out, int out_stride, const uint8_t *w_q4,
                                                        const KernelHalf *w_d, const KernelHalf *w_m,
                                                        const int8_t *x_qs, const float *x_d, int n_tok, int rows,
                                                        int cols)
{
    const int nb = cols / KERNEL_QK;
    int tile = 16384 / (cols / 2 + 2 * nb * (int)sizeof(KernelHalf)) / 8 * 8;
    tile = tile < 8 ? 8 : tile;
    for (int r = 0; r < rows; r += tile) {
        const int n = rows - r < tile ? rows - r : tile;
        for (int t = 0; t < n_tok; t++) {
            kernel_matvec_q4_1(out + (int64_t)t * out_stride + r, w_q4 + (int64_t)r * (cols / 2),
                               w_d + (int64_t)r * nb, w_m + (int64_t)r * nb, x_qs + (int64_t)t * cols,
                               x_d + (int64_t)t * nb, n, cols);
        }
    }
}

/* One token (decode) is the product itself, as for q8_0. */
void kernel_matmul_q4_1(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q4_1(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols);
    } else {
        matmul_q4_1_tiles(out, out_stride, w_q4, w_d, w_m, x_qs, x_d, n_tok, rows, cols);
    }
}
