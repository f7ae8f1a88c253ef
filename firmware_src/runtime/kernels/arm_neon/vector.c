/* The arm_neon set's vector operations: the delta rule's step and the widening of f16 and q8_0
 * rows to float32. */
#include "arm_neon.h"

/* The delta rule four value columns per vector: lane l carries column j + l's chains, each
 * operation the scalar one (vmulq then vaddq, never a fused vfmaq), so the sums are the scalar
 * kernel's. */
void kernel_delta_rule_step(float *out, float *state, const float *q, const float *k, const float *v, float decay,
                            float beta, float *memory, int key_dim, int value_dim)
{
    if (value_dim % 4 != 0) {
        kernel_scalar_delta_rule_step(out, state, q, k, v, decay, beta, memory, key_dim, value_dim);
        return;
    }
    const float32x4_t vdecay = vdupq_n_f32(decay), vbeta = vdupq_n_f32(beta);
    for (int j = 0; j < value_dim; j += 4) {
        float32x4_t s = vmulq_f32(vld1q_f32(state + j), vdecay);
        vst1q_f32(state + j, s);
        float32x4_t m = vmulq_f32(s, vdupq_n_f32(k[0]));
        for (int i = 1; i < key_dim; i++) {
            float *row = state + (int64_t)i * value_dim + j;
            s = vmulq_f32(vld1q_f32(row), vdecay);
            vst1q_f32(row, s);
            m = vaddq_f32(m, vmulq_f32(s, vdupq_n_f32(k[i])));
        }
        m = vmulq_f32(vsubq_f32(vld1q_f32(v + j), m), vbeta);
        vst1q_f32(memory + j, m);
        float32x4_t o = vdupq_n_f32(0.0f);
        for (int i = 0; i < key_dim; i++) {
            float *row = state + (int64_t)i * value_dim + j;
            s = vaddq_f32(vld1q_f32(row), vmulq_f32(vdupq_n_f32(k[i]), m));
            vst1q_f32(row, s);
            const float32x4_t term = vmulq_f32(s, vdupq_n_f32(q[i]));
            o = (i == 0) ? term : vaddq_f32(o, term);
        }
        vst1q_f32(out + j, o);
    }
}

/* binary16 -> float32 with fcvtl (exact, subnormals included). */
void kernel_widen_f16(float *out, const KernelHalf *h, int n)
{
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        vst1q_f32(out + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + i))));
    }
    for (; i < n; i++) {
        out[i] = kernel_half_to_float(h[i]);
    }
}

/* q8_0 -> float32: each quant widened to float32 and times its block's widened scale (exact). */
void kernel_widen_q8_0(float *out, const int8_t *qs, const KernelHalf *d, int n)
{
    for (int b = 0; b < n / KERNEL_QK; b++) {
        const float32x4_t scale = vdupq_n_f32(kernel_half_to_float(d[b]));
        for (int i = 0; i < KERNEL_QK; i += 8) {
            const int16x8_t q = vmovl_s8(vld1_s8(qs + b * KERNEL_QK + i));
            vst1q_f32(out + b * KERNEL_QK + i, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(q))), scale));
            vst1q_f32(out + b * KERNEL_QK + i + 4, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(q))), scale));
        }
    }
}
