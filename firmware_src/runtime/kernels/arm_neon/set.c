/* The arm_neon kernel set (aarch64: NEON, SDOT where the CPU has it; arm_neon.h says how its bits
 * stay the scalar reference's): its name and CPU features, the entry points it defines itself
 * (KERNEL_HAS_<ENTRY>) and fallback.h, included once here, for all the others. Its files by role:
 * arm_neon.h the shared NEON helpers; cpu.c the hwcaps; matvec.c q8_0, q4_0, q4_1; f32.c the f32
 * matvec and batched product; blocks.c the kept GGUF block types; vector.c the delta rule and the
 * widening of f16 and q8_0 rows; attention.c the attention mix. */
#include "arm_neon.h"

/* This set's own entry points (fallback.h defines the rest: the batched q8_0/q4_0/q4_1 products
 * as tiles of these matvecs, quantization and SwiGLU as the scalar ones). */
#define KERNEL_HAS_MATVEC_F32
#define KERNEL_HAS_MATVEC_Q8_0
#define KERNEL_HAS_MATVEC_Q4_0
#define KERNEL_HAS_MATVEC_Q4_1
#define KERNEL_HAS_MATMUL_F32
#define KERNEL_HAS_DELTA_RULE_STEP
#define KERNEL_HAS_MATVEC_Q5_0
#define KERNEL_HAS_MATVEC_Q5_1
#define KERNEL_HAS_MATVEC_Q4_K
#define KERNEL_HAS_MATVEC_Q5_K
#define KERNEL_HAS_MATVEC_Q6_K
#define KERNEL_HAS_MATVEC_Q3_K
#define KERNEL_HAS_MATVEC_Q2_K
#define KERNEL_HAS_MATVEC_IQ4_NL
#define KERNEL_HAS_MATVEC_IQ4_XS
#define KERNEL_HAS_MATVEC_MXFP4
#define KERNEL_HAS_MATMUL_Q5_0
#define KERNEL_HAS_MATMUL_Q5_1
#define KERNEL_HAS_MATMUL_Q4_K
#define KERNEL_HAS_MATMUL_Q5_K
#define KERNEL_HAS_MATMUL_Q6_K
#define KERNEL_HAS_MATMUL_Q3_K
#define KERNEL_HAS_MATMUL_Q2_K
#define KERNEL_HAS_MATMUL_IQ4_NL
#define KERNEL_HAS_MATMUL_IQ4_XS
#define KERNEL_HAS_MATMUL_MXFP4
#define KERNEL_HAS_ATTENTION_MIX
#define KERNEL_HAS_WIDEN_F16
#define KERNEL_HAS_WIDEN_Q8_0
#define KERNEL_ATTENTION_CHAINS 4 /* an out-of-order core overlaps four positions' sums */
#include "../fallback.h"

const char *kernel_set(void)
{
    return arm_neon_have_dotprod() ? "neon-dotprod" : "neon";
}

const char *kernel_cpu_features(void)
{
    return arm_neon_have_dotprod() ? "sdot" : "none";
}

void arm_neon_tiled_matmul_blocks(KernelBlocksMatvec matvec, int64_t row_bytes, float *out, int out_stride,
                                  const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok, int rows,
                                  int cols)
{
    kernel_tiled_matmul_blocks(matvec, row_bytes, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}
