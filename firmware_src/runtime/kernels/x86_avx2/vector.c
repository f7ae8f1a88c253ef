/* The x86_avx2 set's vector operations, eight lanes at a time, each lane the scalar operation's
 * steps in its order (the same bits): activation quantization to q8_0, SwiGLU and GELU-tanh (with
 * op_expf's e^x), softmax, the delta rule's state step, and binary16 and q8_0 widened to float32.
 * Called by set.c's entry points once the CPU was checked. */
#include "../../ops.h" /* op_expf_in_range: exp_shifted_avx2's last values, as op_softmax */
#include "x86_avx2.h"

X86_AVX2_BEGIN /* from here to X86_AVX2_END: compiled for AVX2 and F16C */

/* The scalar quantizer's operations, eight values at a time: the block maximum (order does not
 * matter for a maximum), the same scale and reciprocal, the same rounding by adding and
 * subtracting 1.5 * 2^23, the same clamp. */
void quantize_q8_0_avx2(int8_t *qs, float *d, const float *x, int n)
{
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    /* packs interleaves 128-bit lanes; this puts the 32 quants back in order */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < n / KERNEL_QK; b++) {
        const float *xb = x + b * KERNEL_QK;
        __m256 v[4];
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign_bit, v[i]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float scale = _mm_cvtss_f32(m4) / 127.0f;
        const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
        d[b] = scale;
        const __m256 vinv = _mm256_set1_ps(inv);
        __m256i q[4];
        for (int i = 0; i < 4; i++) {
            __m256 t = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(v[i], vinv), magic), magic);
            q[i] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(t, lo), hi));
        }
        __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(qs + b * KERNEL_QK), _mm256_permutevar8x32_epi32(bytes, order));
    }
}

/* op_expf eight lanes at a time, with its operations in its order (ops.c): n = x/ln2 rounded half
 * to even (cvtps under the default rounding mode, as lrintf), the two-part ln2 reduction, the
 * degree-6 polynomial, 2^n from the exponent bits; below -87 e^x is 0 (NaN stays NaN), above 88 x
 * is clamped. Every step is one IEEE single-precision operation, so each lane is the scalar result
 * bit for bit. */
static inline __m256 expf8(__m256 x)
{
    const __m256 below = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_NGE_UQ);
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256 v = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    const __m256i n = _mm256_cvtps_epi32(_mm256_mul_ps(v, _mm256_set1_ps(1.44269504088896341f)));
    const __m256 nf = _mm256_cvtepi32_ps(n);
    __m256 r = _mm256_sub_ps(v, _mm256_mul_ps(nf, _mm256_set1_ps(0.693145751953125f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(nf, _mm256_set1_ps(1.42860676533018e-06f)));
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(0.5f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
    const __m256 e = _mm256_mul_ps(p, scale);
    return _mm256_blendv_ps(e, _mm256_and_ps(nan, x), below); /* 0, or the NaN itself */
}

/* op_silu eight lanes at a time: x / (1 + e^-x), e^-x as expf8 computes it. */
static inline __m256 silu8(__m256 x)
{
    const __m256 e = expf8(_mm256_xor_ps(x, _mm256_set1_ps(-0.0f)));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* op_softmax eight exponentials and divisions at a time, each lane expf8's steps (x - max is never
 * above 0, so only the low end's case applies); the maximum and the sum stay scalar, in order, as
 * op_softmax computes them. */
/* The maximum of x[0 .. n - 1] as op_softmax finds it, eight lanes at a time; 0 if some value is
 * NaN (the caller then takes op_softmax's loop, where a NaN's place decides). Without NaNs the
 * maximum is the same number in any order, except that the sign of a zero maximum may differ,
 * which changes nothing after it: x - (+0) and x - (-0) are x for x != 0, and e^(+0) = e^(-0) = 1. */
static int max_avx2(const float *x, int n, float *max)
{
    __m256 m = _mm256_set1_ps(x[0]), unordered = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        m = _mm256_max_ps(m, v);
    }
    float lanes[8], best = x[0];
    _mm256_storeu_ps(lanes, m);
    for (int k = 0; k < 8; k++) {
        best = lanes[k] > best ? lanes[k] : best;
    }
    int nan = _mm256_movemask_ps(unordered) != 0 || x[0] != x[0];
    for (; i < n; i++) {
        nan |= x[i] != x[i];
        best = x[i] > best ? x[i] : best;
    }
    *max = best;
    return !nan;
}

/* x[i] = e^(x[i] - max), eight at a time (expf8), the rest as op_softmax computes them. */
static void exp_shifted_avx2(float *x, int n, float max)
{
    const __m256 vmax = _mm256_set1_ps(max);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(x + i, expf8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax)));
    }
    for (; i < n; i++) {
        const float v = x[i] - max;
        x[i] = v >= -87.0f ? op_expf_in_range(v) : (v != v ? v : 0.0f);
    }
}

static void divide_avx2(float *x, int n, float sum)
{
    const __m256 vsum = _mm256_set1_ps(sum);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(x + i, _mm256_div_ps(_mm256_loadu_ps(x + i), vsum));
    }
    for (; i < n; i++) {
        x[i] = x[i] / sum;
    }
}

/* m <= 4 rows (stride apart) of n values: each row's maximum, exponentials, their sum in order
 * and the divisions, as op_softmax. The m sums run interleaved, one add of each row per position:
 * a row's sum is one chain of dependent adds, and m of them fill the adder that one leaves idle. */
__attribute__((always_inline)) static inline void softmax_rows_avx2(float *x, int stride, const int m, int n)
{
    for (int r = 0; r < m; r++) {
        float *row = x + (int64_t)r * stride;
        float max;
        if (!max_avx2(row, n, &max)) {
            max = row[0];
            for (int i = 1; i < n; i++) {
                if (row[i] > max) {
                    max = row[i];
                }
            }
        }
        exp_shifted_avx2(row, n, max);
    }
    float sum[4] = {-0.0f, -0.0f, -0.0f, -0.0f};
    for (int t = 0; t < n; t++) {
#pragma GCC unroll 4
        for (int r = 0; r < m; r++) {
            sum[r] = sum[r] + x[(int64_t)r * stride + t];
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < m; r++) {
        divide_avx2(x + (int64_t)r * stride, n, sum[r]);
    }
}

void softmax_avx2(float *x, int n)
{
    softmax_rows_avx2(x, 0, 1, n);
}

void softmax_many_avx2(float *x, int stride, int rows, int n)
{
    for (int r0 = 0; r0 < rows; r0 += 4) {
        float *x0 = x + (int64_t)r0 * stride;
        switch (rows - r0 < 4 ? rows - r0 : 4) {
        case 1: softmax_rows_avx2(x0, stride, 1, n); break;
        case 2: softmax_rows_avx2(x0, stride, 2, n); break;
        case 3: softmax_rows_avx2(x0, stride, 3, n); break;
        default: softmax_rows_avx2(x0, stride, 4, n); break;
        }
    }
}

void swiglu_avx2(float *up, const float *gate, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 s = silu8(_mm256_loadu_ps(gate + i));
        _mm256_storeu_ps(up + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    kernel_scalar_swiglu(up + i, gate + i, n - i);
}

/* op_gelu_tanh eight lanes at a time, its operations in its order: inner = c * (x + a * ((x * x) *
 * x)), tanh(inner) = 1 - 2 / (e^(2 inner) + 1) with e^ as expf8 computes it, then (0.5 * x) *
 * (1 + tanh). */
static inline __m256 gelu_tanh8(__m256 x)
{
    const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    const __m256 inner = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f),
                                       _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(0.044715f), cube)));
    const __m256 e = expf8(_mm256_mul_ps(_mm256_set1_ps(2.0f), inner));
    const __m256 tanh = _mm256_sub_ps(_mm256_set1_ps(1.0f),
                                      _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), _mm256_add_ps(_mm256_set1_ps(1.0f), tanh));
}

void gelu_tanh_mul_avx2(float *up, const float *gate, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = gelu_tanh8(_mm256_loadu_ps(gate + i));
        _mm256_storeu_ps(up + i, _mm256_mul_ps(g, _mm256_loadu_ps(up + i)));
    }
    kernel_scalar_gelu_tanh_mul(up + i, gate + i, n - i);
}

/* The delta rule eight value columns per vector: lane l carries column j + l's chains, each
 * operation the scalar one (a multiply, then an add), so the sums are the scalar kernel's. */
void delta_rule_step_avx2(float *out, float *state, const float *q, const float *k, const float *v, float decay,
                          float beta, float *memory, int key_dim, int value_dim)
{
    const __m256 vdecay = _mm256_set1_ps(decay), vbeta = _mm256_set1_ps(beta);
    for (int j = 0; j < value_dim; j += 8) {
        __m256 s = _mm256_mul_ps(_mm256_loadu_ps(state + j), vdecay);
        _mm256_storeu_ps(state + j, s);
        __m256 m = _mm256_mul_ps(s, _mm256_set1_ps(k[0]));
        for (int i = 1; i < key_dim; i++) {
            float *row = state + (int64_t)i * value_dim + j;
            s = _mm256_mul_ps(_mm256_loadu_ps(row), vdecay);
            _mm256_storeu_ps(row, s);
            m = _mm256_add_ps(m, _mm256_mul_ps(s, _mm256_set1_ps(k[i])));
        }
        m = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(v + j), m), vbeta);
        _mm256_storeu_ps(memory + j, m);
        __m256 o = _mm256_setzero_ps();
        for (int i = 0; i < key_dim; i++) {
            float *row = state + (int64_t)i * value_dim + j;
            s = _mm256_add_ps(_mm256_loadu_ps(row), _mm256_mul_ps(_mm256_set1_ps(k[i]), m));
            _mm256_storeu_ps(row, s);
            const __m256 term = _mm256_mul_ps(s, _mm256_set1_ps(q[i]));
            o = (i == 0) ? term : _mm256_add_ps(o, term);
        }
        _mm256_storeu_ps(out + j, o);
    }
}

/* binary16 -> float32 with F16C (vcvtph2ps: exact, subnormals included). */
void widen_f16_avx2(float *out, const KernelHalf *h, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    }
    for (; i < n; i++) {
        out[i] = kernel_half_to_float(h[i]);
    }
}

/* q8_0 -> float32: each quant widened to float32 and times its block's widened scale (exact). */
void widen_q8_0_avx2(float *out, const int8_t *qs, const KernelHalf *d, int n)
{
    for (int b = 0; b < n / KERNEL_QK; b++) {
        const __m256 scale = _mm256_set1_ps(kernel_half_to_float(d[b]));
        for (int i = 0; i < KERNEL_QK; i += 8) {
            const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs + b * KERNEL_QK + i)));
            _mm256_storeu_ps(out + b * KERNEL_QK + i, _mm256_mul_ps(_mm256_cvtepi32_ps(q), scale));
        }
    }
}

X86_AVX2_END
