/* The Linux firmware's command line (--weights, --memory-budget, --prefetch, --evict,
 * --probe-storage, --copy-weights, --map-weights, --logits-out) and its usage text. */
#ifndef COLIBRI_BSP_LINUX_OPTIONS_H
#define COLIBRI_BSP_LINUX_OPTIONS_H

#include <stdint.h>

/* The command line. */
typedef struct {
    const char *weights_path;
    const char *logits_path;       /* --logits-out; NULL: none */
    uint64_t budget;               /* --memory-budget in bytes; 0: unlimited (auto: resolved by plan_budget) */
    int budget_auto;               /* --memory-budget auto[-MARGIN]: resolved where this process runs */
    uint64_t auto_margin;          /* the MARGIN of auto-MARGIN (default COLIBRI_AUTO_MARGIN_BYTES) */
    uint64_t probe_storage_mib;    /* --probe-storage; 0: no storage probe */
    int prefetch, eviction;        /* -1: chosen from the pool's size (use_expert_slots) */
    int copy_weights;              /* --copy-weights: the image read into memory, not mapped */
    int map_weights;               /* --map-weights: read through the mapping even where it would fit in memory */
    int resident;                  /* the whole image read into memory in huge pages (plan_budget decides) */
} Options;

/* argv into *opt: 0, or the exit status after the usage and an error frame. */
int parse_options(int argc, char **argv, Options *opt);

/* An error frame (code, message) and the usage with the message on stderr: the exit status 2. */
int refuse_with_usage(int code, const char *message);

#endif
