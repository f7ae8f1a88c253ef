/* Element-wise and reduction operations, defined once (docs/numerics.md) and mirrored by
 * generator/numerics/ops.py. Every sum runs from the first term to the last. */
#ifndef COLIBRI_OPS_H
#define COLIBRI_OPS_H

#include <stdint.h>

/* Round to the nearest integer, ties to even, for |v| < 2^22: (v + 1.5*2^23) - 1.5*2^23. */
static inline float op_round_even(float v)
{
    float shifted = v + 12582912.0f; /* exact IEEE add: the fraction is rounded off here */
    return shifted - 12582912.0f;
}

float op_expf(float x);
float op_silu(float x);
float op_sigmoid(float x);   /* 1 / (1 + exp(-x)) */
float op_tanh(float x);      /* 1 - 2 / (exp(2x) + 1) */
float op_gelu_tanh(float x); /* (0.5 x) (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
float op_softcap(float x, float cap); /* tanh(x / cap) * cap */
float op_dot(const float *a, const float *b, int n);
/* out[i] = (x[i] * (1 / sqrt(sum(x^2) / n + eps))) * w[i]; out may equal x. */
void op_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
/* In place: x[i] = exp(x[i] - max) / sum. */
void op_softmax(float *x, int n);
/* The parts of log-softmax, x unchanged: *max = max x[i], returns sum over i in order of
 * exp(x[i] - max), computed as op_softmax computes them. log p_t = (x[t] - max) - log(sum). */
float op_exp_sum(const float *x, int n, float *max);
/* Rotate-half RoPE of one head: pairs (i, i + half) with cos/sin of the position. */
void op_rope(float *head, const float *cos, const float *sin, int half);

#endif
