/* The x86_avx2 kernel set's entry table. x86-64 kernels: AVX2 integer dot products for q8_0 and
 * q4_0 (AVX-VNNI where the CPU has it) and for the kept GGUF block types (Q5_0 ... MXFP4), f32
 * products eight rows at a time, SwiGLU and activation quantization, chosen at run time (cpuid:
 * cpu.c); the scalar kernels otherwise. Same bits as kernels/scalar.c: each block's int32 sum is
 * exact, the binary16 weight scales are widened exactly by F16C (vcvtph2ps, eight blocks' scales
 * per instruction), and the float terms (float)isum * (w_d * x_d) follow the reduction tree of
 * kernels.h, the eight partials of a row being the eight lanes of one vector; an f32 row's
 * products are added one column after another, each vector lane carrying a different row.
 *
 * The set is this folder, a file per role: x86_avx2.h (the helpers its files share and the
 * kernels this file calls), cpu.c, matvec.c (q8_0, q4_0, q4_1), matmul.c (their batched products),
 * blocks.c with blocks.h and blocks_lanes.c (the kept GGUF types), f32.c, vector.c (quantize,
 * activations, softmax, widening, the delta rule) and attention.c. This file: the set's identity,
 * its KERNEL_HAS_<ENTRY> list with fallback.h, and every entry point, compiled for baseline x86-64:
 * the CPU's features checked once, then the AVX2 kernel, or the scalar one. */
#include "x86_avx2.h"

/* This set's own entry points (fallback.h defines the rest). */
#define KERNEL_HAS_MATVEC_F32
#define KERNEL_HAS_MATVEC_Q8_0
#define KERNEL_HAS_MATVEC_Q4_0
#define KERNEL_HAS_MATMUL_F32
#define KERNEL_HAS_MATMUL_Q8_0
#define KERNEL_HAS_MATMUL_Q4_0
#define KERNEL_HAS_MATVEC_Q4_1
#define KERNEL_HAS_MATMUL_Q4_1
#define KERNEL_HAS_SWIGLU
#define KERNEL_HAS_GELU_TANH_MUL
#define KERNEL_HAS_DELTA_RULE_STEP
#define KERNEL_HAS_QUANTIZE_Q8_0
#define KERNEL_HAS_ATTENTION_SCORES
#define KERNEL_HAS_ATTENTION_MIX
#define KERNEL_HAS_ATTENTION_SCORES_TOKENS
#define KERNEL_HAS_ATTENTION_F16
#define KERNEL_HAS_WIDEN_F16
#define KERNEL_HAS_SOFTMAX
#define KERNEL_HAS_SOFTMAX_ROWS
#define KERNEL_HAS_WIDEN_Q8_0
/* the kept GGUF types (blocks.c) */
#define KERNEL_HAS_MATVEC_Q5_0
#define KERNEL_HAS_MATMUL_Q5_0
#define KERNEL_HAS_MATVEC_Q5_1
#define KERNEL_HAS_MATMUL_Q5_1
#define KERNEL_HAS_MATVEC_Q4_K
#define KERNEL_HAS_MATMUL_Q4_K
#define KERNEL_HAS_MATVEC_Q5_K
#define KERNEL_HAS_MATMUL_Q5_K
#define KERNEL_HAS_MATVEC_Q6_K
#define KERNEL_HAS_MATMUL_Q6_K
#define KERNEL_HAS_MATVEC_Q3_K
#define KERNEL_HAS_MATMUL_Q3_K
#define KERNEL_HAS_MATVEC_Q2_K
#define KERNEL_HAS_MATMUL_Q2_K
#define KERNEL_HAS_MATVEC_IQ4_NL
#define KERNEL_HAS_MATMUL_IQ4_NL
#define KERNEL_HAS_MATVEC_IQ4_XS
#define KERNEL_HAS_MATMUL_IQ4_XS
#define KERNEL_HAS_MATVEC_MXFP4
#define KERNEL_HAS_MATMUL_MXFP4
#include "../fallback.h"

const char *kernel_set(void)
{
    return x86_avx2_usable() ? "avx2" : "scalar";
}

const char *kernel_cpu_features(void)
{
    if (!x86_avx2_usable()) {
        return "none";
    }
    const int vnni = x86_avx2_vnni();
    return vnni == KERNEL_VNNI_VEX ? "avx2,f16c,avxvnni" : vnni ? "avx2,f16c,avx512vnni" : "avx2,f16c";
}

/* The entry points: the CPU's features checked once (cpuid), then the AVX2 kernel, or the scalar
 * one of fallback.h. */
void kernel_matvec_q8_0(float *out, const int8_t *w_qs, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (x86_avx2_usable() && x86_avx2_vnni()) {
        matvec_q8_0_vnni(out, w_qs, w_d, x_qs, x_d, rows, cols, x86_avx2_vnni());
    } else if (x86_avx2_usable()) {
        matvec_q8_0_avx2(out, w_qs, w_d, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q8_0(out, w_qs, w_d, x_qs, x_d, rows, cols);
    }
}

void kernel_matvec_q4_0(float *out, const uint8_t *w_q4, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (x86_avx2_usable() && cols / KERNEL_QK <= MAX_BLOCKS && x86_avx2_vnni()) {
        matvec_q4_0_vnni(out, w_q4, w_d, x_qs, x_d, rows, cols, x86_avx2_vnni());
    } else if (x86_avx2_usable() && cols / KERNEL_QK <= MAX_BLOCKS) {
        matvec_q4_0_avx2(out, w_q4, w_d, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q4_0(out, w_q4, w_d, x_qs, x_d, rows, cols);
    }
}

/* The batched kernels give each of eight tokens a float lane and compute all eight lanes for any
 * count: below five tokens the short-batch kernels (every token under one pass over the rows) cost
 * less, from five the lanes do (q8_0, 1,536 x 576, five tokens: 0.28 ms short, 0.17 ms as eight
 * lanes; four: 0.21 and 0.24). A speculative pass checks 2 to 8 tokens; a prompt batch has 64. */
#define MATMUL_LANES_FROM 5
_Static_assert(SHORT_BATCH_MAX == MATMUL_LANES_FROM - 1, "the short batches end where the lanes begin");

void kernel_matmul_q8_0(float *out, int out_stride, const int8_t *w_qs, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q8_0(out, w_qs, w_d, x_qs, x_d, rows, cols);
    } else if (n_tok < MATMUL_LANES_FROM && x86_avx2_usable()) {
        matmul_short_q8_0(out, out_stride, w_qs, w_d, x_qs, x_d, n_tok, rows, cols, x86_avx2_vnni());
    } else if (n_tok < MATMUL_LANES_FROM) {
        kernel_tiled_matmul_q8_0(out, out_stride, w_qs, w_d, x_qs, x_d, n_tok, rows, cols);
    } else if (x86_avx2_usable() && cols / KERNEL_QK <= MAX_BLOCKS && x86_avx2_vnni()) {
        matmul_q8_0_vnni(out, out_stride, w_qs, w_d, x_qs, x_d, n_tok, rows, cols, x86_avx2_vnni());
    } else if (x86_avx2_usable() && cols / KERNEL_QK <= MAX_BLOCKS) {
        matmul_q8_0_avx2(out, out_stride, w_qs, w_d, x_qs, x_d, n_tok, rows, cols);
    } else {
        kernel_tiled_matmul_q8_0(out, out_stride, w_qs, w_d, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matmul_q4_0(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q4_0(out, w_q4, w_d, x_qs, x_d, rows, cols);
    } else if (n_tok < MATMUL_LANES_FROM && x86_avx2_usable() && cols / KERNEL_QK <= MAX_BLOCKS) {
        matmul_short_q4_0(out, out_stride, w_q4, w_d, x_qs, x_d, n_tok, rows, cols, x86_avx2_vnni());
    } else if (n_tok < MATMUL_LANES_FROM) {
        kernel_tiled_matmul_q4_0(out, out_stride, w_q4, w_d, x_qs, x_d, n_tok, rows, cols);
    } else if (x86_avx2_usable() && cols / KERNEL_QK <= MAX_BLOCKS && x86_avx2_vnni()) {
        matmul_q4_0_vnni(out, out_stride, w_q4, w_d, x_qs, x_d, n_tok, rows, cols, x86_avx2_vnni());
    } else if (x86_avx2_usable() && cols / KERNEL_QK <= MAX_BLOCKS) {
        matmul_q4_0_avx2(out, out_stride, w_q4, w_d, x_qs, x_d, n_tok, rows, cols);
    } else {
        kernel_tiled_matmul_q4_0(out, out_stride, w_q4, w_d, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matvec_q4_1(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (x86_avx2_usable() && cols / KERNEL_QK <= MAX_BLOCKS && x86_avx2_vnni()) {
        matvec_q4_1_vnni(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols, x86_avx2_vnni());
    } else if (x86_avx2_usable() && cols / KERNEL_QK <= MAX_BLOCKS) {
        matvec_q4_1_avx2(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q4_1(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols);
    }
}

void kernel_matmul_q4_1(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q4_1(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols);
    } else if (n_tok < MATMUL_LANES_FROM && x86_avx2_usable() && cols / KERNEL_QK <= MAX_BLOCKS) {
        matmul_short_q4_1(out, out_stride, w_q4, w_d, w_m, x_qs, x_d, n_tok, rows, cols, x86_avx2_vnni());
    } else if (n_tok < MATMUL_LANES_FROM) {
        kernel_tiled_matmul_q4_1(out, out_stride, w_q4, w_d, w_m, x_qs, x_d, n_tok, rows, cols);
    } else if (x86_avx2_usable() && cols / KERNEL_QK <= MAX_BLOCKS && x86_avx2_vnni()) {
        matmul_q4_1_vnni(out, out_stride, w_q4, w_d, w_m, x_qs, x_d, n_tok, rows, cols, x86_avx2_vnni());
    } else if (x86_avx2_usable() && cols / KERNEL_QK <= MAX_BLOCKS) {
        matmul_q4_1_avx2(out, out_stride, w_q4, w_d, w_m, x_qs, x_d, n_tok, rows, cols);
    } else {
        kernel_tiled_matmul_q4_1(out, out_stride, w_q4, w_d, w_m, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matvec_f32(float *out, const float *w, const float *x, int rows, int cols)
{
    if (x86_avx2_usable()) {
        matvec_f32_avx2(out, w, x, rows, cols);
    } else {
        kernel_scalar_matvec_f32(out, w, x, rows, cols);
    }
}

void kernel_matmul_f32(float *out, int out_stride, const float *w, const float *x, int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_f32(out, w, x, rows, cols);
    } else if (x86_avx2_usable()) {
        matmul_f32_avx2(out, out_stride, w, x, n_tok, rows, cols);
    } else {
        kernel_tiled_matmul_f32(out, out_stride, w, x, n_tok, rows, cols);
    }
}

void kernel_delta_rule_step(float *out, float *state, const float *q, const float *k, const float *v, float decay,
                            float beta, float *memory, int key_dim, int value_dim)
{
    if (x86_avx2_usable() && value_dim % 8 == 0) {
        delta_rule_step_avx2(out, state, q, k, v, decay, beta, memory, key_dim, value_dim);
    } else {
        kernel_scalar_delta_rule_step(out, state, q, k, v, decay, beta, memory, key_dim, value_dim);
    }
}

void kernel_swiglu(float *up, const float *gate, int n)
{
    if (x86_avx2_usable()) {
        swiglu_avx2(up, gate, n);
    } else {
        kernel_scalar_swiglu(up, gate, n);
    }
}

void kernel_gelu_tanh_mul(float *up, const float *gate, int n)
{
    if (x86_avx2_usable()) {
        gelu_tanh_mul_avx2(up, gate, n);
    } else {
        kernel_scalar_gelu_tanh_mul(up, gate, n);
    }
}

void kernel_quantize_q8_0(int8_t *qs, float *d, const float *x, int n)
{
    if (x86_avx2_usable()) {
        quantize_q8_0_avx2(qs, d, x, n);
    } else {
        kernel_scalar_quantize_q8_0(qs, d, x, n);
    }
}

void kernel_attention_scores(float *att, int att_stride, const float *q, int q_stride, int n_q, const float *keys,
                             int stride, int n, int head_dim, float scale)
{
    if (x86_avx2_usable()) {
        attention_scores_avx2(att, att_stride, q, q_stride, n_q, keys, stride, n, head_dim, scale);
    } else {
        kernel_scalar_attention_scores(att, att_stride, q, q_stride, n_q, keys, stride, n, head_dim, scale);
    }
}

void kernel_attention_scores_tokens(const KernelQueryRange *tokens, int n_tok, int att_stride, int q_stride, int n_q,
                                    const float *keys, int stride, int n, int head_dim, float scale)
{
    if (x86_avx2_usable() && n_tok >= 2 && n <= TOKENS_ROWS_MAX && head_dim <= TOKENS_HEAD_MAX && head_dim % 8 == 0) {
        attention_scores_tokens_avx2(tokens, n_tok, att_stride, q_stride, n_q, keys, stride, n, head_dim, scale);
        return;
    }
    fallback_scores_token_by_token(tokens, n_tok, att_stride, q_stride, n_q, keys, stride, head_dim, scale);
}

void kernel_attention_mix(float *out, int out_stride, const float *p, int p_stride, int n_q, const float *values,
                          int stride, int n, int head_dim)
{
    if (x86_avx2_usable()) {
        attention_mix_avx2(out, out_stride, p, p_stride, n_q, values, stride, n, head_dim);
    } else {
        kernel_scalar_attention_mix(out, out_stride, p, p_stride, n_q, values, stride, n, head_dim);
    }
}

void kernel_attention_scores_f16(float *att, int att_stride, const float *q, int q_stride, int n_q,
                                 const KernelHalf *keys, int stride, int n, int head_dim, float scale, float *tile,
                                 int tile_rows)
{
    if (x86_avx2_usable()) {
        attention_scores_f16_avx2(att, att_stride, q, q_stride, n_q, keys, stride, n, head_dim, scale);
    } else {
        fallback_widened_scores_f16(att, att_stride, q, q_stride, n_q, keys, stride, n, head_dim, scale, tile,
                                    tile_rows);
    }
}

void kernel_attention_mix_f16(float *out, int out_stride, const float *p, int p_stride, int n_q,
                              const KernelHalf *values, int stride, int n, int head_dim, float *tile, int tile_rows)
{
    if (x86_avx2_usable()) {
        attention_mix_f16_avx2(out, out_stride, p, p_stride, n_q, values, stride, n, head_dim);
    } else {
        fallback_widened_mix_f16(out, out_stride, p, p_stride, n_q, values, stride, n, head_dim, tile, tile_rows);
    }
}

void kernel_softmax_rows(float *x, int stride, int rows, int n)
{
    if (x86_avx2_usable()) {
        softmax_many_avx2(x, stride, rows, n);
    } else {
        for (int r = 0; r < rows; r++) {
            op_softmax(x + (int64_t)r * stride, n);
        }
    }
}

void kernel_softmax(float *x, int n)
{
    if (x86_avx2_usable()) {
        softmax_avx2(x, n);
    } else {
        op_softmax(x, n);
    }
}

void kernel_widen_f16(float *out, const KernelHalf *h, int n)
{
    if (x86_avx2_usable()) {
        widen_f16_avx2(out, h, n);
    } else {
        kernel_scalar_widen_f16(out, h, n);
    }
}

void kernel_widen_q8_0(float *out, const int8_t *qs, const KernelHalf *d, int n)
{
    if (x86_avx2_usable()) {
        widen_q8_0_avx2(out, qs, d, n);
    } else {
        kernel_scalar_widen_q8_0(out, qs, d, n);
    }
}

/* The kept GGUF types: the AVX2 kernel when the CPU has it and a row fits the activation sums'
 * arrays (16384 values), the scalar reference otherwise. */
static int blocks_avx2(int cols)
{
    return x86_avx2_usable() && cols / KERNEL_QK <= MAX_BLOCKS;
}

/* A batched product the AVX2 kernel does not take (rows of more than 16384 values): the matvec,
 * the scalar reference there, once per token. */
static void matmul_by_token(KernelBlocksMatvec matvec, float *out, int out_stride, const uint8_t *w, const int8_t *x_qs,
                            const float *x_d, int n_tok, int rows, int cols)
{
    for (int t = 0; t < n_tok; t++) {
        matvec(out + (int64_t)t * out_stride, w, x_qs + (int64_t)t * cols, x_d + (int64_t)t * (cols / KERNEL_QK), rows, cols);
    }
}

void kernel_matvec_q5_0(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_q5_0_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q5_0(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matvec_q5_1(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_q5_1_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q5_1(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matvec_q4_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_q4_k_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q4_k(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matvec_q5_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_q5_k_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q5_k(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matvec_q6_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_q6_k_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q6_k(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matvec_q3_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_q3_k_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q3_k(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matvec_q2_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_q2_k_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q2_k(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matvec_iq4_nl(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_iq4_nl_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_iq4_nl(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matvec_iq4_xs(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_iq4_xs_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_iq4_xs(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matmul_q5_0(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q5_0(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_q5_0_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_q5_0, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matmul_q5_1(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q5_1(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_q5_1_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_q5_1, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matmul_q4_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q4_k(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_q4_k_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_q4_k, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matmul_q5_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q5_k(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_q5_k_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_q5_k, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matmul_q6_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q6_k(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_q6_k_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_q6_k, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matmul_q3_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q3_k(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_q3_k_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_q3_k, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matmul_q2_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q2_k(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_q2_k_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_q2_k, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matmul_iq4_nl(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                          int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_iq4_nl(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_iq4_nl_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_iq4_nl, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matmul_iq4_xs(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                          int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_iq4_xs(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_iq4_xs_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_iq4_xs, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matvec_mxfp4(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_mxfp4_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_mxfp4(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matmul_mxfp4(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                         int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_mxfp4(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_mxfp4_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_mxfp4, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}
