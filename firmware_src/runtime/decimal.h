/* A uint64_t as decimal text, with no printf: the frame writer (app/protocol.c), the expert cache's
 * failure text and the Linux image fault handler (a signal handler, where printf is not safe) all
 * write numbers this one way. */
#ifndef COLIBRI_DECIMAL_H
#define COLIBRI_DECIMAL_H

#include <stdint.h>

/* The longest uint64_t is 20 digits; with the terminating NUL, 21 bytes. */
#define DECIMAL_U64_BYTES 21

/* Writes v's digits and a NUL into out; returns how many digits. */
static inline int decimal_u64(char out[DECIMAL_U64_BYTES], uint64_t v)
{
    char reversed[DECIMAL_U64_BYTES];
    int n = 0;
    do {
        reversed[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (int i = 0; i < n; i++) {
        out[i] = reversed[n - 1 - i];
    }
    out[n] = '\0';
    return n;
}

#endif
