/* Kernels for rv32imafc MCUs (no SIMD): the scalar kernels' arithmetic, arranged for fewer
 * instructions. The q8_0 product works on four rows at once, so each activation quant is loaded
 * once for four multiply-adds, and the 32-value block loop is unrolled: about 3.3 instructions per
 * multiply-add instead of about 6 (``./colibri bench --board qemu-rv32`` counts them exactly). Each row's block sums and their order are unchanged, so the bits
 * are the scalar kernel's. Portable C: it is tested against the scalar kernels on any machine. */
#include "kernels.h"

const char *kernel_set(void)
{
    return "rv32";
}

/* One row: the scalar kernel's loop. */
static void one_row(float *out, const int8_t *w, const float *wd, const int8_t *x_qs, const float *x_d, int nb)
{
    float acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        int32_t s = 0;
        for (int i = 0; i < KERNEL_QK; i++) {
            s += (int32_t)w[i] * (int32_t)x_qs[i];
        }
        float term = (float)s * (wd[b] * x_d[b]);
        acc = (b == 0) ? term : acc + term;
        w += KERNEL_QK;
        x_qs += KERNEL_QK;
    }
    *out = acc;
}

void kernel_matvec_q8_0(float *out, const int8_t *w_qs, const float *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
        /* Four rows side by side: one load of each activation quant serves four products. */
        const int8_t *w0 = w_qs + (int64_t)r * cols, *w1 = w0 + cols, *w2 = w1 + cols, *w3 = w2 + cols;
        const float *d0 = w_d + (int64_t)r * nb, *d1 = d0 + nb, *d2 = d1 + nb, *d3 = d2 + nb;
        const int8_t *x = x_qs;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        for (int b = 0; b < nb; b++) {
            int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            /* Four quants at a time through advancing pointers: loads with constant offsets. */
            const int8_t *p0 = w0, *p1 = w1, *p2 = w2, *p3 = w3, *px = x;
            for (int k = 0; k < KERNEL_QK / 4; k++) {
                const int32_t x0 = px[0], x1 = px[1], x2 = px[2], x3 = px[3];
                s0 += p0[0] * x0 + p0[1] * x1 + p0[2] * x2 + p0[3] * x3;
                s1 += p1[0] * x0 + p1[1] * x1 + p1[2] * x2 + p1[3] * x3;
                s2 += p2[0] * x0 + p2[1] * x1 + p2[2] * x2 + p2[3] * x3;
                s3 += p3[0] * x0 + p3[1] * x1 + p3[2] * x2 + p3[3] * x3;
                p0 += 4;
                p1 += 4;
                p2 += 4;
                p3 += 4;
                px += 4;
            }
            const float xd = x_d[b];
            const float t0 = (float)s0 * (d0[b] * xd), t1 = (float)s1 * (d1[b] * xd);
            const float t2 = (float)s2 * (d2[b] * xd), t3 = (float)s3 * (d3[b] * xd);
            if (b == 0) {
                a0 = t0;
                a1 = t1;
                a2 = t2;
                a3 = t3;
            } else {
                a0 = a0 + t0;
                a1 = a1 + t1;
                a2 = a2 + t2;
                a3 = a3 + t3;
            }
            w0 += KERNEL_QK;
            w1 += KERNEL_QK;
            w2 += KERNEL_QK;
            w3 += KERNEL_QK;
            x += KERNEL_QK;
        }
        out[r] = a0;
        out[r + 1] = a1;
        out[r + 2] = a2;
        out[r + 3] = a3;
    }
    for (; r < rows; r++) {
        one_row(out + r, w_qs + (int64_t)r * cols, w_d + (int64_t)r * nb, x_qs, x_d, nb);
    }
}

void kernel_matvec_f32(float *out, const float *w, const float *x, int rows, int cols)
{
    kernel_scalar_matvec_f32(out, w, x, rows, cols);
}

void kernel_quantize_q8_0(int8_t *qs, float *d, const float *x, int n)
{
    kernel_scalar_quantize_q8_0(qs, d, x, n);
}

void kernel_matmul_f32(float *out, int out_stride, const float *w, const float *x, int n_tok, int rows, int cols)
{
    kernel_tiled_matmul_f32(out, out_stride, w, x, n_tok, rows, cols);
}

void kernel_matmul_q8_0(float *out, int out_stride, const int8_t *w_qs, const float *w_d,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    kernel_tiled_matmul_q8_0(out, out_stride, w_qs, w_d, x_qs, x_d, n_tok, rows, cols);
}

void kernel_matvec_q4_0(float *out, const uint8_t *w_q4, const float *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    kernel_scalar_matvec_q4_0(out, w_q4, w_d, x_qs, x_d, rows, cols);
}

void kernel_matmul_q4_0(float *out, int out_stride, const uint8_t *w_q4, const float *w_d,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    kernel_tiled_matmul_q4_0(out, out_stride, w_q4, w_d, x_qs, x_d, n_tok, rows, cols);
}
