/* The x86_avx2 kernel set's CPU checks (cpuid, through __builtin_cpu_supports), each made once:
 * whether its AVX2 kernels may run, and how they reach vpdpbusd. Compiled for baseline x86-64, as
 * set.c's entry points that ask them. */
#include "x86_avx2.h"

/* AVX2 and F16C, both or neither: every kernel of the set's AVX2 regions is compiled for the two.
 * Every CPU with AVX2 has F16C, but a hypervisor may hide either; then the scalar kernels run. */
int x86_avx2_usable(void)
{
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") ? 1 : 0;
    }
    return known;
}

/* The integer dot products of quantized blocks. With vpdpbusd (four u8 x s8 products summed into
 * each int32 lane, exactly) a block takes one instruction fewer than with AVX2's maddubs (pairs
 * into int16) + madd (pairs into int32); both give the exact int32 sums. AVX-VNNI encodes it with
 * VEX; a CPU with AVX512-VNNI and AVX512VL but not AVX-VNNI (AMD Zen 4) runs the same instruction
 * on ymm registers EVEX encoded (libgcc reports the AVX-512 features only where the OS saves their
 * state). The choice is made at run time (KERNEL_VNNI_VEX, KERNEL_VNNI_EVEX or 0); KERNEL_NO_VNNI
 * builds the AVX2 path alone (tests run both). */
int x86_avx2_vnni(void)
{
#ifdef KERNEL_NO_VNNI
    return 0;
#else
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avxvnni")                                              ? KERNEL_VNNI_VEX
                : __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") ? KERNEL_VNNI_EVEX
                                                                                               : 0;
    }
    return known;
#endif
}
