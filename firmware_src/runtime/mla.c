/* Multi-head latent attention, absorbed (mla.h). Every sum is the contract's: a score is one dot
 * over the cached row's KV_LORA_RANK + QK_ROPE_DIM values in order, a head's weighted latent sums
 * over the positions in order (the kernels' attention chains, as runtime/attention.c uses them),
 * and the up-projections are matrix products of a head's block of rows. */
#include "mla.h"

#if COLIBRI_KV_LORA_RANK > 0

#include <string.h>

#include "kernels/kernels.h"
#include "matmul.h"
#include "ops.h"

#define ROW (COLIBRI_KV_LORA_RANK + COLIBRI_QK_ROPE_DIM) /* a cached position: the latent, then the RoPE key */
#define QK_HEAD (COLIBRI_QK_NOPE_DIM + COLIBRI_QK_ROPE_DIM) /* a query head: its part without RoPE, then with */
#define V_DIM (COLIBRI_N_HEADS * COLIBRI_V_HEAD_DIM)    /* every head's values: wo's input */

_Static_assert(QK_HEAD == COLIBRI_HEAD_DIM && ROW <= COLIBRI_MAX_KV_DIM, "latent attention's widths");
_Static_assert(COLIBRI_KV_TYPE != COLIBRI_KV_Q8_0 || ROW % 32 == 0, "a cached row is whole q8_0 blocks");
_Static_assert(COLIBRI_SCRATCH_MLA_QUERY_BYTES == 4ull * COLIBRI_N_HEADS * ROW, "absorbed queries of every head");

#if COLIBRI_KV_TYPE == COLIBRI_KV_Q8_0
#define KEY_SCALES colibri_key_scales
#else
#define KEY_SCALES NULL
#endif

static float *scratch(uint64_t offset)
{
    return (float *)(colibri_scratch + offset);
}

/* Where the layer's row of ring slot `slot` lives in the K arena, in values. */
static int64_t row_at(int layer, int slot)
{
    return colibri_kv_offset[layer] + (int64_t)slot * ROW;
}

/* One position's row into the cache, rounded once to the cache's type (as attention.c stores keys). */
static void store(int layer, int slot, const float *row)
{
    const int64_t at = row_at(layer, slot);
#if COLIBRI_KV_TYPE == COLIBRI_KV_F32
    memcpy(colibri_key_cache + at, row, ROW * sizeof(float));
#elif COLIBRI_KV_TYPE == COLIBRI_KV_F16
    kernel_round_f16(colibri_key_cache + at, row, ROW);
#else
    kernel_round_q8_0(colibri_key_cache + at, KEY_SCALES + at / KERNEL_QK, row, ROW);
#endif
}

/* Rows slot .. slot + count - 1 of the layer's cache as floats: in place (f32), or widened exactly
 * into `tile` (room for KV_TILE rows). */
static const float *rows(int layer, int slot, int count, float *tile)
{
    const int64_t at = row_at(layer, slot);
#if COLIBRI_KV_TYPE == COLIBRI_KV_F32
    (void)count, (void)tile;
    return colibri_key_cache + at;
#elif COLIBRI_KV_TYPE == COLIBRI_KV_F16
    kernel_widen_f16(tile, colibri_key_cache + at, count * ROW);
    return tile;
#else
    kernel_widen_q8_0(tile, colibri_key_cache + at, KEY_SCALES + at / KERNEL_QK, count * ROW);
    return tile;
#endif
}

/* The queries of the n tokens into b->q: wq x, or wq_b rmsnorm(wq_a x). */
static void queries(ColibriBuffers *b, const ColibriLayerWeights *lw, const MatmulInput *xn, int n)
{
#if COLIBRI_Q_LORA_RANK > 0
    float *low = scratch(COLIBRI_SCRATCH_MLA_Q_A_OFFSET);
    matmul(low, xn, &lw->wq_a, NULL, COLIBRI_Q_LORA_RANK);
    for (int t = 0; t < n; t++) {
        float *row = low + (int64_t)t * COLIBRI_Q_LORA_RANK;
        op_rmsnorm(row, row, lw->q_a_norm, COLIBRI_Q_LORA_RANK, COLIBRI_RMS_NORM_EPS);
    }
    const MatmulInput compressed = matmul_input(b, low, n, COLIBRI_Q_LORA_RANK);
    matmul(b->q, &compressed, &lw->wq_b, NULL, COLIBRI_N_HEADS * QK_HEAD);
#else
    (void)n;
    matmul(b->q, xn, &lw->wq, NULL, COLIBRI_N_HEADS * QK_HEAD);
#endif
}

/* One token at position p (its queries q, its latent and RoPE key kv, neither normed nor rotated
 * yet): its row into the cache, then each head's absorbed query, scores over positions 0 .. p,
 * softmax, weighted latent and value up-projection into out (V_DIM). */
static void attend(ColibriBuffers *b, const ColibriLayerWeights *lw, int layer, int32_t p, float *q, float *kv,
                   float *out)
{
    const int half = COLIBRI_QK_ROPE_DIM / 2;
    const int64_t rope_row = ((int64_t)colibri_layer_rope[layer] * COLIBRI_N_CTX + p) * COLIBRI_ROPE_HALF;
    const float *cos = colibri_rope_cos + rope_row, *sin = colibri_rope_sin + rope_row;
    op_rmsnorm(kv, kv, lw->kv_a_norm, COLIBRI_KV_LORA_RANK, COLIBRI_RMS_NORM_EPS);
    op_rope(kv + COLIBRI_KV_LORA_RANK, cos, sin, half);
    const int32_t slots = colibri_kv_slots[layer];
    store(layer, p % slots, kv);

    float *query = scratch(COLIBRI_SCRATCH_MLA_QUERY_OFFSET);
    float *mixed = scratch(COLIBRI_SCRATCH_MLA_MIXED_OFFSET);
    for (int h = 0; h < COLIBRI_N_HEADS; h++) {
        float *qh = q + (int64_t)h * QK_HEAD;
        op_rope(qh + COLIBRI_QK_NOPE_DIM, cos, sin, half);
        const MatmulInput nope = matmul_input(b, qh, 1, COLIBRI_QK_NOPE_DIM);
        matmul_rows_of(query + (int64_t)h * ROW, &nope, &lw->wk_b, h * COLIBRI_KV_LORA_RANK, COLIBRI_KV_LORA_RANK);
        memcpy(query + (int64_t)h * ROW + COLIBRI_KV_LORA_RANK, qh + COLIBRI_QK_NOPE_DIM,
               COLIBRI_QK_ROPE_DIM * sizeof(float));
    }
    /* Every head reads each tile of the cache once, for its scores; then once more for the sums. */
    const int32_t first = p - slots + 1 > 0 ? p - slots + 1 : 0, seen = p - first + 1;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            kernel_softmax_rows(b->att, COLIBRI_N_CTX, COLIBRI_N_HEADS, seen);
            for (int64_t i = 0; i < (int64_t)COLIBRI_N_HEADS * COLIBRI_KV_LORA_RANK; i++) {
                mixed[i] = -0.0f; /* each sum starts from -0.0f, which its first term replaces */
            }
        }
        for (int32_t t0 = first; t0 <= p;) {
            const int slot = t0 % slots;
            int count = p - t0 + 1;
            count = count < COLIBRI_KV_TILE ? count : COLIBRI_KV_TILE;
            count = count < slots - slot ? count : slots - slot; /* a tile never wraps the ring */
            const float *tile = rows(layer, slot, count, b->kv_tile);
            if (pass == 0) {
                kernel_attention_scores(b->att + (t0 - first), COLIBRI_N_CTX, query, ROW, COLIBRI_N_HEADS, tile, ROW,
                                        count, ROW, COLIBRI_ATTN_SCALE);
            } else {
                kernel_attention_mix(mixed, COLIBRI_KV_LORA_RANK, b->att + (t0 - first), COLIBRI_N_CTX,
                                     COLIBRI_N_HEADS, tile, ROW, count, COLIBRI_KV_LORA_RANK);
            }
            t0 += count;
        }
    }
    for (int h = 0; h < COLIBRI_N_HEADS; h++) {
        const MatmulInput latent = matmul_input(b, mixed + (int64_t)h * COLIBRI_KV_LORA_RANK, 1, COLIBRI_KV_LORA_RANK);
        matmul_rows_of(out + (int64_t)h * COLIBRI_V_HEAD_DIM, &latent, &lw->wv_b, h * COLIBRI_V_HEAD_DIM,
                       COLIBRI_V_HEAD_DIM);
    }
}

void mla_attention(ColibriBuffers *b, const ColibriLayerWeights *lw, int layer, int32_t pos, int n)
{
    const MatmulInput xn = matmul_input(b, b->xn, n, COLIBRI_DIM);
    matmul(b->k, &xn, &lw->wkv_a, NULL, ROW);
    queries(b, lw, &xn, n);
    for (int t = 0; t < n; t++) {
        attend(b, lw, layer, pos + t, b->q + (int64_t)t * COLIBRI_N_HEADS * QK_HEAD, b->k + (int64_t)t * ROW,
               b->attn_out + (int64_t)t * V_DIM);
    }
    const MatmulInput values = matmul_input(b, b->attn_out, n, V_DIM);
    matmul(b->proj, &values, &lw->wo, NULL, COLIBRI_DIM);
}

#endif
