#include "ops.h"

#include <math.h>
#include <string.h>

float op_expf(float x)
{
    return op_expf_inline(x);
}

float op_silu(float x)
{
    return op_silu_inline(x);
}

float op_sigmoid(float x)
{
    return 1.0f / (1.0f + op_expf(-x));
}

float op_tanh(float x)
{
    return 1.0f - 2.0f / (op_expf(2.0f * x) + 1.0f);
}

float op_gelu_tanh(float x)
{
    float inner = 0.7978845608028654f * (x + 0.044715f * ((x * x) * x));
    return (0.5f * x) * (1.0f + op_tanh(inner));
}

float op_swiglu_clamped(float gate, float up, float alpha, float limit)
{
    const float g = gate > limit ? limit : gate;
    const float u = up < -limit ? -limit : (up > limit ? limit : up);
    const float glu = g * op_sigmoid(alpha * g);
    return (u + 1.0f) * glu;
}

float op_softcap(float x, float cap)
{
    return op_tanh(x / cap) * cap;
}

/* acc starts at -0.0f, which the first product replaces exactly (-0.0f + t == t for every t),
 * so every term goes through the same loop body; the sum is still a[0]*b[0] + a[1]*b[1] + ...
 * from the first term on. Lengths that are a multiple of 16 (head widths, model widths) take
 * sixteen terms per pass: the loop overhead, not the arithmetic, was most of the cost of an
 * attention dot product on an in-order core. */
#define DOT_TERM(k) acc = acc + a[k] * b[k]

float op_dot(const float *a, const float *b, int n)
{
    float acc = -0.0f;
    if (n % 16 == 0) {
        for (const float *end = a + n; a < end; a += 16, b += 16) {
            DOT_TERM(0);
            DOT_TERM(1);
            DOT_TERM(2);
            DOT_TERM(3);
            DOT_TERM(4);
            DOT_TERM(5);
            DOT_TERM(6);
            DOT_TERM(7);
            DOT_TERM(8);
            DOT_TERM(9);
            DOT_TERM(10);
            DOT_TERM(11);
            DOT_TERM(12);
            DOT_TERM(13);
            DOT_TERM(14);
            DOT_TERM(15);
        }
        return acc;
    }
    for (int i = 0; i < n; i++) {
        DOT_TERM(i);
    }
    return acc;
}

void op_rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
    float ss = op_dot(x, x, n);
    float mean = ss / (float)n;
    float inv = 1.0f / sqrtf(mean + eps);
    for (int i = 0; i < n; i++) {
        out[i] = (x[i] * inv) * w[i];
    }
}

void op_rmsnorm_unscaled(float *out, const float *x, int n, float eps)
{
    float ss = op_dot(x, x, n);
    float mean = ss / (float)n;
    float inv = 1.0f / sqrtf(mean + eps);
    for (int i = 0; i < n; i++) {
        out[i] = x[i] * inv;
    }
}

void op_softmax(float *x, int n)
{
    float max = x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] > max) {
            max = x[i];
        }
    }
    float sum = -0.0f; /* replaced exactly by the first term: the sum runs from x[0] */
    for (int i = 0; i < n; i++) {
        /* x[i] - max is <= 0 or NaN (never above 88): only the low end needs a check. */
        const float v = x[i] - max;
        x[i] = v >= -87.0f ? op_expf_in_range(v) : (v != v ? v : 0.0f);
        sum = sum + x[i];
    }
    for (int i = 0; i < n; i++) {
        x[i] = x[i] / sum;
    }
}

void op_softmax_with_sink(float *x, int n, float sink)
{
    float max = sink;
    for (int i = 0; i < n; i++) {
        if (x[i] > max) {
            max = x[i];
        }
    }
    float sum = -0.0f; /* replaced exactly by the first term: the sum runs from x[0], the sink last */
    for (int i = 0; i < n; i++) {
        const float v = x[i] - max;
        x[i] = v >= -87.0f ? op_expf_in_range(v) : (v != v ? v : 0.0f);
        sum = sum + x[i];
    }
    sum = sum + op_expf(sink - max);
    for (int i = 0; i < n; i++) {
        x[i] = x[i] / sum;
    }
}

int op_all_finite(const float *x, int64_t n)
{
    /* A value's exponent is all ones (NaN or an infinity) exactly when adding one to the exponent
     * of its magnitude carries into bit 31: one AND, one ADD and one OR a value, no branch, so the
     * check costs a few instructions per value on every board (it runs on each layer's output and
     * on every step's logits). */
    uint32_t carries = 0;
    for (const float *p = x, *end = x + n; p < end; p++) {
        const union { float f; uint32_t bits; } v = {.f = *p}; /* C11 type punning: a register move, where
                                                                  * memcpy from the array is byte by byte on rv32 */
        carries |= (v.bits & 0x7fffffffu) + 0x00800000u;
    }
    return (carries & 0x80000000u) == 0;
}

float op_exp_sum(const float *x, int n, float *max_out)
{
    float max = x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] > max) {
            max = x[i];
        }
    }
    float sum = -0.0f;
    for (int i = 0; i < n; i++) {
        const float v = x[i] - max;
        sum = sum + (v >= -87.0f ? op_expf_in_range(v) : (v != v ? v : 0.0f));
    }
    *max_out = max;
    return sum;
}

void op_rope(float *head, const float *cos, const float *sin, int half)
{
    for (int i = 0; i < half; i++) {
        float a = head[i];
        float b = head[i + half];
        head[i] = a * cos[i] - b * sin[i];
        head[i + half] = b * cos[i] + a * sin[i];
    }
}

/* ---- Gated DeltaNet (Qwen3.5's linear attention): generator/numerics/ops.py's definitions ---- */

/* Natural log of a normal positive float: x = m 2^e, m in [sqrt(1/2), sqrt(2)), then
 * e ln2 + 2 s p(s^2), s = (m - 1) / (m + 1), p the atanh series up to s^12. */
float op_log(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    int32_t e = (int32_t)((bits >> 23) & 0xFFu) - 127;
    uint32_t mant = (bits & 0x007FFFFFu) | 0x3F800000u;
    float m;
    memcpy(&m, &mant, sizeof m);
    if (m > 1.41421356237309505f) {
        m = m * 0.5f;
        e = e + 1;
    }
    float s = (m - 1.0f) / (m + 1.0f);
    float s2 = s * s;
    float p = 1.0f / 13.0f;
    p = p * s2 + 1.0f / 11.0f;
    p = p * s2 + 1.0f / 9.0f;
    p = p * s2 + 1.0f / 7.0f;
    p = p * s2 + 1.0f / 5.0f;
    p = p * s2 + 1.0f / 3.0f;
    p = p * s2 + 1.0f;
    return (float)e * 0.693147180559945309f + (2.0f * s) * p;
}

/* log(1 + e^x), x itself above 20; log1p(u) as log(w) * (u / (w - 1)) with w = 1 + u, so the
 * digits of a small u that 1 + u rounds away are kept (u itself when w rounds to 1). */
float op_softplus(float x)
{
    if (x > 20.0f) {
        return x;
    }
    float u = op_expf(x);
    float w = 1.0f + u;
    if (w == 1.0f) {
        return u;
    }
    return op_log(w) * (u / (w - 1.0f));
}

void op_l2norm(float *x, int n)
{
    float inv = 1.0f / sqrtf(op_dot(x, x, n) + 1e-6f);
    for (int i = 0; i < n; i++) {
        x[i] = x[i] * inv;
    }
}

void op_conv_step(float *x, float *state, const float *taps, int channels, int kernel)
{
    const int history = kernel - 1;
    for (int c = 0; c < channels; c++) {
        const float *w = taps + (int64_t)c * kernel;
        float acc = -0.0f; /* replaced exactly by the first term */
        for (int j = 0; j < history; j++) {
            acc = acc + w[j] * state[(int64_t)j * channels + c];
        }
        acc = acc + w[history] * x[c];
        /* The window moves on: the oldest input leaves, this one enters last. */
        for (int j = 0; j + 1 < history; j++) {
            state[(int64_t)j * channels + c] = state[(int64_t)(j + 1) * channels + c];
        }
        if (history > 0) {
            state[(int64_t)(history - 1) * channels + c] = x[c];
        }
        x[c] = op_silu(acc);
    }
}

void op_delta_rule_step(float *restrict out, float *restrict state, const float *q, const float *k, const float *v, float decay,
                        float beta, float *restrict memory, int key_dim, int value_dim)
{
    /* Decay the state and read what it holds for this key, row after row (sums in row order: the
     * first row starts each sum). Every j is its own chain, so a compiler may run the j loops
     * several lanes wide without changing any sum. */
    for (int j = 0; j < value_dim; j++) {
        state[j] = state[j] * decay;
        memory[j] = state[j] * k[0];
    }
    for (int i = 1; i < key_dim; i++) {
        float *row = state + (int64_t)i * value_dim;
        const float ki = k[i];
        for (int j = 0; j < value_dim; j++) {
            row[j] = row[j] * decay;
            memory[j] = memory[j] + row[j] * ki;
        }
    }
    /* The correction: what the value adds beyond what the state already predicts, times beta. */
    for (int j = 0; j < value_dim; j++) {
        memory[j] = (v[j] - memory[j]) * beta;
    }
    for (int j = 0; j < value_dim; j++) {
        state[j] = state[j] + k[0] * memory[j];
        out[j] = state[j] * q[0];
    }
    for (int i = 1; i < key_dim; i++) {
        float *row = state + (int64_t)i * value_dim;
        const float ki = k[i], qi = q[i];
        for (int j = 0; j < value_dim; j++) {
            row[j] = row[j] + ki * memory[j];
            out[j] = out[j] + row[j] * qi;
        }
    }
}

void op_gated_rmsnorm(float *x, const float *w, const float *z, int n, float eps)
{
    op_rmsnorm(x, x, w, n, eps);
    for (int i = 0; i < n; i++) {
        x[i] = x[i] * op_silu(z[i]);
    }
}

void op_layer_norm(float *out, const float *x, const float *w, const float *b, int n, float eps)
{
    float sum = x[0];
    for (int i = 1; i < n; i++) {
        sum = sum + x[i];
    }
    const float mean = sum / (float)n;
    for (int i = 0; i < n; i++) {
        out[i] = x[i] - mean;
    }
    const float var = op_dot(out, out, n) / (float)n;
    const float inv = 1.0f / sqrtf(var + eps);
    for (int i = 0; i < n; i++) {
        out[i] = (out[i] * inv) * w[i] + b[i];
    }
}

/* As transformers 5.24's sparsemixer in eval mode: no Gumbel sampling, no jitter; the router's
 * jitter setting is the mask's threshold (twice it). Its experts are the top k of the logits. */
void op_sparsemixer_weights(const float *logits, int n, const int32_t *ids, int k, float threshold, float *weights,
                            float *gates)
{
    for (int r = 0; r < k; r++) {
        const float m = logits[ids[r]];
        for (int e = 0; e < n; e++) {
            int taken = 0;
            for (int j = 0; j < r; j++) {
                taken |= (ids[j] == e);
            }
            const float factor = fmaxf(fabsf(logits[e]), m);
            gates[e] = (taken || (m - logits[e]) / factor > threshold) ? -INFINITY : logits[e];
        }
        op_softmax(gates, n);
        weights[r] = gates[ids[r]];
    }
}
