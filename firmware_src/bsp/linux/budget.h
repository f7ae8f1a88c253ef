/* The memory budget the Linux firmware runs under: --memory-budget in bytes, or auto resolved
 * where the process runs (memory_limit.h), and the expert slots it leaves; unlimited, whether the
 * whole image is read into memory (Options.resident). */
#ifndef COLIBRI_BSP_LINUX_BUDGET_H
#define COLIBRI_BSP_LINUX_BUDGET_H

#include <stdint.h>

#include "options.h"

/* The budget in bytes (auto resolved here, into opt->budget and colibri_weights_info) and the expert
 * slots it leaves, and opt->resident: 0, or -1 after an error frame saying it cannot hold the
 * model. */
int plan_budget(Options *opt, int64_t *slots);

#endif
