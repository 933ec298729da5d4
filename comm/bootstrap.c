/* MPI initialization, the rank's place in the job (node, local rank), its device, and
 * the communicators split from the world. */
#define INA_LOG_SUBSYS "comm"
#include "comm/bootstrap.h"

#include <mpi.h>
#include <stdlib.h>

#include "comm/comm_internal.h"
#include "core/check.h"
#include "core/cuda.h"
#ifdef INA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

struct ina_bootstrap {
  int we_initialized; /* MPI_Init_thread was ours, so MPI_Finalize is too */
  int thread_multiple;
  int world_rank, world_size;
  int node_id, node_count;
  int local_rank, local_size;
  int device;
};

#define MPI_OR_FAIL(call, what)                                                          \
  do {                                                                                   \
    int rc_ = (call);                                                                    \
    if (rc_ != MPI_SUCCESS) {                                                            \
      char msg_[MPI_MAX_ERROR_STRING + 1] = "";                                          \
      int len_ = 0;                                                                      \
      MPI_Error_string(rc_, msg_, &len_);                                                \
      INA_REQUIRE(0, INA_ERR_MPI, "bootstrap: %s failed: %s", what, msg_);               \
    }                                                                                    \
  } while (0)

/* Node placement from INA_RANKS_PER_NODE: 0 when unset. */
static ina_status_t ranks_per_node_from_env(int world_size, int *out) {
  ina_status_t st = INA_OK;
  *out = 0;
  const char *v = getenv("INA_RANKS_PER_NODE");
  if (!v || !v[0]) return INA_OK;
  char *end = NULL;
  long n = strtol(v, &end, 10);
  INA_REQUIRE(*end == '\0' && n > 0 && world_size % n == 0, INA_ERR_INVALID_ARGUMENT,
              "bootstrap: INA_RANKS_PER_NODE='%s' must be a positive divisor of the world size %d",
              v, world_size);
  *out = (int)n;
fail:
  return st;
}

static ina_status_t find_node(ina_bootstrap_t *b) {
  ina_status_t st = INA_OK;
  MPI_Comm shared = MPI_COMM_NULL;
  int per_node = 0;
  INA_CHECK(ranks_per_node_from_env(b->world_size, &per_node));
  if (per_node > 0) {
    b->node_id = b->world_rank / per_node;
    b->local_rank = b->world_rank % per_node;
    b->local_size = per_node;
    b->node_count = b->world_size / per_node;
    return INA_OK;
  }
  MPI_OR_FAIL(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, b->world_rank,
                                  MPI_INFO_NULL, &shared), "MPI_Comm_split_type(SHARED)");
  MPI_Comm_rank(shared, &b->local_rank);
  MPI_Comm_size(shared, &b->local_size);
  /* Node ids: count the node leaders (local rank 0) with a lower world rank. */
  int leader = b->local_rank == 0, leader_world = b->world_rank, first_leader = 0;
  MPI_OR_FAIL(MPI_Bcast(&leader_world, 1, MPI_INT, 0, shared), "MPI_Bcast(node leader)");
  int *leaders = malloc((size_t)b->world_size * sizeof(int));
  INA_CHECK_ALLOC(leaders);
  int rc = MPI_Allgather(&leader, 1, MPI_INT, leaders, 1, MPI_INT, MPI_COMM_WORLD);
  b->node_id = 0;
  b->node_count = 0;
  for (int r = 0; r < b->world_size; r++) {
    b->node_count += leaders[r];
    if (r < leader_world) first_leader += leaders[r];
  }
  b->node_id = first_leader;
  free(leaders);
  MPI_OR_FAIL(rc, "MPI_Allgather(node leaders)");
fail:
  if (shared != MPI_COMM_NULL) MPI_Comm_free(&shared);
  return st;
}

static ina_status_t select_device(ina_bootstrap_t *b) {
  b->device = -1;
#ifdef INA_HAVE_CUDA
  ina_status_t st = INA_OK;
  int count = ina_cuda_device_count();
  if (count <= 0) return INA_OK;
  int dev = b->local_rank % count;
  cudaError_t e = cudaSetDevice(dev);
  INA_REQUIRE(e == cudaSuccess, INA_ERR_CUDA, "bootstrap: rank %d: cudaSetDevice(%d): %s",
              b->world_rank, dev, cudaGetErrorString(e));
  b->device = dev;
fail:
  return st;
#else
  return INA_OK; /* no CUDA in this build: the rank runs on the CPU */
#endif
}

ina_status_t ina_bootstrap_init(int *argc, char ***argv, ina_bootstrap_t **out) {
  ina_status_t st = INA_OK;
  ina_bootstrap_t *b = NULL;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "bootstrap: out is NULL");
  *out = NULL;
  b = calloc(1, sizeof(*b));
  INA_CHECK_ALLOC(b);
  int initialized = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialized);
  if (!initialized) {
    MPI_OR_FAIL(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    b->we_initialized = 1;
  } else {
    MPI_Query_thread(&provided);
  }
  b->thread_multiple = provided >= MPI_THREAD_MULTIPLE;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &b->world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &b->world_size);
  INA_CHECK(find_node(b));
  INA_CHECK(select_device(b));
  static const char *levels[] = {"single", "funneled", "serialized", "multiple"};
  INA_LOG_I(INA_LOG_SUBSYS,
            "rank %d/%d: node %d/%d, local rank %d/%d, device %d, MPI thread level %s",
            b->world_rank, b->world_size, b->node_id, b->node_count, b->local_rank,
            b->local_size, b->device,
            provided >= 0 && provided <= 3 ? levels[provided] : "unknown");
  *out = b;
  return INA_OK;
fail:
  ina_bootstrap_finalize(b);
  return st;
}

void ina_bootstrap_finalize(ina_bootstrap_t *b) {
  if (!b) return;
  if (b->we_initialized) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  free(b);
}

void ina_bootstrap_abort(const ina_bootstrap_t *b, int code) {
  (void)b;
  MPI_Abort(MPI_COMM_WORLD, code);
  abort(); /* MPI_Abort does not return; this keeps the promise if it ever does */
}

int ina_bootstrap_world_rank(const ina_bootstrap_t *b) { return b->world_rank; }
int ina_bootstrap_world_size(const ina_bootstrap_t *b) { return b->world_size; }
int ina_bootstrap_node_id(const ina_bootstrap_t *b) { return b->node_id; }
int ina_bootstrap_node_count(const ina_bootstrap_t *b) { return b->node_count; }
int ina_bootstrap_local_rank(const ina_bootstrap_t *b) { return b->local_rank; }
int ina_bootstrap_local_size(const ina_bootstrap_t *b) { return b->local_size; }
int ina_bootstrap_device(const ina_bootstrap_t *b) { return b->device; }
int ina_bootstrap_thread_multiple(const ina_bootstrap_t *b) { return b->thread_multiple; }

ina_status_t ina_bootstrap_split(const ina_bootstrap_t *b, int color, int key,
                                 ina_comm_backend_t backend, ina_comm_t **out) {
  ina_status_t st = INA_OK;
  MPI_Comm sub = MPI_COMM_NULL;
  INA_REQUIRE(b != NULL && out != NULL, INA_ERR_INVALID_ARGUMENT, "bootstrap split: NULL argument");
  *out = NULL;
  MPI_OR_FAIL(MPI_Comm_split(MPI_COMM_WORLD, color < 0 ? MPI_UNDEFINED : color, key, &sub),
              "MPI_Comm_split");
  if (sub == MPI_COMM_NULL) return INA_OK;
  INA_CHECK(ina_comm_create_from_mpi(sub, backend, out));
fail:
  return st;
}

ina_status_t ina_bootstrap_world_comm(const ina_bootstrap_t *b, ina_comm_backend_t backend,
                                      ina_comm_t **out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(b != NULL, INA_ERR_INVALID_ARGUMENT, "bootstrap world comm: bootstrap is NULL");
  INA_CHECK(ina_bootstrap_split(b, 0, b->world_rank, backend, out));
fail:
  return st;
}

ina_status_t ina_bootstrap_node_comm(const ina_bootstrap_t *b, ina_comm_backend_t backend,
                                     ina_comm_t **out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(b != NULL, INA_ERR_INVALID_ARGUMENT, "bootstrap node comm: bootstrap is NULL");
  INA_CHECK(ina_bootstrap_split(b, b->node_id, b->local_rank, backend, out));
fail:
  return st;
}

ina_status_t ina_bootstrap_split_tp_dp(const ina_bootstrap_t *b, int tp_size,
                                       ina_comm_backend_t backend, ina_comm_t **tp_out,
                                       ina_comm_t **dp_out) {
  ina_status_t st = INA_OK;
  ina_comm_t *tp = NULL, *dp = NULL;
  if (tp_out) *tp_out = NULL;
  if (dp_out) *dp_out = NULL;
  INA_REQUIRE(b != NULL, INA_ERR_INVALID_ARGUMENT, "bootstrap tp/dp split: bootstrap is NULL");
  INA_REQUIRE(tp_size > 0 && b->world_size % tp_size == 0, INA_ERR_INVALID_ARGUMENT,
              "bootstrap tp/dp split: tp_size %d does not divide the world size %d", tp_size,
              b->world_size);
  /* Both splits are collective: every rank makes both, then drops what it was not asked
   * for. */
  INA_CHECK(ina_bootstrap_split(b, b->world_rank / tp_size, b->world_rank, backend, &tp));
  INA_CHECK(ina_bootstrap_split(b, b->world_rank % tp_size, b->world_rank, backend, &dp));
  if (tp_out) *tp_out = tp;
  else ina_comm_destroy(tp);
  if (dp_out) *dp_out = dp;
  else ina_comm_destroy(dp);
  return INA_OK;
fail:
  ina_comm_destroy(tp);
  ina_comm_destroy(dp);
  return st;
}
