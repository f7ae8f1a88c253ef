#include "expert_cache.h"

#include <stddef.h>
#include <string.h>

#include "decimal.h"
#include "image_loader.h"
#include "ranks.h"
#include "tensor_table.h"

#define EXPERTS_PER_LAYER (COLIBRI_N_EXPERTS > 0 ? COLIBRI_N_EXPERTS : 1)
#define TABLE_ENTRIES (COLIBRI_N_LAYERS * EXPERTS_PER_LAYER)
#define MAX_SLOTS (COLIBRI_N_MOE_LAYERS > 0 ? COLIBRI_N_MOE_LAYERS * EXPERTS_PER_LAYER : 1) /* every expert its own */
#define MAX_K (COLIBRI_EXPERTS_PER_TOKEN > 0 ? COLIBRI_EXPERTS_PER_TOKEN : 1)

/* One slot: an expert's gate, up and down matrices as one aligned read of the image file. Only the
 * forward pass's thread changes a slot's fields, except `status` and `read_us`, which an I/O thread
 * writes when the slot's queued read is done and the forward pass reads only after storage->wait
 * (or wait_any) has returned its ticket. */
typedef struct {
    int32_t entry;       /* what it holds or is being read into it (layer x N_EXPERTS + expert); -1: empty */
    int pinned;          /* holds an expert of the token being computed: never evicted meanwhile */
    uint64_t last_use;   /* the clock at its last use (or prefetch): least recently used goes first */
    int pending;         /* a queued read not waited for yet */
    int prefetched;      /* filled by a prefetch and not used since */
    int checked;         /* its read is in and good, its matrices bound: ready to compute */
    int check;           /* the read checks the expert's CRC-32s (its first time in) */
    uint64_t skip, need; /* the expert's first byte in the read, and the bytes the read must deliver */
    int status;          /* the read's outcome: COLIBRI_OK, COLIBRI_ERR_READ or a CRC-32 mismatch */
    int64_t got;         /* what the storage's read returned (bytes, -errno or COLIBRI_STORAGE_CHANGED) */
    uint64_t read_us;    /* how long the read took */
    uint8_t *buf;        /* COLIBRI_EXPERT_SLOT_BYTES, COLIBRI_STORAGE_ALIGN aligned */
    ColibriExpert w;     /* its matrices, bound into buf */
} Slot;

typedef enum { IN_PLACE, SLOTS } Mode;

/* Expert `expert` of `layer` as bound in the image (NULL in a model without experts). */
static const ColibriExpert *in_image(const ColibriWeights *w, int layer, int expert)
{
#if COLIBRI_N_EXPERTS > 0
    return &w->layers[layer].experts[expert];
#else
    (void)w;
    (void)layer;
    (void)expert;
    return NULL;
#endif
}

static Mode mode = IN_PLACE;
static const uint8_t *image_base;
static int check_in_place;                    /* IN_PLACE: check each expert on first use */
static uint8_t verified[TABLE_ENTRIES];        /* [layer][expert]: its CRC-32s matched once (in place or in a slot) */
static int n_slots;
static int prefetch_on;
static ColibriStorage *storage;
static Slot slots[MAX_SLOTS];                 /* one pool for every MoE layer: only n_slots used */
static int32_t slot_of[TABLE_ENTRIES];        /* [layer][expert]: its slot, or -1 */
static uint64_t clock_tick;
static colibri_eviction policy = COLIBRI_EVICT_LFU;
static uint32_t uses[TABLE_ENTRIES];           /* [layer][expert]: times used since start (LFU) */
static ColibriCacheStats stats;

/* The last expert that could not be brought in, and why (colibri_experts_failure). */
#define FAILURE_BYTES 320
static char failure[FAILURE_BYTES];
static int failure_len;

static void failure_text(const char *s)
{
    while (*s && failure_len < FAILURE_BYTES - 1) {
        failure[failure_len++] = *s++;
    }
    failure[failure_len] = '\0';
}

static void failure_u64(uint64_t v)
{
    char text[DECIMAL_U64_BYTES];
    decimal_u64(text, v);
    failure_text(text);
}

/* "<the loader's message>: layer L expert E (file bytes A..B): <cause>", for the error frame. */
static void note_failure(int status, int layer, int expert, int64_t got, uint64_t need)
{
    uint64_t start, bytes;
    const ColibriExpertGroup *group = colibri_layer_experts(layer);
    start = (uint64_t)COLIBRI_IMAGE_DATA_OFFSET + colibri_expert_offset(group, expert);
    bytes = group->stride;
    failure_len = 0;
    failure_text(colibri_status_message(status));
    failure_text(": layer ");
    failure_u64((uint64_t)layer);
    failure_text(" expert ");
    failure_u64((uint64_t)expert);
    failure_text(" (file bytes ");
    failure_u64(start);
    failure_text("..");
    failure_u64(start + bytes);
    failure_text("): ");
    if (status != COLIBRI_ERR_READ) {
        failure_text("its bytes fail their CRC-32 (the image on storage is damaged)");
    } else if (got == COLIBRI_STORAGE_CHANGED) {
        failure_text("the weight image file changed (truncated or rewritten) since the firmware opened it");
    } else if (got < 0) {
        failure_text("the read failed: ");
        failure_text(strerror((int)-got));
    } else {
        failure_text("a short read: the file gave ");
        failure_u64((uint64_t)got);
        failure_text(" of ");
        failure_u64(need);
        failure_text(" B (it ends there: truncated?)");
    }
}

const char *colibri_experts_failure(void)
{
    return failure_len > 0 ? failure : NULL;
}

/* The experts of the token being computed (one layer), as colibri_experts_next hands them out. */
typedef enum { READY, IN_FLIGHT, GIVEN } Progress;
static struct {
    const ColibriWeights *w;
    int k;
    const ColibriExpert *expert[MAX_K]; /* READY: its matrices */
    int slot[MAX_K];                    /* SLOTS: its slot */
    Progress progress[MAX_K];
} token;

int64_t colibri_cache_least_slots(void)
{
    const int32_t held = colibri_rank_budget()->experts_per_layer;
    return COLIBRI_N_MOE_LAYERS > 0 ? (COLIBRI_EXPERTS_PER_TOKEN < held ? COLIBRI_EXPERTS_PER_TOKEN : held) : 0;
}

int64_t colibri_cache_slots_for_budget(uint64_t budget)
{
    /* This rank's share (a single board's: the whole model): its fixed part, and its own experts. */
    const ColibriRankBudget *share = colibri_rank_budget();
    if (budget == 0) {
        return 0;
    }
    if (COLIBRI_IMAGE_RANKS > 1 && budget >= share->memory_bytes) {
        return 0; /* a rank's whole share: its image read in place, as with no budget */
    }
    if (budget < share->fixed_bytes) {
        return -1;
    }
#if COLIBRI_N_MOE_LAYERS > 0
    const uint64_t slots = (budget - share->fixed_bytes) / COLIBRI_EXPERT_SLOT_BYTES;
    const uint64_t most = (uint64_t)COLIBRI_N_MOE_LAYERS * (uint64_t)share->experts_per_layer;
    if (slots < (uint64_t)colibri_cache_least_slots()) {
        return -1; /* one token's experts of one layer (those on this rank) must fit at once */
    }
    return (int64_t)(slots > most ? most : slots);
#else
    return 0; /* no routed experts: everything is resident */
#endif
}

void colibri_experts_in_place(const uint8_t *image, int check_on_first_use)
{
    mode = IN_PLACE;
    image_base = image;
    check_in_place = check_on_first_use;
    for (int i = 0; i < TABLE_ENTRIES; i++) {
        verified[i] = 0;
    }
}

/* An expert's extent: where it starts in the image file and its bytes. */
static void expert_extent(int layer, int expert, uint64_t *file_offset, uint64_t *bytes)
{
    const ColibriExpertGroup *group = colibri_layer_experts(layer);
    *file_offset = (uint64_t)COLIBRI_IMAGE_DATA_OFFSET + colibri_expert_offset(group, expert);
    *bytes = group->stride;
}

/* The expert's three matrices against their CRC-32s, wherever their bytes are (`data`: its first byte). */
static int check_expert(int layer, int expert, const uint8_t *data)
{
    const ColibriExpertGroup *group = colibri_layer_experts(layer);
    for (int i = 0; i < 3; i++) {
        int status = colibri_image_check_tensor_copy(image_base, colibri_expert_tensor(group, expert, i),
                                                     data + group->part[i].at);
        if (status != COLIBRI_OK) {
            return status;
        }
    }
    return COLIBRI_OK;
}

/* A read into a slot: short reads fail; the expert's CRC-32s are checked the first time it is brought
 * in (later reads of it come from the same read-only file, as the mapping's pages would). Runs where
 * the read finished: on an I/O thread, or on the caller. */
static void finish_read(Slot *slot, int64_t got)
{
    const int layer = slot->entry / EXPERTS_PER_LAYER, expert = slot->entry % EXPERTS_PER_LAYER;
    slot->got = got;
    if (got < (int64_t)slot->need) {
        slot->status = COLIBRI_ERR_READ;
    } else if (slot->check) {
        slot->status = check_expert(layer, expert, slot->buf + slot->skip);
    } else {
        slot->status = COLIBRI_OK;
    }
}

/* Called on an I/O thread when a queued read is done. The CRC-32 tables it uses were made at open,
 * when the loader checked the header, before any I/O thread started. */
static void read_done(int ticket, int64_t result, uint64_t read_us)
{
    slots[ticket].read_us = read_us;
    finish_read(&slots[ticket], result);
}

void colibri_experts_use_slots(const uint8_t *image, uint8_t *pool, int count, ColibriStorage *s, int prefetch,
                               colibri_eviction eviction)
{
    mode = SLOTS;
    policy = eviction;
    image_base = image;
    storage = s;
    storage->done = read_done;
    n_slots = count < MAX_SLOTS ? count : MAX_SLOTS;
    prefetch_on = prefetch && s->submit != NULL;
    for (int i = 0; i < TABLE_ENTRIES; i++) {
        slot_of[i] = -1;
        verified[i] = 0;
        uses[i] = 0;
    }
    for (int j = 0; j < n_slots; j++) {
        Slot *slot = &slots[j];
        slot->entry = -1;
        slot->pinned = 0;
        slot->buf = pool + (uint64_t)j * COLIBRI_EXPERT_SLOT_BYTES;
        slot->last_use = 0;
        slot->pending = 0;
        slot->prefetched = 0;
        slot->checked = 0;
    }
    token.k = 0;
}

/* Where the aligned read of an expert starts and how long it is; `skip`: the expert's first byte in it. */
static void aligned_read(int layer, int expert, uint64_t *offset, uint64_t *len, uint64_t *skip, uint64_t *need)
{
    uint64_t start, bytes;
    expert_extent(layer, expert, &start, &bytes);
    *offset = start / COLIBRI_STORAGE_ALIGN * COLIBRI_STORAGE_ALIGN;
    *skip = start - *offset;
    *need = *skip + bytes;
    *len = (*need + COLIBRI_STORAGE_ALIGN - 1) / COLIBRI_STORAGE_ALIGN * COLIBRI_STORAGE_ALIGN;
}

/* Point the slot's matrices at the expert's bytes in it: the same offsets as in the image. */
static void bind_slot(Slot *slot, const ColibriWeights *w, int layer, int expert, uint64_t skip)
{
    const ColibriExpert *mapped = in_image(w, layer, expert);
    uint64_t start, bytes;
    expert_extent(layer, expert, &start, &bytes);
    const uint8_t *origin = image_base + start;
    const uint8_t *data = slot->buf + skip;
    const ColibriMatrix *from[3] = {&mapped->w_gate, &mapped->w_up, &mapped->w_down};
    ColibriMatrix *to[3] = {&slot->w.w_gate, &slot->w.w_up, &slot->w.w_down};
    for (int i = 0; i < 3; i++) {
        to[i]->dtype = from[i]->dtype;
        to[i]->w = data + ((const uint8_t *)from[i]->w - origin);
        to[i]->d = from[i]->d == NULL ? NULL : (const uint16_t *)(data + ((const uint8_t *)from[i]->d - origin));
        to[i]->m = from[i]->m == NULL ? NULL : (const uint16_t *)(data + ((const uint8_t *)from[i]->m - origin));
    }
}

/* Wait for a slot's queued read, if any. */
static void settle(int j)
{
    Slot *slot = &slots[j];
    if (slot->pending) {
        const uint64_t t0 = storage->now_us();
        storage->wait(storage->ctx, j);
        stats.wait_us += storage->now_us() - t0;
        stats.read_us += slot->read_us;
        slot->pending = 0;
    }
}

/* The slot to give up that is not pinned (and, for prefetches, not being read); -1 if none. LRU: the
 * one used longest ago. One pool serves every MoE layer, and as the layers take turns the slot used
 * longest ago usually holds an expert of the layer now asking (its previous token's): a per-layer LRU
 * when there are top-k slots per layer or more. Below that, LRU evicts every expert before its layer
 * comes round again (0 % hits, measured: docs/performance.md), so LFU, the default, gives up the
 * expert used least often since start (the least recently used among equals): the pool keeps the
 * experts the router picks most. */
static int victim(int skip_pending)
{
    int best = -1;
    for (int j = 0; j < n_slots; j++) {
        const Slot *slot = &slots[j];
        if (slot->pinned || (skip_pending && slot->pending)) {
            continue;
        }
        if (best < 0) {
            best = j;
            continue;
        }
        const Slot *b = &slots[best];
        const uint32_t u = slot->entry >= 0 ? uses[slot->entry] : 0, ub = b->entry >= 0 ? uses[b->entry] : 0;
        if (policy == COLIBRI_EVICT_LFU && u != ub) {
            best = u < ub ? j : best;
        } else if (slot->last_use < b->last_use) {
            best = j;
        }
    }
    return best;
}

static void assign(int j, int32_t entry)
{
    Slot *slot = &slots[j];
    if (slot->entry >= 0) {
        slot_of[slot->entry] = -1;
    }
    slot->entry = entry;
    slot->checked = 0;
    slot->prefetched = 0;
    slot_of[entry] = j;
}

static void forget(int j)
{
    if (slots[j].entry >= 0) {
        slot_of[slots[j].entry] = -1;
    }
    slots[j].entry = -1;
}

/* Where slot j's expert is read from, and whether the read checks its CRC-32s. */
static void prepare_read(int j, uint64_t *offset, uint64_t *len)
{
    Slot *slot = &slots[j];
    aligned_read(slot->entry / EXPERTS_PER_LAYER, slot->entry % EXPERTS_PER_LAYER, offset, len, &slot->skip,
                 &slot->need);
    slot->check = !verified[slot->entry];
    slot->status = COLIBRI_ERR_READ;
}

/* Queue the read of slot j's expert on the I/O threads: whether it could. */
static int queue_read(int j)
{
    Slot *slot = &slots[j];
    uint64_t offset, len;
    prepare_read(j, &offset, &len);
    const int in_flight = storage->submit == NULL ? -1 : storage->submit(storage->ctx, j, slot->buf, offset, len);
    if (in_flight < 0) {
        return 0;
    }
    slot->pending = 1;
    stats.bytes_read += len;
    if ((uint64_t)in_flight > stats.max_in_flight) {
        stats.max_in_flight = (uint64_t)in_flight;
    }
    return 1;
}

/* Read slot j's expert here, waiting for it (no I/O thread, or its queue refused the read). */
static void read_here(int j)
{
    Slot *slot = &slots[j];
    uint64_t offset, len;
    prepare_read(j, &offset, &len);
    const uint64_t t0 = storage->now_us();
    const int64_t got = storage->read(storage->ctx, slot->buf, offset, len);
    finish_read(slot, got);
    const uint64_t us = storage->now_us() - t0;
    stats.wait_us += us;
    stats.read_us += us;
    if (got > 0) {
        stats.bytes_read += (uint64_t)got;
    }
    if (stats.max_in_flight == 0) {
        stats.max_in_flight = 1;
    }
}

/* Slot j's read is in: its matrices bound if it is good (the first time), else the slot emptied and
 * the read's error returned. */
static int take(int j)
{
    Slot *slot = &slots[j];
    if (slot->checked) {
        return COLIBRI_OK;
    }
    const int status = slot->status;
    if (status != COLIBRI_OK) {
        note_failure(status, slot->entry / EXPERTS_PER_LAYER, slot->entry % EXPERTS_PER_LAYER, slot->got, slot->need);
        forget(j);
        return status;
    }
    verified[slot->entry] = 1;
    slot->checked = 1;
    bind_slot(slot, token.w, slot->entry / EXPERTS_PER_LAYER, slot->entry % EXPERTS_PER_LAYER, slot->skip);
    return COLIBRI_OK;
}

int colibri_experts_acquire(const ColibriWeights *w, int layer, const int32_t *ids, int k)
{
    token.w = w;
    token.k = k;
    failure_len = 0;
    for (int i = 0; i < k; i++) {
        token.progress[i] = READY;
    }
    if (mode == IN_PLACE) {
        for (int i = 0; i < k; i++) {
            const int entry = layer * EXPERTS_PER_LAYER + ids[i];
            if (check_in_place && !verified[entry] && ranks_owns_expert(ids[i])) {
                uint64_t start, bytes;
                expert_extent(layer, ids[i], &start, &bytes);
                int status = check_expert(layer, ids[i], image_base + start);
                if (status != COLIBRI_OK) {
                    note_failure(status, layer, ids[i], (int64_t)bytes, bytes);
                    return status;
                }
                verified[entry] = 1;
            }
            token.expert[i] = in_image(w, layer, ids[i]);
        }
        return COLIBRI_OK;
    }
    /* The previous token's (or layer's) experts are done with; this token's hits are pinned first,
     * so that no miss evicts another expert of this token. */
    for (int j = 0; j < n_slots; j++) {
        slots[j].pinned = 0;
    }
    for (int i = 0; i < k; i++) {
        const int j = slot_of[layer * EXPERTS_PER_LAYER + ids[i]];
        if (j >= 0) {
            slots[j].pinned = 1;
        }
        uses[layer * EXPERTS_PER_LAYER + ids[i]]++;
    }
    /* Every miss gets its slot and its read is queued at once: the storage sees them all in flight
     * together, and the forward pass computes the hits meanwhile. */
    for (int i = 0; i < k; i++) {
        const int32_t entry = layer * EXPERTS_PER_LAYER + ids[i];
        if (!ranks_owns_expert(ids[i])) { /* computed on its own rank (ranks.h): no slot here */
            token.slot[i] = -1;
            token.expert[i] = in_image(w, layer, ids[i]);
            continue;
        }
        int j = slot_of[entry];
        if (j >= 0) {
            stats.hits++;
            if (slots[j].prefetched) {
                stats.prefetch_hits++;
                slots[j].prefetched = 0;
            }
        } else {
            stats.misses++;
            j = victim(0);
            settle(j); /* never overwrite a buffer being read into */
            assign(j, entry);
            slots[j].pinned = 1;
            if (!queue_read(j)) {
                read_here(j);
            }
        }
        token.slot[i] = j;
        if (slots[j].pending) {
            token.progress[i] = IN_FLIGHT;
            continue;
        }
        int status = take(j);
        if (status != COLIBRI_OK) {
            return status;
        }
        token.expert[i] = &slots[j].w;
    }
    for (int i = 0; i < k; i++) {
        if (token.slot[i] >= 0) {
            slots[token.slot[i]].last_use = ++clock_tick;
        }
    }
    return COLIBRI_OK;
}

int colibri_experts_next(int *rank, const ColibriExpert **out)
{
    /* Those in a slot already, in rank order. */
    for (int i = 0; i < token.k; i++) {
        if (token.progress[i] == READY) {
            token.progress[i] = GIVEN;
            *rank = i;
            *out = token.expert[i];
            return COLIBRI_OK;
        }
    }
    /* Then the first read to finish of those still in flight. */
    int tickets[MAX_K], ranks[MAX_K], n = 0;
    for (int i = 0; i < token.k; i++) {
        if (token.progress[i] == IN_FLIGHT) {
            tickets[n] = token.slot[i];
            ranks[n++] = i;
        }
    }
    if (n == 0) {
        *rank = -1;
        *out = NULL;
        return COLIBRI_OK; /* called more often than the token has experts */
    }
    const uint64_t t0 = storage->now_us();
    const int first = storage->wait_any(storage->ctx, tickets, n);
    stats.wait_us += storage->now_us() - t0;
    const int i = ranks[first], j = tickets[first];
    stats.reordered += ranks[0] < i; /* ranks[] ascends: a lower rank still in flight */
    slots[j].pending = 0;
    stats.read_us += slots[j].read_us;
    token.progress[i] = GIVEN;
    int status = take(j);
    if (status != COLIBRI_OK) {
        return status;
    }
    *rank = i;
    *out = &slots[j].w;
    return COLIBRI_OK;
}

int colibri_experts_prefetching(void)
{
    return mode == SLOTS && prefetch_on;
}

void colibri_experts_prefetch(int layer, const int32_t *ids, int k)
{
    if (!colibri_experts_prefetching()) {
        return;
    }
    for (int i = 0; i < k; i++) {
        const int32_t entry = layer * EXPERTS_PER_LAYER + ids[i];
        if (slot_of[entry] >= 0 || !ranks_owns_expert(ids[i])) {
            continue; /* there, or on its way; or another rank's */
        }
        const int j = victim(1);
        if (j < 0) {
            return;
        }
        Slot *slot = &slots[j];
        assign(j, entry);
        slot->last_use = ++clock_tick;
        slot->pinned = 1; /* not to be evicted by the next guess of this token */
        if (!queue_read(j)) {
            forget(j);
            return;
        }
        slot->prefetched = 1;
        stats.prefetches++;
    }
}

void colibri_experts_stats(ColibriCacheStats *out)
{
    /* Over several ranks, each caching its own experts: the counters summed over the ranks (every
     * rank calls this at the same point of a request), the most reads in flight this rank's. */
    *out = stats;
    out->slots = mode == SLOTS ? (uint64_t)n_slots : 0;
    uint64_t summed[] = {out->hits, out->misses, out->prefetches, out->prefetch_hits, out->bytes_read,
                         out->wait_us, out->read_us, out->reordered, out->slots};
    ranks_sum_u64(summed, (int)(sizeof summed / sizeof summed[0]));
    out->hits = summed[0];
    out->misses = summed[1];
    out->prefetches = summed[2];
    out->prefetch_hits = summed[3];
    out->bytes_read = summed[4];
    out->wait_us = summed[5];
    out->read_us = summed[6];
    out->reordered = summed[7];
    out->slots = summed[8];
}
