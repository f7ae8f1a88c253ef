/* Runs on qemu-system-riscv32 (bare metal, semihosting output): the rv32 kernels, compiled for
 * rv32imafc with the board's flags, against the scalar kernels on the same machine, bit for bit,
 * over awkward sizes and extreme values; then the exact instruction counts of the kernels at the
 * default model's shapes. Prints "mismatches N" last and exits through the SiFive test device. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernels/kernels.h"
#include "ops.h"

static uint32_t rng_state = 0x12345678u;

static uint32_t next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

/* A quant in [-127, 127]; now and then the extremes, so that the int32 sums reach their bounds. */
static int8_t quant(int extreme)
{
    uint32_t r = next();
    if (extreme) {
        return (r & 1) ? 127 : -127;
    }
    return (int8_t)((int32_t)(r % 255u) - 127);
}

static float scale(void)
{
    return (float)(next() % 100000u) * 1e-7f + 1e-6f;
}

/* A weight scale as the image holds it (binary16 bits): positive, from binary16's subnormals (and
 * now and then zero) to about 0.016, every encoding equally likely. */
static KernelHalf half_scale(void)
{
    return (KernelHalf)(next() % 0x2400u);
}

/* Any finite binary16 of either sign: zeros, subnormals, normals up to 65504. */
static KernelHalf any_half(void)
{
    uint32_t h = next() & 0xFFFFu;
    if ((h & 0x7C00u) == 0x7C00u) {
        h &= ~0x4000u; /* no infinities or NaNs: the image never holds one */
    }
    return (KernelHalf)h;
}

/* An activation block scale. extreme 0: what quantized activations usually have; 1: also
 * subnormal, zero, negative and the largest below 2^16 (which the rv32 set's prescaled product must
 * still take exactly); 2: as 1, but one block of the call at 2^16 or above (the rv32 set then takes the
 * scalar kernel's path). */
static float act_scale(int extreme)
{
    if (!extreme) {
        return scale();
    }
    switch (next() % 8u) {
    case 0: return (float)(next() % 1000u + 1u) * 1e-42f; /* subnormal */
    case 1: return 0x1.fffffep15f;                       /* the largest below 2^16 */
    case 2: return -scale();
    case 3: return 0.0f;
    case 4: return (float)(next() % 60000u) + 1.0f;
    default: return scale();
    }
}

static void fill_act_scales(float *d, int n, int extreme)
{
    for (int i = 0; i < n; i++) {
        d[i] = act_scale(extreme);
    }
    if (extreme == 2) {
        d[next() % (uint32_t)n] = (next() & 1) ? 0x1p16f : 3e5f;
    }
}

static float value(void)
{
    return ((float)(int32_t)(next() % 200001u) - 100000.0f) * 1e-4f;
}

#define MAX_WEIGHTS (40 * 2304)
#define MAX_COLS 2304
#define MAX_TOKENS 4
#define MAX_OUT 1024
static int8_t w_qs[MAX_WEIGHTS];
static KernelHalf w_d[MAX_WEIGHTS / KERNEL_QK];
static KernelHalf w_m[MAX_WEIGHTS / KERNEL_QK];
static int8_t x_qs[MAX_TOKENS * MAX_COLS];
static float x_d[MAX_TOKENS * MAX_COLS / KERNEL_QK];
static float out_fast[MAX_OUT], out_ref[MAX_OUT];
static float xf[MAX_COLS], yf[MAX_COLS];

static int mismatches;

/* extreme: quants at their ends, weight scales anywhere in binary16's range (either sign) and the
 * activation scales of act_scale(extreme). */
static void fill(int rows, int cols, int extreme, int tokens)
{
    for (int i = 0; i < rows * cols; i++) {
        w_qs[i] = quant(extreme);
    }
    for (int i = 0; i < rows * cols / KERNEL_QK; i++) {
        w_d[i] = extreme ? any_half() : half_scale();
    }
    for (int i = 0; i < tokens * cols; i++) {
        x_qs[i] = quant(extreme);
    }
    fill_act_scales(x_d, tokens * cols / KERNEL_QK, extreme);
}

static void check_matvec(int rows, int cols, int extreme)
{
    fill(rows, cols, extreme, 1);
    kernel_matvec_q8_0(out_fast, w_qs, w_d, x_qs, x_d, rows, cols);
    kernel_scalar_matvec_q8_0(out_ref, w_qs, w_d, x_qs, x_d, rows, cols);
    if (memcmp(out_fast, out_ref, rows * sizeof(float)) != 0) {
        printf("matvec_q8_0 %dx%d (extremes %d) differs from the scalar kernel\n", rows, cols, extreme);
        mismatches++;
    }
}

/* The batched product: every token's rows as the scalar kernel gives them one token at a time. */
static void check_matmul(int tokens, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    fill(rows, cols, 0, tokens);
    kernel_matmul_q8_0(out_fast, rows, w_qs, w_d, x_qs, x_d, tokens, rows, cols);
    for (int t = 0; t < tokens; t++) {
        kernel_scalar_matvec_q8_0(out_ref + t * rows, w_qs, w_d, x_qs + t * cols, x_d + t * nb, rows, cols);
    }
    if (memcmp(out_fast, out_ref, (size_t)tokens * rows * sizeof(float)) != 0) {
        printf("matmul_q8_0 %d tokens %dx%d differs from the scalar kernel\n", tokens, rows, cols);
        mismatches++;
    }
}

/* q4_1: any packed bytes (w_qs reinterpreted), scales and minimums of both signs; with `extreme`,
 * quants and activations at their ends, scales and minimums anywhere in binary16's range and the
 * activation scales of act_scale(extreme). */
static void fill_q4_1(int rows, int cols, int extreme, int tokens)
{
    for (int i = 0; i < rows * cols / 2; i++) {
        w_qs[i] = (int8_t)(extreme && (i % 3) == 0 ? 0xFF : next()); /* 0xFF: quants 15 and 15 */
    }
    for (int i = 0; i < rows * cols / KERNEL_QK; i++) {
        w_d[i] = extreme ? any_half() : half_scale();
        w_m[i] = extreme ? any_half() : (KernelHalf)((next() % 0x4A00u) | ((next() & 1u) << 15)); /* |m| < 12 */
    }
    for (int i = 0; i < tokens * cols; i++) {
        x_qs[i] = quant(extreme);
    }
    fill_act_scales(x_d, tokens * cols / KERNEL_QK, extreme);
}

static void check_matvec_q4_1(int rows, int cols, int extreme)
{
    fill_q4_1(rows, cols, extreme, 1);
    const uint8_t *w = (const uint8_t *)w_qs;
    kernel_matvec_q4_1(out_fast, w, w_d, w_m, x_qs, x_d, rows, cols);
    kernel_scalar_matvec_q4_1(out_ref, w, w_d, w_m, x_qs, x_d, rows, cols);
    if (memcmp(out_fast, out_ref, rows * sizeof(float)) != 0) {
        printf("matvec_q4_1 %dx%d (extremes %d) differs from the scalar kernel\n", rows, cols, extreme);
        mismatches++;
    }
}

static void check_matmul_q4_1(int tokens, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    const uint8_t *w = (const uint8_t *)w_qs;
    fill_q4_1(rows, cols, 0, tokens);
    kernel_matmul_q4_1(out_fast, rows, w, w_d, w_m, x_qs, x_d, tokens, rows, cols);
    for (int t = 0; t < tokens; t++) {
        kernel_scalar_matvec_q4_1(out_ref + t * rows, w, w_d, w_m, x_qs + t * cols, x_d + t * nb, rows, cols);
    }
    if (memcmp(out_fast, out_ref, (size_t)tokens * rows * sizeof(float)) != 0) {
        printf("matmul_q4_1 %d tokens %dx%d differs from the scalar kernel\n", tokens, rows, cols);
        mismatches++;
    }
}

static void check_quantize(int n)
{
    static int8_t qa[MAX_COLS], qb[MAX_COLS];
    static float da[MAX_COLS / KERNEL_QK], db[MAX_COLS / KERNEL_QK];
    for (int i = 0; i < n; i++) {
        xf[i] = value();
    }
    if (n >= 64) {
        for (int i = 32; i < 64; i++) {
            xf[i] = 0.0f; /* a block of zeros: d = 0 */
        }
        xf[5] = 2.5f * xf[6]; /* ties and the block maximum */
    }
    if (n >= 160) {
        for (int i = 64; i < 96; i++) {
            xf[i] = (float)(int32_t)(next() % 2001u - 1000) * 1e-39f; /* a subnormal d */
            xf[i + 32] = (float)(int32_t)(next() % 2001u - 1000) * 1e-44f; /* 1/d overflows */
        }
        xf[100] = 1.0f / 0.0f;        /* an infinite value: d = inf, 1/d = 0 */
        xf[130] = 0.0f / 0.0f;        /* NaN takes no part in the maximum */
        xf[131] = -xf[132];
    }
    kernel_quantize_q8_0(qa, da, xf, n);
    kernel_scalar_quantize_q8_0(qb, db, xf, n);
    if (memcmp(qa, qb, n) != 0 || memcmp(da, db, n / KERNEL_QK * sizeof(float)) != 0) {
        printf("quantize_q8_0 %d differs from the scalar kernel\n", n);
        mismatches++;
    }
}

/* SwiGLU (rv32/vector.c restates op_silu inline) over ordinary values and every branch of its e^-x:
 * below -87 (0), above 88 (clamped), at both edges, NaN, infinities, zeros and subnormals. */
static void check_swiglu(void)
{
    static const float edges[] = {87.0f, -87.0f, 87.00001f, -87.00001f, 88.0f, -88.0f, 88.00001f, -88.00001f,
                                  200.0f, -200.0f, 0.0f, -0.0f, 1e-40f, -1e-40f, 0.5f, -0.5f};
    static float up_a[MAX_COLS], up_b[MAX_COLS];
    const int n = 600;
    for (int i = 0; i < n; i++) {
        xf[i] = value() * (i % 7 == 0 ? 20.0f : 1.0f);
        up_a[i] = up_b[i] = value();
    }
    for (unsigned i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        xf[i] = edges[i];
    }
    xf[20] = 0.0f / 0.0f;
    xf[21] = 1.0f / 0.0f;
    xf[22] = -1.0f / 0.0f;
    kernel_swiglu(up_a, xf, n);
    kernel_scalar_swiglu(up_b, xf, n);
    if (memcmp(up_a, up_b, n * sizeof(float)) != 0) {
        printf("swiglu differs from the scalar kernel\n");
        mismatches++;
    }
}

/* The binary16 KV cache's widening (rv32/vector.c: half_scaled times 2^112) against the scalar
 * kernel_half_to_float for all 65,536 encodings, subnormals, signed zeros and NaNs included, at
 * lengths that leave every remainder of its eight-value loop. */
static void check_widen_f16(void)
{
    static KernelHalf h[65536];
    static float wide_a[65536], wide_b[65536];
    for (uint32_t i = 0; i < 65536u; i++) {
        h[i] = (KernelHalf)i;
    }
    kernel_widen_f16(wide_a, h, 65536);
    kernel_scalar_widen_f16(wide_b, h, 65536);
    if (memcmp(wide_a, wide_b, sizeof wide_a) != 0) {
        printf("widen_f16 differs from the scalar kernel\n");
        mismatches++;
    }
    for (int n = 1; n <= 17; n++) {
        wide_a[n] = wide_b[n] = 1.0f; /* the value just past the end stays as it was */
        kernel_widen_f16(wide_a, h + 0x3C00 - n, n);
        kernel_scalar_widen_f16(wide_b, h + 0x3C00 - n, n);
        if (memcmp(wide_a, wide_b, (size_t)(n + 1) * sizeof(float)) != 0) {
            printf("widen_f16 %d differs from the scalar kernel\n", n);
            mismatches++;
        }
    }
}

/* Attention over a binary16 tile read in place (rv32/attention.c's kernel_attention_*_f16) against the tile
 * widened by the scalar kernel and the scalar attention kernels: every encoding in the keys and
 * values (NaN's and infinity's included, which widen to finite values); queries ordinary, with
 * zeros, subnormals and values just below 2^16 (still prescaled exactly), and (large) one of 2^16
 * or more, which takes the widened path; weights in [0, 1], subnormal, negative or large. */
#define ATT_MAX_N 70
#define ATT_MAX_HEADS 9
#define ATT_MAX_DIM 264

static KernelHalf att_kv[ATT_MAX_N * ATT_MAX_DIM];
static float att_q[ATT_MAX_HEADS * ATT_MAX_DIM], att_p[ATT_MAX_HEADS * ATT_MAX_N];
static float att_tile[ATT_MAX_N * ATT_MAX_DIM];
static float att_a[ATT_MAX_HEADS * ATT_MAX_N], att_b[ATT_MAX_HEADS * ATT_MAX_N];
static float mix_a[ATT_MAX_HEADS * ATT_MAX_DIM], mix_b[ATT_MAX_HEADS * ATT_MAX_DIM];

static float att_query(int large)
{
    switch (next() % 16u) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return (float)(int32_t)(next() % 2001u - 1000u) * 1e-41f; /* subnormal */
    case 3: return (next() & 1) ? 0x1.fffffep15f : -0x1.fffffep15f;
    case 4: return large ? 0x1p16f : value();
    default: return value() * (float)(1u << (next() % 8u));
    }
}

static float att_weight(void)
{
    switch (next() % 8u) {
    case 0: return 0.0f;
    case 1: return (float)(next() % 1000u) * 1e-42f; /* subnormal */
    case 2: return -value();
    case 3: return value() * 3000.0f;
    default: return (float)(next() % 1000001u) * 1e-6f;
    }
}

static void check_attention_f16(int n_q, int n, int head_dim, int stride, int large)
{
    const int tile_rows = n > 8 ? 8 : n; /* the widened path takes several tiles */
    for (int i = 0; i < n * stride; i++) {
        att_kv[i] = (KernelHalf)next();
    }
    for (int i = 0; i < n_q * head_dim; i++) {
        att_q[i] = att_query(large);
    }
    for (int i = 0; i < n_q * n; i++) {
        att_p[i] = att_weight();
    }
    for (int i = 0; i < n; i++) {
        kernel_scalar_widen_f16(att_tile + i * head_dim, att_kv + i * stride, head_dim);
    }
    kernel_attention_scores_f16(att_a, n, att_q, head_dim, n_q, att_kv, stride, n, head_dim, 0.25f,
                                att_tile + n * head_dim, tile_rows);
    kernel_scalar_attention_scores(att_b, n, att_q, head_dim, n_q, att_tile, head_dim, n, head_dim, 0.25f);
    for (int i = 0; i < n_q * head_dim; i++) {
        mix_a[i] = mix_b[i] = (i % 3 == 0) ? -0.0f : value(); /* the sum so far: fresh, or earlier tiles' */
    }
    kernel_attention_mix_f16(mix_a, head_dim, att_p, n, n_q, att_kv, stride, n, head_dim, att_tile + n * head_dim,
                             tile_rows);
    kernel_scalar_attention_mix(mix_b, head_dim, att_p, n, n_q, att_tile, head_dim, n, head_dim);
    if (memcmp(att_a, att_b, (size_t)n_q * n * sizeof(float)) != 0) {
        printf("attention_scores_f16 %d heads %d positions %d wide (stride %d, large %d) differs from the scalar kernel\n",
               n_q, n, head_dim, stride, large);
        mismatches++;
    }
    if (memcmp(mix_a, mix_b, (size_t)n_q * head_dim * sizeof(float)) != 0) {
        printf("attention_mix_f16 %d heads %d positions %d wide (stride %d) differs from the scalar kernel\n", n_q,
               n, head_dim, stride);
        mismatches++;
    }
}

/* GGUF blocks in place (rv32/kquants.c and blocks.c read several rows at a time): random quants and scales, the
 * binary16 fields (Q4_K's d and dmin, Q6_K's and Q5_0's d, ...) from the weight scales' ranges
 * (either sign, any binary16 with extreme), MXFP4's e8m0 exponent near 2^0 (any but 0xFF, which the
 * image never holds, with extreme). With extreme, every fourth block is all ones and the next all
 * zeros apart from those fields: the largest and smallest quants, scales and minimums. */
static uint8_t k_blocks[MAX_WEIGHTS / KERNEL_QK * KERNEL_Q5_1_BYTES];

typedef void (*BlocksMatvec)(float *, const uint8_t *, const int8_t *, const float *, int, int);

typedef struct {
    const char *name;
    int values, bytes;  /* a block's */
    int halves[2];      /* offsets of its binary16 fields (-1: none) */
    BlocksMatvec fast, scalar;
    int e8m0;           /* offset of its e8m0 exponent (-1: none) */
} KType;

static const KType Q4_K = {"q4_k", KERNEL_Q4_K_VALUES, KERNEL_Q4_K_BYTES, {0, 2}, kernel_matvec_q4_k, kernel_scalar_matvec_q4_k, -1};
static const KType Q6_K = {"q6_k", KERNEL_Q6_K_VALUES, KERNEL_Q6_K_BYTES, {208, -1}, kernel_matvec_q6_k, kernel_scalar_matvec_q6_k, -1};
static const KType Q5_0 = {"q5_0", KERNEL_Q5_0_VALUES, KERNEL_Q5_0_BYTES, {0, -1}, kernel_matvec_q5_0,
                           kernel_scalar_matvec_q5_0, -1};
static const KType Q5_K = {"q5_k", KERNEL_Q5_K_VALUES, KERNEL_Q5_K_BYTES, {0, 2}, kernel_matvec_q5_k, kernel_scalar_matvec_q5_k, -1};
static const KType Q3_K = {"q3_k", KERNEL_Q3_K_VALUES, KERNEL_Q3_K_BYTES, {108, -1}, kernel_matvec_q3_k, kernel_scalar_matvec_q3_k, -1};
static const KType Q2_K = {"q2_k", KERNEL_Q2_K_VALUES, KERNEL_Q2_K_BYTES, {80, 82}, kernel_matvec_q2_k, kernel_scalar_matvec_q2_k, -1};
static const KType IQ4_XS = {"iq4_xs", KERNEL_IQ4_XS_VALUES, KERNEL_IQ4_XS_BYTES, {0, -1}, kernel_matvec_iq4_xs,
                             kernel_scalar_matvec_iq4_xs, -1};
static const KType IQ4_NL = {"iq4_nl", KERNEL_IQ4_NL_VALUES, KERNEL_IQ4_NL_BYTES, {0, -1}, kernel_matvec_iq4_nl,
                             kernel_scalar_matvec_iq4_nl, -1};
static const KType Q5_1 = {"q5_1", KERNEL_Q5_1_VALUES, KERNEL_Q5_1_BYTES, {0, 2}, kernel_matvec_q5_1, kernel_scalar_matvec_q5_1, -1};
static const KType MXFP4 = {"mxfp4", KERNEL_MXFP4_VALUES, KERNEL_MXFP4_BYTES, {-1, -1}, kernel_matvec_mxfp4,
                            kernel_scalar_matvec_mxfp4, 0};

/* The types of 256-value superblocks and of 32-value blocks, each checked and counted alike. */
static const KType *const k_types256[] = {&Q4_K, &Q6_K, &Q5_K, &Q3_K, &Q2_K, &IQ4_XS};
static const KType *const k_types32[] = {&Q5_0, &Q5_1, &IQ4_NL, &MXFP4};

static void fill_k(const KType *t, int rows, int cols, int extreme)
{
    const int n = rows * cols / t->values;
    for (int i = 0; i < n * t->bytes; i++) {
        k_blocks[i] = (uint8_t)next();
    }
    for (int i = 0; i < n; i++) {
        if (extreme && i % 4 < 2) {
            memset(k_blocks + i * t->bytes, i % 4 == 0 ? 0xFF : 0x00, (size_t)t->bytes);
        }
        for (int f = 0; f < 2 && t->halves[f] >= 0; f++) {
            const KernelHalf h = extreme ? any_half() : half_scale();
            k_blocks[i * t->bytes + t->halves[f]] = (uint8_t)h;
            k_blocks[i * t->bytes + t->halves[f] + 1] = (uint8_t)(h >> 8);
        }
        if (t->e8m0 >= 0) {
            k_blocks[i * t->bytes + t->e8m0] = (uint8_t)(extreme ? next() % 255u : 118u + next() % 16u);
        }
    }
    for (int i = 0; i < cols; i++) {
        x_qs[i] = quant(extreme);
    }
    fill_act_scales(x_d, cols / KERNEL_QK, extreme);
}

static void check_matvec_k(const KType *t, int rows, int cols, int extreme)
{
    fill_k(t, rows, cols, extreme);
    t->fast(out_fast, k_blocks, x_qs, x_d, rows, cols);
    t->scalar(out_ref, k_blocks, x_qs, x_d, rows, cols);
    if (memcmp(out_fast, out_ref, rows * sizeof(float)) != 0) {
        printf("matvec_%s %dx%d (extremes %d) differs from the scalar kernel\n", t->name, rows, cols, extreme);
        mismatches++;
    }
}

static void check_dot(int n)
{
    for (int i = 0; i < n; i++) {
        xf[i] = value();
        yf[i] = value();
    }
    float acc = xf[0] * yf[0];
    for (int i = 1; i < n; i++) {
        acc = acc + xf[i] * yf[i];
    }
    float got = op_dot(xf, yf, n);
    if (memcmp(&got, &acc, sizeof acc) != 0) {
        printf("op_dot %d differs from the sequential sum\n", n);
        mismatches++;
    }
}

static uint32_t instret(void)
{
    uint32_t n;
    __asm__ volatile("rdinstret %0" : "=r"(n));
    return n;
}

static void count_matvec(int rows, int cols)
{
    fill(rows, cols, 0, 1);
    uint32_t a = instret();
    kernel_matvec_q8_0(out_fast, w_qs, w_d, x_qs, x_d, rows, cols);
    uint32_t b = instret();
    printf("instructions matvec_q8_0 %dx%d: %lu (%.3f per multiply-accumulate)\n", rows, cols,
           (unsigned long)(b - a), (double)(b - a) / ((double)rows * cols));
}

/* The 4-bit products read in place: q4_1 (rv32/matvec.c) and q4_0 (no rv32 kernel: the scalar one, which a
 * board with room for expanded weights avoids by reading the int8 copy with the q8_0 kernel). */
static void count_matvec_4bit(int rows, int cols)
{
    fill_q4_1(rows, cols, 0, 1);
    const uint8_t *w = (const uint8_t *)w_qs;
    uint32_t a = instret();
    kernel_matvec_q4_1(out_fast, w, w_d, w_m, x_qs, x_d, rows, cols);
    uint32_t b = instret();
    kernel_matvec_q4_0(out_fast, w, w_d, x_qs, x_d, rows, cols);
    uint32_t c = instret();
    printf("instructions matvec_q4_1 %dx%d: %lu (%.3f per multiply-accumulate)\n", rows, cols,
           (unsigned long)(b - a), (double)(b - a) / ((double)rows * cols));
    printf("instructions matvec_q4_0 %dx%d: %lu (%.3f per multiply-accumulate)\n", rows, cols,
           (unsigned long)(c - b), (double)(c - b) / ((double)rows * cols));
}

static void count_dot(int n)
{
    for (int i = 0; i < n; i++) {
        xf[i] = value();
        yf[i] = value();
    }
    uint32_t a = instret();
    volatile float r = op_dot(xf, yf, n);
    uint32_t b = instret();
    (void)r;
    printf("instructions op_dot %d: %lu\n", n, (unsigned long)(b - a));
}

static void count_swiglu(int n)
{
    static float up[MAX_COLS];
    for (int i = 0; i < n; i++) {
        xf[i] = value();
        up[i] = value();
    }
    uint32_t a = instret();
    kernel_swiglu(up, xf, n);
    uint32_t b = instret();
    printf("instructions swiglu %d: %lu\n", n, (unsigned long)(b - a));
}

static void count_matvec_k(const KType *t, int rows, int cols)
{
    fill_k(t, rows, cols, 0);
    uint32_t a = instret();
    t->fast(out_fast, k_blocks, x_qs, x_d, rows, cols);
    uint32_t b = instret();
    t->scalar(out_ref, k_blocks, x_qs, x_d, rows, cols);
    uint32_t c = instret();
    printf("instructions matvec_%s %dx%d: %lu (%.3f per multiply-accumulate), scalar %lu (%.3f)\n", t->name, rows,
           cols, (unsigned long)(b - a), (double)(b - a) / ((double)rows * cols), (unsigned long)(c - b),
           (double)(c - b) / ((double)rows * cols));
}

static void count_widen_f16(int n)
{
    static KernelHalf h[MAX_COLS];
    static float wide[MAX_COLS];
    for (int i = 0; i < n; i++) {
        h[i] = (KernelHalf)(next() & 0xFFFFu);
    }
    uint32_t a = instret();
    kernel_widen_f16(wide, h, n);
    uint32_t b = instret();
    printf("instructions widen_f16 %d: %lu\n", n, (unsigned long)(b - a));
}

/* Attention at the default model's shape (4 query heads on one KV head, head width 16) over a tile
 * of n positions: the binary16 tile read in place, widened then read as float32, and a float32
 * tile (an f32 cache). */
static void count_attention(int n)
{
    const int n_q = 4, hd = 16;
    for (int i = 0; i < n * hd; i++) {
        att_kv[i] = kernel_float_to_half(value());
        att_tile[i] = value();
    }
    for (int i = 0; i < n_q * hd; i++) {
        att_q[i] = value();
    }
    for (int i = 0; i < n_q * n; i++) {
        att_p[i] = (float)(next() % 1000u) * 1e-3f;
    }
    float *tile = att_tile + n * hd;
    uint32_t c0 = instret();
    kernel_attention_scores_f16(att_a, n, att_q, hd, n_q, att_kv, hd, n, hd, 0.25f, tile, n);
    uint32_t c1 = instret();
    kernel_attention_mix_f16(mix_a, hd, att_p, n, n_q, att_kv, hd, n, hd, tile, n);
    uint32_t c2 = instret();
    kernel_widen_f16(tile, att_kv, n * hd);
    kernel_attention_scores(att_a, n, att_q, hd, n_q, tile, hd, n, hd, 0.25f);
    uint32_t c3 = instret();
    kernel_widen_f16(tile, att_kv, n * hd);
    kernel_attention_mix(mix_a, hd, att_p, n, n_q, tile, hd, n, hd);
    uint32_t c4 = instret();
    kernel_attention_scores(att_a, n, att_q, hd, n_q, att_tile, hd, n, hd, 0.25f);
    uint32_t c5 = instret();
    kernel_attention_mix(mix_a, hd, att_p, n, n_q, att_tile, hd, n, hd);
    uint32_t c6 = instret();
    printf("instructions attention 4x16 %d positions: f16 in place scores %lu mix %lu, f16 widened scores %lu mix "
           "%lu, f32 scores %lu mix %lu\n",
           n, (unsigned long)(c1 - c0), (unsigned long)(c2 - c1), (unsigned long)(c3 - c2), (unsigned long)(c4 - c3),
           (unsigned long)(c5 - c4), (unsigned long)(c6 - c5));
}

static void count_quantize(int n)
{
    static int8_t q[MAX_COLS];
    static float d[MAX_COLS / KERNEL_QK];
    for (int i = 0; i < n; i++) {
        xf[i] = value();
    }
    uint32_t a = instret();
    kernel_quantize_q8_0(q, d, xf, n);
    uint32_t b = instret();
    printf("instructions quantize_q8_0 %d: %lu\n", n, (unsigned long)(b - a));
}

int main(void)
{
    static const int rows[] = {1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 15, 16, 17, 23, 24, 31, 33, 40};
    static const int cols[] = {32, 64, 96, 128, 160, 224, 256, 288, 512, 544, 576, 2048, 2304};
    for (unsigned c = 0; c < sizeof cols / sizeof cols[0]; c++) {
        for (unsigned r = 0; r < sizeof rows / sizeof rows[0]; r++) {
            check_matvec(rows[r], cols[c], 0);
            check_matvec(rows[r], cols[c], 1);
            check_matvec(rows[r], cols[c], 2);
        }
    }
    for (unsigned c = 0; c < sizeof cols / sizeof cols[0]; c++) {
        for (unsigned r = 0; r < sizeof rows / sizeof rows[0]; r++) {
            check_matvec_q4_1(rows[r], cols[c], 0);
            check_matvec_q4_1(rows[r], cols[c], 1);
            check_matvec_q4_1(rows[r], cols[c], 2);
        }
    }
    check_matmul_q4_1(3, 240, 64);
    check_matmul_q4_1(2, 37, 96);
    check_matmul_q4_1(4, 130, 128);
    check_matmul(1, 512, 64);
    check_matmul(3, 240, 64);
    check_matmul(4, 130, 128);
    check_matmul(2, 37, 96);
    check_matmul(2, 40, 576);
    for (int n = 32; n <= 288; n += 32) {
        check_quantize(n);
    }
    for (int n = 1; n <= 40; n++) {
        check_dot(n);
    }
    check_swiglu();
    check_widen_f16();
    static const int att_heads[] = {1, 2, 3, 4, 5, 8, 9};
    static const int att_dims[] = {8, 16, 24, 32, 40, 64, 12, 128, 256, 264};
    static const int att_n[] = {1, 2, 3, 4, 5, 7, 8, 9, 17, 64, 70};
    for (unsigned h = 0; h < sizeof att_heads / sizeof att_heads[0]; h++) {
        for (unsigned d = 0; d < sizeof att_dims / sizeof att_dims[0]; d++) {
            for (unsigned k = 0; k < sizeof att_n / sizeof att_n[0]; k++) {
                const int hd = att_dims[d], n = att_n[k];
                if (n * (hd + 8) * 2 > ATT_MAX_N * ATT_MAX_DIM) {
                    continue; /* the tile and its widened copy must fit att_tile */
                }
                check_attention_f16(att_heads[h], n, hd, hd, (int)(k % 2));
                check_attention_f16(att_heads[h], n, hd, hd + 8, (int)(k % 2 == 0));
            }
        }
    }
    static const int k_rows[] = {1, 2, 3, 4, 5, 6, 8, 11, 16, 33};
    for (unsigned r = 0; r < sizeof k_rows / sizeof k_rows[0]; r++) {
        for (int cols = 256; cols <= 2304; cols += 512) {
            for (int extreme = 0; extreme < 3; extreme++) {
                for (unsigned t = 0; t < sizeof k_types256 / sizeof k_types256[0]; t++) {
                    check_matvec_k(k_types256[t], k_rows[r], cols, extreme);
                }
                for (unsigned t = 0; t < sizeof k_types32 / sizeof k_types32[0]; t++) {
                    check_matvec_k(k_types32[t], k_rows[r], cols + 32, extreme); /* 9, 25, 41, 57, 73 blocks */
                }
            }
        }
        for (int cols = 32; cols <= 256; cols += 32) { /* 1 to 8 blocks: one per partial */
            for (unsigned t = 0; t < sizeof k_types32 / sizeof k_types32[0]; t++) {
                check_matvec_k(k_types32[t], k_rows[r], cols, r % 3);
            }
        }
    }
    count_matvec(64, 64);
    count_matvec(16, 64);
    count_matvec(128, 64);
    count_matvec(64, 128);
    count_matvec(512, 64);
    count_matvec(32, 288); /* the 8-row passes of wider models */
    count_matvec_4bit(64, 64);
    count_matvec_4bit(64, 128);
    count_matvec_4bit(512, 64);
    count_matvec_4bit(32, 288);
    count_dot(16);
    count_dot(64);
    count_quantize(64);
    count_quantize(128);
    count_swiglu(128);
    count_widen_f16(512);
    count_attention(64);
    count_attention(9);
    count_matvec_k(&Q4_K, 64, 256);
    count_matvec_k(&Q4_K, 32, 1024);
    count_matvec_k(&Q6_K, 64, 256);
    count_matvec_k(&Q6_K, 32, 1024);
    count_matvec_k(&Q5_0, 64, 64);
    count_matvec_k(&Q5_0, 32, 288);
    count_matvec_k(&Q5_0, 32, 1024);
    count_matvec_k(&Q5_K, 64, 256);
    count_matvec_k(&Q5_K, 32, 1024);
    count_matvec_k(&Q3_K, 64, 256);
    count_matvec_k(&Q3_K, 32, 1024);
    count_matvec_k(&Q2_K, 64, 256);
    count_matvec_k(&Q2_K, 32, 1024);
    count_matvec_k(&IQ4_XS, 64, 256);
    count_matvec_k(&IQ4_XS, 32, 1024);
    count_matvec_k(&IQ4_NL, 64, 64);
    count_matvec_k(&IQ4_NL, 32, 1024);
    count_matvec_k(&Q5_1, 64, 64);
    count_matvec_k(&Q5_1, 32, 1024);
    count_matvec_k(&MXFP4, 64, 64);
    count_matvec_k(&MXFP4, 32, 1024);
    printf("mismatches %d\n", mismatches);
    *(volatile uint32_t *)0x00100000u = mismatches == 0 ? 0x5555u : (1u << 16) | 0x3333u; /* SiFive test device */
    for (;;) {
    }
}
