/* The weight image's directory as this firmware expects it, entry by entry: the named tensors of
 * colibri_tensor_table and the routed experts of colibri_expert_groups, one row per MoE layer (every
 * expert of a layer is laid out alike), so that a 30 B MoE's 18,432 expert matrices cost 48 table
 * rows instead of a constant each. */
#ifndef COLIBRI_TENSOR_TABLE_H
#define COLIBRI_TENSOR_TABLE_H

#include <stdint.h>

#include "model_def.h"

enum { COLIBRI_EXPERT_W_GATE = 0, COLIBRI_EXPERT_W_UP = 1, COLIBRI_EXPERT_W_DOWN = 2 };

/* One directory entry as the plan has it. */
typedef struct {
    char name[COLIBRI_IMAGE_NAME_BYTES]; /* NUL padded, as the directory stores it */
    uint32_t dtype;                      /* COLIBRI_DTYPE_* */
    uint32_t rows;
    uint32_t cols;
    uint64_t offset; /* from the data region's start */
    uint64_t bytes;
    int expert; /* 1: a routed expert's matrix, checked against its CRC-32 when first brought in on Linux boards */
} ColibriTensorEntry;

/* Entry `index` of the directory (index < COLIBRI_IMAGE_TENSOR_COUNT). */
void colibri_expected_tensor(uint32_t index, ColibriTensorEntry *out);

/* Whether entry `index` is a routed expert's matrix. */
int colibri_tensor_is_expert(uint32_t index);

/* The routed experts of `layer`, or NULL for a layer without. */
const ColibriExpertGroup *colibri_layer_experts(int layer);

/* This rank's weight image (colibri_rank_images; a single board's: the whole image). */
const ColibriRankImage *colibri_rank_image(void);

/* What this rank holds under a memory budget (colibri_rank_budgets; a single board's: the whole model). */
const ColibriRankBudget *colibri_rank_budget(void);

/* Expert `expert`'s first byte in this rank's image, from the data region's start (an expert of
 * this rank's: expert % COLIBRI_IMAGE_RANKS is its rank). */
uint64_t colibri_expert_offset(const ColibriExpertGroup *group, int expert);

/* The directory entry of part `part` (COLIBRI_EXPERT_W_*) of expert `expert`. */
uint32_t colibri_expert_tensor(const ColibriExpertGroup *group, int expert, int part);

#endif
