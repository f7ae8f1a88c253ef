/* Element-wise and reduction operations, defined once (docs/numerics.md) and mirrored by
 * generator/numerics/ops.py. Every sum runs from the first term to the last. */
#ifndef COLIBRI_OPS_H
#define COLIBRI_OPS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Round to the nearest integer, ties to even, for |v| < 2^22: (v + 1.5*2^23) - 1.5*2^23. */
static inline float op_round_even(float v)
{
    float shifted = v + 12582912.0f; /* exact IEEE add: the fraction is rounded off here */
    return shifted - 12582912.0f;
}

/* e^x = 2^n * p(r) with x = n*ln2 + r, |r| <= ln2/2 and p a degree-6 Taylor polynomial, for
 * -87 <= x <= 88. n is x/ln2 rounded half to even: lrintf in the default rounding mode gives the
 * same integer as op_round_even (|x/ln2| < 128), in one conversion, and (float)n is exact.
 * Inline, so that op_softmax's loop (and a kernel's SwiGLU) keeps the constants in registers. */
static inline float op_expf_in_range(float x)
{
    const int32_t n = (int32_t)lrintf(x * 1.44269504088896341f);
    float r = x - (float)n * 0.693145751953125f;
    r = r - (float)n * 1.42860676533018e-06f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t bits = (uint32_t)(n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* NaN stays NaN, below -87 gives 0, above 88 is clamped to 88. */
static inline float op_expf_inline(float x)
{
    if (!(x >= -87.0f)) {
        return x != x ? x : 0.0f;
    }
    if (x > 88.0f) {
        x = 88.0f;
    }
    return op_expf_in_range(x);
}

/* op_silu, inline: x / (1 + e^-x). */
static inline float op_silu_inline(float x)
{
    return x / (1.0f + op_expf_inline(-x));
}

float op_expf(float x);
/* 1 when none of the n values is NaN or an infinity, by their exponent bits (no isfinite, whose
 * cost and meaning depend on the compiler's flags): the check every board makes on a layer's
 * output and on the logits (docs/numerics.md, "Non-finite values"). */
int op_all_finite(const float *x, int64_t n);
float op_silu(float x);
float op_sigmoid(float x);   /* 1 / (1 + exp(-x)) */
float op_tanh(float x);      /* 1 - 2 / (exp(2x) + 1) */
float op_gelu_tanh(float x); /* (0.5 x) (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
float op_softcap(float x, float cap); /* tanh(x / cap) * cap */
/* gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit), (u + 1) * (g * sigmoid(alpha * g)). */
float op_swiglu_clamped(float gate, float up, float alpha, float limit);
float op_dot(const float *a, const float *b, int n);
/* out[i] = (x[i] * (1 / sqrt(sum(x^2) / n + eps))) * w[i]; out may equal x. */
void op_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
/* RMSNorm without a weight (Gemma 4's values): op_rmsnorm's bits with w = 1. */
void op_rmsnorm_unscaled(float *out, const float *x, int n, float eps);
/* In place: x[i] = exp(x[i] - max) / sum. */
void op_softmax(float *x, int n);
/* In place, softmax over x and one more logit, the sink, which is dropped: m = max(x, sink),
 * x[i] = exp(x[i] - m) / (sum of those in order + exp(sink - m)). */
void op_softmax_with_sink(float *x, int n, float sink);
/* The parts of log-softmax, x unchanged: *max = max x[i], returns sum over i in order of
 * exp(x[i] - max), computed as op_softmax computes them. log p_t = (x[t] - max) - log(sum). */
float op_exp_sum(const float *x, int n, float *max);
/* Rotate-half RoPE of one head: pairs (i, i + half) with cos/sin of the position. */
void op_rope(float *head, const float *cos, const float *sin, int half);

/* Gated DeltaNet operations (Qwen3.5's linear attention). */
float op_log(float x);      /* natural log of a normal positive float: our own, never libm's */
float op_softplus(float x); /* log(1 + exp(x)); x above 20 */
/* In place: x[i] * (1 / sqrt(sum(x^2) + 1e-6)). */
void op_l2norm(float *x, int n);
/* One position of the causal depthwise convolution, in place on x[channels], then SiLU:
 * out_c = sum_j taps[c][j] * window[j][c] over the window (state's kernel - 1 rows, oldest first,
 * then x), in j order; state moves on by one input. */
void op_conv_step(float *x, float *state, const float *taps, int channels, int kernel);
/* The gated delta rule of one head at one position on its state S[key_dim][value_dim]:
 * S = S * decay; m_j = sum_i S_ij k_i; d_j = (v_j - m_j) * beta; S_ij = S_ij + k_i d_j;
 * out_j = sum_i S_ij q_i (sums in i order). memory: value_dim floats of scratch. */
void op_delta_rule_step(float *out, float *state, const float *q, const float *k, const float *v, float decay,
                        float beta, float *memory, int key_dim, int value_dim);
/* In place: x[i] = ((x[i] * inv) * w[i]) * silu(z[i]), inv = 1 / sqrt(mean(x^2) + eps). */
void op_gated_rmsnorm(float *x, const float *w, const float *z, int n, float eps);
/* Phi-3.5-MoE's LayerNorm: out[i] = ((d[i] * (1 / sqrt(dot(d, d) / n + eps))) * w[i]) + b[i], with
 * d[i] = x[i] - (sum of x in order) / n; out may equal x. */
void op_layer_norm(float *out, const float *x, const float *w, const float *b, int n, float eps);
/* Phi-3.5-MoE's sparsemixer at inference: the weights of the k experts `ids` (the top k of the n
 * router logits, best first). For the expert of rank r, with m its logit, the softmax over the
 * logits of the experts not chosen at an earlier rank and within the threshold of m
 * ((m - l[e]) / max(|l[e]|, m) <= threshold; the others -inf), at the expert. gates: n floats. */
void op_sparsemixer_weights(const float *logits, int n, const int32_t *ids, int k, float threshold, float *weights,
                            float *gates);

#endif
