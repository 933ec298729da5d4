/* The custom all-reduce, host side (comm/custom_ar.h): creation (IPC handle exchange over
 * the communicator's MPI ranks, peer-access decision), destruction, and the per-run
 * argument checks, algorithm choice and launch or NCCL fallback. Kernels: custom_ar.cu.
 *
 * Collective steps agree before anyone acts on a local result: every rank's status
 * travels with the all-gathered data (or one MIN all-reduce), so a failure on one rank
 * fails creation on all of them instead of leaving the others waiting in a collective. */
#define INA_LOG_SUBSYS "custom_ar"
#include "comm/custom_ar.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <mpi.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "comm/custom_ar_kernels.h"
#include "comm/custom_ar_plan.h"
#include "core/check.h"

struct ina_custom_ar {
  ina_comm_t *comm; /* the caller's; NCCL fallbacks run on it */
  ina_comm_t *ctl;  /* private MPI twin of comm: handshakes, checked mode, destroy */
  int rank, nranks, device;
  int peer_access; /* the IPC path is usable (same on every rank) */
  int blocks;      /* grid of every kernel (same on every rank) */
  int check;       /* checked mode */
  uint64_t one_shot_max_bytes;
  uint64_t timeout_ns;
  double timeout_s;
  ina_car_layout_t layout;
  uint8_t *base[INA_CAR_MAX_RANKS]; /* [rank]: our allocation; others: mapped peers */
  ina_car_watchdog_t *watchdog;     /* mapped pinned host memory */
  ina_car_watchdog_t *watchdog_dev; /* its device address */
};

/* What every rank tells the others at creation. */
typedef struct rank_info {
  int32_t ok;         /* local steps succeeded */
  int32_t sm_count;
  char bus_id[32];    /* PCI bus id of the rank's device */
  uint64_t max_bytes; /* config, resolved: must agree */
  uint64_t one_shot_max_bytes;
  int32_t max_blocks;
  int32_t check;
} rank_info_t;

typedef struct ipc_info {
  int32_t ok;
  cudaIpcMemHandle_t handle;
} ipc_info_t;

#define CREATE_V1_SIZE (offsetof(ina_custom_ar_config_t, timeout_s) + sizeof(double))
#define ARGS_V1_SIZE (offsetof(ina_custom_ar_args_t, stream) + sizeof(void *))

static const char *algo_name(int algo) {
  switch (algo) {
    case INA_CAR_ALGO_ONE_SHOT: return "one-shot";
    case INA_CAR_ALGO_TWO_SHOT: return "two-shot";
    case INA_CAR_ALGO_NCCL: return "nccl";
    case INA_CAR_ALGO_LL: return "ll";
    default: return "auto";
  }
}

static int env_flag(const char *name) {
  const char *v = getenv(name);
  return v && v[0] && strcmp(v, "0") != 0;
}

/* cudaError_t -> a recorded error naming the step and rank (cudaGetLastError clears the
 * runtime's last-error slot so a later launch check does not report it again). */
static ina_status_t cuda_status(cudaError_t e, const char *what, int rank) {
  if (e == cudaSuccess) return INA_OK;
  (void)cudaGetLastError();
  ina_error(INA_LOG_SUBSYS, "custom_ar on rank %d: %s: %s (%s)", rank, what,
            cudaGetErrorString(e), cudaGetErrorName(e));
  return INA_ERR_CUDA;
}

static ina_status_t allgather_bytes(ina_comm_t *ctl, const void *mine, size_t bytes, void *all,
                                    const char *op) {
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, ctl->mpi, &req);
  if (rc != MPI_SUCCESS) return ina_comm_mpi_error(ctl, op, rc);
  return ina_comm_mpi_wait(ctl, &req, op);
}

/* *all = the minimum of `mine` over the ranks. */
static ina_status_t allreduce_min(ina_comm_t *ctl, int mine, int *all, const char *op) {
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Iallreduce(&mine, all, 1, MPI_INT, MPI_MIN, ctl->mpi, &req);
  if (rc != MPI_SUCCESS) return ina_comm_mpi_error(ctl, op, rc);
  return ina_comm_mpi_wait(ctl, &req, op);
}

/* Releases this rank's resources without talking to the others: the mappings of the
 * peers' memory, our allocation, the watchdog record and the private communicator. */
static void release(ina_custom_ar_t *ar) {
  for (int r = 0; r < ar->nranks && r < INA_CAR_MAX_RANKS; r++) {
    if (!ar->base[r]) continue;
    if (r == ar->rank) cudaFree(ar->base[r]);
    else cudaIpcCloseMemHandle(ar->base[r]);
    ar->base[r] = NULL;
  }
  if (ar->watchdog) cudaFreeHost(ar->watchdog);
  ar->watchdog = ar->watchdog_dev = NULL;
  (void)cudaGetLastError();
  ina_comm_destroy(ar->ctl);
  ar->ctl = NULL;
}

static ina_status_t resolve_config(const ina_custom_ar_config_t *in, ina_custom_ar_config_t *cfg) {
  ina_status_t st = INA_OK;
  const ina_custom_ar_config_t defaults = INA_CUSTOM_AR_CONFIG_INIT;
  *cfg = defaults;
  if (in) {
    INA_REQUIRE_VERSIONED(in, CREATE_V1_SIZE, "ina_custom_ar_create: config",
                          "INA_CUSTOM_AR_CONFIG_INIT");
    memcpy(cfg, in, CREATE_V1_SIZE);
    cfg->struct_size = sizeof *cfg;
  }
  INA_REQUIRE(cfg->max_bytes > 0 && cfg->max_bytes <= ((size_t)1 << 38),
              INA_ERR_INVALID_ARGUMENT,
              "ina_custom_ar_create: max_bytes %zu must be in [1, 2^38]", cfg->max_bytes);
  INA_REQUIRE(cfg->max_blocks >= 0, INA_ERR_INVALID_ARGUMENT,
              "ina_custom_ar_create: max_blocks %d must be >= 0", (int)cfg->max_blocks);
  INA_REQUIRE(cfg->check >= -1 && cfg->check <= 1, INA_ERR_INVALID_ARGUMENT,
              "ina_custom_ar_create: check %d must be -1, 0 or 1", (int)cfg->check);
  INA_REQUIRE(!isnan(cfg->timeout_s) && cfg->timeout_s < 1e9, INA_ERR_INVALID_ARGUMENT,
              "ina_custom_ar_create: timeout_s %g is not a number of seconds", cfg->timeout_s);
fail:
  return st;
}

/* Whether this rank's device can reach every peer's device directly. */
static int local_peer_access(const ina_custom_ar_t *ar, const rank_info_t *infos) {
  for (int r = 0; r < ar->nranks; r++) {
    if (r == ar->rank) continue;
    int peer_dev = -1, can = 0;
    if (strcmp(infos[r].bus_id, infos[ar->rank].bus_id) == 0) {
      INA_LOG_I(INA_LOG_SUBSYS, "rank %d: rank %d uses the same GPU (%s); no IPC path",
                ar->rank, r, infos[r].bus_id);
      return 0;
    }
    if (cudaDeviceGetByPCIBusId(&peer_dev, infos[r].bus_id) != cudaSuccess ||
        cudaDeviceCanAccessPeer(&can, ar->device, peer_dev) != cudaSuccess || !can) {
      (void)cudaGetLastError();
      INA_LOG_I(INA_LOG_SUBSYS, "rank %d: no peer access to rank %d's GPU %s", ar->rank, r,
                infos[r].bus_id);
      return 0;
    }
  }
  return 1;
}

/* 1 when every rank of ctl runs on this host. */
static ina_status_t same_node(ina_custom_ar_t *ar, int *out) {
  ina_status_t st = INA_OK;
  MPI_Comm shared = MPI_COMM_NULL;
  int size = 0;
  int rc = MPI_Comm_split_type(ar->ctl->mpi, MPI_COMM_TYPE_SHARED, ar->rank, MPI_INFO_NULL,
                               &shared);
  if (rc != MPI_SUCCESS) {
    st = ina_comm_mpi_error(ar->ctl, "custom_ar create (node split)", rc);
    goto fail;
  }
  MPI_Comm_size(shared, &size);
  *out = size == ar->nranks;
fail:
  if (shared != MPI_COMM_NULL) MPI_Comm_free(&shared);
  return st;
}

/* Allocates, exports and maps the registered memory. Sets ar->peer_access to 0 (all ranks
 * alike) when mapping a peer fails, after undoing what was done; allocation failures fail. */
static ina_status_t map_peers(ina_custom_ar_t *ar) {
  ina_status_t st = INA_OK, local = INA_OK;
  ipc_info_t mine, *all = NULL;
  int all_ok = 0;
  void *base = NULL;
  const char *op = "custom_ar create (IPC handle exchange)";
  memset(&mine, 0, sizeof mine);
  all = calloc((size_t)ar->nranks, sizeof *all);
  INA_CHECK_ALLOC(all);

  /* The counters must be zero before any peer can see the memory: memset, then wait. */
  local = cuda_status(cudaMalloc(&base, ar->layout.total), "cudaMalloc of the registered buffers",
                      ar->rank);
  if (local == INA_OK) {
    ar->base[ar->rank] = base;
    local = cuda_status(cudaMemset(base, 0, ar->layout.input), "cudaMemset", ar->rank);
  }
  if (local == INA_OK)
    local = cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize", ar->rank);
  if (local == INA_OK)
    local = cuda_status(cudaHostAlloc((void **)&ar->watchdog, sizeof *ar->watchdog,
                                      cudaHostAllocMapped),
                        "cudaHostAlloc of the watchdog record", ar->rank);
  if (local == INA_OK) {
    memset((void *)ar->watchdog, 0, sizeof *ar->watchdog);
    local = cuda_status(cudaHostGetDevicePointer((void **)&ar->watchdog_dev, ar->watchdog, 0),
                        "cudaHostGetDevicePointer", ar->rank);
  }
  if (local == INA_OK)
    local = cuda_status(cudaIpcGetMemHandle(&mine.handle, base), "cudaIpcGetMemHandle", ar->rank);
  mine.ok = local == INA_OK;
  INA_CHECK(allgather_bytes(ar->ctl, &mine, sizeof mine, all, op));
  for (int r = 0; r < ar->nranks; r++)
    INA_REQUIRE(all[r].ok, local != INA_OK ? local : INA_ERR_CUDA,
                "custom_ar create on rank %d: rank %d could not set up its registered buffers "
                "(%llu bytes)",
                ar->rank, r, (unsigned long long)ar->layout.total);

  local = INA_OK;
  for (int r = 0; r < ar->nranks && local == INA_OK; r++) {
    if (r == ar->rank) continue;
    void *peer = NULL;
    local = cuda_status(cudaIpcOpenMemHandle(&peer, all[r].handle,
                                             cudaIpcMemLazyEnablePeerAccess),
                        "cudaIpcOpenMemHandle", ar->rank);
    if (local == INA_OK) ar->base[r] = peer;
  }
  INA_CHECK(allreduce_min(ar->ctl, local == INA_OK, &all_ok, op));
  if (!all_ok) {
    /* Nobody has launched anything yet, so each rank can undo its part alone. */
    INA_LOG_W(INA_LOG_SUBSYS, "rank %d: mapping the peers' buffers failed on some rank; every "
              "run will use NCCL", ar->rank);
    for (int r = 0; r < ar->nranks; r++) {
      if (!ar->base[r]) continue;
      if (r == ar->rank) cudaFree(ar->base[r]);
      else cudaIpcCloseMemHandle(ar->base[r]);
      ar->base[r] = NULL;
    }
    (void)cudaGetLastError();
    ar->peer_access = 0;
  }
fail:
  free(all);
  return st;
}

ina_status_t ina_custom_ar_create(ina_comm_t *comm, const ina_custom_ar_config_t *cfg_in,
                                  ina_custom_ar_t **out) {
  ina_status_t st = INA_OK;
  ina_custom_ar_config_t cfg;
  ina_custom_ar_t *ar = NULL;
  rank_info_t mine, *infos = NULL;
  MPI_Comm dup = MPI_COMM_NULL;
  int all_ok = 0, node = 0, min_blocks = 0;
  const char *op = "custom_ar create";
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_custom_ar_create: out is NULL");
  *out = NULL;
  INA_REQUIRE(comm != NULL, INA_ERR_INVALID_ARGUMENT, "ina_custom_ar_create: comm is NULL");
  INA_REQUIRE(!comm->broken, INA_ERR_MPI,
              "ina_custom_ar_create on rank %d: the communicator is broken", comm->rank);
  INA_CHECK(resolve_config(cfg_in, &cfg));

  ar = calloc(1, sizeof *ar);
  INA_CHECK_ALLOC(ar);
  ar->comm = comm;
  ar->rank = comm->rank;
  ar->nranks = comm->size;
  ar->device = -1;
  ar->check = cfg.check < 0 ? env_flag("INA_COMM_CHECK") : cfg.check;
  ar->timeout_s = cfg.timeout_s < 0 ? ina_comm_timeout_from_env() : cfg.timeout_s;
  ar->timeout_ns = (uint64_t)(ar->timeout_s * 1e9);
  ar->one_shot_max_bytes = cfg.one_shot_max_bytes ? cfg.one_shot_max_bytes
                                                  : ina_car_default_one_shot_max_bytes(ar->nranks);
  /* More than INA_CAR_MAX_RANKS ranks never take the IPC path; the layout is then unused. */
  INA_CHECK(ina_car_layout_init(
      cfg.max_bytes, ar->nranks < INA_CAR_MAX_RANKS ? ar->nranks : INA_CAR_MAX_RANKS, &ar->layout));
  {
    int rc = MPI_Comm_dup(comm->mpi, &dup);
    if (rc != MPI_SUCCESS) {
      st = ina_comm_mpi_error(comm, op, rc);
      goto fail;
    }
  }
  INA_CHECK(ina_comm_create_from_mpi(dup, INA_COMM_BACKEND_MPI, &ar->ctl));
  dup = MPI_COMM_NULL; /* owned by ctl now */

  /* Who is where: device, SM count, and the config each rank resolved. */
  memset(&mine, 0, sizeof mine);
  mine.ok = cudaGetDevice(&ar->device) == cudaSuccess &&
            cudaDeviceGetAttribute(&mine.sm_count, cudaDevAttrMultiProcessorCount, ar->device) ==
                cudaSuccess &&
            cudaDeviceGetPCIBusId(mine.bus_id, (int)sizeof mine.bus_id, ar->device) == cudaSuccess;
  (void)cudaGetLastError();
  mine.max_bytes = cfg.max_bytes;
  mine.one_shot_max_bytes = ar->one_shot_max_bytes;
  mine.max_blocks = cfg.max_blocks;
  mine.check = ar->check;
  infos = calloc((size_t)ar->nranks, sizeof *infos);
  INA_CHECK_ALLOC(infos);
  INA_CHECK(allgather_bytes(ar->ctl, &mine, sizeof mine, infos, op));
  ar->blocks = INA_CAR_MAX_BLOCKS;
  for (int r = 0; r < ar->nranks; r++) {
    const rank_info_t *o = &infos[r];
    INA_REQUIRE(o->ok, INA_ERR_CUDA,
                "%s on rank %d: rank %d has no usable current CUDA device", op, ar->rank, r);
    INA_REQUIRE(
        o->max_bytes == mine.max_bytes && o->one_shot_max_bytes == mine.one_shot_max_bytes &&
            o->max_blocks == mine.max_blocks && o->check == mine.check,
        INA_ERR_INVALID_ARGUMENT,
        "%s on rank %d: rank %d has another config (max_bytes %llu vs %llu, "
        "one_shot_max_bytes %llu vs %llu, max_blocks %d vs %d, check %d vs %d)",
        op, ar->rank, r, (unsigned long long)o->max_bytes, (unsigned long long)mine.max_bytes,
        (unsigned long long)o->one_shot_max_bytes, (unsigned long long)mine.one_shot_max_bytes,
        (int)o->max_blocks, (int)mine.max_blocks, (int)o->check, (int)mine.check);
    if (o->sm_count < ar->blocks) ar->blocks = o->sm_count;
  }
  if (cfg.max_blocks > 0 && cfg.max_blocks < ar->blocks) ar->blocks = cfg.max_blocks;

  /* The IPC path needs one host, at most 8 ranks, distinct GPUs that reach each other, and
   * kernels that fit at least one CTA per SM (so the grid is resident at once). */
  INA_CHECK(same_node(ar, &node));
  min_blocks = ina_car_min_blocks_per_sm();
  {
    const int local_ok = node && ar->nranks <= INA_CAR_MAX_RANKS && ar->blocks >= 1 &&
                         min_blocks >= 1 && local_peer_access(ar, infos);
    INA_CHECK(allreduce_min(ar->ctl, local_ok, &all_ok, op));
  }
  ar->peer_access = all_ok;
  if (ar->peer_access) INA_CHECK(map_peers(ar));
  INA_REQUIRE(ar->peer_access || comm->backend == INA_COMM_BACKEND_NCCL, INA_ERR_UNSUPPORTED,
              "%s on rank %d: the ranks cannot map each other's memory (%s) and the "
              "communicator has no NCCL backend to fall back to",
              op, ar->rank,
              !node ? "not all on one node"
              : ar->nranks > INA_CAR_MAX_RANKS ? "more than 8 ranks"
              : min_blocks < 1 ? "kernel does not fit an SM"
                                 : "no peer access or IPC");
  INA_LOG_I(INA_LOG_SUBSYS, "rank %d of %d: device %d, %s, %d CTAs, %llu-byte buffers",
            ar->rank, ar->nranks, ar->device, ar->peer_access ? "IPC path" : "NCCL only",
            ar->blocks, (unsigned long long)ar->layout.capacity);
  free(infos);
  *out = ar;
  return INA_OK;
fail:
  if (dup != MPI_COMM_NULL) MPI_Comm_free(&dup);
  if (ar) {
    release(ar);
    free(ar);
  }
  free(infos);
  return st;
}

void ina_custom_ar_destroy(ina_custom_ar_t *ar) {
  if (!ar) return;
  if (ar->peer_access) {
    /* Our kernels read the peers' memory and theirs read ours: wait for our device, then
     * for every rank to have done the same, before unmapping and freeing. */
    (void)cudaDeviceSynchronize();
    (void)cudaGetLastError();
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Ibarrier(ar->ctl->mpi, &req) != MPI_SUCCESS ||
        ina_comm_mpi_wait(ar->ctl, &req, "custom_ar destroy (barrier)") != INA_OK)
      INA_LOG_W(INA_LOG_SUBSYS, "rank %d: destroy barrier failed; freeing the buffers anyway",
                ar->rank);
  }
  release(ar);
  free(ar);
}

void *ina_custom_ar_input_buffer(const ina_custom_ar_t *ar, size_t *bytes) {
  const int ok = ar && ar->peer_access;
  if (bytes) *bytes = ok ? (size_t)ar->layout.capacity : 0;
  return ok ? ar->base[ar->rank] + ar->layout.input : NULL;
}

int ina_custom_ar_peer_access(const ina_custom_ar_t *ar) { return ar ? ar->peer_access : 0; }
int ina_custom_ar_nranks(const ina_custom_ar_t *ar) { return ar ? ar->nranks : 0; }

static void fill_request(const ina_custom_ar_t *ar, int mode, int algo, size_t count, int64_t rows,
                         int64_t cols, ina_car_request_t *r) {
  memset(r, 0, sizeof *r);
  r->mode = mode;
  r->algo = algo;
  r->count = count;
  r->rows = rows;
  r->cols = cols;
  r->nranks = ar->nranks;
  r->peer_access = ar->peer_access;
  r->have_nccl = ar->comm->backend == INA_COMM_BACKEND_NCCL;
  r->capacity = ar->layout.capacity;
  r->ll_capacity = ar->layout.ll_capacity;
  r->one_shot_max_bytes = ar->one_shot_max_bytes;
  r->blocks = ar->blocks;
}

ina_status_t ina_custom_ar_choose(const ina_custom_ar_t *ar, ina_custom_ar_mode_t mode,
                                  ina_custom_ar_algo_t requested, size_t count, int64_t rows,
                                  int64_t cols, ina_custom_ar_algo_t *algo) {
  ina_status_t st = INA_OK;
  ina_car_request_t req;
  ina_car_plan_t plan;
  int chosen = 0;
  INA_REQUIRE(ar != NULL && algo != NULL, INA_ERR_INVALID_ARGUMENT,
              "ina_custom_ar_choose: NULL argument");
  fill_request(ar, (int)mode, (int)requested, count, rows, cols, &req);
  INA_CHECK(ina_car_choose(&req, &chosen, &plan));
  *algo = (ina_custom_ar_algo_t)chosen;
fail:
  return st;
}

/* [p, p + n) and [q, q + m) share a byte. */
static int overlaps(const void *p, size_t n, const void *q, size_t m) {
  const uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
  return n && m && a < b + m && b < a + n;
}

static int aligned(const void *p, uintptr_t to) { return (uintptr_t)p % to == 0; }

/* Local argument checks beyond the shape (pointers, alignment, overlap). */
static ina_status_t check_buffers(const ina_custom_ar_t *ar, const ina_custom_ar_args_t *a,
                                  int epilogue) {
  ina_status_t st = INA_OK;
  const size_t eb = a->mode == INA_CUSTOM_AR_F32 ? 4 : 2;
  const size_t bytes = a->count * eb;
  size_t cap = 0;
  const uint8_t *input = ina_custom_ar_input_buffer(ar, &cap);
  INA_REQUIRE(a->in != NULL && a->out != NULL, INA_ERR_INVALID_ARGUMENT,
              "ina_custom_ar_run on rank %d: NULL in or out with count %zu", ar->rank, a->count);
  INA_REQUIRE(aligned(a->in, eb) && aligned(a->out, eb), INA_ERR_INVALID_ARGUMENT,
              "ina_custom_ar_run on rank %d: in and out must be aligned to their %zu-byte "
              "elements", ar->rank, eb);
  INA_REQUIRE((const uint8_t *)a->in == input || !overlaps(a->in, bytes, input, cap),
              INA_ERR_INVALID_ARGUMENT,
              "ina_custom_ar_run on rank %d: in overlaps the input buffer without being it",
              ar->rank);
  INA_REQUIRE((const uint8_t *)a->out == input || !overlaps(a->out, bytes, input, cap),
              INA_ERR_INVALID_ARGUMENT,
              "ina_custom_ar_run on rank %d: out overlaps the input buffer without being it",
              ar->rank);
  INA_REQUIRE(a->in == a->out || !overlaps(a->in, bytes, a->out, bytes),
              INA_ERR_INVALID_ARGUMENT,
              "ina_custom_ar_run on rank %d: in and out overlap without being equal", ar->rank);
  if (!epilogue) return INA_OK;
  INA_REQUIRE(a->norm_weight_dtype == INA_DTYPE_BF16 || a->norm_weight_dtype == INA_DTYPE_F32,
              INA_ERR_UNSUPPORTED,
              "ina_custom_ar_run: norm weight dtype %s is not supported (bf16 or f32)",
              ina_dtype_name(a->norm_weight_dtype));
  INA_REQUIRE(isfinite(a->eps) && a->eps >= 0.0f, INA_ERR_INVALID_ARGUMENT,
              "ina_custom_ar_run: eps %g must be finite and >= 0", (double)a->eps);
  INA_REQUIRE((a->y_fp8 == NULL) == (a->y_scale_inv == NULL), INA_ERR_INVALID_ARGUMENT,
              "ina_custom_ar_run: y_fp8 and y_scale_inv must be given together");
  INA_REQUIRE(aligned(a->out, 16) && aligned(a->residual, 16) && aligned(a->norm_weight, 16) &&
                  aligned(a->y_fp8, 8) && aligned(a->y_scale_inv, 4),
              INA_ERR_INVALID_ARGUMENT,
              "ina_custom_ar_run on rank %d: epilogue buffers must be aligned (out, residual, "
              "weight 16 bytes; y_fp8 8; y_scale_inv 4)", ar->rank);
  INA_REQUIRE(!overlaps(a->residual, a->residual ? bytes : 0, a->out, bytes) &&
                  !overlaps(a->residual, a->residual ? bytes : 0, a->in, bytes) &&
                  !overlaps(a->y_fp8, a->y_fp8 ? a->count : 0, a->out, bytes) &&
                  !overlaps(a->y_fp8, a->y_fp8 ? a->count : 0, a->residual,
                            a->residual ? bytes : 0),
              INA_ERR_INVALID_ARGUMENT,
              "ina_custom_ar_run on rank %d: residual, out, in and y_fp8 must not overlap",
              ar->rank);
fail:
  return st;
}

/* Checked mode: every rank must run the same (mode, algo, count, rows, cols). */
static ina_status_t check_header(ina_custom_ar_t *ar, const ina_custom_ar_args_t *a, int64_t rows,
                                 int64_t cols) {
  ina_status_t st = INA_OK;
  const char *op = "ina_custom_ar_run (checked mode)";
  const int64_t mine[5] = {(int64_t)a->mode, (int64_t)a->algo, (int64_t)a->count, rows, cols};
  int64_t *all = malloc(sizeof mine * (size_t)ar->nranks);
  INA_CHECK_ALLOC(all);
  INA_CHECK(allgather_bytes(ar->ctl, mine, sizeof mine, all, op));
  for (int r = 0; r < ar->nranks; r++) {
    const int64_t *h = all + 5 * r;
    INA_REQUIRE(memcmp(h, mine, sizeof mine) == 0, INA_ERR_INVALID_ARGUMENT,
                "%s on rank %d: rank %d runs mode %lld algo %lld count %lld rows %lld cols %lld, "
                "this rank mode %lld algo %lld count %lld rows %lld cols %lld",
                op, ar->rank, r, (long long)h[0], (long long)h[1], (long long)h[2],
                (long long)h[3], (long long)h[4], (long long)mine[0], (long long)mine[1],
                (long long)mine[2], (long long)mine[3], (long long)mine[4]);
  }
fail:
  free(all);
  return st;
}

static void fill_epilogue(const ina_custom_ar_args_t *a, ina_car_kernel_args_t *k) {
  k->epilogue = 1;
  k->cols = a->cols;
  k->residual = a->residual;
  k->weight = a->norm_weight;
  k->weight_f32 = a->norm_weight_dtype == INA_DTYPE_F32;
  k->eps = a->eps;
  k->y_fp8 = a->y_fp8;
  k->y_scale_inv = a->y_scale_inv;
}

ina_status_t ina_custom_ar_run(ina_custom_ar_t *ar, const ina_custom_ar_args_t *a) {
  ina_status_t st = INA_OK;
  ina_car_request_t req;
  ina_car_plan_t plan;
  ina_car_kernel_args_t k;
  int algo = 0, device = -1;
  INA_REQUIRE(ar != NULL, INA_ERR_INVALID_ARGUMENT, "ina_custom_ar_run: instance is NULL");
  INA_REQUIRE_VERSIONED(a, ARGS_V1_SIZE, "ina_custom_ar_run: args", "INA_CUSTOM_AR_ARGS_INIT");
  if (ar->watchdog && ar->watchdog->tripped) {
    const ina_car_watchdog_t *w = ar->watchdog;
    INA_REQUIRE(0, INA_ERR_CUDA,
                "ina_custom_ar_run on rank %d: an earlier run timed out: CTA %d of rank %d "
                "waited more than %.1f s for rank %d at the %s of run %llu (counter "
                "at %llu); the CUDA context is lost",
                ar->rank, (int)w->block, (int)w->rank, ar->timeout_s, (int)w->peer,
                w->kind == INA_CAR_FLAG_READY ? "ready barrier"
                : w->kind == INA_CAR_FLAG_MID ? "mid barrier"
                                              : "LL data wait",
                (unsigned long long)w->epoch,
                (unsigned long long)w->seen);
  }
  const int epilogue = a->norm_weight != NULL;
  const int64_t rows = epilogue ? a->rows : 0, cols = epilogue ? a->cols : 0;
  fill_request(ar, (int)a->mode, (int)a->algo, a->count, rows, cols, &req);
  INA_CHECK(ina_car_choose(&req, &algo, &plan));
  if (a->count > 0) INA_CHECK(check_buffers(ar, a, epilogue));
  if (ar->check) INA_CHECK(check_header(ar, a, rows, cols));
  if (a->count == 0) return INA_OK;
  INA_CHECK(cuda_status(cudaGetDevice(&device), "cudaGetDevice", ar->rank));
  INA_REQUIRE(device == ar->device, INA_ERR_INVALID_ARGUMENT,
              "ina_custom_ar_run on rank %d: current device %d, but the instance was made on %d",
              ar->rank, device, ar->device);

  memset(&k, 0, sizeof k);
  k.in = a->in;
  k.out = a->out;
  if (epilogue) fill_epilogue(a, &k);
  if (algo == INA_CAR_ALGO_NCCL) {
    const ina_dtype_t dtype = a->mode == INA_CUSTOM_AR_F32 ? INA_DTYPE_F32 : INA_DTYPE_BF16;
    INA_CHECK(ina_comm_all_reduce(ar->comm, a->in, a->out, a->count, dtype, a->stream));
    if (epilogue) INA_CHECK(ina_car_launch_epilogue(&k, rows, a->stream));
    return INA_OK;
  }
  k.plan = plan;
  k.layout = ar->layout;
  for (int r = 0; r < ar->nranks; r++) k.base[r] = ar->base[r];
  k.rank = ar->rank;
  k.zero_copy = plan.algo == INA_CAR_ALGO_TWO_SHOT && plan.mode != INA_CAR_MODE_FP8 &&
                (const uint8_t *)a->in == ar->base[ar->rank] + ar->layout.input;
  k.in_aligned = aligned(a->in, 16);
  k.out_aligned = aligned(a->out, 16);
  k.in_place = a->in == a->out;
  k.timeout_ns = ar->timeout_ns;
  k.watchdog = ar->watchdog_dev;
  INA_LOG_D(INA_LOG_SUBSYS, "rank %d: %s %zu elements, mode %d%s%s", ar->rank, algo_name(algo),
            a->count, (int)a->mode, epilogue ? ", epilogue" : "", k.zero_copy ? ", zero-copy" : "");
  INA_CHECK(ina_car_launch(&k, a->stream));
fail:
  return st;
}
