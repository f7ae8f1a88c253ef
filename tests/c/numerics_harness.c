/* Test harness: runs one runtime operation on binary input from stdin, writes the result to
 * stdout, so tests can compare the C runtime with generator/numerics/ops.py bit for bit.
 *
 *   harness expf N | silu N | swiglu N | gelu_mul N | tanh N | gelu N | softmax N | kernel_softmax N | rmsnorm N EPS
 *           rmsnorm_unscaled N EPS | quantize N
 *           swiglu_clamped N ALPHA LIMIT (gate, then up) | softmax_sink N SINK
 *           kernel_softmax_rows N ROWS STRIDE (ROWS rows of N values, STRIDE floats apart)
 *           matvec_f32 ROWS COLS | matvec_q8_0 ROWS COLS | matvec_q4_0 ROWS COLS | matvec_q4_1 ROWS COLS
 *           matmul_f32 TOKENS ROWS COLS | matmul_q8_0 | matmul_q4_0 | matmul_q4_1 TOKENS ROWS COLS
 *           (output: token-major; weight scales and q4_1 minimums are binary16; q4_1 weights:
 *           packed quants, scales, then minimums)
 *           blocks_matvec TYPE ROWS COLS | blocks_scalar_matvec TYPE ROWS COLS | blocks_matmul TYPE TOKENS ROWS COLS
 *           (a kept GGUF type, e.g. q4_k: the rows' blocks, then the q8_0 quants and float32 scales)
 *           blocks_values TYPE BLOCKS32 (the values of BLOCKS32 32-value blocks: kernel_<type>_unpack,
 *           kernel_unpacked_value)
 *           rng SEED COUNT | sample N COUNT TEMPERATURE TOP_K TOP_P MIN_P SEED
 *           attention N N_Q STRIDE HEAD_DIM SCALE  (N key and value rows of STRIDE floats, N_Q queries, their
 *           weights, the sums the mix continues; output: the N_Q x N scores, then the N_Q x HEAD_DIM sums)
 *           attention_tokens N N_Q STRIDE HEAD_DIM SCALE TOKENS  (N key rows of STRIDE floats; per token
 *           its first position and count as int32 pairs, then its N_Q queries of HEAD_DIM; output: per
 *           token N_Q rows of N scores, -7 where the token sees no position)
 *           kv_f16 N | kv_q8_0 N  (N floats as the KV cache stores them, and read back)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "ops.h"
#include "sampler.h"

static void *read_exact(size_t bytes)
{
    void *buf = malloc(bytes ? bytes : 1);
    if (buf == NULL || fread(buf, 1, bytes, stdin) != bytes) {
        fprintf(stderr, "short input\n");
        exit(3);
    }
    return buf;
}

static void write_all(const void *data, size_t bytes)
{
    fwrite(data, 1, bytes, stdout);
}

/* A batched product's output: `tokens` rows of `rows` floats written with a stride of rows + 3,
 * to check that the kernel honours out_stride; the gaps hold a value it must leave untouched. */
#define GAP_VALUE -7.0f

static float *strided_output(int tokens, int stride)
{
    float *out = malloc((size_t)tokens * stride * sizeof(float));
    for (int i = 0; i < tokens * stride; i++) {
        out[i] = GAP_VALUE;
    }
    return out;
}

/* Each token's rows to stdout; 4 (and nothing written after it) when a gap was written. */
static int write_strided(const float *out, int tokens, int rows, int stride)
{
    for (int k = 0; k < tokens; k++) {
        for (int i = rows; i < stride; i++) {
            if (out[k * stride + i] != GAP_VALUE) {
                fprintf(stderr, "matmul wrote outside its rows\n");
                return 4;
            }
        }
        write_all(out + (size_t)k * stride, rows * sizeof(float));
    }
    return 0;
}

/* The kept GGUF block types by name: their entry points, block size and term shape. */
typedef struct {
    const char *name;
    KernelBlocksMatvec matvec, scalar_matvec;
    void (*matmul)(float *, int, const uint8_t *, const int8_t *, const float *, int, int, int);
    void (*unpack)(const uint8_t *, int, KernelUnpacked *);
    int values, bytes, affine;
} BlockType;

static const BlockType block_types[] = {
    {"q5_0", kernel_matvec_q5_0, kernel_scalar_matvec_q5_0, kernel_matmul_q5_0, kernel_q5_0_unpack, KERNEL_Q5_0_VALUES, KERNEL_Q5_0_BYTES, 0},
    {"q5_1", kernel_matvec_q5_1, kernel_scalar_matvec_q5_1, kernel_matmul_q5_1, kernel_q5_1_unpack, KERNEL_Q5_1_VALUES, KERNEL_Q5_1_BYTES, 1},
    {"q4_k", kernel_matvec_q4_k, kernel_scalar_matvec_q4_k, kernel_matmul_q4_k, kernel_q4_k_unpack, KERNEL_Q4_K_VALUES, KERNEL_Q4_K_BYTES, 1},
    {"q5_k", kernel_matvec_q5_k, kernel_scalar_matvec_q5_k, kernel_matmul_q5_k, kernel_q5_k_unpack, KERNEL_Q5_K_VALUES, KERNEL_Q5_K_BYTES, 1},
    {"q6_k", kernel_matvec_q6_k, kernel_scalar_matvec_q6_k, kernel_matmul_q6_k, kernel_q6_k_unpack, KERNEL_Q6_K_VALUES, KERNEL_Q6_K_BYTES, 0},
    {"q3_k", kernel_matvec_q3_k, kernel_scalar_matvec_q3_k, kernel_matmul_q3_k, kernel_q3_k_unpack, KERNEL_Q3_K_VALUES, KERNEL_Q3_K_BYTES, 0},
    {"q2_k", kernel_matvec_q2_k, kernel_scalar_matvec_q2_k, kernel_matmul_q2_k, kernel_q2_k_unpack, KERNEL_Q2_K_VALUES, KERNEL_Q2_K_BYTES, 1},
    {"iq4_nl", kernel_matvec_iq4_nl, kernel_scalar_matvec_iq4_nl, kernel_matmul_iq4_nl, kernel_iq4_nl_unpack, KERNEL_IQ4_NL_VALUES, KERNEL_IQ4_NL_BYTES, 0},
    {"iq4_xs", kernel_matvec_iq4_xs, kernel_scalar_matvec_iq4_xs, kernel_matmul_iq4_xs, kernel_iq4_xs_unpack, KERNEL_IQ4_XS_VALUES, KERNEL_IQ4_XS_BYTES, 0},
    {"mxfp4", kernel_matvec_mxfp4, kernel_scalar_matvec_mxfp4, kernel_matmul_mxfp4, kernel_mxfp4_unpack, KERNEL_MXFP4_VALUES, KERNEL_MXFP4_BYTES, 0},
};

static const BlockType *block_type(const char *name)
{
    for (size_t i = 0; i < sizeof block_types / sizeof block_types[0]; i++) {
        if (strcmp(block_types[i].name, name) == 0) {
            return &block_types[i];
        }
    }
    fprintf(stderr, "unknown block type %s\n", name);
    exit(2);
}

/* blocks_matvec, blocks_scalar_matvec, blocks_matmul, blocks_values: argv[2] is the type. */
static int run_blocks(const char *op, char **argv)
{
    const BlockType *t = block_type(argv[2]);
    if (strcmp(op, "blocks_values") == 0) {
        const int n = atoi(argv[3]); /* 32-value blocks, whole superblocks */
        const uint8_t *w = read_exact((size_t)n * KERNEL_QK / t->values * t->bytes);
        float *out = malloc((size_t)n * KERNEL_QK * sizeof(float));
        for (int b = 0; b < n; b++) {
            KernelUnpacked u;
            t->unpack(w, b, &u);
            for (int l = 0; l < KERNEL_QK; l++) {
                out[b * KERNEL_QK + l] = kernel_unpacked_value(&u, l, t->affine);
            }
        }
        write_all(out, (size_t)n * KERNEL_QK * sizeof(float));
        return 0;
    }
    const int batched = strcmp(op, "blocks_matmul") == 0;
    const int tokens = batched ? atoi(argv[3]) : 1;
    const int rows = atoi(argv[batched ? 4 : 3]);
    const int cols = atoi(argv[batched ? 5 : 4]);
    const uint8_t *w = read_exact((size_t)rows * (cols / t->values) * t->bytes);
    const int8_t *xq = read_exact((size_t)tokens * cols);
    const float *xd = read_exact((size_t)tokens * (cols / KERNEL_QK) * sizeof(float));
    const int stride = rows + 3; /* gaps the matmul must leave untouched */
    float *out = strided_output(tokens, stride);
    if (batched) {
        t->matmul(out, stride, w, xq, xd, tokens, rows, cols);
    } else if (strcmp(op, "blocks_scalar_matvec") == 0) {
        t->scalar_matvec(out, w, xq, xd, rows, cols);
    } else {
        t->matvec(out, w, xq, xd, rows, cols);
    }
    return write_strided(out, tokens, rows, stride);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: harness OP ARGS...\n");
        return 2;
    }
    const char *op = argv[1];
    if (strncmp(op, "blocks_", 7) == 0) {
        return run_blocks(op, argv);
    }
    int n = atoi(argv[2]);
    if (strcmp(op, "expf") == 0 || strcmp(op, "silu") == 0 || strcmp(op, "tanh") == 0 || strcmp(op, "gelu") == 0) {
        float *x = read_exact(n * sizeof(float));
        for (int i = 0; i < n; i++) {
            switch (op[0]) {
            case 'e': x[i] = op_expf(x[i]); break;
            case 's': x[i] = op_silu(x[i]); break;
            case 't': x[i] = op_tanh(x[i]); break;
            default: x[i] = op_gelu_tanh(x[i]); break;
            }
        }
        write_all(x, n * sizeof(float));
    } else if (strcmp(op, "log") == 0 || strcmp(op, "softplus") == 0) {
        float *x = read_exact(n * sizeof(float));
        for (int i = 0; i < n; i++) {
            x[i] = op[0] == 'l' ? op_log(x[i]) : op_softplus(x[i]);
        }
        write_all(x, n * sizeof(float));
    } else if (strcmp(op, "l2norm") == 0) {
        float *x = read_exact(n * sizeof(float));
        op_l2norm(x, n);
        write_all(x, n * sizeof(float));
    } else if (strcmp(op, "conv_step") == 0) { /* n channels, argv[3] taps: state, taps, x -> x, state */
        int kernel = atoi(argv[3]);
        float *state = read_exact((size_t)(kernel - 1) * n * sizeof(float));
        float *taps = read_exact((size_t)n * kernel * sizeof(float));
        float *x = read_exact(n * sizeof(float));
        op_conv_step(x, state, taps, n, kernel);
        write_all(x, n * sizeof(float));
        write_all(state, (size_t)(kernel - 1) * n * sizeof(float));
    } else if (strcmp(op, "delta_step") == 0) { /* key dim n, value dim argv[3]: S, q, k, v, decay, beta -> out, S */
        int value_dim = atoi(argv[3]);
        float *state = read_exact((size_t)n * value_dim * sizeof(float));
        float *q = read_exact(n * sizeof(float));
        float *k = read_exact(n * sizeof(float));
        float *v = read_exact(value_dim * sizeof(float));
        float *gates = read_exact(2 * sizeof(float));
        float *out = malloc(value_dim * sizeof(float));
        float *memory = malloc(value_dim * sizeof(float));
        kernel_delta_rule_step(out, state, q, k, v, gates[0], gates[1], memory, n, value_dim);
        write_all(out, value_dim * sizeof(float));
        write_all(state, (size_t)n * value_dim * sizeof(float));
    } else if (strcmp(op, "gated_rmsnorm") == 0) {
        float eps = strtof(argv[3], NULL);
        float *x = read_exact(n * sizeof(float));
        float *w = read_exact(n * sizeof(float));
        float *z = read_exact(n * sizeof(float));
        op_gated_rmsnorm(x, w, z, n, eps);
        write_all(x, n * sizeof(float));
    } else if (strcmp(op, "swiglu") == 0) {
        float *gate = read_exact(n * sizeof(float));
        float *up = read_exact(n * sizeof(float));
        kernel_swiglu(up, gate, n);
        write_all(up, n * sizeof(float));
    } else if (strcmp(op, "gelu_mul") == 0) {
        float *gate = read_exact(n * sizeof(float));
        float *up = read_exact(n * sizeof(float));
        kernel_gelu_tanh_mul(up, gate, n);
        write_all(up, n * sizeof(float));
    } else if (strcmp(op, "swiglu_clamped") == 0) {
        const float alpha = strtof(argv[3], NULL), limit = strtof(argv[4], NULL);
        float *gate = read_exact(n * sizeof(float));
        float *up = read_exact(n * sizeof(float));
        for (int i = 0; i < n; i++) {
            up[i] = op_swiglu_clamped(gate[i], up[i], alpha, limit);
        }
        write_all(up, n * sizeof(float));
    } else if (strcmp(op, "softmax_sink") == 0) {
        const float sink = strtof(argv[3], NULL);
        float *x = read_exact(n * sizeof(float));
        op_softmax_with_sink(x, n, sink);
        write_all(x, n * sizeof(float));
    } else if (strcmp(op, "softmax") == 0) {
        float *x = read_exact(n * sizeof(float));
        op_softmax(x, n);
        write_all(x, n * sizeof(float));
    } else if (strcmp(op, "kernel_softmax") == 0) { /* the kernel set's softmax (attention's) */
        float *x = read_exact(n * sizeof(float));
        kernel_softmax(x, n);
        write_all(x, n * sizeof(float));
    } else if (strcmp(op, "kernel_softmax_rows") == 0) { /* a KV head's query heads together */
        int rows = atoi(argv[3]), stride = atoi(argv[4]);
        float *x = read_exact((size_t)rows * stride * sizeof(float));
        kernel_softmax_rows(x, stride, rows, n);
        write_all(x, (size_t)rows * stride * sizeof(float));
    } else if (strcmp(op, "rmsnorm") == 0) {
        float eps = strtof(argv[3], NULL);
        float *x = read_exact(n * sizeof(float));
        float *w = read_exact(n * sizeof(float));
        op_rmsnorm(x, x, w, n, eps);
        write_all(x, n * sizeof(float));
    } else if (strcmp(op, "rmsnorm_unscaled") == 0) {
        float eps = strtof(argv[3], NULL);
        float *x = read_exact(n * sizeof(float));
        op_rmsnorm_unscaled(x, x, n, eps);
        write_all(x, n * sizeof(float));
    } else if (strcmp(op, "quantize") == 0) {
        float *x = read_exact(n * sizeof(float));
        int8_t *qs = malloc(n);
        float *d = malloc(n / KERNEL_QK * sizeof(float));
        kernel_quantize_q8_0(qs, d, x, n);
        write_all(qs, n);
        write_all(d, n / KERNEL_QK * sizeof(float));
    } else if (strcmp(op, "matvec_f32") == 0) {
        int cols = atoi(argv[3]);
        float *w = read_exact((size_t)n * cols * sizeof(float));
        float *x = read_exact(cols * sizeof(float));
        float *out = malloc(n * sizeof(float));
        kernel_matvec_f32(out, w, x, n, cols);
        write_all(out, n * sizeof(float));
    } else if (strcmp(op, "matvec_q8_0") == 0 || strcmp(op, "matvec_q4_0") == 0) {
        /* weights of int8 quants, or for q4_0 of two quants a byte */
        const int q4_0 = strcmp(op, "matvec_q4_0") == 0;
        int cols = atoi(argv[3]);
        int nb = cols / KERNEL_QK;
        void *wq = read_exact((size_t)n * cols / (q4_0 ? 2 : 1));
        KernelHalf *wd = read_exact((size_t)n * nb * sizeof(KernelHalf));
        int8_t *xq = read_exact(cols);
        float *xd = read_exact(nb * sizeof(float));
        float *out = malloc(n * sizeof(float));
        if (q4_0) {
            kernel_matvec_q4_0(out, wq, wd, xq, xd, n, cols);
        } else {
            kernel_matvec_q8_0(out, wq, wd, xq, xd, n, cols);
        }
        write_all(out, n * sizeof(float));
    } else if (strcmp(op, "matvec_q4_1") == 0 || strcmp(op, "scalar_matvec_q4_1") == 0) {
        int cols = atoi(argv[3]);
        int nb = cols / KERNEL_QK;
        uint8_t *wq = read_exact((size_t)n * cols / 2);
        KernelHalf *wd = read_exact((size_t)n * nb * sizeof(KernelHalf));
        KernelHalf *wm = read_exact((size_t)n * nb * sizeof(KernelHalf));
        int8_t *xq = read_exact(cols);
        float *xd = read_exact(nb * sizeof(float));
        float *out = malloc(n * sizeof(float));
        if (op[0] == 's') {
            kernel_scalar_matvec_q4_1(out, wq, wd, wm, xq, xd, n, cols);
        } else {
            kernel_matvec_q4_1(out, wq, wd, wm, xq, xd, n, cols);
        }
        write_all(out, n * sizeof(float));
    } else if (strncmp(op, "matmul_", 7) == 0) {
        /* n tokens, their rows strided (strided_output) */
        int rows = atoi(argv[3]), cols = atoi(argv[4]), nb = cols / KERNEL_QK, stride = rows + 3;
        float *out = strided_output(n, stride);
        if (strcmp(op, "matmul_f32") == 0) {
            float *w = read_exact((size_t)rows * cols * sizeof(float));
            float *x = read_exact((size_t)n * cols * sizeof(float));
            kernel_matmul_f32(out, stride, w, x, n, rows, cols);
        } else if (strcmp(op, "matmul_q8_0") == 0) {
            int8_t *wq = read_exact((size_t)rows * cols);
            KernelHalf *wd = read_exact((size_t)rows * nb * sizeof(KernelHalf));
            int8_t *xq = read_exact((size_t)n * cols);
            float *xd = read_exact((size_t)n * nb * sizeof(float));
            kernel_matmul_q8_0(out, stride, wq, wd, xq, xd, n, rows, cols);
        } else if (strcmp(op, "matmul_q4_1") == 0) {
            uint8_t *wq = read_exact((size_t)rows * cols / 2);
            KernelHalf *wd = read_exact((size_t)rows * nb * sizeof(KernelHalf));
            KernelHalf *wm = read_exact((size_t)rows * nb * sizeof(KernelHalf));
            int8_t *xq = read_exact((size_t)n * cols);
            float *xd = read_exact((size_t)n * nb * sizeof(float));
            kernel_matmul_q4_1(out, stride, wq, wd, wm, xq, xd, n, rows, cols);
        } else {
            uint8_t *wq = read_exact((size_t)rows * cols / 2);
            KernelHalf *wd = read_exact((size_t)rows * nb * sizeof(KernelHalf));
            int8_t *xq = read_exact((size_t)n * cols);
            float *xd = read_exact((size_t)n * nb * sizeof(float));
            kernel_matmul_q4_0(out, stride, wq, wd, xq, xd, n, rows, cols);
        }
        int written = write_strided(out, n, rows, stride);
        if (written != 0) {
            return written;
        }
    } else if (strcmp(op, "attention") == 0 || strcmp(op, "attention_f16") == 0) {
        /* N positions' key and value rows of STRIDE floats, N_Q queries of HEAD_DIM, their N_Q rows
         * of N weights, and N_Q rows of HEAD_DIM that the mix adds onto; attention_f16: the same
         * over binary16 key and value rows, read in place, a tile of TILE_ROWS rows for a set that
         * widens them */
        const int f16 = strcmp(op, "attention_f16") == 0;
        const size_t element = f16 ? sizeof(KernelHalf) : sizeof(float);
        int n_q = atoi(argv[3]), stride = atoi(argv[4]), head_dim = atoi(argv[5]);
        float scale = strtof(argv[6], NULL);
        void *keys = read_exact((size_t)n * stride * element);
        void *values = read_exact((size_t)n * stride * element);
        float *q = read_exact((size_t)n_q * head_dim * sizeof(float));
        float *p = read_exact((size_t)n_q * n * sizeof(float));
        float *out = read_exact((size_t)n_q * head_dim * sizeof(float));
        float *att = malloc((size_t)n_q * n * sizeof(float));
        if (f16) {
            int tile_rows = atoi(argv[7]);
            float *tile = malloc((size_t)tile_rows * head_dim * sizeof(float));
            kernel_attention_scores_f16(att, n, q, head_dim, n_q, keys, stride, n, head_dim, scale, tile, tile_rows);
            kernel_attention_mix_f16(out, head_dim, p, n, n_q, values, stride, n, head_dim, tile, tile_rows);
        } else {
            kernel_attention_scores(att, n, q, head_dim, n_q, keys, stride, n, head_dim, scale);
            kernel_attention_mix(out, head_dim, p, n, n_q, values, stride, n, head_dim);
        }
        write_all(att, (size_t)n_q * n * sizeof(float));
        write_all(out, (size_t)n_q * head_dim * sizeof(float));
    } else if (strcmp(op, "attention_tokens") == 0) {
        /* a block of query tokens against one tile, each its own range of positions */
        int n_q = atoi(argv[3]), stride = atoi(argv[4]), head_dim = atoi(argv[5]), n_tok = atoi(argv[7]);
        float scale = strtof(argv[6], NULL);
        float *keys = read_exact((size_t)n * stride * sizeof(float));
        int32_t *ranges = read_exact((size_t)n_tok * 2 * sizeof(int32_t));
        float *q = read_exact((size_t)n_tok * n_q * head_dim * sizeof(float));
        float *att = malloc((size_t)n_tok * n_q * n * sizeof(float));
        KernelQueryRange *tokens = malloc((size_t)n_tok * sizeof(KernelQueryRange));
        for (int i = 0; i < n_tok * n_q * n; i++) {
            att[i] = -7.0f;
        }
        for (int t = 0; t < n_tok; t++) {
            const int first = ranges[2 * t], count = ranges[2 * t + 1];
            tokens[t] = (KernelQueryRange){att + (size_t)t * n_q * n + first, q + (size_t)t * n_q * head_dim, first,
                                           count};
        }
        kernel_attention_scores_tokens(tokens, n_tok, n, head_dim, n_q, keys, stride, n, head_dim, scale);
        write_all(att, (size_t)n_tok * n_q * n * sizeof(float));
    } else if (strcmp(op, "kv_f16") == 0) {
        /* N floats rounded as an f16 KV cache writes them: the binary16 bits, then widened */
        float *x = read_exact((size_t)n * sizeof(float));
        KernelHalf *h = malloc((size_t)n * sizeof(KernelHalf));
        float *wide = malloc((size_t)n * sizeof(float));
        kernel_round_f16(h, x, n);
        kernel_widen_f16(wide, h, n);
        write_all(h, (size_t)n * sizeof(KernelHalf));
        write_all(wide, (size_t)n * sizeof(float));
    } else if (strcmp(op, "kv_q8_0") == 0) {
        /* N floats (whole blocks) rounded as a q8_0 KV cache writes them: quants, binary16 scales,
         * then widened */
        float *x = read_exact((size_t)n * sizeof(float));
        int8_t *qs = malloc((size_t)n);
        KernelHalf *d = malloc((size_t)n / KERNEL_QK * sizeof(KernelHalf));
        float *wide = malloc((size_t)n * sizeof(float));
        kernel_round_q8_0(qs, d, x, n);
        kernel_widen_q8_0(wide, qs, d, n);
        write_all(qs, (size_t)n);
        write_all(d, (size_t)n / KERNEL_QK * sizeof(KernelHalf));
        write_all(wide, (size_t)n * sizeof(float));
    } else if (strcmp(op, "rng") == 0) {
        ColibriRng rng;
        rng_seed(&rng, strtoull(argv[2], NULL, 10));
        int count = atoi(argv[3]);
        for (int i = 0; i < count; i++) {
            uint32_t u = rng_next_u32(&rng);
            write_all(&u, sizeof u);
        }
        for (int i = 0; i < count; i++) {
            float f = rng_uniform(&rng);
            write_all(&f, sizeof f);
        }
    } else if (strcmp(op, "sample") == 0) {
        int count = atoi(argv[3]);
        ColibriSampling s;
        s.temperature = strtof(argv[4], NULL);
        s.top_k = atoi(argv[5]);
        s.top_p = strtof(argv[6], NULL);
        s.min_p = strtof(argv[7], NULL);
        s.seed = strtoull(argv[8], NULL, 10);
        /* Optional: the repetition penalty, its window, and how many seen tokens follow the logits. */
        s.repeat_penalty = argc > 9 ? strtof(argv[9], NULL) : 1.0f;
        s.repeat_last_n = argc > 10 ? atoi(argv[10]) : 0;
        const int n_seen = argc > 11 ? atoi(argv[11]) : 0;
        float *logits = read_exact(n * sizeof(float));
        const int32_t *seen = n_seen > 0 ? read_exact((size_t)n_seen * sizeof(int32_t)) : NULL;
        float *probs = malloc(n * sizeof(float));
        int32_t *cand = malloc(n * sizeof(int32_t));
        ColibriRng rng;
        rng_seed(&rng, s.seed);
        for (int i = 0; i < count; i++) {
            int32_t t = sample_token(logits, n, &s, seen, n_seen, &rng, probs, cand);
            write_all(&t, sizeof t);
        }
    } else {
        fprintf(stderr, "unknown op %s\n", op);
        return 2;
    }
    return 0;
}
