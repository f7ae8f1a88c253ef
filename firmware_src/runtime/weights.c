/* Binding the weights: ColibriWeights' pointers into a validated image's data region, driven by the
 * generated binding tables (model_data.c), so no generated code decides anything. q4_0 matrices the
 * plan expands at load get their int8 copy in colibri_expanded and are read by the q8_0 kernels; q4_1
 * matrices are always read in place (their minimums as well as their scales), and so are the kept
 * GGUF types' blocks. */
#include "weights.h"

#include <string.h>

#include "kernels/kernels.h"
#include "ranks.h"
#include "tensor_table.h"

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

/* One matrix: read in place at data + offset, or (q4_0 expanded at load) from its int8 copy at
 * colibri_expanded + expanded_offset, which it fills. */
static void bind_matrix(ColibriMatrix *m, const uint8_t *data, uint32_t dtype, uint64_t offset, uint64_t scales_offset,
                        uint64_t mins_offset, uint64_t values, int64_t expanded_offset, uint64_t expanded_scales_offset)
{
#if COLIBRI_Q4_0_EXPANDED
    if (expanded_offset >= 0) {
        int8_t *copy = colibri_expanded + expanded_offset;
        KernelHalf *scales = (KernelHalf *)(copy + expanded_scales_offset);
        expand_q4_0(copy, scales, data + offset, data + offset + scales_offset, values);
        m->dtype = COLIBRI_DTYPE_Q8_0;
        m->first_row = 0;
        m->rows_held = 0;
        m->w = copy;
        m->d = scales;
        m->m = NULL;
        return;
    }
#else
    (void)values;
    (void)expanded_offset;
    (void)expanded_scales_offset;
#endif
    m->dtype = dtype;
    m->first_row = 0;
    m->rows_held = 0;
    m->w = data + offset;
    /* q8_0, q4_0 and q4_1 keep their scales apart; f32 has none, a kept GGUF type's are in its blocks */
    const int scaled = dtype == COLIBRI_DTYPE_Q8_0 || dtype == COLIBRI_DTYPE_Q4_0 || dtype == COLIBRI_DTYPE_Q4_1;
    m->d = scaled ? (const KernelHalf *)(data + offset + scales_offset) : NULL;
    m->m = dtype == COLIBRI_DTYPE_Q4_1 ? (const KernelHalf *)(data + offset + mins_offset) : NULL;
}

/* Every routed expert of every MoE layer, from its layer's row of colibri_expert_groups. */
static void bind_experts(const uint8_t *data, ColibriWeights *w)
{
#if COLIBRI_N_EXPERTS > 0
    for (int g = 0; g < COLIBRI_N_EXPERT_GROUPS; g++) {
        const ColibriExpertGroup *group = &colibri_expert_groups[g];
        for (int e = 0; e < COLIBRI_N_EXPERTS; e++) {
            if (!ranks_owns_expert(e)) {
                continue; /* another rank's: not in this rank's image */
            }
            ColibriExpert *ex = &w->layers[group->layer].experts[e];
            ColibriMatrix *to[3] = {&ex->w_gate, &ex->w_up, &ex->w_down};
            for (int p = 0; p < 3; p++) {
                const ColibriExpertPart *part = &group->part[p];
                const int64_t expanded = part->expanded_at < 0 ? -1
                    : group->expanded_offset + (int64_t)((uint64_t)e * group->expanded_stride) + part->expanded_at;
                bind_matrix(to[p], data, part->dtype, colibri_expert_offset(group, e) + part->at,
                            part->scales_offset, part->mins_offset, (uint64_t)part->rows * part->cols, expanded,
                            part->expanded_scales_offset);
            }
        }
    }
#else
    (void)data;
    (void)w;
#endif
}

void colibri_bind_weights(const uint8_t *data, ColibriWeights *w)
{
    memset(w, 0, sizeof *w); /* what the model does not have stays NULL */
    const ColibriRankImage *image = colibri_rank_image(); /* a rank's: its rows of each split product */
    for (int i = 0; i < COLIBRI_N_MATRIX_BINDINGS; i++) {
        const ColibriMatrixBinding *b = &colibri_matrix_bindings[i];
        const ColibriHeldTensor *held = &image->named[b->named];
        ColibriMatrix *m = (ColibriMatrix *)((uint8_t *)w + b->field);
        bind_matrix(m, data, b->dtype, held->offset, held->scales_offset, held->mins_offset,
                    (uint64_t)held->rows * colibri_tensor_table[b->named].cols, b->expanded_offset,
                    b->expanded_scales_offset);
        if (held->rows != colibri_tensor_table[b->named].rows) {
            m->first_row = (int32_t)held->first_row;
            m->rows_held = (int32_t)held->rows;
        }
    }
    bind_experts(data, w);
    for (int i = 0; i < COLIBRI_N_VECTOR_BINDINGS; i++) {
        const ColibriVectorBinding *v = &colibri_vector_bindings[i];
        *(const float **)((uint8_t *)w + v->field) = (const float *)(data + image->named[v->named].offset);
    }
}
