/* How the Linux firmware holds the weights: the image file mapped (or copied), checked and bound;
 * unlimited, read into memory where the whole model fits; under a budget its resident part held in
 * RAM and the routed experts brought into a locked pool of slots from storage.c's reads. */
#ifndef COLIBRI_BSP_LINUX_HELD_WEIGHTS_H
#define COLIBRI_BSP_LINUX_HELD_WEIGHTS_H

#include <stdint.h>

#include "options.h"

/* The weights as this process holds them. */
typedef struct {
    uint8_t *image;     /* the image file, mapped read-only (or copied: --copy-weights) */
    uint64_t image_len;
    int refused;        /* the loader's status for a file refused before it was read (copy_image), else 0 */
    int64_t slots;      /* expert slots the budget leaves (plan_budget); 0: every expert in place */
    uint8_t *pool;      /* their memory; NULL: the experts are read in place through the mapping */
} HeldWeights;

/* The image file mapped read-only, or read into memory (--copy-weights): 0, or -1 after an error
 * frame. */
int open_image(const Options *opt, HeldWeights *w);

/* The image checked and bound, under a budget its resident part held in RAM and its experts
 * brought into slots. Returns the loader's status (0: loaded; else reported by the caller), or -1
 * after an error frame when the slots cannot be set up. */
int bind_weights(Options *opt, HeldWeights *w);

/* The slots freed, the image unmapped (or freed) and its file closed. */
void release_weights(const Options *opt, HeldWeights *w);

#endif
