/* The memory budget (budget.h): auto's arithmetic (cache_plan.py's auto_budget) on what
 * memory_limit.c finds, and the refusal of a budget that cannot hold the model. */
#include "budget.h"

#include <stdio.h>

#include "../../app/decode.h"
#include "../../runtime/expert_cache.h"
#include "../../runtime/tensor_table.h"
#include "memory_limit.h"

/* What the whole model takes when every expert is held: the resident weights, the arenas and the
 * reserve, and every expert in a slot of its own (cache_plan.py's arithmetic); a rank's, its share
 * (cache_plan.py RankShare: its image read in place, the arenas, the reserve). */
static uint64_t whole_model_bytes(void)
{
    if (COLIBRI_IMAGE_RANKS > 1) {
        return colibri_rank_budget()->memory_bytes;
    }
    return (uint64_t)COLIBRI_BUDGET_FIXED_BYTES +
           (uint64_t)COLIBRI_N_MOE_LAYERS * COLIBRI_N_EXPERTS * COLIBRI_EXPERT_SLOT_BYTES;
}

#define LEAST_BYTES 160

/* The least a budget holds, as both refusals say it: "at least N B (resident weights, arenas and
 * reserve F B + k expert slots x S B)", k the experts of a token where the model has MoE layers. */
static void least_budget(char *out, size_t size)
{
    const int slots = (int)colibri_cache_least_slots();
    const unsigned long long fixed = (unsigned long long)colibri_rank_budget()->fixed_bytes;
    snprintf(out, size, "at least %llu B (resident weights, arenas and reserve %llu B + %d expert slots x %llu B)",
             fixed + (unsigned long long)slots * COLIBRI_EXPERT_SLOT_BYTES, fixed, slots,
             (unsigned long long)COLIBRI_EXPERT_SLOT_BYTES);
}

/* --memory-budget auto[-MARGIN]: the memory this process may use less the margin (memory_limit.h), as
 * *budget; 0 (unlimited) when that holds every expert in a slot, i.e. the whole model. The arithmetic
 * is cache_plan.py's auto_budget. Returns 0, or -1 with *message saying why it cannot run. */
static int resolve_auto_budget(uint64_t margin, uint64_t *budget, ColibriWeightsInfo *info, char *message, size_t size)
{
    MemoryFound found;
    if (memory_found("", &found) != 0) {
        snprintf(message, size, "--memory-budget auto: no memory cgroup limit and no MemAvailable "
                                "(/proc/self/cgroup, /proc/meminfo); give the budget in bytes");
        return -1;
    }
    const uint64_t usable = found.bytes > margin ? found.bytes - margin : 0;
    const uint64_t whole = whole_model_bytes();
    info->auto_source = memory_source_name(found.source);
    info->auto_found = found.bytes;
    info->auto_margin = margin;
    snprintf(info->auto_where, sizeof info->auto_where, "%s", found.where);
    *budget = usable >= whole ? 0 : usable;
    if (usable == 0 || colibri_cache_slots_for_budget(*budget) < 0) {
        char least[LEAST_BYTES];
        least_budget(least, sizeof least);
        snprintf(message, size, "--memory-budget auto: %s %llu B (%s) - margin %llu B = %llu B cannot hold this model: it needs %s",
                 memory_source_name(found.source), (unsigned long long)found.bytes, found.where,
                 (unsigned long long)margin, (unsigned long long)usable, least);
        return -1;
    }
    /* For whoever runs the firmware by hand; the host reads the same from the stats frame. */
    fprintf(stderr, "colibri: --memory-budget auto: %s %llu B (%s) - margin %llu B = %llu B%s\n",
            memory_source_name(found.source), (unsigned long long)found.bytes, found.where,
            (unsigned long long)margin, (unsigned long long)usable,
            *budget == 0 ? ": it holds the whole model, so unlimited (the mapped image read in place)" : "");
    return 0;
}

int plan_budget(Options *opt, int64_t *slots)
{
    if (opt->budget_auto) {
        char message[512];
        if (resolve_auto_budget(opt->auto_margin, &opt->budget, &colibri_weights_info, message, sizeof message) != 0) {
            colibri_report_error(COLIBRI_ERR_BUDGET, message);
            return -1;
        }
    }
    /* Unlimited, and the whole model fits in the memory this process may use (less the auto
     * margin): the image is read into memory in huge pages (copy_in_place) instead of being read
     * through the mapping's 4 KiB pages. Where it does not fit (or memory cannot be told), the
     * mapping stays, and the page cache holds what it can. */
    MemoryFound found;
    opt->resident = opt->budget == 0 && !opt->copy_weights && !opt->map_weights && memory_found("", &found) == 0 &&
                    found.bytes > COLIBRI_AUTO_MARGIN_BYTES &&
                    whole_model_bytes() <= found.bytes - COLIBRI_AUTO_MARGIN_BYTES;
    *slots = colibri_cache_slots_for_budget(opt->budget);
    if (*slots < 0) {
        char message[320], least[LEAST_BYTES];
        least_budget(least, sizeof least);
        snprintf(message, sizeof message, "--memory-budget %llu B cannot hold this model: it needs %s",
                 (unsigned long long)opt->budget, least);
        colibri_report_error(COLIBRI_ERR_BUDGET, message);
        return -1;
    }
    return 0;
}
