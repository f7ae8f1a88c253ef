/* x86-64 kernels: AVX2 integer dot products for q8_0, chosen at run time (cpuid); the scalar
 * kernels otherwise. Same bits as kernels/scalar.c: each block's int32 sum is exact, and the
 * float terms (float)isum * (w_d * x_d) are added to the row's sum one block after another. */
#include <immintrin.h>

#include "kernels.h"

static int have_avx2(void)
{
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    return known;
}

const char *kernel_set(void)
{
    return have_avx2() ? "avx2" : "scalar";
}

/* Eight int32 partial sums -> their total in every lane is not needed: return the 8 lanes'
 * horizontal sums of v0..v7, one per lane, in order (integer adds: exact in any order). */
__attribute__((target("avx2"))) static inline __m256i block_sums8(__m256i v0, __m256i v1, __m256i v2, __m256i v3,
                                                                  __m256i v4, __m256i v5, __m256i v6, __m256i v7)
{
    __m256i h01 = _mm256_hadd_epi32(v0, v1);
    __m256i h23 = _mm256_hadd_epi32(v2, v3);
    __m256i h45 = _mm256_hadd_epi32(v4, v5);
    __m256i h67 = _mm256_hadd_epi32(v6, v7);
    __m256i h0123 = _mm256_hadd_epi32(h01, h23);
    __m256i h4567 = _mm256_hadd_epi32(h45, h67);
    __m256i lo = _mm256_permute2x128_si256(h0123, h4567, 0x20);
    __m256i hi = _mm256_permute2x128_si256(h0123, h4567, 0x31);
    return _mm256_add_epi32(lo, hi);
}

/* The 32 products of one block, as 8 int32 partial sums. q8_0 quants lie in [-127, 127], so
 * |w| * x pairs summed by maddubs stay within int16. */
__attribute__((target("avx2"))) static inline __m256i block_products(const int8_t *w, const int8_t *x)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i wv = _mm256_loadu_si256((const __m256i *)w);
    __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
    return _mm256_madd_epi16(pairs, ones);
}

__attribute__((target("avx2"))) static void matvec_q8_0_avx2(float *out, const int8_t *w_qs, const float *w_d,
                                                             const int8_t *x_qs, const float *x_d, int rows,
                                                             int cols)
{
    const int nb = cols / KERNEL_QK;
    for (int r = 0; r < rows; r++) {
        const int8_t *wq = w_qs + (int64_t)r * cols;
        const float *wd = w_d + (int64_t)r * nb;
        float acc = 0.0f;
        int b = 0;
        for (; b + 8 <= nb; b += 8) {
            const int8_t *w = wq + b * KERNEL_QK;
            const int8_t *x = x_qs + b * KERNEL_QK;
            __m256i sums = block_sums8(block_products(w, x), block_products(w + 32, x + 32),
                                       block_products(w + 64, x + 64), block_products(w + 96, x + 96),
                                       block_products(w + 128, x + 128), block_products(w + 160, x + 160),
                                       block_products(w + 192, x + 192), block_products(w + 224, x + 224));
            __m256 scales = _mm256_mul_ps(_mm256_loadu_ps(wd + b), _mm256_loadu_ps(x_d + b));
            float terms[8];
            _mm256_storeu_ps(terms, _mm256_mul_ps(_mm256_cvtepi32_ps(sums), scales));
            for (int i = 0; i < 8; i++) {
                acc = (b + i == 0) ? terms[i] : acc + terms[i];
            }
        }
        for (; b < nb; b++) {
            __m256i v = block_products(wq + b * KERNEL_QK, x_qs + b * KERNEL_QK);
            __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            s = _mm_hadd_epi32(s, s);
            s = _mm_hadd_epi32(s, s);
            float term = (float)_mm_cvtsi128_si32(s) * (wd[b] * x_d[b]);
            acc = (b == 0) ? term : acc + term;
        }
        out[r] = acc;
    }
}

void kernel_matvec_q8_0(float *out, const int8_t *w_qs, const float *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (have_avx2()) {
        matvec_q8_0_avx2(out, w_qs, w_d, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q8_0(out, w_qs, w_d, x_qs, x_d, rows, cols);
    }
}

/* A row's f32 sum is sequential by definition; only the q8_0 path has a SIMD kernel here. */
void kernel_matvec_f32(float *out, const float *w, const float *x, int rows, int cols)
{
    kernel_scalar_matvec_f32(out, w, x, rows, cols);
}

void kernel_quantize_q8_0(int8_t *qs, float *d, const float *x, int n)
{
    kernel_scalar_quantize_q8_0(qs, d, x, n);
}
