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
    int huge_pages;       /* 1: the buffer was advised into 2 MiB pages, as weights read into memory are */
} ReadProbe;

/* A buffer size well above the last-level cache: twice the largest cache Linux reports for cpu0,
 * at least 256 MiB, at most a quarter of the physical memory. */
uint64_t read_probe_default_mib(void);

/* Read a buffer of `mib` MiB with `threads` threads, best of a few passes, in a forked child so
 * the buffer never counts in this process's peak RSS (VmHWM). Must be called before this process
 * starts its own thread pool (a fork copies only the calling thread). huge_pages: the buffer in 2 MiB
 * pages (where the kernel gives them), as the decode's weights are when read into memory: one core
 * read 32 GB/s from those and 20 from 4 KiB pages on the build machine. Returns 0 and fills *out,
 * or -1 if the child could not be started or could not allocate the buffer. */
int read_probe_run(int threads, uint64_t mib, int huge_pages, ReadProbe *out);

/* The storage read bandwidth of the weight image's file: how fast experts can come in. */
typedef struct {
    uint64_t bytes_per_s;
    uint64_t bytes;  /* read in all */
    uint64_t chunk;  /* bytes per pread */
    int direct;      /* 1: O_DIRECT; 0: buffered reads after dropping the file from the page cache */
} StorageProbe;

/* pread `chunk`-byte pieces (a multiple of 4096) of `path` one after another, `mib` MiB in all (at
 * most the file), with O_DIRECT where the file system allows it, else after posix_fadvise(DONTNEED)
 * so the reads come from storage, not from the page cache. Returns 0 and fills *out, or -1. */
int storage_probe_run(const char *path, uint64_t mib, uint64_t chunk, StorageProbe *out);

#endif
