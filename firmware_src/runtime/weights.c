/* Binding the weights: ColibriWeights' pointers into a validated image's data region, driven by the
 * generated binding tables (model_data.c), so no generated code decides anything. q4_0 matrices the
 * plan expands at load get their int8 copy in colibri_expanded and are read by the q8_0 kernels; q4_1
 * matrices are always read in place (their minimums as well as their scales). */
#include "weights.h"

#include <string.h>

#include "kernels/kernels.h"

#if COLIBRI_Q4_0_EXPANDED
/* One q4_0 matrix of n values into its int8 copy (the values quant - 8), scales copied as they are. */
static void expand_q4_0(int8_t *dst, KernelHalf *dst_d, const uint8_t *src, const uint8_t *src_d, uint64_t n)
{
    for (uint64_t b = 0; b < n / KERNEL_QK; b++) {
        for (int j = 0; j < KERNEL_QK; j++) {
            dst[b * KERNEL_QK + j] = kernel_q4_0_value(src + b * (KERNEL_QK / 2), j);
        }
    }
    memcpy(dst_d, src_d, (size_t)(n / KERNEL_QK) * sizeof(KernelHalf));
}
#endif

void colibri_bind_weights(const uint8_t *data, ColibriWeights *w)
{
    memset(w, 0, sizeof *w); /* what the model does not have stays NULL */
    for (int i = 0; i < COLIBRI_N_MATRIX_BINDINGS; i++) {
        const ColibriMatrixBinding *b = &colibri_matrix_bindings[i];
        ColibriMatrix *m = (ColibriMatrix *)((uint8_t *)w + b->field);
#if COLIBRI_Q4_0_EXPANDED
        if (b->expanded_offset >= 0) {
            int8_t *copy = colibri_expanded + b->expanded_offset;
            KernelHalf *scales = (KernelHalf *)(copy + b->expanded_scales_offset);
            expand_q4_0(copy, scales, data + b->offset, data + b->offset + b->scales_offset, b->values);
            m->dtype = COLIBRI_DTYPE_Q8_0;
            m->w = copy;
            m->d = scales;
            m->m = NULL;
            continue;
        }
#endif
        m->dtype = b->dtype;
        m->w = data + b->offset;
        m->d = b->dtype == COLIBRI_DTYPE_F32 ? NULL : (const KernelHalf *)(data + b->offset + b->scales_offset);
        m->m = b->dtype == COLIBRI_DTYPE_Q4_1 ? (const KernelHalf *)(data + b->offset + b->mins_offset) : NULL;
    }
    for (int i = 0; i < COLIBRI_N_VECTOR_BINDINGS; i++) {
        const ColibriVectorBinding *v = &colibri_vector_bindings[i];
        *(const float **)((uint8_t *)w + v->field) = (const float *)(data + v->offset);
    }
}
