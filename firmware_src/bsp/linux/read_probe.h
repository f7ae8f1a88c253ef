/* The memory read bandwidth of the machine the firmware runs on, measured inside the firmware
 * (bench asks for it next to every decode run: --probe-bandwidth). Linux boards only: it forks. */
#ifndef COLIBRI_READ_PROBE_H
#define COLIBRI_READ_PROBE_H

#include <stdint.h>

typedef struct {
    uint64_t bytes_per_s; /* the best pass */
    uint64_t mib;         /* buffer size */
    int threads;          /* threads that read it (as many as the decode uses) */
    int passes;
} ReadProbe;

/* A buffer size well above the last-level cache: twice the largest cache Linux reports for cpu0,
 * at least 256 MiB, at most a quarter of the physical memory. */
uint64_t read_probe_default_mib(void);

/* Read a buffer of `mib` MiB with `threads` threads, best of a few passes, in a forked child so
 * the buffer never counts in this process's peak RSS (VmHWM). Must be called before this process
 * starts its own thread pool (a fork copies only the calling thread). Returns 0 and fills *out,
 * or -1 if the child could not be started or could not allocate the buffer. */
int read_probe_run(int threads, uint64_t mib, ReadProbe *out);

#endif
