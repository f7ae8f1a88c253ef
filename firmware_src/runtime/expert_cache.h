/* Routed experts for the forward pass: straight from the weight image (MCU flash, or a Linux board's
 * mapped image with no budget), or, under a memory budget, from one fixed pool of expert slots shared
 * by the MoE layers (least recently used first out), filled from the image file through a small
 * storage interface the BSP provides (bsp/linux/storage.c).
 *
 * The bytes the kernels read are the image's bytes either way (a slot holds an exact copy, checked
 * against the tensor's CRC-32 in the directory), so results are identical at any budget. */
#ifndef COLIBRI_EXPERT_CACHE_H
#define COLIBRI_EXPERT_CACHE_H

#include <stdint.h>

#include "model_def.h"

/* A storage read's result when the file changed under it (its size or modification time). */
#define COLIBRI_STORAGE_CHANGED (-1000000)

/* What the cache asks of the BSP. Reads are of the image file, at offsets and lengths that are
 * multiples of COLIBRI_STORAGE_ALIGN into buffers aligned the same way. */
typedef struct {
    /* Read `bytes` at file `offset` into dst on the caller's thread: the bytes read (fewer only at the
     * end of the file), or -errno when the read failed, or COLIBRI_STORAGE_CHANGED when the file is
     * no longer the one opened (truncated or rewritten since). */
    int64_t (*read)(void *ctx, uint8_t *dst, uint64_t offset, uint64_t bytes);
    /* Queue the same read for the I/O threads, tagged `ticket`; when it is done an I/O thread calls
     * done(ticket, bytes read or -1, the read's microseconds) and only then counts the ticket finished.
     * NULL: no I/O thread (reads on the caller, one after another; no prefetching). Returns the reads
     * then queued or under way, this one included (>= 1), or -1 when it cannot queue (the cache then
     * reads on the caller). */
    int (*submit)(void *ctx, int ticket, uint8_t *dst, uint64_t offset, uint64_t bytes);
    /* Block until the read queued with `ticket` is finished (done has returned). */
    void (*wait)(void *ctx, int ticket);
    /* Block until one of the n queued tickets is finished; of those finished, the index of the one
     * that finished first. */
    int (*wait_any)(void *ctx, const int *tickets, int n);
    uint64_t (*now_us)(void); /* a monotonic clock, for the time spent waiting on reads */
    void *ctx;
    void (*done)(int ticket, int64_t result, uint64_t read_us); /* set by colibri_experts_use_slots */
} ColibriStorage;

/* Counters since start (the stats frame reports the decode's share). */
typedef struct {
    uint64_t hits;           /* expert uses that found the expert in a slot (read or being read) */
    uint64_t misses;         /* expert uses that had to read it first */
    uint64_t prefetches;     /* reads queued from the next layer's router guess */
    uint64_t prefetch_hits;  /* of the hits, those on a prefetched expert's first use */
    uint64_t bytes_read;     /* from storage, aligned reads, prefetches included */
    uint64_t wait_us;        /* the forward pass blocked on reads (and their CRC-32 checks) */
    uint64_t read_us;        /* the reads' own durations, summed: above wait_us when reads overlap
                              * each other or the compute */
    uint64_t max_in_flight;  /* the most reads queued or under way at once */
    uint64_t reordered;      /* experts computed while one of lower rank was still being read */
    uint64_t slots;          /* the pool's slots (0: experts in place) */
} ColibriCacheStats;

/* Expert slots under a budget of `budget` bytes, from the constants compiled into this firmware
 * (compile/cache_plan.py computes the same): (budget - this rank's fixed_bytes, a single board's
 * COLIBRI_BUDGET_FIXED_BYTES) / COLIBRI_EXPERT_SLOT_BYTES, at most one per routed expert the rank
 * holds; 0 when budget is 0 (unlimited) or the model has no routed experts; -1 when the budget
 * cannot hold the fixed part and colibri_cache_least_slots() slots (one token's experts of one
 * layer at once). */
int64_t colibri_cache_slots_for_budget(uint64_t budget);

/* The fewest slots that run: a token's experts of one layer that live on this rank (a single
 * board's: COLIBRI_EXPERTS_PER_TOKEN); 0 without routed experts. */
int64_t colibri_cache_least_slots(void);

/* Experts read in place from `image` (the default, with every tensor checked at open). With
 * check_on_first_use, each expert is checked against its CRC-32 the first time it is used (an image
 * opened with COLIBRI_CHECK_RESIDENT). */
void colibri_experts_in_place(const uint8_t *image, int check_on_first_use);

/* Which expert a full pool gives up (expert_cache.c victim()). */
typedef enum {
    COLIBRI_EVICT_LFU = 0, /* the one used least often since start, least recently among equals (default) */
    COLIBRI_EVICT_LRU = 1, /* the one used least recently */
} colibri_eviction;

/* Experts read from storage into `slots` slots in `pool` (slots x COLIBRI_EXPERT_SLOT_BYTES bytes,
 * COLIBRI_STORAGE_ALIGN aligned, owned by the caller; tickets 0..slots-1); `image` is the opened,
 * mapped image (its directory holds the CRC-32s). With prefetch and a storage that can submit, the
 * next MoE layer's likely experts are read while this one computes. */
void colibri_experts_use_slots(const uint8_t *image, uint8_t *pool, int slots, ColibriStorage *storage, int prefetch,
                               colibri_eviction eviction);

/* Start bringing in the k experts `ids` of MoE layer `layer` for one token (k <=
 * COLIBRI_EXPERTS_PER_TOKEN): those in a slot are ready, the others are read all at once, on the I/O
 * threads where the storage has them. Then colibri_experts_next, k times, hands them out as they are
 * ready. COLIBRI_OK or the loader's error code (a failed read on the caller: COLIBRI_ERR_READ). */
int colibri_experts_acquire(const ColibriWeights *w, int layer, const int32_t *ids, int k);

/* The next of the acquired experts ready to compute, into *rank (its index in ids) and *out: first
 * those that were in a slot, in rank order, then the others in the order their reads finish (waiting
 * when none has). COLIBRI_OK or the loader's error code (a failed or short read:
 * COLIBRI_ERR_READ; a corrupted expert: COLIBRI_ERR_TENSOR_CHECKSUM). The pointer stays valid until
 * the next colibri_experts_acquire. */
int colibri_experts_next(int *rank, const ColibriExpert **out);

/* Whether colibri_experts_prefetch does anything (slots with I/O threads and prefetch on). */
int colibri_experts_prefetching(void);

/* Hint: MoE layer `layer` will probably want experts ids[0..k-1]; queue reads of those not in a slot,
 * into the least recently used slots that are neither pinned (the experts of the token being
 * computed) nor being read. */
void colibri_experts_prefetch(int layer, const int32_t *ids, int k);

void colibri_experts_stats(ColibriCacheStats *out);

/* Why the last colibri_experts_acquire / colibri_experts_next failed, naming the expert (layer,
 * expert id, its file bytes) and the cause (the read's errno, a short read, the file changed, a
 * CRC-32 mismatch), for the error frame; NULL when nothing failed since the last acquire. */
const char *colibri_experts_failure(void);

#endif
