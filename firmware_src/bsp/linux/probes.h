/* The probes the Linux firmware runs before it reads the weights: the memory read bandwidth (a
 * request's probe_mib) and the image file's storage read bandwidth (--probe-storage), each reported
 * in its frame. */
#ifndef COLIBRI_BSP_LINUX_PROBES_H
#define COLIBRI_BSP_LINUX_PROBES_H

#include "../../app/decode.h"
#include "options.h"

/* The probes the first request and the command line ask for, each reported in its frame: 0, or -1
 * after an error frame. Run before the weight image is read and before the thread pool starts (a
 * fork copies only this thread): the child then copies almost nothing, and the board never holds
 * the probe's buffer and the weights at once. */
int run_probes(const Options *opt, const ColibriRequest *req);

#endif
