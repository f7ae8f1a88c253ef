/* The rv32 kernel set's entry table: its name and CPU features, the entry points its files
 * define (KERNEL_HAS_<ENTRY>) and every other one from fallback.h; rv32.h says what the set is. */

/* This set's own entry points (fallback.h defines the rest, attention with
 * one sum at a time: fewest instructions on an in-order core). */
#define KERNEL_HAS_MATVEC_Q8_0
#define KERNEL_HAS_MATMUL_Q8_0
#define KERNEL_HAS_QUANTIZE_Q8_0
#define KERNEL_HAS_SWIGLU
#define KERNEL_HAS_MATVEC_Q4_1
#define KERNEL_HAS_MATMUL_Q4_1
#define KERNEL_HAS_WIDEN_F16
#define KERNEL_HAS_ATTENTION_F16
#define KERNEL_HAS_MATVEC_Q4_K
#define KERNEL_HAS_MATVEC_Q6_K
#define KERNEL_HAS_MATVEC_Q5_0
#define KERNEL_HAS_MATVEC_Q5_K
#define KERNEL_HAS_MATVEC_Q3_K
#define KERNEL_HAS_MATVEC_Q2_K
#define KERNEL_HAS_MATVEC_Q5_1
#define KERNEL_HAS_MATVEC_IQ4_NL
#define KERNEL_HAS_MATVEC_IQ4_XS
#define KERNEL_HAS_MATVEC_MXFP4
#include "../fallback.h"
#include "rv32.h"

const char *kernel_set(void)
{
    return "rv32";
}

const char *kernel_cpu_features(void)
{
    return "none"; /* rv32imafc, fixed by the board file */
}

void rv32_widened_scores_f16(float *att, int att_stride, const float *q, int q_stride, int n_q,
                             const KernelHalf *keys, int stride, int n, int head_dim, float scale, float *tile,
                             int tile_rows)
{
    fallback_widened_scores_f16(att, att_stride, q, q_stride, n_q, keys, stride, n, head_dim, scale, tile, tile_rows);
}

void rv32_widened_mix_f16(float *out, int out_stride, const float *p, int p_stride, int n_q,
                          const KernelHalf *values, int stride, int n, int head_dim, float *tile, int tile_rows)
{
    fallback_widened_mix_f16(out, out_stride, p, p_stride, n_q, values, stride, n, head_dim, tile, tile_rows);
}
