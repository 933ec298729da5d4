/* Process bootstrap over MPI: one process per GPU, launched by mpirun.
 *
 * ina_bootstrap_init initializes MPI (MPI_THREAD_MULTIPLE when the library offers it;
 * the level granted is reported), finds this rank's place (world rank/size, node id,
 * rank within the node) and selects its GPU: device = local_rank % device_count when
 * CUDA devices exist, otherwise the rank runs on the CPU (device -1).
 *
 * Nodes come from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). The environment setting
 * INA_RANKS_PER_NODE=N overrides that split so one host behaves as several nodes of N
 * ranks each (node id = world rank / N, local rank = world rank % N): hierarchical code
 * can then be tested on one machine. N must divide the world size.
 *
 * Communicators (comm/comm.h) are made from a bootstrap: the world, the ranks of this
 * node, or any split by (color, key) in MPI_Comm_split's sense. The usual parallel
 * layout is one call, ina_bootstrap_split_tp_dp.
 *
 * MPI_COMM_WORLD gets the MPI_ERRORS_RETURN handler, so MPI failures come back as
 * errors instead of ending the process.
 *
 * Ownership: the caller owns the bootstrap and finalizes it after destroying every
 * communicator made from it. Thread safety: create and finalize on the main thread;
 * the accessors are thread-safe. */
#ifndef INA_COMM_BOOTSTRAP_H
#define INA_COMM_BOOTSTRAP_H

#include "comm/comm.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_bootstrap ina_bootstrap_t;

/* argc/argv may be NULL. Initializes MPI unless it already is (then finalize leaves it
 * alone). On failure *out = NULL. */
ina_status_t ina_bootstrap_init(int *argc, char ***argv, ina_bootstrap_t **out);
/* Frees the bootstrap and finalizes MPI if ina_bootstrap_init initialized it. NULL is a
 * no-op. */
void ina_bootstrap_finalize(ina_bootstrap_t *boot);
/* Ends every rank of the job (MPI_Abort): the caller's choice after an unrecoverable
 * communicator error such as a timeout. Does not return. */
void ina_bootstrap_abort(const ina_bootstrap_t *boot, int code);

int ina_bootstrap_world_rank(const ina_bootstrap_t *boot);
int ina_bootstrap_world_size(const ina_bootstrap_t *boot);
int ina_bootstrap_node_id(const ina_bootstrap_t *boot);
int ina_bootstrap_node_count(const ina_bootstrap_t *boot);
int ina_bootstrap_local_rank(const ina_bootstrap_t *boot);
int ina_bootstrap_local_size(const ina_bootstrap_t *boot);
/* The CUDA device this rank selected, or -1 when it runs on the CPU. */
int ina_bootstrap_device(const ina_bootstrap_t *boot);
/* 1 when MPI granted MPI_THREAD_MULTIPLE (operations on distinct communicators may then
 * run from different threads), 0 otherwise. */
int ina_bootstrap_thread_multiple(const ina_bootstrap_t *boot);

/* A communicator over every rank. */
ina_status_t ina_bootstrap_world_comm(const ina_bootstrap_t *boot, ina_comm_backend_t backend,
                                      ina_comm_t **out);
/* A communicator over the ranks of this node (INA_RANKS_PER_NODE respected), ordered by
 * local rank. */
ina_status_t ina_bootstrap_node_comm(const ina_bootstrap_t *boot, ina_comm_backend_t backend,
                                     ina_comm_t **out);
/* Collective over the world: ranks with equal color >= 0 form one communicator, ordered
 * by key (ties by world rank). A rank passing color < 0 takes part in no group and gets
 * *out = NULL with INA_OK. */
ina_status_t ina_bootstrap_split(const ina_bootstrap_t *boot, int color, int key,
                                 ina_comm_backend_t backend, ina_comm_t **out);
/* The parallel layout: world = tp_size * dp_size. TP groups are runs of tp_size
 * consecutive world ranks (so they stay within a node when tp_size divides the node
 * size); DP groups take one rank of each TP group (world ranks congruent mod tp_size).
 * Expert parallelism spans the world communicator. Either output may be NULL when not
 * wanted. On failure both are NULL. */
ina_status_t ina_bootstrap_split_tp_dp(const ina_bootstrap_t *boot, int tp_size,
                                       ina_comm_backend_t backend, ina_comm_t **tp_out,
                                       ina_comm_t **dp_out);

#ifdef __cplusplus
}
#endif
#endif
