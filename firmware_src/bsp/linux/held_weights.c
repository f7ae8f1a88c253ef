/* How the weights are held (held_weights.h): the image opened (image_map.c), read into memory or
 * its resident part held, the expert slots and their storage set up, then the loader's checks. */
#include "held_weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "../../app/decode.h"
#include "../../runtime/expert_cache.h"
#include "../../runtime/image_loader.h"
#include "image_map.h"
#include "storage.h"

static Storage storage;

int open_image(const Options *opt, HeldWeights *w)
{
    w->image = opt->copy_weights ? copy_image(opt->weights_path, &w->image_len, &w->refused)
                                 : map_image(opt->weights_path, &w->image_len);
    if (w->image == NULL && w->refused == COLIBRI_OK) {
        colibri_report_error(COLIBRI_ERR_NO_IMAGE,
                             "cannot read the weight image file (missing, unreadable, empty, or not a regular file)");
        return -1;
    }
    return 0;
}

/* Under a budget with routed experts: a pool of slots, committed and locked now, that the expert
 * cache fills from storage. Returns 0, or -1 after an error frame. */
static int use_expert_slots(Options *opt, HeldWeights *w)
{
    ColibriWeightsInfo *info = &colibri_weights_info;
    /* Measured (docs/performance.md): with top-k slots per MoE layer or more, LRU keeps the experts
     * consecutive tokens share; below that, LRU evicts every expert before its layer comes round
     * again, so the pool keeps the most used (LFU). Guessing the next layer's experts (--prefetch 1)
     * did not pay at any budget once a token's misses were read side by side, nor with all of them in
     * flight at once: wrong guesses read bytes nobody uses and evict experts that would have hit. */
    const int roomy = w->slots >= colibri_cache_least_slots() * COLIBRI_N_MOE_LAYERS;
    if (opt->eviction < 0) {
        opt->eviction = roomy ? COLIBRI_EVICT_LRU : COLIBRI_EVICT_LFU;
    }
    if (opt->prefetch < 0) {
        opt->prefetch = 0;
    }
    const uint64_t pool_bytes = (uint64_t)w->slots * COLIBRI_EXPERT_SLOT_BYTES;
    w->pool = aligned_alloc(COLIBRI_STORAGE_ALIGN, (size_t)pool_bytes);
    /* One I/O thread per expert of a token: a layer's misses are all read at once. */
    if (w->pool == NULL || storage_open(&storage, opt->weights_path, (int)w->slots, COLIBRI_EXPERTS_PER_TOKEN) != 0) {
        colibri_report_error(COLIBRI_ERR_BUDGET, "cannot allocate the expert slots or open the image file for reading");
        return -1;
    }
    memset(w->pool, 0, (size_t)pool_bytes); /* committed now, never per token */
    if (mlock(w->pool, (size_t)pool_bytes) == 0) {
        info->locked_bytes += pool_bytes;
    } else {
        info->lock_refused = 1;
    }
    info->slots = (int32_t)w->slots;
    info->direct_io = storage.direct;
    info->prefetch = opt->prefetch && storage.iface.submit != NULL;
    info->eviction_lru = opt->eviction == COLIBRI_EVICT_LRU;
    colibri_experts_use_slots(w->image, w->pool, (int)w->slots, &storage.iface, opt->prefetch,
                              (colibri_eviction)opt->eviction);
    return 0;
}

int bind_weights(Options *opt, HeldWeights *w)
{
    /* The file's length against its header's, before anything reads past the header (a valid image
     * padded to gigabytes would be read whole into memory first). */
    const int length = w->refused != COLIBRI_OK ? w->refused : colibri_image_check_length(w->image, w->image_len);
    if (length != COLIBRI_OK) {
        return length;
    }
    ColibriWeightsInfo *info = &colibri_weights_info;
    info->mapped = !opt->copy_weights;
    info->budget = opt->budget;
    if (opt->resident) {
        /* Before the checks below read it; nothing reads the file afterwards. */
        if (read_image_into_memory(w->image, w->image_len) != 0) {
            colibri_report_error(COLIBRI_ERR_NO_IMAGE, "cannot read the weight image file into memory");
            return -1;
        }
        info->resident_bytes = w->image_len;
    }
    if (opt->budget > 0) {
        /* Before the checks below read the resident tensors. */
        const int64_t held = hold_resident(w->image, w->image_len, &info->lock_refused);
        if (held < 0) {
            colibri_report_error(COLIBRI_ERR_NO_IMAGE, "cannot read the resident weights from the weight image file");
            return -1;
        }
        info->locked_bytes = (uint64_t)held;
        info->resident_bytes = (uint64_t)held;
    }
    /* Mapped: the header, the directory and the resident tensors are checked now, each expert when
     * it is first brought in, so start-up does not grow with the experts. */
    const int status = colibri_load_checking(w->image, w->image_len,
                                             opt->copy_weights ? COLIBRI_CHECK_ALL : COLIBRI_CHECK_RESIDENT);
    if (status != 0) {
        return status;
    }
    if (opt->budget == 0) {
        colibri_experts_in_place(w->image, !opt->copy_weights);
        return 0;
    }
    if (w->slots == 0) {
        colibri_experts_in_place(w->image, 1); /* no routed experts: everything is resident */
    } else if (use_expert_slots(opt, w) != 0) {
        return -1;
    }
    if (info->lock_refused) {
        struct rlimit limit;
        unsigned long long soft = getrlimit(RLIMIT_MEMLOCK, &limit) == 0 ? (unsigned long long)limit.rlim_cur : 0;
        fprintf(stderr, "colibri: note: the resident weights and expert slots are NOT locked in RAM: mlock was "
                        "refused (RLIMIT_MEMLOCK %llu B; raise it with ulimit -l); under memory pressure they "
                        "may be paged out and read again\n", soft);
    }
    return 0;
}

void release_weights(const Options *opt, HeldWeights *w)
{
    if (w->pool != NULL) {
        storage_close(&storage);
        free(w->pool);
    }
    if (opt->copy_weights) {
        free(w->image);
    } else {
        unmap_image(w->image, w->image_len);
    }
}
