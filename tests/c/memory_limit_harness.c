/* Prints what bsp/linux/memory_limit.c finds under a fake root (argv[1]): "SOURCE BYTES WHERE", or
 * "none" when it finds nothing; tests/compile/test_memory_auto.py compares it with cache_plan.find_memory. */
#include <stdio.h>

#include "memory_limit.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: memory_limit_harness ROOT\n");
        return 2;
    }
    MemoryFound found;
    if (memory_found(argv[1], &found) != 0) {
        printf("none\n");
        return 0;
    }
    printf("%s %llu %s\n", memory_source_name(found.source), (unsigned long long)found.bytes, found.where);
    return 0;
}
