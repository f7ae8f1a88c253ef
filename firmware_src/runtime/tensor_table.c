#include "tensor_table.h"

#include <string.h>

#include "ranks.h"

static const char *const part_names[3] = {"w_gate", "w_up", "w_down"};

/* Appends the decimal digits of v at p; returns the end. No printf: the bare-metal boards have none. */
static char *put_uint(char *p, uint32_t v)
{
    char digits[10];
    int n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (n > 0) {
        *p++ = digits[--n];
    }
    return p;
}

static char *put_text(char *p, const char *text)
{
    size_t n = strlen(text);
    memcpy(p, text, n);
    return p + n;
}

/* The group holding entry `index`, with the expert and part it is; NULL when it is a named tensor,
 * and then *named its row in colibri_tensor_table. Groups are in directory order. */
static const ColibriExpertGroup *locate(uint32_t index, int *expert, int *part, uint32_t *named)
{
    uint32_t before = 0; /* expert entries before `index` */
    for (int g = 0; g < COLIBRI_N_EXPERT_GROUPS; g++) {
        const ColibriExpertGroup *group = &colibri_expert_groups[g];
        const uint32_t entries = 3u * (uint32_t)COLIBRI_N_EXPERTS;
        if (index < group->first_tensor) {
            break;
        }
        if (index < group->first_tensor + entries) {
            *expert = (int)((index - group->first_tensor) / 3);
            *part = (int)((index - group->first_tensor) % 3);
            return group;
        }
        before += entries;
    }
    *named = index - before;
    return NULL;
}

void colibri_expected_tensor(uint32_t index, ColibriTensorEntry *out)
{
    int expert = 0, part = 0;
    uint32_t named = 0;
    const ColibriExpertGroup *group = locate(index, &expert, &part, &named);
    memset(out, 0, sizeof *out);
    if (group == NULL) {
        const ColibriTensorDesc *t = &colibri_tensor_table[named];
        const ColibriHeldTensor *held = &colibri_rank_image()->named[named];
        strncpy(out->name, t->name, sizeof out->name - 1);
        out->dtype = t->dtype;
        out->rows = held->rows;
        out->cols = t->cols;
        out->offset = held->offset;
        out->bytes = held->bytes;
        return;
    }
    const ColibriExpertPart *p = &group->part[part];
    char *end = put_text(out->name, "layers.");
    end = put_uint(end, group->layer);
    end = put_text(end, ".experts.");
    end = put_uint(end, (uint32_t)expert);
    *end++ = '.';
    put_text(end, part_names[part]); /* at most 43 characters: the name fits */
    out->dtype = p->dtype;
    out->cols = p->cols;
    out->expert = 1;
    if (ranks_owns_expert(expert)) { /* another rank's: an entry of no rows and no bytes */
        out->rows = p->rows;
        out->offset = colibri_expert_offset(group, expert) + p->at;
        out->bytes = p->bytes;
    }
}

int colibri_tensor_is_expert(uint32_t index)
{
    int expert, part;
    uint32_t named;
    return locate(index, &expert, &part, &named) != NULL;
}

const ColibriExpertGroup *colibri_layer_experts(int layer)
{
    const int32_t g = colibri_layer_expert_group[layer];
    return g < 0 ? NULL : &colibri_expert_groups[g];
}

const ColibriRankImage *colibri_rank_image(void)
{
    const int rank = ranks_rank();
    return &colibri_rank_images[rank < COLIBRI_IMAGE_RANKS ? rank : 0];
}

const ColibriRankBudget *colibri_rank_budget(void)
{
    const int rank = ranks_rank();
    return &colibri_rank_budgets[rank < COLIBRI_IMAGE_RANKS ? rank : 0];
}

uint64_t colibri_expert_offset(const ColibriExpertGroup *group, int expert)
{
    return colibri_rank_image()->group_offset[group - colibri_expert_groups] +
           (uint64_t)(expert / COLIBRI_IMAGE_RANKS) * group->stride;
}

uint32_t colibri_expert_tensor(const ColibriExpertGroup *group, int expert, int part)
{
    return group->first_tensor + 3u * (uint32_t)expert + (uint32_t)part;
}
