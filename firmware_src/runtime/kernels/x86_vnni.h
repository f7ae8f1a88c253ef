/* The x86_avx2 kernel set's ways to reach vpdpbusd: the value of the kernels' `vnni` argument (a
 * constant in each compiled copy) and of x86_avx2.c's have_vnni(). 0 is not at all (maddubs + madd). */
#ifndef COLIBRI_X86_VNNI_H
#define COLIBRI_X86_VNNI_H

/* AVX-VNNI's VEX encoding, or AVX512-VNNI's EVEX encoding of the same instruction on ymm
 * registers (with AVX512VL: CPUs with AVX-512 but without AVX-VNNI, such as AMD Zen 4). Both give
 * the same exact int32 sums. */
#define KERNEL_VNNI_VEX 1
#define KERNEL_VNNI_EVEX 2

#endif
