#include "ops.h"

#include <math.h>
#include <string.h>

/* e^x = 2^n * p(r) with x = n*ln2 + r, |r| <= ln2/2 and p a degree-6 Taylor polynomial. */
float op_expf(float x)
{
    if (x != x) {
        return x;
    }
    if (x < -87.0f) {
        return 0.0f;
    }
    if (x > 88.0f) {
        x = 88.0f;
    }
    float n = op_round_even(x * 1.44269504088896341f);
    float r = x - n * 0.693145751953125f;
    r = r - n * 1.42860676533018e-06f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

float op_silu(float x)
{
    return x / (1.0f + op_expf(-x));
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

float op_softcap(float x, float cap)
{
    return op_tanh(x / cap) * cap;
}

float op_dot(const float *a, const float *b, int n)
{
    float acc = a[0] * b[0];
    for (int i = 1; i < n; i++) {
        acc = acc + a[i] * b[i];
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
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = op_expf(x[i] - max);
        sum = (i == 0) ? x[i] : sum + x[i];
    }
    for (int i = 0; i < n; i++) {
        x[i] = x[i] / sum;
    }
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
