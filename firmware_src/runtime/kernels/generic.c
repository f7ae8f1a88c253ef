/* The kernel set for boards without an ISA-specific one: every entry point is fallback.h's. */
#include "kernels.h"
#include "fallback.h"

const char *kernel_set(void)
{
    return "scalar";
}

const char *kernel_cpu_features(void)
{
    return "none"; /* portable C: it looks for nothing */
}
