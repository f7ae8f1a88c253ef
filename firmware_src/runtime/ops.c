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
