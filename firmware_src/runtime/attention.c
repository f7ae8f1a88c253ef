/* Attention over the KV cache (attention.h). The order of every sum is the contract's
 * (docs/numerics.md, "Attention"): a score sums q_j * k_j over j in order, a head's output sums
 * p_t * v_t over the positions t in order, so the tiles, the grouping of query heads and the blocks
 * of query tokens change which reads serve which sums, never a sum. */
#include "attention.h"

#include <string.h>

#include "kernels/kernels.h"
#include "ops.h"
#include "parallel.h"

#define ATTENTION_MIN_MACS 32768                    /* below this a block's attention stays on one thread */

_Static_assert(COLIBRI_ATTENTION_BLOCK >= 1 && COLIBRI_ATTENTION_BLOCK <= COLIBRI_PREFILL_BATCH, "attention block");
_Static_assert(COLIBRI_SCRATCH_ATT_BYTES == 4ull * COLIBRI_ATTENTION_BLOCK * COLIBRI_N_HEADS * COLIBRI_N_CTX,
               "scores for every token of a block and every head");

#if COLIBRI_KV_TYPE == COLIBRI_KV_Q8_0
#define KEY_SCALES colibri_key_scales
#define VALUE_SCALES colibri_value_scales
#else
#define KEY_SCALES NULL
#define VALUE_SCALES NULL
#endif

/* A layer's attention geometry: its head width and KV heads (Gemma 4's global layers differ from
 * its sliding ones) and the layer whose cache it keeps or reads (itself, or a Gemma 4 KV-sharing
 * layer's source, whose ring and offsets are the ones to use). */
typedef struct {
    int hd;       /* head width */
    int kv_heads; /* key/value heads */
    int group;    /* query heads per KV head */
    int q_dim;    /* a token's queries (and outputs): N_HEADS x hd */
    int kv_dim;   /* a token's keys (or values): kv_heads x hd */
    int cache;    /* the layer whose part of the arenas holds the keys and values */
    int g_first;  /* the first KV head this rank keeps (a layer split by KV group over ranks; else 0) */
} Geometry;

static Geometry geometry(int layer, int g_first)
{
    Geometry g;
    g.hd = colibri_layer_head_dim[layer];
    g.kv_heads = colibri_layer_kv_heads[layer];
    g.group = COLIBRI_N_HEADS / g.kv_heads;
    g.q_dim = COLIBRI_N_HEADS * g.hd;
    g.kv_dim = g.kv_heads * g.hd;
    g.cache = colibri_layer_kv_source[layer];
    g.g_first = g_first;
    return g;
}

/* Where a layer's cache keeps KV head g's key (or value) of ring slot `slot`, in values: a layer's
 * part of each arena is [KV head][slot][head width], so one KV head's positions are one contiguous
 * stream (read once per token, front to back, as the weights are). A rank of a layer split by KV
 * group keeps its own KV heads only, from g_first. */
static int64_t kv_at(const Geometry *geo, int g, int slot)
{
    return colibri_kv_offset[geo->cache] + ((int64_t)(g - geo->g_first) * colibri_kv_slots[geo->cache] + slot) * geo->hd;
}

/* KV heads g_begin .. g_end - 1 of one token's KV_DIM keys or values into the cache at ring slot
 * `slot`, rounded to the cache's type (kernels.h: kernel_round_f16, kernel_round_q8_0; head widths
 * are whole q8_0 blocks). */
static void store_row(ColibriKvValue *cache, uint16_t *scales, const Geometry *geo, int slot, const float *x,
                      int g_begin, int g_end)
{
    for (int g = g_begin; g < g_end; g++) {
        const int64_t at = kv_at(geo, g, slot);
        const float *head = x + (int64_t)g * geo->hd;
#if COLIBRI_KV_TYPE == COLIBRI_KV_F32
        (void)scales;
        memcpy(cache + at, head, (size_t)geo->hd * sizeof(float));
#elif COLIBRI_KV_TYPE == COLIBRI_KV_F16
        (void)scales;
        kernel_round_f16(cache + at, head, geo->hd);
#else
        kernel_round_q8_0(cache + at, scales + at / KERNEL_QK, head, geo->hd);
#endif
    }
}

/* Slots slot .. slot + count - 1 of KV head g in a layer's keys or values, as float32 rows
 * HEAD_DIM apart: the cache itself (f32), or widened exactly into `tile`. */
static const float *kv_rows(const ColibriKvValue *cache, const uint16_t *scales, const Geometry *geo, int slot,
                            int count, int g, float *tile)
{
    const int64_t first = kv_at(geo, g, slot);
#if COLIBRI_KV_TYPE == COLIBRI_KV_F32
    (void)scales;
    (void)count;
    (void)tile;
    return cache + first;
#elif COLIBRI_KV_TYPE == COLIBRI_KV_F16
    (void)scales;
    kernel_widen_f16(tile, cache + first, count * geo->hd);
    return tile;
#else
    kernel_widen_q8_0(tile, cache + first, scales + first / KERNEL_QK, count * geo->hd);
    return tile;
#endif
}

#if COLIBRI_KV_TYPE == COLIBRI_KV_F16
/* One query token reads a binary16 tile where it lies (kernels.h: a set decodes it in registers, or
 * widens it into `tile` itself); a block of tokens has it widened once for all of them. */
#define IN_PLACE(n_tokens) ((n_tokens) == 1)
#else
#define IN_PLACE(n_tokens) 0
#endif

/* Scores (in_keys) or value sums of n_q query heads over positions slot .. slot + n - 1 of KV head
 * g, read in place from a binary16 cache (IN_PLACE). */
static void in_place(const Geometry *geo, int in_keys, int g, int slot, float *att, const float *q, float *out, int n,
                     float *tile)
{
#if COLIBRI_KV_TYPE == COLIBRI_KV_F16
    const int hd = geo->hd;
    const int64_t at = kv_at(geo, g, slot);
    if (in_keys) {
        kernel_attention_scores_f16(att, COLIBRI_N_CTX, q, hd, geo->group, colibri_key_cache + at, hd, n, hd,
                                    COLIBRI_ATTN_SCALE, tile, COLIBRI_KV_TILE);
    } else {
        kernel_attention_mix_f16(out, hd, att, COLIBRI_N_CTX, geo->group, colibri_value_cache + at, hd, n, hd, tile,
                                 COLIBRI_KV_TILE);
    }
#else
    (void)geo, (void)in_keys, (void)g, (void)slot, (void)att, (void)q, (void)out, (void)n, (void)tile;
#endif
}

/* The first position a query at position p sees: 0, or the start of its sliding window, or with
 * CHUNKED_WINDOWS the start of its chunk (Llama 4: a position sees its own chunk only, never the
 * chunk before it: the window's ring holds the chunk's positions, all within the last `window`). */
static int32_t first_seen(int32_t p, int32_t window)
{
    if (COLIBRI_CHUNKED_WINDOWS) {
        return window > 0 ? p - p % window : 0;
    }
    return (window > 0 && p - window + 1 > 0) ? p - window + 1 : 0;
}

/* A block of query tokens of one layer, for the KV heads a thread takes. */
typedef struct {
    const ColibriBuffers *b;
    int layer;
    Geometry geo;
    int32_t pos;        /* the block's first token's position */
    int n;              /* tokens in the block */
    const float *q;     /* [n][geo.q_dim] their queries */
    float *out;         /* [n][geo.q_dim] their attention outputs */
    const float *sinks; /* [N_HEADS] each head's sink logit (gpt-oss), or NULL */
    int g_begin;        /* the first KV head taken (this rank's first, on a layer split by KV group) */
} AttentionJob;

/* Scores (in_keys) or value sums over the positions the block sees, tile after tile of KV head g:
 * query token a takes, of each tile, the positions in its own range [first_seen, its position]. */
static void over_tiles(const AttentionJob *j, int g, int in_keys)
{
    const Geometry *geo = &j->geo;
    const int32_t window = colibri_layer_window[j->layer];
    const int32_t slots = colibri_kv_slots[geo->cache];
    const int32_t last = j->pos + j->n - 1;
    const int hd = geo->hd, group = geo->group;
    float *tile = j->b->kv_tile != NULL ? j->b->kv_tile + (int64_t)g * COLIBRI_KV_TILE * hd : NULL;
    /* read in place, a tile is every position up to the ring's end (the kernel widens, if it does,
     * COLIBRI_KV_TILE rows at a time) */
    const int direct = IN_PLACE(j->n);
    const int most = direct ? slots : COLIBRI_KV_TILE;
    for (int32_t t0 = first_seen(j->pos, window); t0 <= last;) {
        const int slot = t0 % slots;
        int count = last - t0 + 1;
        count = count < most ? count : most;
        count = count < slots - slot ? count : slots - slot; /* a tile never wraps the ring */
        const int stride = hd;
        const float *rows = direct    ? NULL
                            : in_keys ? kv_rows(colibri_key_cache, KEY_SCALES, geo, slot, count, g, tile)
                                      : kv_rows(colibri_value_cache, VALUE_SCALES, geo, slot, count, g, tile);
        KernelQueryRange seen[COLIBRI_ATTENTION_BLOCK]; /* the block's tokens that score this tile */
        int n_seen = 0;
        for (int a = 0; a < j->n; a++) {
            const int32_t p = j->pos + a;
            const int32_t start = first_seen(p, window);
            const int32_t lo = t0 > start ? t0 : start;
            const int32_t hi = t0 + count - 1 < p ? t0 + count - 1 : p;
            if (hi < lo) {
                continue;
            }
            float *att = j->b->att + ((int64_t)a * COLIBRI_N_HEADS + g * group) * COLIBRI_N_CTX + (lo - start);
            const int64_t head = (int64_t)a * geo->q_dim + (int64_t)g * group * hd;
            if (direct) {
                in_place(geo, in_keys, g, slot + (lo - t0), att, j->q + head, j->out + head, hi - lo + 1, tile);
            } else if (in_keys) {
                seen[n_seen++] = (KernelQueryRange){att, j->q + head, lo - t0, hi - lo + 1};
            } else {
                kernel_attention_mix(j->out + head, hd, att, COLIBRI_N_CTX, group, rows + (int64_t)(lo - t0) * stride,
                                     stride, hi - lo + 1, hd);
            }
        }
        if (n_seen > 0) { /* all of them at once: a set may rearrange the tile once for the block */
            kernel_attention_scores_tokens(seen, n_seen, COLIBRI_N_CTX, hd, group, rows, stride, count, hd,
                                           COLIBRI_ATTN_SCALE);
        }
        t0 += count;
    }
}

/* The job's KV heads from - to - 1 (counted from its g_begin) of a block: every score, the softmax
 * of each (token, head), then the weighted sums of the values. */
static void attend_kv_heads(void *ctx, int from, int to)
{
    const AttentionJob *j = ctx;
    const int32_t window = colibri_layer_window[j->layer];
    const int hd = j->geo.hd, group = j->geo.group;
    for (int g = j->g_begin + from; g < j->g_begin + to; g++) {
        over_tiles(j, g, 1);
        for (int a = 0; a < j->n; a++) {
            const int32_t p = j->pos + a;
            const int n_seen = p - first_seen(p, window) + 1;
            float *scores = j->b->att + ((int64_t)a * COLIBRI_N_HEADS + g * group) * COLIBRI_N_CTX;
            if (j->sinks == NULL) {
                kernel_softmax_rows(scores, COLIBRI_N_CTX, group, n_seen); /* the group's heads together */
            }
            for (int h = g * group; h < (g + 1) * group; h++) {
                if (j->sinks != NULL) {
                    op_softmax_with_sink(scores + (int64_t)(h - g * group) * COLIBRI_N_CTX, n_seen, j->sinks[h]);
                }
                float *out = j->out + (int64_t)a * j->geo.q_dim + (int64_t)h * hd;
                for (int i = 0; i < hd; i++) {
                    out[i] = -0.0f; /* each value sum starts from -0.0f, which its first term replaces */
                }
            }
        }
        over_tiles(j, g, 0);
    }
}

void attention_layer(const ColibriBuffers *b, int layer, int32_t pos, int n, const float *sinks, int g_begin,
                     int g_end)
{
    const Geometry geo = geometry(layer, g_begin);
    const int32_t slots = colibri_kv_slots[geo.cache];
    /* A sliding layer whose ring holds only its window attends token by token, right after each
     * token's keys and values enter: a block's later keys would overwrite positions its earlier
     * tokens still see. A KV-sharing layer stores nothing: its source stored these positions. */
    const int block = slots < COLIBRI_N_CTX ? 1 : COLIBRI_ATTENTION_BLOCK;
    for (int t0 = 0; t0 < n; t0 += block) {
        const int m = n - t0 < block ? n - t0 : block;
        for (int t = t0; geo.cache == layer && t < t0 + m; t++) {
            const int slot = (pos + t) % slots;
            store_row(colibri_key_cache, KEY_SCALES, &geo, slot, b->k + (int64_t)t * geo.kv_dim, g_begin, g_end);
            store_row(colibri_value_cache, VALUE_SCALES, &geo, slot, b->v + (int64_t)t * geo.kv_dim, g_begin, g_end);
        }
        AttentionJob job = {b, layer, geo, pos + t0, m, b->q + (int64_t)t0 * geo.q_dim,
                            b->attn_out + (int64_t)t0 * geo.q_dim, sinks, g_begin};
        const int64_t macs = 2 * (int64_t)geo.group * (g_end - g_begin) * (pos + t0 + m) * geo.hd * m;
        if (macs < ATTENTION_MIN_MACS) {
            attend_kv_heads(&job, 0, g_end - g_begin);
        } else {
            parallel_for(attend_kv_heads, &job, g_end - g_begin);
        }
    }
}
