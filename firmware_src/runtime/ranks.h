/* One model over several ranks (MPI processes, on one machine or several boards): ranks/mpi.c on
 * boards whose runner launches ranks, ranks/none.c (one rank, nothing shared) everywhere else.
 *
 * Every rank holds the whole state (the residual, the sampler) and runs the same forward pass; the
 * weight products are what is split. A dense matrix is split by output rows,
 * each row computed whole on one rank and gathered, so no sum changes order; a routed expert is
 * computed on the rank it lives on (expert % ranks), its weighted output gathered and summed in
 * the single board's order. An attention layer the plan splits by KV group (model_def.h's
 * colibri_layer_kv_split) is computed on the rank that owns the group: its heads' queries, keys
 * and values, its part of the KV cache, its heads' attention; the heads' outputs are then
 * gathered. So every rank ends each product with the single board's bits. Rank 0
 * alone reads requests (and shares each line) and writes frames; the others are silent. */
#ifndef COLIBRI_RANKS_H
#define COLIBRI_RANKS_H

#include <stdint.h>

/* Join the ranks (MPI_Init) before anything is written; silences stdout on every rank but 0. */
void ranks_start(int *argc, char ***argv);

/* Leave them with the process's exit status: a failure ends every rank, so none waits for it. */
int ranks_finish(int status);

/* This process's rank (0 on a single board) and the number of ranks (1). */
int ranks_rank(void);
int ranks_count(void);

/* A split product needs rows [begin, end) that this rank's weight image does not hold (its image and
 * the runtime disagree on a split: a defect): every rank ends, saying so. */
void ranks_missing_rows(int rows, int begin, int end);

/* This rank cannot go on with the request every rank is computing (an expert it could not bring
 * in: the loader's code and why): on several ranks it says so on stderr (which mpirun forwards; only rank 0 writes frames),
 * naming its rank and host, and ends every rank, which would otherwise wait for its share in a
 * gather until the run's timeout. On a single board it returns: the error frame says it. */
void ranks_fail(int code, const char *why);

/* Whether this rank talks the link protocol (rank 0; the only rank of a single board). */
int ranks_leader(void);

/* The leader's request line (its length, or -1 at the end of its stdin) on every rank. */
int ranks_share_line(char *line, int len);

/* This rank's output rows [*begin, *end) of a product with `rows` rows: all of them while
 * ranks_alone is on, or on a single board. */
void ranks_rows(int rows, int *begin, int *end);

/* Every rank's rows into out (n_tok tokens of `rows` floats each), after each computed its own. */
void ranks_gather_rows(float *out, int n_tok, int rows);

/* This rank's KV groups [*begin, *end) of an attention layer of `groups` KV heads split by KV group:
 * groups*r/N up to groups*(r+1)/N (all of them on a single board). */
void ranks_kv_groups(int groups, int *begin, int *end);

/* Every rank's heads into out (n_tok tokens of `rows` floats, `groups` equal blocks of rows each),
 * after each computed the blocks of its own KV groups (ranks_kv_groups). */
void ranks_gather_groups(float *out, int n_tok, int rows, int groups);

/* On (1): products are computed whole by this rank (an expert where it lives); off (0): split. */
void ranks_alone(int on);

/* Whether routed expert `expert` is computed on this rank. */
int ranks_owns_expert(int64_t expert);

/* The k weighted expert outputs (rows of dim floats, row i for expert ids[i]) from the ranks that
 * computed them into every rank's terms, before they are summed in order. */
void ranks_share_terms(float *terms, const int32_t *ids, int k, int dim);

/* The ranks' values summed into every rank's `values` (n of them; the same call on every rank):
 * the expert cache's counters, which each rank keeps for its own experts. */
void ranks_sum_u64(uint64_t *values, int n);

#endif
