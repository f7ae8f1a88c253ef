/* The weight image file as storage for the expert cache (runtime/expert_cache.h): pread, with
 * O_DIRECT where the file system takes it (so expert reads do not also fill the page cache), else
 * buffered reads whose pages are dropped again; and a few I/O threads, so that a layer's misses are
 * all read at once (the disk answers several reads in flight faster than one after the other). */
#ifndef COLIBRI_BSP_LINUX_STORAGE_H
#define COLIBRI_BSP_LINUX_STORAGE_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "../../runtime/expert_cache.h"

typedef struct {
    int ticket;
    uint8_t *dst;
    uint64_t offset, bytes;
} StorageRequest;

typedef struct {
    int fd;
    int direct;              /* 1: O_DIRECT reads */
    off_t size;              /* the file's size and modification time when opened: a read after */
    struct timespec mtime;   /* either changed fails (storage.c unchanged()) */
    int n_tickets;
    /* The I/O threads' shared queue (a ring of n_tickets: a ticket is queued at most once at a time). */
    pthread_t *threads;
    int n_threads;           /* running */
    pthread_mutex_t lock;
    pthread_cond_t wake, finished;
    StorageRequest *queue;
    int head, count;
    int busy;                /* reads queued or being read */
    uint8_t *done;           /* per ticket: 1 once its read and the cache's `done` have run */
    uint64_t *finished_as;   /* per ticket: its place in the order reads finished (1, 2, ...) */
    uint64_t n_finished;
    int stopping;
    ColibriStorage iface;    /* what the runtime calls */
} Storage;

/* Open `path` for expert reads (O_DIRECT if a first aligned read works, else buffered, saying so on
 * stderr), with tickets 0..n_tickets-1 and io_threads threads for queued reads (0: every read on the
 * caller). Allocates everything it needs here, once. Returns 0 or -1. */
int storage_open(Storage *s, const char *path, int n_tickets, int io_threads);

void storage_close(Storage *s);

#endif
