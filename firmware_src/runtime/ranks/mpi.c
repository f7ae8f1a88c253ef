/* Several ranks over MPI (runtime/ranks.h): Open MPI's collectives, every rank in MPI_COMM_WORLD.
 * Products are gathered with MPI_Allgatherv, which only moves bytes: each value is the one its
 * rank computed, whole, so the ranks' results are the single board's bits. */
#define _POSIX_C_SOURCE 200809L

#include "../ranks.h"

#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, n_ranks = 1;
static int alone;             /* ranks_alone's depth: products computed whole here */
static int *counts, *displs;  /* per rank, for MPI_Allgatherv */
static float *packed, *gathered; /* a batch's rows: this rank's, then every rank's */
static size_t packed_floats, gathered_floats;

/* Out of memory for a gather buffer: no rank can go on alone, so every rank ends. */
static void *grown(void *buffer, size_t *have, size_t floats)
{
    if (floats <= *have) {
        return buffer;
    }
    void *more = realloc(buffer, floats * sizeof(float));
    if (more == NULL) {
        fprintf(stderr, "colibri: error: rank %d: out of memory for %zu floats of a gather\n", rank, floats);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    *have = floats;
    return more;
}

void ranks_start(int *argc, char ***argv)
{
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n_ranks);
    counts = malloc((size_t)n_ranks * sizeof *counts);
    displs = malloc((size_t)n_ranks * sizeof *displs);
    if (counts == NULL || displs == NULL) {
        fprintf(stderr, "colibri: error: rank %d: out of memory for %d ranks\n", rank, n_ranks);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank != 0) { /* one voice on the link: the other ranks' frames would repeat rank 0's */
        const int null = open("/dev/null", O_WRONLY);
        if (null >= 0) {
            dup2(null, STDOUT_FILENO);
            close(null);
        }
    }
}

int ranks_finish(int status)
{
    if (status != 0 && n_ranks > 1) {
        MPI_Abort(MPI_COMM_WORLD, status); /* the others may be waiting in a collective */
    }
    MPI_Finalize();
    return status;
}

int ranks_rank(void)
{
    return rank;
}

int ranks_count(void)
{
    return n_ranks;
}

void ranks_missing_rows(int rows, int begin, int end)
{
    fprintf(stderr, "colibri: error: rank %d: its weight image lacks rows %d..%d of a product of %d rows\n", rank, begin,
            end, rows);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

void ranks_fail(int code, const char *why)
{
    if (n_ranks == 1) {
        return;
    }
    char host[MPI_MAX_PROCESSOR_NAME];
    int len = 0;
    MPI_Get_processor_name(host, &len);
    fprintf(stderr, "colibri: error: rank %d on host %.*s: error %d: %s\n", rank, len, host, code, why);
    fflush(stdout); /* rank 0's error frame before the abort ends it */
    MPI_Abort(MPI_COMM_WORLD, 1);
}

int ranks_leader(void)
{
    return rank == 0;
}

int ranks_share_line(char *line, int len)
{
    MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (len >= 0) {
        MPI_Bcast(line, len + 1, MPI_CHAR, 0, MPI_COMM_WORLD);
    }
    return len;
}

static int first_row(int rows, int r)
{
    return (int)((int64_t)rows * r / n_ranks);
}

void ranks_rows(int rows, int *begin, int *end)
{
    const int split = !alone && n_ranks > 1;
    *begin = split ? first_row(rows, rank) : 0;
    *end = split ? first_row(rows, rank + 1) : rows;
}

/* Rank r's first row of a product of `rows` rows split in blocks of `unit` rows: a block is never
 * cut (unit 1: ranks_rows' rows; a head's rows: ranks_kv_groups' groups). */
static int first_row_of_blocks(int rows, int unit, int r)
{
    return first_row(rows / unit, r) * unit;
}

/* Every rank's rows of n_tok tokens (each `rows` floats) into out, each rank's rows its blocks of
 * `unit` rows (first_row_of_blocks). */
static void gather_blocks(float *out, int n_tok, int rows, int unit)
{
    for (int r = 0; r < n_ranks; r++) {
        counts[r] = (first_row_of_blocks(rows, unit, r + 1) - first_row_of_blocks(rows, unit, r)) * n_tok;
        displs[r] = first_row_of_blocks(rows, unit, r) * n_tok;
    }
    if (n_tok == 1) {
        MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, counts, displs, MPI_FLOAT, MPI_COMM_WORLD);
        return;
    }
    /* A batch: each token's rows are `rows` apart, so each rank's block is packed token by token. */
    const int begin = first_row_of_blocks(rows, unit, rank);
    const int mine = first_row_of_blocks(rows, unit, rank + 1) - begin;
    packed = grown(packed, &packed_floats, (size_t)mine * n_tok);
    gathered = grown(gathered, &gathered_floats, (size_t)rows * n_tok);
    for (int t = 0; t < n_tok; t++) {
        memcpy(packed + (int64_t)t * mine, out + (int64_t)t * rows + begin, (size_t)mine * sizeof(float));
    }
    MPI_Allgatherv(packed, mine * n_tok, MPI_FLOAT, gathered, counts, displs, MPI_FLOAT, MPI_COMM_WORLD);
    for (int r = 0; r < n_ranks; r++) {
        const int first = first_row_of_blocks(rows, unit, r);
        const int width = first_row_of_blocks(rows, unit, r + 1) - first;
        for (int t = 0; t < n_tok; t++) {
            memcpy(out + (int64_t)t * rows + first, gathered + displs[r] + (int64_t)t * width,
                   (size_t)width * sizeof(float));
        }
    }
}

void ranks_gather_rows(float *out, int n_tok, int rows)
{
    if (alone || n_ranks == 1) {
        return;
    }
    gather_blocks(out, n_tok, rows, 1);
}

void ranks_kv_groups(int groups, int *begin, int *end)
{
    *begin = first_row(groups, rank);
    *end = first_row(groups, rank + 1);
}

void ranks_gather_groups(float *out, int n_tok, int rows, int groups)
{
    if (n_ranks > 1) {
        gather_blocks(out, n_tok, rows, rows / groups);
    }
}

void ranks_alone(int on)
{
    alone += on ? 1 : -1;
}

static int owner(int64_t expert)
{
    return (int)(expert % n_ranks);
}

int ranks_owns_expert(int64_t expert)
{
    return owner(expert) == rank;
}

void ranks_share_terms(float *terms, const int32_t *ids, int k, int dim)
{
    if (n_ranks == 1) {
        return;
    }
    /* Each rank's rows in the order of ids; every rank knows the routing, so the counts. */
    int at = 0;
    for (int r = 0; r < n_ranks; r++) {
        displs[r] = at;
        counts[r] = 0;
        for (int i = 0; i < k; i++) {
            counts[r] += owner(ids[i]) == r ? dim : 0;
        }
        at += counts[r];
    }
    packed = grown(packed, &packed_floats, (size_t)k * dim);
    gathered = grown(gathered, &gathered_floats, (size_t)k * dim);
    int mine = 0;
    for (int i = 0; i < k; i++) {
        if (owner(ids[i]) == rank) {
            memcpy(packed + (int64_t)mine * dim, terms + (int64_t)i * dim, (size_t)dim * sizeof(float));
            mine++;
        }
    }
    MPI_Allgatherv(packed, mine * dim, MPI_FLOAT, gathered, counts, displs, MPI_FLOAT, MPI_COMM_WORLD);
    for (int r = 0, row = 0; r < n_ranks; r++) {
        for (int i = 0; i < k; i++) {
            if (owner(ids[i]) == r) {
                memcpy(terms + (int64_t)i * dim, gathered + (int64_t)row * dim, (size_t)dim * sizeof(float));
                row++;
            }
        }
    }
}

void ranks_sum_u64(uint64_t *values, int n)
{
    if (n_ranks > 1) {
        MPI_Allreduce(MPI_IN_PLACE, values, n, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    }
}
