/* A single board: one rank, holding and computing everything (runtime/ranks.h). */
#include "../ranks.h"

void ranks_start(int *argc, char ***argv)
{
    (void)argc, (void)argv;
}

int ranks_finish(int status)
{
    return status;
}

int ranks_rank(void)
{
    return 0;
}

int ranks_count(void)
{
    return 1;
}

void ranks_missing_rows(int rows, int begin, int end)
{
    (void)rows, (void)begin, (void)end; /* a single board holds every row */
}

void ranks_fail(int code, const char *why)
{
    (void)code, (void)why; /* a single board's error frame says it */
}

int ranks_leader(void)
{
    return 1;
}

int ranks_share_line(char *line, int len)
{
    (void)line;
    return len;
}

void ranks_rows(int rows, int *begin, int *end)
{
    *begin = 0;
    *end = rows;
}

void ranks_gather_rows(float *out, int n_tok, int rows)
{
    (void)out, (void)n_tok, (void)rows;
}

void ranks_kv_groups(int groups, int *begin, int *end)
{
    *begin = 0;
    *end = groups;
}

void ranks_gather_groups(float *out, int n_tok, int rows, int groups)
{
    (void)out, (void)n_tok, (void)rows, (void)groups;
}

void ranks_alone(int on)
{
    (void)on;
}

int ranks_owns_expert(int64_t expert)
{
    (void)expert;
    return 1;
}

void ranks_share_terms(float *terms, const int32_t *ids, int k, int dim)
{
    (void)terms, (void)ids, (void)k, (void)dim;
}

void ranks_sum_u64(uint64_t *values, int n)
{
    (void)values, (void)n;
}
