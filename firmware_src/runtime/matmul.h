/* Matrix products of the forward pass: an input's rows quantized once for every matrix that takes
 * them, each weight matrix read in its own form (f32, q8_0, q4_0, q4_1 or a kept GGUF type's blocks)
 * by the kernel set's product for its element type, split over the threads; and one row of an
 * embedding table as floats. */
#ifndef COLIBRI_MATMUL_H
#define COLIBRI_MATMUL_H

#include <stdint.h>

#include "model.h"

/* The input of one or more matrix products: n_tok rows of `cols` floats and, when the model has
 * integer weights and the rows are whole q8_0 blocks, their q8_0 quants, made once for every matrix
 * that takes this input (run.c quantizes x the same way before its matmuls). The quants live in the
 * scratch arena's act_qs/act_d: an input stays valid until the next matmul_input(). */
typedef struct {
    const float *x;
    const int8_t *qs; /* NULL: not quantized (f32 model, or rows that are not whole blocks) */
    const float *d;
    int n_tok, cols;
} MatmulInput;

/* The n_tok rows of x (each `cols` wide) as a product's input, quantized into b's act_qs/act_d
 * where the model has integer weights. */
MatmulInput matmul_input(const ColibriBuffers *b, const float *x, int n_tok, int cols);

/* out[t] = W in[t] (+ bias) for each of the input's rows; out rows are `rows` long, one after
 * another. Each matrix is read in its own form (the plan may keep a matrix in f32 when its rows
 * are not whole blocks), so the product picks its kernel by the matrix's element type. */
void matmul(float *out, const MatmulInput *in, const ColibriMatrix *w, const float *bias, int rows);

/* Rows [begin, end) of matmul's product only, each at its place in out, on this rank alone (no
 * other rank's rows, nothing gathered): an attention layer's heads of this rank's KV groups. */
void matmul_span(float *out, const MatmulInput *in, const ColibriMatrix *w, const float *bias, int rows, int begin,
                 int end);

/* Rows first .. first + rows - 1 of W times the input's rows (out[t] is `rows` long): one head's
 * block of a matrix that holds every head's (latent attention's wk_b, wv_b), the same bits as
 * those rows of matmul's product. */
void matmul_rows_of(float *out, const MatmulInput *in, const ColibriMatrix *w, int first, int rows);

/* Row `token` of an embedding table of `cols` values a row (embed, ple_embed), as floats: only that
 * row is read (on an MCU it stays in flash). */
void embedding_row(float *x, const ColibriMatrix *m, int32_t token, int cols);

#endif
