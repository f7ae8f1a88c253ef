/* Drives firmware_src/app/speculate.c's drafting alone, one state for all the arguments, in order:
 *   cost=C1,C2,...  what passes of 1, 2, ... tokens cost (default: all 1.0, so drafting is free
 *                   and a draft is as long as it can be);
 *   taken=N         N tokens of the last draft were taken (spec_taken);
 *   anything else   a context (token ids separated by commas): its draft, up to 7 tokens, printed
 *                   as one line (empty: no draft). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "speculate.h"

#define MAX_DRAFT 7

int main(int argc, char **argv)
{
    SpecState s = {0};
    float cost[MAX_DRAFT + 1];
    for (int i = 0; i <= MAX_DRAFT; i++) {
        cost[i] = 1.0f;
    }
    int last = 0;
    for (int a = 1; a < argc; a++) {
        if (strncmp(argv[a], "cost=", 5) == 0) {
            int i = 0;
            for (char *c = strtok(argv[a] + 5, ","); c != NULL && i <= MAX_DRAFT; c = strtok(NULL, ",")) {
                cost[i++] = strtof(c, NULL);
            }
            continue;
        }
        if (strncmp(argv[a], "taken=", 6) == 0) {
            spec_taken(&s, last, atoi(argv[a] + 6));
            continue;
        }
        int32_t history[256];
        int32_t len = 0;
        for (char *tok = strtok(argv[a], ","); tok != NULL && len < 256; tok = strtok(NULL, ",")) {
            history[len++] = (int32_t)strtol(tok, NULL, 10);
        }
        int32_t draft[MAX_DRAFT];
        last = spec_draft(&s, history, len, draft, MAX_DRAFT, cost);
        for (int i = 0; i < last; i++) {
            printf(i ? ",%d" : "%d", (int)draft[i]);
        }
        printf("\n");
    }
    return 0;
}
