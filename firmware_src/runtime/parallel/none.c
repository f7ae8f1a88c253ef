/* Single-threaded boards: parallel_for is one call over the whole range. */
#include "../parallel.h"

int parallel_start(int n_threads)
{
    (void)n_threads;
    return 1;
}

void parallel_for(void (*fn)(void *ctx, int begin, int end), void *ctx, int n)
{
    fn(ctx, 0, n);
}

int parallel_threads(void)
{
    return 1;
}
