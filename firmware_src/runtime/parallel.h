/* Splitting work over threads: a persistent pool on Linux boards (parallel/pthread.c), a plain
 * loop on MCUs (parallel/none.c). Work is split by contiguous ranges, never by changing the order
 * of a sum, so results are the same bits at every thread count. */
#ifndef COLIBRI_PARALLEL_H
#define COLIBRI_PARALLEL_H

/* Start the pool with n threads in all (the caller included); returns the count in use. */
int parallel_start(int n_threads);

/* Call fn(ctx, begin, end) on disjoint ranges covering [0, n), one per thread, and wait for all. */
void parallel_for(void (*fn)(void *ctx, int begin, int end), void *ctx, int n);

int parallel_threads(void);

#endif
