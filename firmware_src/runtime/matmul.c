/* Matrix products of the forward pass (matmul.h): each weight matrix read in its own form by the
 * kernel set's product for its element type, the rows split over the threads; and one row of an
 * embedding table as floats. */
#include "matmul.h"

#include <string.h>

#include "kernels/kernels.h"
#include "parallel.h"
#include "ranks.h"

#define READS_KEPT_BLOCKS (COLIBRI_READS_Q5_0 || COLIBRI_READS_Q5_1 || COLIBRI_READS_Q4_K || COLIBRI_READS_Q5_K || COLIBRI_READS_Q6_K || COLIBRI_READS_Q3_K || COLIBRI_READS_Q2_K || COLIBRI_READS_IQ4_NL || COLIBRI_READS_IQ4_XS || COLIBRI_READS_MXFP4) /* some matrix is a kept GGUF type's blocks */

/* The generator's blocks of the kept GGUF types (model_def.h) are the kernels' (kernels.h). */
_Static_assert(COLIBRI_Q5_0_BLOCK_VALUES == KERNEL_Q5_0_VALUES && COLIBRI_Q5_0_BLOCK_BYTES == KERNEL_Q5_0_BYTES, "q5_0 blocks");
_Static_assert(COLIBRI_Q5_1_BLOCK_VALUES == KERNEL_Q5_1_VALUES && COLIBRI_Q5_1_BLOCK_BYTES == KERNEL_Q5_1_BYTES, "q5_1 blocks");
_Static_assert(COLIBRI_Q4_K_BLOCK_VALUES == KERNEL_Q4_K_VALUES && COLIBRI_Q4_K_BLOCK_BYTES == KERNEL_Q4_K_BYTES, "q4_k blocks");
_Static_assert(COLIBRI_Q5_K_BLOCK_VALUES == KERNEL_Q5_K_VALUES && COLIBRI_Q5_K_BLOCK_BYTES == KERNEL_Q5_K_BYTES, "q5_k blocks");
_Static_assert(COLIBRI_Q6_K_BLOCK_VALUES == KERNEL_Q6_K_VALUES && COLIBRI_Q6_K_BLOCK_BYTES == KERNEL_Q6_K_BYTES, "q6_k blocks");
_Static_assert(COLIBRI_Q3_K_BLOCK_VALUES == KERNEL_Q3_K_VALUES && COLIBRI_Q3_K_BLOCK_BYTES == KERNEL_Q3_K_BYTES, "q3_k blocks");
_Static_assert(COLIBRI_Q2_K_BLOCK_VALUES == KERNEL_Q2_K_VALUES && COLIBRI_Q2_K_BLOCK_BYTES == KERNEL_Q2_K_BYTES, "q2_k blocks");
_Static_assert(COLIBRI_IQ4_NL_BLOCK_VALUES == KERNEL_IQ4_NL_VALUES && COLIBRI_IQ4_NL_BLOCK_BYTES == KERNEL_IQ4_NL_BYTES, "iq4_nl blocks");
_Static_assert(COLIBRI_IQ4_XS_BLOCK_VALUES == KERNEL_IQ4_XS_VALUES && COLIBRI_IQ4_XS_BLOCK_BYTES == KERNEL_IQ4_XS_BYTES, "iq4_xs blocks");
_Static_assert(COLIBRI_MXFP4_BLOCK_VALUES == KERNEL_MXFP4_VALUES && COLIBRI_MXFP4_BLOCK_BYTES == KERNEL_MXFP4_BYTES, "mxfp4 blocks");

MatmulInput matmul_input(const ColibriBuffers *b, const float *x, int n_tok, int cols)
{
    MatmulInput in = {x, NULL, NULL, n_tok, cols};
#if COLIBRI_ACT_Q8_0
    if (cols % KERNEL_QK == 0) {
        for (int t = 0; t < n_tok; t++) {
            kernel_quantize_q8_0(b->act_qs + (int64_t)t * cols, b->act_d + (int64_t)t * (cols / KERNEL_QK),
                                 x + (int64_t)t * cols, cols);
        }
        in.qs = b->act_qs;
        in.d = b->act_d;
    }
#else
    (void)b;
#endif
    return in;
}

#if READS_KEPT_BLOCKS
/* Row `first` of a matrix of a kept GGUF type, whose rows are row_bytes of blocks each. */
static const uint8_t *block_row(const ColibriMatrix *w, int64_t first, int64_t row_bytes)
{
    return (const uint8_t *)w->w + first * row_bytes;
}
#endif

/* One matrix times the input's rows, split by weight rows over the threads (each sum unchanged). */
typedef struct {
    float *out;
    const MatmulInput *in;
    const ColibriMatrix *w;
    int rows;
    int first; /* the matrix's first row taken (matmul_rows_of: a head's block of rows) */
} MatmulJob;

static void matmul_rows(void *ctx, int begin, int end)
{
    const MatmulJob *j = ctx;
    float *const out = j->out + begin;
    begin += j->first - j->w->first_row; /* the matrix holds rows from first_row (a rank's share) */
    end += j->first - j->w->first_row;
    const int cols = j->in->cols, n = end - begin;
    const int64_t first_scale = (int64_t)begin * (cols / KERNEL_QK);
    switch (j->w->dtype) {
#if COLIBRI_READS_Q4_0
    case COLIBRI_DTYPE_Q4_0:
        kernel_matmul_q4_0(out, j->rows, (const uint8_t *)j->w->w + (int64_t)begin * (cols / 2),
                           j->w->d + first_scale, j->in->qs, j->in->d, j->in->n_tok, n, cols);
        break;
#endif
#if COLIBRI_READS_Q4_1
    case COLIBRI_DTYPE_Q4_1:
        kernel_matmul_q4_1(out, j->rows, (const uint8_t *)j->w->w + (int64_t)begin * (cols / 2),
                           j->w->d + first_scale, j->w->m + first_scale, j->in->qs, j->in->d, j->in->n_tok, n,
                           cols);
        break;
#endif
#if COLIBRI_READS_Q5_0
    case COLIBRI_DTYPE_Q5_0:
        kernel_matmul_q5_0(out, j->rows, block_row(j->w, begin, (int64_t)(cols / KERNEL_Q5_0_VALUES) * KERNEL_Q5_0_BYTES),
                          j->in->qs, j->in->d, j->in->n_tok, n, cols);
        break;
#endif
#if COLIBRI_READS_Q5_1
    case COLIBRI_DTYPE_Q5_1:
        kernel_matmul_q5_1(out, j->rows, block_row(j->w, begin, (int64_t)(cols / KERNEL_Q5_1_VALUES) * KERNEL_Q5_1_BYTES),
                          j->in->qs, j->in->d, j->in->n_tok, n, cols);
        break;
#endif
#if COLIBRI_READS_Q4_K
    case COLIBRI_DTYPE_Q4_K:
        kernel_matmul_q4_k(out, j->rows, block_row(j->w, begin, (int64_t)(cols / KERNEL_Q4_K_VALUES) * KERNEL_Q4_K_BYTES),
                          j->in->qs, j->in->d, j->in->n_tok, n, cols);
        break;
#endif
#if COLIBRI_READS_Q5_K
    case COLIBRI_DTYPE_Q5_K:
        kernel_matmul_q5_k(out, j->rows, block_row(j->w, begin, (int64_t)(cols / KERNEL_Q5_K_VALUES) * KERNEL_Q5_K_BYTES),
                          j->in->qs, j->in->d, j->in->n_tok, n, cols);
        break;
#endif
#if COLIBRI_READS_Q6_K
    case COLIBRI_DTYPE_Q6_K:
        kernel_matmul_q6_k(out, j->rows, block_row(j->w, begin, (int64_t)(cols / KERNEL_Q6_K_VALUES) * KERNEL_Q6_K_BYTES),
                          j->in->qs, j->in->d, j->in->n_tok, n, cols);
        break;
#endif
#if COLIBRI_READS_Q3_K
    case COLIBRI_DTYPE_Q3_K:
        kernel_matmul_q3_k(out, j->rows, block_row(j->w, begin, (int64_t)(cols / KERNEL_Q3_K_VALUES) * KERNEL_Q3_K_BYTES),
                          j->in->qs, j->in->d, j->in->n_tok, n, cols);
        break;
#endif
#if COLIBRI_READS_Q2_K
    case COLIBRI_DTYPE_Q2_K:
        kernel_matmul_q2_k(out, j->rows, block_row(j->w, begin, (int64_t)(cols / KERNEL_Q2_K_VALUES) * KERNEL_Q2_K_BYTES),
                          j->in->qs, j->in->d, j->in->n_tok, n, cols);
        break;
#endif
#if COLIBRI_READS_IQ4_NL
    case COLIBRI_DTYPE_IQ4_NL:
        kernel_matmul_iq4_nl(out, j->rows, block_row(j->w, begin, (int64_t)(cols / KERNEL_IQ4_NL_VALUES) * KERNEL_IQ4_NL_BYTES),
                          j->in->qs, j->in->d, j->in->n_tok, n, cols);
        break;
#endif
#if COLIBRI_READS_IQ4_XS
    case COLIBRI_DTYPE_IQ4_XS:
        kernel_matmul_iq4_xs(out, j->rows, block_row(j->w, begin, (int64_t)(cols / KERNEL_IQ4_XS_VALUES) * KERNEL_IQ4_XS_BYTES),
                          j->in->qs, j->in->d, j->in->n_tok, n, cols);
        break;
#endif
#if COLIBRI_READS_MXFP4
    case COLIBRI_DTYPE_MXFP4:
        kernel_matmul_mxfp4(out, j->rows, block_row(j->w, begin, (int64_t)(cols / KERNEL_MXFP4_VALUES) * KERNEL_MXFP4_BYTES),
                          j->in->qs, j->in->d, j->in->n_tok, n, cols);
        break;
#endif
    case COLIBRI_DTYPE_Q8_0:
        kernel_matmul_q8_0(out, j->rows, (const int8_t *)j->w->w + (int64_t)begin * cols,
                           j->w->d + first_scale, j->in->qs, j->in->d, j->in->n_tok, n, cols);
        break;
    default:
        kernel_matmul_f32(out, j->rows, (const float *)j->w->w + (int64_t)begin * cols, j->in->x,
                          j->in->n_tok, n, cols);
        break;
    }
}

/* Below this many multiply-adds a product is not worth waking the other threads for. */
#define PARALLEL_MIN_MACS 32768

/* Rows [begin, end) of a product of `rows` rows, each at its place in out (a token's rows `rows`
 * apart), split over the threads. */
static void product_rows(float *out, const MatmulInput *in, const ColibriMatrix *w, int rows, int begin, int end)
{
    if (w->rows_held != 0 && end > begin && (begin < w->first_row || end > w->first_row + w->rows_held)) {
        ranks_missing_rows(rows, begin, end);
    }
    MatmulJob job = {out + begin, in, w, rows, begin};
    if ((int64_t)in->n_tok * (end - begin) * in->cols < PARALLEL_MIN_MACS) {
        matmul_rows(&job, 0, end - begin);
    } else {
        parallel_for(matmul_rows, &job, end - begin);
    }
}

/* out[i] += bias[i] for rows [begin, end) of each token's `rows`. */
static void add_bias(float *out, const float *bias, int n_tok, int rows, int begin, int end)
{
    if (bias == NULL) {
        return;
    }
    for (int t = 0; t < n_tok; t++) {
        float *o = out + (int64_t)t * rows;
        for (int i = begin; i < end; i++) {
            o[i] = o[i] + bias[i];
        }
    }
}

void matmul(float *out, const MatmulInput *in, const ColibriMatrix *w, const float *bias, int rows)
{
    int begin, end; /* this rank's rows (runtime/ranks.h): all of them on a single board */
    ranks_rows(rows, &begin, &end);
    product_rows(out, in, w, rows, begin, end);
    ranks_gather_rows(out, in->n_tok, rows);
    add_bias(out, bias, in->n_tok, rows, 0, rows);
}

void matmul_span(float *out, const MatmulInput *in, const ColibriMatrix *w, const float *bias, int rows, int begin,
                 int end)
{
    product_rows(out, in, w, rows, begin, end);
    add_bias(out, bias, in->n_tok, rows, begin, end);
}

void matmul_rows_of(float *out, const MatmulInput *in, const ColibriMatrix *w, int first, int rows)
{
    MatmulJob job = {out, in, w, rows, first};
    if ((int64_t)in->n_tok * rows * in->cols < PARALLEL_MIN_MACS) {
        matmul_rows(&job, 0, rows);
    } else {
        parallel_for(matmul_rows, &job, rows);
    }
}

#if READS_KEPT_BLOCKS
/* A kept GGUF type's embedding row: each 32-value block unpacked, its values scale * q (+ offset). */
static void embed_blocks(float *x, const ColibriMatrix *m, int32_t token, int cols, int64_t row_bytes,
                         void (*unpack)(const uint8_t *, int, KernelUnpacked *), int affine)
{
    const uint8_t *row = block_row(m, token, row_bytes);
    for (int b = 0; b < cols / KERNEL_QK; b++) {
        KernelUnpacked u;
        unpack(row, b, &u);
        for (int l = 0; l < KERNEL_QK; l++) {
            x[b * KERNEL_QK + l] = kernel_unpacked_value(&u, l, affine);
        }
    }
}
#endif

void embedding_row(float *x, const ColibriMatrix *m, int32_t token, int cols)
{
    const int64_t first_scale = (int64_t)token * (cols / KERNEL_QK);
    switch (m->dtype) {
#if COLIBRI_READS_Q4_0
    case COLIBRI_DTYPE_Q4_0: {
        const uint8_t *qs = (const uint8_t *)m->w + (int64_t)token * (cols / 2);
        for (int i = 0; i < cols; i++) {
            const int b = i / KERNEL_QK;
            x[i] = (float)kernel_q4_0_value(qs + b * (KERNEL_QK / 2), i % KERNEL_QK) * kernel_half_to_float(m->d[first_scale + b]);
        }
        break;
    }
#endif
#if COLIBRI_READS_Q4_1
    case COLIBRI_DTYPE_Q4_1: { /* (float)q * d + m: a product, then a sum (docs/numerics.md) */
        const uint8_t *qs = (const uint8_t *)m->w + (int64_t)token * (cols / 2);
        for (int i = 0; i < cols; i++) {
            const int b = i / KERNEL_QK;
            x[i] = (float)kernel_q4_1_quant(qs + b * (KERNEL_QK / 2), i % KERNEL_QK) * kernel_half_to_float(m->d[first_scale + b]) +
                   kernel_half_to_float(m->m[first_scale + b]);
        }
        break;
    }
#endif
#if COLIBRI_READS_Q5_0
    case COLIBRI_DTYPE_Q5_0:
        embed_blocks(x, m, token, cols, (int64_t)(cols / KERNEL_Q5_0_VALUES) * KERNEL_Q5_0_BYTES, kernel_q5_0_unpack, 0);
        break;
#endif
#if COLIBRI_READS_Q5_1
    case COLIBRI_DTYPE_Q5_1:
        embed_blocks(x, m, token, cols, (int64_t)(cols / KERNEL_Q5_1_VALUES) * KERNEL_Q5_1_BYTES, kernel_q5_1_unpack, 1);
        break;
#endif
#if COLIBRI_READS_Q4_K
    case COLIBRI_DTYPE_Q4_K:
        embed_blocks(x, m, token, cols, (int64_t)(cols / KERNEL_Q4_K_VALUES) * KERNEL_Q4_K_BYTES, kernel_q4_k_unpack, 1);
        break;
#endif
#if COLIBRI_READS_Q5_K
    case COLIBRI_DTYPE_Q5_K:
        embed_blocks(x, m, token, cols, (int64_t)(cols / KERNEL_Q5_K_VALUES) * KERNEL_Q5_K_BYTES, kernel_q5_k_unpack, 1);
        break;
#endif
#if COLIBRI_READS_Q6_K
    case COLIBRI_DTYPE_Q6_K:
        embed_blocks(x, m, token, cols, (int64_t)(cols / KERNEL_Q6_K_VALUES) * KERNEL_Q6_K_BYTES, kernel_q6_k_unpack, 0);
        break;
#endif
#if COLIBRI_READS_Q3_K
    case COLIBRI_DTYPE_Q3_K:
        embed_blocks(x, m, token, cols, (int64_t)(cols / KERNEL_Q3_K_VALUES) * KERNEL_Q3_K_BYTES, kernel_q3_k_unpack, 0);
        break;
#endif
#if COLIBRI_READS_Q2_K
    case COLIBRI_DTYPE_Q2_K:
        embed_blocks(x, m, token, cols, (int64_t)(cols / KERNEL_Q2_K_VALUES) * KERNEL_Q2_K_BYTES, kernel_q2_k_unpack, 1);
        break;
#endif
#if COLIBRI_READS_IQ4_NL
    case COLIBRI_DTYPE_IQ4_NL:
        embed_blocks(x, m, token, cols, (int64_t)(cols / KERNEL_IQ4_NL_VALUES) * KERNEL_IQ4_NL_BYTES, kernel_iq4_nl_unpack, 0);
        break;
#endif
#if COLIBRI_READS_IQ4_XS
    case COLIBRI_DTYPE_IQ4_XS:
        embed_blocks(x, m, token, cols, (int64_t)(cols / KERNEL_IQ4_XS_VALUES) * KERNEL_IQ4_XS_BYTES, kernel_iq4_xs_unpack, 0);
        break;
#endif
#if COLIBRI_READS_MXFP4
    case COLIBRI_DTYPE_MXFP4:
        embed_blocks(x, m, token, cols, (int64_t)(cols / KERNEL_MXFP4_VALUES) * KERNEL_MXFP4_BYTES, kernel_mxfp4_unpack, 0);
        break;
#endif
    case COLIBRI_DTYPE_Q8_0: {
        const int8_t *qs = (const int8_t *)m->w + (int64_t)token * cols;
        for (int i = 0; i < cols; i++) {
            x[i] = (float)qs[i] * kernel_half_to_float(m->d[first_scale + i / KERNEL_QK]);
        }
        break;
    }
    default:
        memcpy(x, (const float *)m->w + (int64_t)token * cols, (size_t)cols * sizeof(float));
        break;
    }
}
