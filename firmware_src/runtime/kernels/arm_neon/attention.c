/* The arm_neon set's attention: the weighted sum of values (the scores are fallback.h's portable
 * loop in four chains, KERNEL_ATTENTION_CHAINS in set.c). */
#include "arm_neon.h"

/* The weighted sum of values, four of a head's dimensions per vector (lane j carries out[j]'s chain
 * over the positions in order: a multiply, then an add, never fused), up to 32 dimensions (eight
 * vectors) in registers at once. */
void kernel_attention_mix(float *out, int out_stride, const float *p, int p_stride, int n_q, const float *values,
                          int stride, int n, int head_dim)
{
    for (int a = 0; a < n_q; a++) {
        float *o = out + (int64_t)a * out_stride;
        const float *w = p + (int64_t)a * p_stride;
        int j0 = 0;
        for (; j0 + 32 <= head_dim; j0 += 32) {
            float32x4_t acc[8];
            for (int v = 0; v < 8; v++) {
                acc[v] = vld1q_f32(o + j0 + 4 * v);
            }
            for (int i = 0; i < n; i++) {
                const float *row = values + (int64_t)i * stride + j0;
                const float32x4_t wi = vdupq_n_f32(w[i]);
                for (int v = 0; v < 8; v++) {
                    acc[v] = vaddq_f32(acc[v], vmulq_f32(wi, vld1q_f32(row + 4 * v)));
                }
            }
            for (int v = 0; v < 8; v++) {
                vst1q_f32(o + j0 + 4 * v, acc[v]);
            }
        }
        for (; j0 + 4 <= head_dim; j0 += 4) {
            float32x4_t acc = vld1q_f32(o + j0);
            for (int i = 0; i < n; i++) {
                acc = vaddq_f32(acc, vmulq_f32(vdupq_n_f32(w[i]), vld1q_f32(values + (int64_t)i * stride + j0)));
            }
            vst1q_f32(o + j0, acc);
        }
        for (; j0 < head_dim; j0++) {
            float acc = o[j0];
            for (int i = 0; i < n; i++) {
                acc = acc + w[i] * values[(int64_t)i * stride + j0];
            }
            o[j0] = acc;
        }
    }
}
