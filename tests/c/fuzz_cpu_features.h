/* clang-14 knows neither __builtin_cpu_supports("f16c") nor ("avxvnni"), which the AVX2 kernel set
 * asks for; the libFuzzer builds (clang only) force-include this header, which answers the same
 * questions from CPUID (leaf 1: F16C; leaf 7: AVX2; leaf 7 subleaf 1: AVX-VNNI). Any other feature
 * (AVX512-VNNI, AVX512VL) is answered "no", so these builds never take the EVEX-encoded path. */
#ifndef COLIBRI_FUZZ_CPU_FEATURES_H
#define COLIBRI_FUZZ_CPU_FEATURES_H
#include <cpuid.h>
#include <string.h>

static inline int colibri_fuzz_cpu_supports(const char *feature)
{
    unsigned a, b, c, d;
    if (strcmp(feature, "f16c") == 0) {
        return __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
    }
    if (strcmp(feature, "avx2") == 0) {
        return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b >> 5 & 1);
    }
    if (strcmp(feature, "avxvnni") == 0) {
        return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1);
    }
    return 0;
}
#define __builtin_cpu_supports(feature) colibri_fuzz_cpu_supports(feature)
#endif
