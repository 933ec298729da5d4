/* The parallel layout of an mpirun job (model/parallel_job.h). */
#define INA_LOG_SUBSYS "model"
#include "model/parallel_job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

ina_status_t ina_parallel_job_start(int32_t tp_size, int32_t expert_parallel, ina_comm_backend_t backend,
                                    ina_parallel_job_t *out) {
  ina_status_t st = INA_OK;
  int argc = 0;
  char **argv = NULL;
  INA_REQUIRE(out != NULL && tp_size >= 1, INA_ERR_INVALID_ARGUMENT,
              "parallel job: tensor-parallel size %d must be >= 1", tp_size);
  memset(out, 0, sizeof *out);
  INA_CHECK(ina_bootstrap_init(&argc, &argv, &out->boot));
  out->rank = ina_bootstrap_world_rank(out->boot);
  out->size = ina_bootstrap_world_size(out->boot);
  out->tp_size = tp_size;
  INA_REQUIRE(expert_parallel >= INA_PARALLEL_EP_ALL, INA_ERR_INVALID_ARGUMENT,
              "parallel job: expert-parallel degree %d", expert_parallel);
  INA_REQUIRE(out->size % tp_size == 0 && (expert_parallel || out->size == tp_size),
              INA_ERR_INVALID_ARGUMENT, "--tp %d on %d ranks: the ranks must be %s", tp_size,
              out->size,
              expert_parallel ? "a multiple of --tp"
                              : "exactly --tp (add --ep to split the experts over groups)");
  out->groups = out->size / tp_size;
  INA_REQUIRE(expert_parallel <= 0 || expert_parallel == out->groups, INA_ERR_INVALID_ARGUMENT,
              "--ep %d with --tp %d on %d ranks: the ranks form %d group(s) of %d, and expert "
              "parallelism runs over all of them (--ep %d, or --ep alone)",
              expert_parallel, tp_size, out->size, out->groups, tp_size, out->groups);
  INA_REQUIRE(backend != INA_COMM_BACKEND_NCCL || ina_bootstrap_device(out->boot) >= 0,
              INA_ERR_UNSUPPORTED, "rank %d: the NCCL communicators of a GPU job need a CUDA device",
              out->rank);
  INA_CHECK(ina_bootstrap_split_tp_dp(out->boot, tp_size, backend,
                                      tp_size > 1 ? &out->tp : NULL,
                                      expert_parallel ? &out->ep : NULL));
  INA_CHECK(ina_bootstrap_world_comm(out->boot, INA_COMM_BACKEND_MPI, &out->world));
fail:
  return st;
}

ina_status_t ina_parallel_job_shard(const ina_parallel_job_t *job, const ina_model_config_t *cfg,
                                    int even, ina_shard_t *out) {
  ina_status_t st = INA_OK;
  const int64_t experts = cfg->n_routed_experts, groups = job->ep ? job->groups : 1;
  const int64_t group = ina_parallel_job_ep_rank(job);
  INA_REQUIRE(!even || experts % groups == 0, INA_ERR_INVALID_ARGUMENT,
              "--ep: the %lld routed experts do not divide over %lld groups", (long long)experts,
              (long long)groups);
  out->tp_rank = job->rank % job->tp_size;
  out->tp_size = job->tp_size;
  out->expert_begin = (int32_t)(experts * group / groups);
  out->expert_end = (int32_t)(experts * (group + 1) / groups);
fail:
  return st;
}

/* `--OPTION`, `--OPTION=N` or `--OPTION N` (the next argument when it is a number): *out
 * = N, or `absent` without one. */
static int parse_degree(const char *program, const char *option, const char *what, const char *optarg, int argc,
                        char **argv, int *next_arg, int32_t absent, int32_t *out) {
  const char *text = optarg;
  /* getopt_long leaves `--OPTION N`'s N as the next argument: take it when it is a number. */
  if (!text && *next_arg < argc && argv[*next_arg][0] >= '0' && argv[*next_arg][0] <= '9')
    text = argv[(*next_arg)++];
  if (!text) {
    *out = absent;
    return 0;
  }
  char *end = NULL;
  const long v = strtol(text, &end, 10);
  if (!text[0] || *end || v < 1 || v > 65536) {
    fprintf(stderr, "%s: --%s '%s': expected the number of %s (1 to 65536)\n", program, option, text, what);
    return 2;
  }
  *out = (int32_t)v;
  return 0;
}

int ina_parallel_job_parse_ep(const char *program, const char *optarg, int argc, char **argv,
                              int *next_arg, int32_t *out) {
  return parse_degree(program, "ep", "expert-parallel groups", optarg, argc, argv, next_arg, INA_PARALLEL_EP_ALL, out);
}

int ina_parallel_job_parse_dp(const char *program, const char *optarg, int argc, char **argv, int *next_arg,
                              int32_t *out) {
  return parse_degree(program, "dp", "attention data-parallel groups", optarg, argc, argv, next_arg, 0, out);
}

int32_t ina_parallel_job_device(const ina_parallel_job_t *job) {
  return job->boot ? ina_bootstrap_device(job->boot) : -1;
}

int32_t ina_parallel_job_ep_rank(const ina_parallel_job_t *job) {
  return job->ep ? job->rank / job->tp_size : 0;
}

void ina_parallel_job_end(ina_parallel_job_t *job) {
  if (!job) return;
  ina_comm_destroy(job->world);
  ina_comm_destroy(job->ep);
  ina_comm_destroy(job->tp);
  job->world = job->ep = job->tp = NULL;
  if (job->boot) ina_bootstrap_finalize(job->boot);
  job->boot = NULL;
}

void ina_parallel_job_abort(const ina_parallel_job_t *job, int code) {
  ina_bootstrap_abort(job->boot, code);
}
