#include "selftest.h"

#include <string.h>

#include "../runtime/image_loader.h"
#include "../runtime/kernels/kernels.h"
#include "bsp.h"
#include "decode.h"
#include "model_def.h"
#include "protocol.h"
#include "selftest_checks.h" /* generated: the block types this model uses */

/* The fixed input of the kernel check: SELFTEST_ROWS rows of SELFTEST_COLS values (two K-quant
 * superblocks, sixteen 32-value blocks: the reduction tree's eight partials each take two terms),
 * SELFTEST_TOKENS tokens for the batched products; f32 rows are SELFTEST_F32_COLS wide, so that
 * every row fits in SELFTEST_ROW_BYTES. Only the block types this model's matrices use are checked
 * (selftest_checks.h, generated with the golden vectors): a kernel the firmware never runs is not
 * linked in for the check's sake. A build with COLIBRI_SELFTEST_CHECK_ALL checks every type. */
#define SELFTEST_ROWS 3
#define SELFTEST_COLS 512
#define SELFTEST_F32_COLS 128
#define SELFTEST_TOKENS 2
#define SELFTEST_BLOCKS (SELFTEST_COLS / KERNEL_QK)
#define SELFTEST_ROW_BYTES SELFTEST_COLS /* the widest row: q8_0's quants, f32's 128 values */
#define SELFTEST_HEAD_DIM 64
#define SELFTEST_POSITIONS 5
#define SELFTEST_SWIGLU 256

_Static_assert(SELFTEST_COLS % KERNEL_Q4_K_VALUES == 0, "whole superblocks");
_Static_assert(SELFTEST_F32_COLS * 4 <= SELFTEST_ROW_BYTES, "an f32 row fits");
_Static_assert(KERNEL_Q6_K_BYTES * (SELFTEST_COLS / KERNEL_Q6_K_VALUES) <= SELFTEST_ROW_BYTES, "the widest kept-block row fits");
_Static_assert(SELFTEST_COLS >= SELFTEST_POSITIONS * SELFTEST_HEAD_DIM, "the keys fit in x");
_Static_assert(SELFTEST_ROWS * SELFTEST_BLOCKS >= SELFTEST_POSITIONS * 8 &&
                   SELFTEST_ROWS * SELFTEST_ROW_BYTES / 4 >= 4 * 8 + 4 * SELFTEST_POSITIONS + 2 * SELFTEST_POSITIONS * 8,
               "the binary16 keys fit in w_d, the four heads' queries, weights and two tiles in w");
_Static_assert(SELFTEST_COLS >= 2 * SELFTEST_SWIGLU && SELFTEST_SWIGLU >= SELFTEST_TOKENS * SELFTEST_ROWS,
               "SwiGLU's two inputs fit in x, a batched product's result in want");

typedef struct {
    union {
        uint8_t bytes[SELFTEST_ROWS * SELFTEST_ROW_BYTES];
        float f32[SELFTEST_ROWS * SELFTEST_ROW_BYTES / 4];
        int8_t i8[SELFTEST_ROWS * SELFTEST_ROW_BYTES];
    } w;
    KernelHalf w_d[SELFTEST_ROWS * SELFTEST_BLOCKS], w_m[SELFTEST_ROWS * SELFTEST_BLOCKS];
    float x[SELFTEST_COLS]; /* one token's values (quantized token by token into x_qs, x_d) */
    int8_t x_qs[SELFTEST_TOKENS * SELFTEST_COLS];
    float x_d[SELFTEST_TOKENS * SELFTEST_BLOCKS];
    float want[SELFTEST_SWIGLU], got[SELFTEST_SWIGLU]; /* the widest result: SwiGLU's */
    int8_t q_want[SELFTEST_COLS], q_got[SELFTEST_COLS];
} SelftestBuffers;

/* The check's buffers live in the scratch arena when it is large enough (the self-test runs between
 * requests, and a decode sets up its scratch from nothing), else in an arena of their own. */
#define SELFTEST_OWN_BYTES (sizeof(SelftestBuffers) > COLIBRI_SCRATCH_BYTES ? sizeof(SelftestBuffers) : 1)
static _Alignas(64) uint8_t selftest_own[SELFTEST_OWN_BYTES];
static SelftestBuffers *st;

/* xorshift32 from a fixed seed: the same input on every board and at every run. */
static uint32_t rng_state;

static uint32_t next_u32(void)
{
    uint32_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return rng_state = x;
}

/* A float in [-1, 1) with 24 random bits (exactly representable). */
static float next_float(void)
{
    return (float)(int32_t)(next_u32() >> 8) / 8388608.0f - 1.0f;
}

/* A binary16 scale of magnitude 2^-10 .. 2^-3 with a random mantissa and sign: finite, normal. */
static KernelHalf next_half(void)
{
    const uint32_t r = next_u32();
    return (KernelHalf)((r & 0x8000u) | ((5u + (r >> 16) % 8u) << 10) | (r & 0x3FFu));
}

static void put_half(uint8_t *p)
{
    const KernelHalf h = next_half();
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static void fill_input(void)
{
    rng_state = 0x2545F491u;
    for (int t = 0; t < SELFTEST_TOKENS; t++) {
        for (int i = 0; i < SELFTEST_COLS; i++) {
            st->x[i] = next_float();
        }
        kernel_scalar_quantize_q8_0(st->x_qs + t * SELFTEST_COLS, st->x_d + t * SELFTEST_BLOCKS, st->x, SELFTEST_COLS);
    }
}

static void fill_bytes(void)
{
    for (int i = 0; i < SELFTEST_ROWS * SELFTEST_ROW_BYTES; i++) {
        st->w.bytes[i] = (uint8_t)(next_u32() >> 24);
    }
    for (int i = 0; i < SELFTEST_ROWS * SELFTEST_BLOCKS; i++) {
        st->w_d[i] = next_half();
        st->w_m[i] = next_half();
    }
}

/* A kept GGUF type's rows of random bytes, with every binary16 field (at `half_at`, `n_halves` of
 * them, per block of `block_bytes`) a finite scale and MXFP4's exponent byte (`e8m0`) in range. */
static void fill_blocks(int block_bytes, int values, int half_at, int n_halves, int e8m0)
{
    fill_bytes();
    const int blocks = SELFTEST_ROWS * (SELFTEST_COLS / values);
    for (int b = 0; b < blocks; b++) {
        uint8_t *blk = st->w.bytes + b * block_bytes;
        for (int h = 0; h < n_halves; h++) {
            put_half(blk + half_at + 2 * h);
        }
        if (e8m0) {
            blk[0] = (uint8_t)(118 + next_u32() % 8);
        }
    }
}

/* The first kernel whose result differed from the scalar one, for the frame. */
static const char *kernel_failed;
static int kernels_checked;

static void expect_same(const char *name, const void *want, const void *got, int bytes)
{
    kernels_checked++;
    if (kernel_failed == NULL && memcmp(want, got, (size_t)bytes) != 0) {
        kernel_failed = name;
    }
}

typedef void (*BlockMatvec)(float *, const uint8_t *, const int8_t *, const float *, int, int);
typedef void (*BlockMatmul)(float *, int, const uint8_t *, const int8_t *, const float *, int, int, int);

typedef struct {
    const char *matvec_name, *matmul_name;
    BlockMatvec scalar, matvec;
    BlockMatmul matmul;
    int block_bytes, values, half_at, n_halves, e8m0;
} BlockType;

static const BlockType block_types[] = {
#if COLIBRI_SELFTEST_CHECKS_Q5_0 || defined(COLIBRI_SELFTEST_CHECK_ALL)
    {"matvec_q5_0", "matmul_q5_0", kernel_scalar_matvec_q5_0, kernel_matvec_q5_0, kernel_matmul_q5_0, KERNEL_Q5_0_BYTES, KERNEL_Q5_0_VALUES, 0, 1, 0},
#endif
#if COLIBRI_SELFTEST_CHECKS_Q5_1 || defined(COLIBRI_SELFTEST_CHECK_ALL)
    {"matvec_q5_1", "matmul_q5_1", kernel_scalar_matvec_q5_1, kernel_matvec_q5_1, kernel_matmul_q5_1, KERNEL_Q5_1_BYTES, KERNEL_Q5_1_VALUES, 0, 2, 0},
#endif
#if COLIBRI_SELFTEST_CHECKS_Q4_K || defined(COLIBRI_SELFTEST_CHECK_ALL)
    {"matvec_q4_k", "matmul_q4_k", kernel_scalar_matvec_q4_k, kernel_matvec_q4_k, kernel_matmul_q4_k, KERNEL_Q4_K_BYTES, KERNEL_Q4_K_VALUES, 0, 2, 0},
#endif
#if COLIBRI_SELFTEST_CHECKS_Q5_K || defined(COLIBRI_SELFTEST_CHECK_ALL)
    {"matvec_q5_k", "matmul_q5_k", kernel_scalar_matvec_q5_k, kernel_matvec_q5_k, kernel_matmul_q5_k, KERNEL_Q5_K_BYTES, KERNEL_Q5_K_VALUES, 0, 2, 0},
#endif
#if COLIBRI_SELFTEST_CHECKS_Q6_K || defined(COLIBRI_SELFTEST_CHECK_ALL)
    {"matvec_q6_k", "matmul_q6_k", kernel_scalar_matvec_q6_k, kernel_matvec_q6_k, kernel_matmul_q6_k, KERNEL_Q6_K_BYTES, KERNEL_Q6_K_VALUES, 208, 1, 0},
#endif
#if COLIBRI_SELFTEST_CHECKS_Q3_K || defined(COLIBRI_SELFTEST_CHECK_ALL)
    {"matvec_q3_k", "matmul_q3_k", kernel_scalar_matvec_q3_k, kernel_matvec_q3_k, kernel_matmul_q3_k, KERNEL_Q3_K_BYTES, KERNEL_Q3_K_VALUES, 108, 1, 0},
#endif
#if COLIBRI_SELFTEST_CHECKS_Q2_K || defined(COLIBRI_SELFTEST_CHECK_ALL)
    {"matvec_q2_k", "matmul_q2_k", kernel_scalar_matvec_q2_k, kernel_matvec_q2_k, kernel_matmul_q2_k, KERNEL_Q2_K_BYTES, KERNEL_Q2_K_VALUES, 80, 2, 0},
#endif
#if COLIBRI_SELFTEST_CHECKS_IQ4_NL || defined(COLIBRI_SELFTEST_CHECK_ALL)
    {"matvec_iq4_nl", "matmul_iq4_nl", kernel_scalar_matvec_iq4_nl, kernel_matvec_iq4_nl, kernel_matmul_iq4_nl, KERNEL_IQ4_NL_BYTES, KERNEL_IQ4_NL_VALUES, 0, 1, 0},
#endif
#if COLIBRI_SELFTEST_CHECKS_IQ4_XS || defined(COLIBRI_SELFTEST_CHECK_ALL)
    {"matvec_iq4_xs", "matmul_iq4_xs", kernel_scalar_matvec_iq4_xs, kernel_matvec_iq4_xs, kernel_matmul_iq4_xs, KERNEL_IQ4_XS_BYTES, KERNEL_IQ4_XS_VALUES, 0, 1, 0},
#endif
#if COLIBRI_SELFTEST_CHECKS_MXFP4 || defined(COLIBRI_SELFTEST_CHECK_ALL)
    {"matvec_mxfp4", "matmul_mxfp4", kernel_scalar_matvec_mxfp4, kernel_matvec_mxfp4, kernel_matmul_mxfp4, KERNEL_MXFP4_BYTES, KERNEL_MXFP4_VALUES, 0, 0, 1},
#endif
    {NULL, NULL, NULL, NULL, NULL, 0, 0, 0, 0, 0}, /* the end (and never empty) */
};

/* The scalar product of every token, row by row: what a batched product must give. */
#define WANT_PER_TOKEN(call)                                                                        \
    for (int t = 0; t < SELFTEST_TOKENS; t++) {                                                     \
        const int8_t *xq = st->x_qs + t * SELFTEST_COLS;                                             \
        const float *xd = st->x_d + t * SELFTEST_BLOCKS;                                             \
        float *o = st->want + t * SELFTEST_ROWS;                                                     \
        (void)xq;                                                                                   \
        (void)xd;                                                                                   \
        call;                                                                                       \
    }

static void check_block_type(const BlockType *k)
{
    const int out_bytes = SELFTEST_ROWS * (int)sizeof(float);
    fill_blocks(k->block_bytes, k->values, k->half_at, k->n_halves, k->e8m0);
    WANT_PER_TOKEN(k->scalar(o, st->w.bytes, xq, xd, SELFTEST_ROWS, SELFTEST_COLS));
    k->matvec(st->got, st->w.bytes, st->x_qs, st->x_d, SELFTEST_ROWS, SELFTEST_COLS);
    expect_same(k->matvec_name, st->want, st->got, out_bytes);
    k->matmul(st->got, SELFTEST_ROWS, st->w.bytes, st->x_qs, st->x_d, SELFTEST_TOKENS, SELFTEST_ROWS, SELFTEST_COLS);
    expect_same(k->matmul_name, st->want, st->got, SELFTEST_TOKENS * out_bytes);
}

static void check_kernels(void)
{
    const int rows = SELFTEST_ROWS, cols = SELFTEST_COLS, n_tok = SELFTEST_TOKENS;
    const int out_bytes = rows * (int)sizeof(float);
    kernel_failed = NULL;
    kernels_checked = 0;
    st = sizeof(SelftestBuffers) <= COLIBRI_SCRATCH_BYTES ? (SelftestBuffers *)(void *)colibri_scratch
                                                          : (SelftestBuffers *)(void *)selftest_own;
    fill_input();

    const int f32_cols = SELFTEST_F32_COLS;
    fill_bytes();
    for (int i = 0; i < rows * f32_cols; i++) {
        st->w.f32[i] = next_float();
    }
    WANT_PER_TOKEN(kernel_scalar_matvec_f32(o, st->w.f32, st->x + t * f32_cols, rows, f32_cols));
    kernel_matvec_f32(st->got, st->w.f32, st->x, rows, f32_cols);
    expect_same("matvec_f32", st->want, st->got, out_bytes);
    kernel_matmul_f32(st->got, rows, st->w.f32, st->x, n_tok, rows, f32_cols);
    expect_same("matmul_f32", st->want, st->got, n_tok * out_bytes);

    fill_bytes();
    WANT_PER_TOKEN(kernel_scalar_matvec_q8_0(o, st->w.i8, st->w_d, xq, xd, rows, cols));
    kernel_matvec_q8_0(st->got, st->w.i8, st->w_d, st->x_qs, st->x_d, rows, cols);
    expect_same("matvec_q8_0", st->want, st->got, out_bytes);
    kernel_matmul_q8_0(st->got, rows, st->w.i8, st->w_d, st->x_qs, st->x_d, n_tok, rows, cols);
    expect_same("matmul_q8_0", st->want, st->got, n_tok * out_bytes);

#if COLIBRI_SELFTEST_CHECKS_Q4_0 || defined(COLIBRI_SELFTEST_CHECK_ALL)
    WANT_PER_TOKEN(kernel_scalar_matvec_q4_0(o, st->w.bytes, st->w_d, xq, xd, rows, cols));
    kernel_matvec_q4_0(st->got, st->w.bytes, st->w_d, st->x_qs, st->x_d, rows, cols);
    expect_same("matvec_q4_0", st->want, st->got, out_bytes);
    kernel_matmul_q4_0(st->got, rows, st->w.bytes, st->w_d, st->x_qs, st->x_d, n_tok, rows, cols);
    expect_same("matmul_q4_0", st->want, st->got, n_tok * out_bytes);
#endif
#if COLIBRI_SELFTEST_CHECKS_Q4_1 || defined(COLIBRI_SELFTEST_CHECK_ALL)
    WANT_PER_TOKEN(kernel_scalar_matvec_q4_1(o, st->w.bytes, st->w_d, st->w_m, xq, xd, rows, cols));
    kernel_matvec_q4_1(st->got, st->w.bytes, st->w_d, st->w_m, st->x_qs, st->x_d, rows, cols);
    expect_same("matvec_q4_1", st->want, st->got, out_bytes);
    kernel_matmul_q4_1(st->got, rows, st->w.bytes, st->w_d, st->w_m, st->x_qs, st->x_d, n_tok, rows, cols);
    expect_same("matmul_q4_1", st->want, st->got, n_tok * out_bytes);
#endif

    for (const BlockType *k = block_types; k->matvec != NULL; k++) {
        check_block_type(k);
    }

    float d_want[SELFTEST_BLOCKS], d_got[SELFTEST_BLOCKS];
    kernel_scalar_quantize_q8_0(st->q_want, d_want, st->x, cols);
    kernel_quantize_q8_0(st->q_got, d_got, st->x, cols);
    expect_same("quantize_q8_0", st->q_want, st->q_got, cols);
    expect_same("quantize_q8_0", d_want, d_got, (int)sizeof d_want);

    const int n_swiglu = SELFTEST_SWIGLU;
    memcpy(st->want, st->x + n_swiglu, (size_t)n_swiglu * sizeof(float));
    memcpy(st->got, st->x + n_swiglu, (size_t)n_swiglu * sizeof(float));
    kernel_scalar_swiglu(st->want, st->x, n_swiglu);
    kernel_swiglu(st->got, st->x, n_swiglu);
    expect_same("swiglu", st->want, st->got, n_swiglu * (int)sizeof(float));
#if COLIBRI_FFN_GELU_TANH || defined(COLIBRI_SELFTEST_CHECK_ALL)
    /* Gemma's GeGLU: only where the model runs it (or every check is asked for), so it is not linked
     * into other firmware for the check's sake. */
    memcpy(st->want, st->x + n_swiglu, (size_t)n_swiglu * sizeof(float));
    memcpy(st->got, st->x + n_swiglu, (size_t)n_swiglu * sizeof(float));
    kernel_scalar_gelu_tanh_mul(st->want, st->x, n_swiglu);
    kernel_gelu_tanh_mul(st->got, st->x, n_swiglu);
    expect_same("gelu_tanh_mul", st->want, st->got, n_swiglu * (int)sizeof(float));
#endif

    /* Attention over a tile of SELFTEST_POSITIONS positions of one KV head for two query heads
     * that share it (the grouped-query path), as the runtime calls it (kernels.h). */
    const int n_q = 2, n = SELFTEST_POSITIONS, hd = SELFTEST_HEAD_DIM;
    for (int i = 0; i < n_q * hd; i++) {
        st->w.f32[i] = next_float();
    }
    const float *q = st->w.f32, *keys = st->x;
    kernel_scalar_attention_scores(st->want, n, q, hd, n_q, keys, hd, n, hd, 0.125f);
    kernel_attention_scores(st->got, n, q, hd, n_q, keys, hd, n, hd, 0.125f);
    expect_same("attention_scores", st->want, st->got, n_q * n * (int)sizeof(float));
    float mix_want[2 * SELFTEST_HEAD_DIM], mix_got[2 * SELFTEST_HEAD_DIM];
    for (int i = 0; i < n_q * hd; i++) {
        mix_want[i] = mix_got[i] = -0.0f;
    }
    const float *p = st->w.f32 + n_q * hd; /* weights of the positions: the next values of the input */
    for (int i = 0; i < n_q * n; i++) {
        st->w.f32[n_q * hd + i] = next_float();
    }
    kernel_scalar_attention_mix(mix_want, hd, p, n, n_q, keys, hd, n, hd);
    kernel_attention_mix(mix_got, hd, p, n, n_q, keys, hd, n, hd);
    expect_same("attention_mix", mix_want, mix_got, (int)sizeof mix_want);

    /* The same over a binary16 tile read where it lies (a decode step's path), four query heads on
     * the KV head, head width 8, against the tile widened by the scalar kernel. */
    const int g4 = 4, hd8 = 8;
    KernelHalf *halves = st->w_d;
    kernel_round_f16(halves, st->x, n * hd8);
    float *q4 = st->w.f32, *p4 = q4 + g4 * hd8, *wide = p4 + g4 * n, *tile = wide + n * hd8;
    for (int i = 0; i < g4 * (hd8 + n); i++) {
        q4[i] = next_float(); /* the queries, then the weights */
    }
    kernel_scalar_widen_f16(wide, halves, n * hd8);
    kernel_scalar_attention_scores(st->want, n, q4, hd8, g4, wide, hd8, n, hd8, 0.125f);
    kernel_attention_scores_f16(st->got, n, q4, hd8, g4, halves, hd8, n, hd8, 0.125f, tile, n);
    expect_same("attention_scores_f16", st->want, st->got, g4 * n * (int)sizeof(float));
    for (int i = 0; i < g4 * hd8; i++) {
        st->want[i] = st->got[i] = -0.0f;
    }
    kernel_scalar_attention_mix(st->want, hd8, p4, n, g4, wide, hd8, n, hd8);
    kernel_attention_mix_f16(st->got, hd8, p4, n, g4, halves, hd8, n, hd8, tile, n);
    expect_same("attention_mix_f16", st->want, st->got, g4 * hd8 * (int)sizeof(float));
}

/* The golden decode: the first step whose token or logits differ (-1: none). */
static int32_t tokens[COLIBRI_SELFTEST_STEPS];
static uint8_t digests[COLIBRI_SELFTEST_STEPS][32];

static int first_divergence(int steps)
{
    for (int s = 0; s < steps; s++) {
        if (tokens[s] != colibri_selftest_tokens[s] || memcmp(digests[s], colibri_selftest_digests[s], 32) != 0) {
            return s;
        }
    }
    return -1;
}

int colibri_selftest(int load_status, const char *load_message, int answering)
{
    uint64_t i0 = 0, i1 = 0;
    const int counted = bsp_instructions(&i0);
    const uint64_t t0 = bsp_time_us();
    check_kernels();
    int steps = 0, divergent = -1, decode_status = load_status;
    if (load_status == 0) {
        decode_status = colibri_decode_quietly(colibri_selftest_prompt, COLIBRI_SELFTEST_PROMPT_TOKENS,
                                               COLIBRI_SELFTEST_STEPS, tokens, digests, &steps);
#ifdef COLIBRI_TEST_SELFTEST_DAMAGE_STEP
        /* Test builds only: one bit of one step's logits digest flipped, as a wrong forward pass would. */
        digests[COLIBRI_TEST_SELFTEST_DAMAGE_STEP][0] ^= 1;
#endif
        divergent = decode_status == 0 ? first_divergence(steps) : -1;
    }
    const uint64_t us = bsp_time_us() - t0;
    if (counted) {
        bsp_instructions(&i1);
    }
    const int passed = kernel_failed == NULL && decode_status == 0 && divergent < 0;

    proto_begin("selftest");
    proto_str("result", passed ? "pass" : "fail");
    proto_str("kernels", kernel_set());
    proto_u64("kernels_checked", (uint64_t)kernels_checked);
    if (kernel_failed != NULL) {
        proto_str("kernel_failed", kernel_failed); /* the first entry point that differed from the scalar one */
    }
    proto_u64("steps", (uint64_t)steps);
    if (load_status != 0) {
        proto_u64("image_error", (uint64_t)load_status);
        proto_str("image", load_message != NULL ? load_message : colibri_status_message(load_status));
    } else if (decode_status != 0) {
        proto_u64("decode_error", (uint64_t)decode_status);
    } else if (divergent >= 0) {
        proto_u64("step", (uint64_t)divergent); /* the first step that differed from the golden one */
        proto_u64("token", (uint64_t)tokens[divergent]);
        proto_u64("expected", (uint64_t)colibri_selftest_tokens[divergent]);
        proto_str("logits", memcmp(digests[divergent], colibri_selftest_digests[divergent], 32) == 0 ? "same" : "differ");
    }
    proto_u64("us", us);
    if (counted) {
        proto_u64("instret", i1 - i0);
    }
    proto_end();

    if (answering) {
        proto_begin("done");
        proto_u64("tokens", 0);
        proto_str("reason", "selftest");
        proto_u64("held", 0);
        proto_end();
    }
    return passed ? 0 : COLIBRI_ERR_SELFTEST;
}
