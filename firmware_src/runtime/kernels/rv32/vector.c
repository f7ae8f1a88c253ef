/* The rv32 set's vector operations: a binary16 KV tile widened, activations quantized to q8_0,
 * SwiGLU. */
#include "rv32.h"

/* A binary16 KV cache's tile widened: half_scaled's four instructions, the 2^112 multiplied back
 * (exact: the value times 2^-112 times 2^112) and the store, six a value where the portable
 * kernel_half_to_float takes about twelve (its sign goes back by integer instructions). The same
 * bits as kernel_half_to_float for every encoding. */
void kernel_widen_f16(float *out, const KernelHalf *h, int n)
{
    const int16_t *bits = (const int16_t *)h;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            out[i + k] = half_scaled(bits[i + k]) * 0x1p112f;
        }
    }
    for (; i < n; i++) {
        out[i] = half_scaled(bits[i]) * 0x1p112f;
    }
}

/* The scalar kernel's quantization, with shortcuts that give the same bits: values are rounded
 * to the nearest integer, ties to even, by lrintf in the default rounding mode (one fcvt.w.s
 * instead of op_round_even's two additions and a conversion); and the clamp to +-127 is skipped
 * for a block whose largest magnitude times 1/d stays below 127.5, since rounding is monotonic and
 * no value of the block can then round beyond 127. (Where the clamp is needed it is applied
 * before rounding: the bounds are integers, so that is the same as after.) */
void kernel_quantize_q8_0(int8_t *qs, float *d, const float *x, int n)
{
    for (int b = 0; b < n / KERNEL_QK; b++) {
        const float *xb = x + b * KERNEL_QK;
        int8_t *qb = qs + b * KERNEL_QK;
        float amax = 0.0f;
#pragma GCC unroll 32
        for (int i = 0; i < KERNEL_QK; i++) {
            const float a = fabsf(xb[i]);
            if (a > amax) {
                amax = a;
            }
        }
        const float scale = amax / 127.0f;
        const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
        d[b] = scale;
        if (amax * inv < 127.5f) {
#pragma GCC unroll 32
            for (int i = 0; i < KERNEL_QK; i++) {
                qb[i] = (int8_t)lrintf(xb[i] * inv);
            }
        } else {
            for (int i = 0; i < KERNEL_QK; i++) {
                float v = xb[i] * inv;
                if (v > 127.0f) {
                    v = 127.0f;
                }
                if (v < -127.0f) {
                    v = -127.0f;
                }
                qb[i] = (int8_t)lrintf(v);
            }
        }
    }
}

/* SwiGLU with op_silu_inline (ops.h), op_silu's own definition inlined into the loop: its
 * constants stay in float registers for the whole loop, and op_silu's call, return and eleven
 * constant loads (two instructions each) are gone: 37 instructions per value instead of the scalar
 * kernel's 62 (tests/c/rv32_selftest.c), 12,700 fewer per decoded token of the default model, which
 * pays for most of the binary16 scales' widening. */
void kernel_swiglu(float *up, const float *gate, int n)
{
    for (int i = 0; i < n; i++) {
        up[i] = op_silu_inline(gate[i]) * up[i];
    }
}
