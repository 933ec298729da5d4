/* The parallel layout of an mpirun job (`--tp T`, `--ep` of `ina generate` and
 * `ina-agent`): consecutive ranks form tensor-parallel groups of T ranks;
 * with expert parallelism the groups split the routed experts, and the ranks holding the
 * same tensor slice form an expert-parallel group. Without it every rank must be in the
 * one tensor-parallel group. Every rank runs the same batches.
 *
 * Ownership: start/end pair (end frees the communicators and finalizes MPI). Thread
 * safety: one thread. */
#ifndef INA_MODEL_PARALLEL_JOB_H
#define INA_MODEL_PARALLEL_JOB_H

#include <stdint.h>

#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "core/status.h"
#include "model/config.h"
#include "model/weights.h"

typedef struct ina_parallel_job {
  ina_bootstrap_t *boot;
  ina_comm_t *tp;    /* this rank's tensor-parallel group; NULL when tp == 1 */
  ina_comm_t *ep;    /* its expert-parallel group; NULL without expert parallelism */
  ina_comm_t *world; /* every rank, for the caller's own messages */
  int32_t rank, size;
  int32_t tp_size, groups; /* groups = size / tp_size */
} ina_parallel_job_t;

/* Expert parallelism of ina_parallel_job_start: none, over every group, or a degree the
 * command line named (`--ep E`), which must then be the number of groups. */
enum { INA_PARALLEL_EP_NONE = 0, INA_PARALLEL_EP_ALL = -1 };

/* Collective: starts MPI (once per process) and forms the groups, their communicators on
 * `backend` (MPI for CPU engines; NCCL for CUDA engines, on the GPU the bootstrap chose
 * for this rank: ina_parallel_job_device). The world communicator is MPI always (host
 * messages). `expert_parallel`: INA_PARALLEL_EP_NONE, INA_PARALLEL_EP_ALL or a degree E > 0.
 * On a layout the ranks cannot take (size not a multiple of tp, several groups without
 * expert parallelism, E not the number of groups) INA_ERR_INVALID_ARGUMENT naming the
 * numbers; *out is then still to be ended. */
ina_status_t ina_parallel_job_start(int32_t tp_size, int32_t expert_parallel, ina_comm_backend_t backend,
                                    ina_parallel_job_t *out);
/* Parses the optional degree of a `--ep` option parsed by getopt_long as
 * optional_argument: `--ep` (every group: INA_PARALLEL_EP_ALL), `--ep=E`, or `--ep E`,
 * where the E that follows as the next argument is taken (advancing *next_arg) when it is
 * a number. 0 on success; else prints `program: --ep ...` to stderr and returns 2. */
int ina_parallel_job_parse_ep(const char *program, const char *optarg, int argc, char **argv,
                              int *next_arg, int32_t *out);
/* The same for `--dp [D]` (attention data parallelism): *out = D, or 0 without a degree
 * (every group). The caller checks D against the groups once the job has started. */
int ina_parallel_job_parse_dp(const char *program, const char *optarg, int argc, char **argv, int *next_arg,
                              int32_t *out);

/* The CUDA device of this rank (local rank modulo the devices), or -1 without one. */
int32_t ina_parallel_job_device(const ina_parallel_job_t *job);

/* This rank's slice of a model: tensor slice rank % tp of tp, and its group's share of the
 * routed experts (near-equal contiguous ranges in group order; with `even`, the experts
 * must divide over the groups: INA_ERR_INVALID_ARGUMENT otherwise). */
ina_status_t ina_parallel_job_shard(const ina_parallel_job_t *job, const ina_model_config_t *cfg,
                                    int even, ina_shard_t *out);

/* This rank's expert-parallel rank: its group with expert parallelism, else 0. */
int32_t ina_parallel_job_ep_rank(const ina_parallel_job_t *job);

/* Frees the communicators and finalizes MPI. NULL fields are skipped. */
void ina_parallel_job_end(ina_parallel_job_t *job);

/* Ends every rank of the job now (MPI_Abort): after a peer stopped answering, finalizing
 * would wait for it. Does not return. */
void ina_parallel_job_abort(const ina_parallel_job_t *job, int code);

#endif
