/* Drives firmware_src/app/speculate.c's drafting alone: each argument is a context (token ids
 * separated by commas) and its draft, up to 8 tokens, is printed as one line (empty: no draft),
 * each from a fresh state whose draft length is already 8. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "speculate.h"

int main(int argc, char **argv)
{
    for (int a = 1; a < argc; a++) {
        int32_t history[256];
        int32_t len = 0;
        for (char *tok = strtok(argv[a], ","); tok != NULL && len < 256; tok = strtok(NULL, ",")) {
            history[len++] = (int32_t)strtol(tok, NULL, 10);
        }
        SpecState s = {0};
        s.length = 8;
        int32_t draft[8];
        const int n = spec_draft(&s, history, len, draft, 8);
        for (int i = 0; i < n; i++) {
            printf(i ? ",%d" : "%d", (int)draft[i]);
        }
        printf("\n");
    }
    return 0;
}
