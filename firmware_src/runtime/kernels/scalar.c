/* Portable scalar kernels: the reference for every ISA-specific kernel set. */
#include "kernels.h"
#include "../ops.h"

void kernel_scalar_matvec_f32(float *out, const float *w, const float *x, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        const float *row = w + (int64_t)r * cols;
        float acc = row[0] * x[0];
        for (int j = 1; j < cols; j++) {
            acc = acc + row[j] * x[j];
        }
        out[r] = acc;
    }
}

void kernel_scalar_matvec_q8_0(float *out, const int8_t *w_qs, const float *w_d,
                               const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    for (int r = 0; r < rows; r++) {
        const int8_t *wq = w_qs + (int64_t)r * cols;
        const float *wd = w_d + (int64_t)r * nb;
        float acc = 0.0f;
        for (int b = 0; b < nb; b++) {
            int32_t isum = 0;
            for (int i = 0; i < KERNEL_QK; i++) {
                isum += (int32_t)wq[b * KERNEL_QK + i] * (int32_t)x_qs[b * KERNEL_QK + i];
            }
            float term = (float)isum * (wd[b] * x_d[b]);
            acc = (b == 0) ? term : acc + term;
        }
        out[r] = acc;
    }
}

void kernel_scalar_matvec_q4_0(float *out, const uint8_t *w_q4, const float *w_d,
                               const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    for (int r = 0; r < rows; r++) {
        const uint8_t *wq = w_q4 + (int64_t)r * (cols / 2);
        const float *wd = w_d + (int64_t)r * nb;
        float acc = 0.0f;
        for (int b = 0; b < nb; b++) {
            const uint8_t *wb = wq + b * (KERNEL_QK / 2);
            const int8_t *xb = x_qs + b * KERNEL_QK;
            int32_t isum = 0;
            for (int j = 0; j < KERNEL_QK / 2; j++) {
                isum += ((int32_t)(wb[j] & 0x0F) - 8) * (int32_t)xb[j];
                isum += ((int32_t)(wb[j] >> 4) - 8) * (int32_t)xb[j + KERNEL_QK / 2];
            }
            float term = (float)isum * (wd[b] * x_d[b]);
            acc = (b == 0) ? term : acc + term;
        }
        out[r] = acc;
    }
}

void kernel_scalar_swiglu(float *up, const float *gate, int n)
{
    for (int i = 0; i < n; i++) {
        up[i] = op_silu(gate[i]) * up[i];
    }
}

void kernel_scalar_quantize_q8_0(int8_t *qs, float *d, const float *x, int n)
{
    for (int b = 0; b < n / KERNEL_QK; b++) {
        const float *xb = x + b * KERNEL_QK;
        float amax = 0.0f;
        for (int i = 0; i < KERNEL_QK; i++) {
            float a = xb[i] < 0.0f ? -xb[i] : xb[i];
            if (a > amax) {
                amax = a;
            }
        }
        float scale = amax / 127.0f;
        float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
        d[b] = scale;
        for (int i = 0; i < KERNEL_QK; i++) {
            float q = op_round_even(xb[i] * inv);
            if (q > 127.0f) {
                q = 127.0f;
            } else if (q < -127.0f) {
                q = -127.0f;
            }
            qs[b * KERNEL_QK + i] = (int8_t)(int32_t)q;
        }
    }
}

/* Rows per tile: enough weight bytes to make the per-tile work worthwhile, few enough (with the
 * 16 KiB target below) that a tile stays in the L1 or L2 cache while every token passes over it. */
static int tile_rows(int row_bytes)
{
    int rows = 16384 / (row_bytes > 0 ? row_bytes : 1);
    return rows < 1 ? 1 : rows;
}

void kernel_tiled_matmul_f32(float *out, int out_stride, const float *w, const float *x, int n_tok, int rows,
                             int cols)
{
    const int tile = tile_rows(cols * (int)sizeof(float));
    for (int r = 0; r < rows; r += tile) {
        const int n = rows - r < tile ? rows - r : tile;
        for (int t = 0; t < n_tok; t++) {
            kernel_matvec_f32(out + (int64_t)t * out_stride + r, w + (int64_t)r * cols, x + (int64_t)t * cols, n,
                              cols);
        }
    }
}

void kernel_tiled_matmul_q8_0(float *out, int out_stride, const int8_t *w_qs, const float *w_d,
                              const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    const int tile = tile_rows(cols + nb * (int)sizeof(float));
    for (int r = 0; r < rows; r += tile) {
        const int n = rows - r < tile ? rows - r : tile;
        for (int t = 0; t < n_tok; t++) {
            kernel_matvec_q8_0(out + (int64_t)t * out_stride + r, w_qs + (int64_t)r * cols, w_d + (int64_t)r * nb,
                               x_qs + (int64_t)t * cols, x_d + (int64_t)t * nb, n, cols);
        }
    }
}

void kernel_tiled_matmul_q4_0(float *out, int out_stride, const uint8_t *w_q4, const float *w_d,
                              const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    const int tile = tile_rows(cols / 2 + nb * (int)sizeof(float));
    for (int r = 0; r < rows; r += tile) {
        const int n = rows - r < tile ? rows - r : tile;
        for (int t = 0; t < n_tok; t++) {
            kernel_matvec_q4_0(out + (int64_t)t * out_stride + r, w_q4 + (int64_t)r * (cols / 2),
                               w_d + (int64_t)r * nb, x_qs + (int64_t)t * cols, x_d + (int64_t)t * nb, n, cols);
        }
    }
}
