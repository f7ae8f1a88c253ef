#define _GNU_SOURCE /* O_DIRECT */
#include "storage.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../app/bsp.h"

/* Whether the open file is still the one opened: its size and modification time as they were. A
 * rename over the path leaves the open file as it was (this firmware reads on from it); a truncation
 * or a write into it is seen here, after the read, so a read that raced with either is refused. */
static int unchanged(const Storage *s)
{
    struct stat st;
    return fstat(s->fd, &st) == 0 && st.st_size == s->size && st.st_mtim.tv_sec == s->mtime.tv_sec &&
           st.st_mtim.tv_nsec == s->mtime.tv_nsec;
}

/* pread until `bytes` are in or the file ends: the bytes read, -errno, or COLIBRI_STORAGE_CHANGED.
 * Buffered reads drop their pages from the page cache afterwards: the slot holds the copy, the cache
 * need not hold another. */
static int64_t read_at(Storage *s, uint8_t *dst, uint64_t offset, uint64_t bytes)
{
    uint64_t done = 0;
    while (done < bytes) {
        ssize_t n = pread(s->fd, dst + done, (size_t)(bytes - done), (off_t)(offset + done));
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return errno > 0 ? -(int64_t)errno : -EIO;
        }
        if (n == 0) {
            break; /* the end of the file */
        }
        done += (uint64_t)n;
    }
    if (!s->direct) {
        posix_fadvise(s->fd, (off_t)offset, (off_t)bytes, POSIX_FADV_DONTNEED);
    }
    if (!unchanged(s)) {
        return COLIBRI_STORAGE_CHANGED;
    }
    return (int64_t)done;
}

static int64_t iface_read(void *ctx, uint8_t *dst, uint64_t offset, uint64_t bytes)
{
    return read_at(ctx, dst, offset, bytes);
}

/* Queue a read for the I/O threads: the reads then queued or under way (this one included), or -1. */
static int iface_submit(void *ctx, int ticket, uint8_t *dst, uint64_t offset, uint64_t bytes)
{
    Storage *s = ctx;
    if (ticket < 0 || ticket >= s->n_tickets) {
        return -1;
    }
    pthread_mutex_lock(&s->lock);
    if (s->count == s->n_tickets || !s->done[ticket]) {
        pthread_mutex_unlock(&s->lock);
        return -1;
    }
    StorageRequest *r = &s->queue[(s->head + s->count) % s->n_tickets];
    r->ticket = ticket;
    r->dst = dst;
    r->offset = offset;
    r->bytes = bytes;
    s->count++;
    s->busy++;
    s->done[ticket] = 0;
    const int busy = s->busy;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
    return busy;
}

static void iface_wait(void *ctx, int ticket)
{
    Storage *s = ctx;
    pthread_mutex_lock(&s->lock);
    while (!s->done[ticket]) {
        pthread_cond_wait(&s->finished, &s->lock);
    }
    pthread_mutex_unlock(&s->lock);
}

/* The first of the tickets to finish: of those finished, the one that finished earliest. */
static int iface_wait_any(void *ctx, const int *tickets, int n)
{
    Storage *s = ctx;
    int first = -1;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        for (int i = 0; i < n; i++) {
            const int t = tickets[i];
            if (s->done[t] && (first < 0 || s->finished_as[t] < s->finished_as[tickets[first]])) {
                first = i;
            }
        }
        if (first >= 0) {
            break;
        }
        pthread_cond_wait(&s->finished, &s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    return first;
}

static void *io_thread(void *arg)
{
    Storage *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        while (s->count == 0 && !s->stopping) {
            pthread_cond_wait(&s->wake, &s->lock);
        }
        if (s->count == 0) {
            pthread_mutex_unlock(&s->lock);
            return NULL;
        }
        StorageRequest r = s->queue[s->head];
        s->head = (s->head + 1) % s->n_tickets;
        s->count--;
        pthread_mutex_unlock(&s->lock);

        const uint64_t t0 = bsp_time_us();
        int64_t got = read_at(s, r.dst, r.offset, r.bytes);
        /* The cache checks a new expert's CRC-32 here, on this thread, while the forward pass computes. */
        s->iface.done(r.ticket, got, bsp_time_us() - t0);

        pthread_mutex_lock(&s->lock);
        s->done[r.ticket] = 1;
        s->finished_as[r.ticket] = ++s->n_finished;
        s->busy--;
        pthread_cond_broadcast(&s->finished);
        pthread_mutex_unlock(&s->lock);
    }
}

/* Whether an O_DIRECT read of the file's first block works (some file systems refuse it at open,
 * others only at the first read). */
static int direct_works(int fd)
{
    void *block = NULL;
    if (posix_memalign(&block, COLIBRI_STORAGE_ALIGN, COLIBRI_STORAGE_ALIGN) != 0) {
        return 0;
    }
    ssize_t n = pread(fd, block, COLIBRI_STORAGE_ALIGN, 0);
    free(block);
    return n > 0;
}

int storage_open(Storage *s, const char *path, int n_tickets, int io_threads)
{
    memset(s, 0, sizeof *s);
    s->fd = open(path, O_RDONLY | O_DIRECT);
    s->direct = 1;
    if (s->fd >= 0 && !direct_works(s->fd)) {
        close(s->fd);
        s->fd = -1;
    }
    if (s->fd < 0) {
        s->direct = 0;
        s->fd = open(path, O_RDONLY);
        if (s->fd < 0) {
            return -1;
        }
        fprintf(stderr, "colibri: note: this file system refuses O_DIRECT reads of %s: experts are read through "
                        "the page cache (each read's pages are dropped again)\n", path);
    }
    struct stat st;
    if (fstat(s->fd, &st) != 0) {
        close(s->fd);
        s->fd = -1;
        return -1;
    }
    s->size = st.st_size;
    s->mtime = st.st_mtim;
    s->n_tickets = n_tickets > 0 ? n_tickets : 1;
    s->queue = calloc((size_t)s->n_tickets, sizeof *s->queue);
    s->done = malloc((size_t)s->n_tickets);
    s->finished_as = calloc((size_t)s->n_tickets, sizeof *s->finished_as);
    s->threads = calloc(io_threads > 0 ? (size_t)io_threads : 1, sizeof *s->threads);
    if (s->queue == NULL || s->done == NULL || s->finished_as == NULL || s->threads == NULL) {
        return -1;
    }
    memset(s->done, 1, (size_t)s->n_tickets);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake, NULL);
    pthread_cond_init(&s->finished, NULL);
    s->iface.read = iface_read;
    s->iface.submit = NULL;
    s->iface.wait = iface_wait;
    s->iface.wait_any = iface_wait_any;
    s->iface.now_us = bsp_time_us;
    s->iface.ctx = s;
    for (int i = 0; i < io_threads; i++) {
        if (pthread_create(&s->threads[s->n_threads], NULL, io_thread, s) != 0) {
            break;
        }
        s->n_threads++;
    }
    if (s->n_threads < io_threads) {
        fprintf(stderr, "colibri: note: %d of %d I/O threads started (pthread_create failed): %s\n", s->n_threads,
                io_threads, s->n_threads > 0 ? "fewer expert reads in flight at once"
                                             : "experts are read when needed, one after another, without prefetching");
    }
    if (s->n_threads > 0) {
        s->iface.submit = iface_submit;
    }
    return 0;
}

void storage_close(Storage *s)
{
    if (s->n_threads > 0) {
        /* The threads finish what is queued (reads still in flight after an error) and stop. */
        pthread_mutex_lock(&s->lock);
        s->stopping = 1;
        pthread_cond_broadcast(&s->wake);
        pthread_mutex_unlock(&s->lock);
        for (int i = 0; i < s->n_threads; i++) {
            pthread_join(s->threads[i], NULL);
        }
        s->n_threads = 0;
    }
    if (s->fd >= 0) {
        close(s->fd);
        s->fd = -1;
    }
    free(s->queue);
    free(s->done);
    free(s->finished_as);
    free(s->threads);
    s->queue = NULL;
    s->done = NULL;
    s->finished_as = NULL;
    s->threads = NULL;
}
