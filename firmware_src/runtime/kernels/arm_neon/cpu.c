/* The arm_neon set's CPU features: whether the CPU has the dot-product extension (SDOT), from the
 * hwcaps the Linux kernel gives the process. */
#include <sys/auxv.h>

#include "arm_neon.h"

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20) /* Linux uapi: the CPU has SDOT/UDOT */
#endif

int arm_neon_have_dotprod(void)
{
    static int known = -1;
    if (known < 0) {
        known = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) ? 1 : 0;
    }
    return known;
}
