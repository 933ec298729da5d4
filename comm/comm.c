/* The communicator object: creation, argument validation and dispatch to a backend. */
#define INA_LOG_SUBSYS "comm"
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "core/check.h"

int ina_comm_have_nccl(void) {
#ifdef INA_HAVE_NCCL
  return 1;
#else
  return 0;
#endif
}

static int env_flag(const char *name) {
  const char *v = getenv(name);
  return v && v[0] && strcmp(v, "0") != 0;
}

ina_status_t ina_comm_create_from_mpi(MPI_Comm mpi, ina_comm_backend_t backend, ina_comm_t **out) {
  ina_status_t st = INA_OK;
  ina_comm_t *c = NULL;
  *out = NULL;
  INA_REQUIRE(backend == INA_COMM_BACKEND_MPI || backend == INA_COMM_BACKEND_NCCL,
              INA_ERR_INVALID_ARGUMENT, "comm create: unknown backend %d", (int)backend);
  INA_REQUIRE(backend == INA_COMM_BACKEND_MPI || ina_comm_have_nccl(), INA_ERR_UNSUPPORTED,
              "comm create: this build has no NCCL backend");
  c = calloc(1, sizeof(*c));
  INA_CHECK_ALLOC(c);
  c->mpi = mpi;
  mpi = MPI_COMM_NULL;
  c->backend = backend;
  c->stalled = MPI_REQUEST_NULL;
  c->timeout_s = ina_comm_timeout_from_env();
  c->check = env_flag("INA_COMM_CHECK");
  MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
  MPI_Comm_rank(c->mpi, &c->rank);
  MPI_Comm_size(c->mpi, &c->size);
  if (backend == INA_COMM_BACKEND_NCCL) {
#ifdef INA_HAVE_NCCL
    INA_CHECK(ina_comm_nccl_create(c));
#endif
  }
  *out = c;
  return INA_OK;
fail:
  if (mpi != MPI_COMM_NULL) MPI_Comm_free(&mpi);
  if (c) {
    MPI_Comm_free(&c->mpi);
    free(c);
  }
  return st;
}

void ina_comm_destroy(ina_comm_t *c) {
  if (!c) return;
#ifdef INA_HAVE_NCCL
  if (c->nccl) ina_comm_nccl_destroy(c);
#endif
  if (c->stalled != MPI_REQUEST_NULL) {
    /* A timed-out operation may still complete if the peer was only slow: give it one
     * more timeout. A request that never completes cannot be freed (MPI forbids
     * freeing an active collective request), so its communicator is leaked too. */
    c->broken = 0;
    MPI_Request req = c->stalled;
    c->stalled = MPI_REQUEST_NULL;
    if (ina_comm_mpi_wait(c, &req, "destroy (draining a timed-out operation)") != INA_OK) {
      INA_LOG_W(INA_LOG_SUBSYS, "rank %d: leaking a communicator whose operation never completed",
                c->rank);
      free(c);
      return;
    }
  }
  MPI_Comm_free(&c->mpi);
  free(c);
}

int ina_comm_rank(const ina_comm_t *c) { return c->rank; }
int ina_comm_size(const ina_comm_t *c) { return c->size; }
ina_comm_backend_t ina_comm_backend(const ina_comm_t *c) { return c->backend; }
void ina_comm_set_timeout(ina_comm_t *c, double seconds) { c->timeout_s = seconds > 0 ? seconds : 0; }
double ina_comm_timeout(const ina_comm_t *c) { return c->timeout_s; }
int ina_comm_is_broken(const ina_comm_t *c) { return c->broken; }

/* Checks common to every operation: a usable communicator, a known dtype, buffers
 * present when there is data, and (MPI) byte counts that fit MPI's int counts. */
static ina_status_t validate(const ina_comm_t *c, const char *op, ina_dtype_t dtype, size_t count,
                             const void *a, const void *b) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(c != NULL, INA_ERR_INVALID_ARGUMENT, "%s: communicator is NULL", op);
  INA_REQUIRE(!c->broken, INA_ERR_MPI,
              "%s on rank %d: the communicator is broken by an earlier timeout or failure", op,
              c->rank);
  INA_REQUIRE((int)dtype >= 0 && dtype < INA_DTYPE_COUNT, INA_ERR_INVALID_ARGUMENT,
              "%s on rank %d: invalid dtype %d", op, c->rank, (int)dtype);
  INA_REQUIRE(count == 0 || (a != NULL && b != NULL), INA_ERR_INVALID_ARGUMENT,
              "%s on rank %d: NULL buffer with count %zu", op, c->rank, count);
  /* MPI counts are ints (and all-gathers move size x count); NCCL's are size_t. */
  INA_REQUIRE(c->backend != INA_COMM_BACKEND_MPI || count <= (size_t)INT_MAX / 8 / (size_t)c->size,
              INA_ERR_UNSUPPORTED, "%s on rank %d: count %zu is too large for one MPI operation",
              op, c->rank, count);
fail:
  return st;
}

static ina_status_t validate_sum_dtype(const ina_comm_t *c, const char *op, ina_dtype_t dtype) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(dtype == INA_DTYPE_F32 || dtype == INA_DTYPE_BF16, INA_ERR_INVALID_ARGUMENT,
              "%s on rank %d: sum supports f32 and bf16, not %s", op, c->rank,
              ina_dtype_name(dtype));
fail:
  return st;
}

static ina_status_t validate_peer(const ina_comm_t *c, const char *op, int peer, int allow_none) {
  ina_status_t st = INA_OK;
  INA_REQUIRE((allow_none && peer == -1) || (peer >= 0 && peer < c->size),
              INA_ERR_INVALID_ARGUMENT, "%s on rank %d: peer %d is outside [0, %d)", op, c->rank,
              peer, c->size);
fail:
  return st;
}

#ifdef INA_HAVE_NCCL
#define DISPATCH(c, mpi_call, nccl_call) \
  ((c)->backend == INA_COMM_BACKEND_NCCL ? (nccl_call) : (mpi_call))
#else
#define DISPATCH(c, mpi_call, nccl_call) (mpi_call)
#endif

ina_status_t ina_comm_all_reduce(ina_comm_t *c, const void *send, void *recv, size_t count,
                                 ina_dtype_t dtype, void *stream) {
  ina_status_t st = INA_OK;
  const char *op = "all_reduce";
  INA_CHECK(validate(c, op, dtype, count, send, recv));
  INA_CHECK(validate_sum_dtype(c, op, dtype));
  if (c->check) INA_CHECK(ina_comm_check_header(c, op, dtype, count));
  INA_CHECK(DISPATCH(c, ina_comm_mpi_all_reduce(c, send, recv, count, dtype),
                     ina_comm_nccl_all_reduce(c, send, recv, count, dtype, stream)));
fail:
  return st;
}

ina_status_t ina_comm_all_gather(ina_comm_t *c, const void *send, void *recv, size_t count,
                                 ina_dtype_t dtype, void *stream) {
  ina_status_t st = INA_OK;
  const char *op = "all_gather";
  INA_CHECK(validate(c, op, dtype, count, send, recv));
  if (c->check) INA_CHECK(ina_comm_check_header(c, op, dtype, count));
  INA_CHECK(DISPATCH(c, ina_comm_mpi_all_gather(c, send, recv, count, dtype),
                     ina_comm_nccl_all_gather(c, send, recv, count, dtype, stream)));
fail:
  return st;
}

ina_status_t ina_comm_reduce_scatter(ina_comm_t *c, const void *send, void *recv,
                                     size_t recv_count, ina_dtype_t dtype, void *stream) {
  ina_status_t st = INA_OK;
  const char *op = "reduce_scatter";
  INA_CHECK(validate(c, op, dtype, recv_count, send, recv));
  INA_CHECK(validate_sum_dtype(c, op, dtype));
  if (c->check) INA_CHECK(ina_comm_check_header(c, op, dtype, recv_count));
  INA_CHECK(DISPATCH(c, ina_comm_mpi_reduce_scatter(c, send, recv, recv_count, dtype),
                     ina_comm_nccl_reduce_scatter(c, send, recv, recv_count, dtype, stream)));
fail:
  return st;
}

ina_status_t ina_comm_all_to_all_v(ina_comm_t *c, const void *send, const size_t *send_counts,
                                   const size_t *send_displs, void *recv,
                                   const size_t *recv_counts, const size_t *recv_displs,
                                   ina_dtype_t dtype, void *stream) {
  ina_status_t st = INA_OK;
  const char *op = "all_to_all_v";
  INA_CHECK(validate(c, op, dtype, 0, NULL, NULL));
  INA_REQUIRE(send_counts && recv_counts, INA_ERR_INVALID_ARGUMENT,
              "%s on rank %d: send_counts and recv_counts are required", op, c->rank);
  size_t send_total = 0, recv_total = 0;
  for (int p = 0; p < c->size; p++) {
    INA_CHECK(validate(c, op, dtype, send_counts[p], send, send));
    INA_CHECK(validate(c, op, dtype, recv_counts[p], recv, recv));
    send_total += send_counts[p];
    recv_total += recv_counts[p];
  }
  INA_REQUIRE(send_total <= (size_t)INT_MAX / 8 && recv_total <= (size_t)INT_MAX / 8,
              INA_ERR_UNSUPPORTED, "%s on rank %d: %zu/%zu elements are too many for one call",
              op, c->rank, send_total, recv_total);
  if (c->check) INA_CHECK(ina_comm_check_counts(c, op, dtype, send_counts, recv_counts));
  INA_CHECK(DISPATCH(c,
                     ina_comm_mpi_all_to_all_v(c, send, send_counts, send_displs, recv,
                                               recv_counts, recv_displs, dtype),
                     ina_comm_nccl_all_to_all_v(c, send, send_counts, send_displs, recv,
                                                recv_counts, recv_displs, dtype, stream)));
fail:
  return st;
}

ina_status_t ina_comm_send_recv(ina_comm_t *c, const void *send, size_t send_count, int send_peer,
                                void *recv, size_t recv_count, int recv_peer, ina_dtype_t dtype,
                                void *stream) {
  ina_status_t st = INA_OK;
  const char *op = "send_recv";
  INA_CHECK(validate(c, op, dtype, 0, NULL, NULL));
  INA_CHECK(validate_peer(c, op, send_peer, 1));
  INA_CHECK(validate_peer(c, op, recv_peer, 1));
  if (send_peer >= 0) INA_CHECK(validate(c, op, dtype, send_count, send, send));
  if (recv_peer >= 0) INA_CHECK(validate(c, op, dtype, recv_count, recv, recv));
  INA_CHECK(DISPATCH(c,
                     ina_comm_mpi_send_recv(c, send, send_count, send_peer, recv, recv_count,
                                            recv_peer, dtype),
                     ina_comm_nccl_send_recv(c, send, send_count, send_peer, recv, recv_count,
                                             recv_peer, dtype, stream)));
fail:
  return st;
}

ina_status_t ina_comm_send(ina_comm_t *c, const void *buf, size_t count, ina_dtype_t dtype,
                           int peer, void *stream) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(c != NULL, INA_ERR_INVALID_ARGUMENT, "send: communicator is NULL");
  INA_CHECK(validate_peer(c, "send", peer, 0));
  INA_CHECK(ina_comm_send_recv(c, buf, count, peer, NULL, 0, -1, dtype, stream));
fail:
  return st;
}

ina_status_t ina_comm_recv(ina_comm_t *c, void *buf, size_t count, ina_dtype_t dtype, int peer,
                           void *stream) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(c != NULL, INA_ERR_INVALID_ARGUMENT, "recv: communicator is NULL");
  INA_CHECK(validate_peer(c, "recv", peer, 0));
  INA_CHECK(ina_comm_send_recv(c, NULL, 0, -1, buf, count, peer, dtype, stream));
fail:
  return st;
}

ina_status_t ina_comm_broadcast(ina_comm_t *c, void *buf, size_t count, ina_dtype_t dtype,
                                int root, void *stream) {
  ina_status_t st = INA_OK;
  const char *op = "broadcast";
  INA_CHECK(validate(c, op, dtype, count, buf, buf));
  INA_CHECK(validate_peer(c, op, root, 0));
  if (count == 0) return INA_OK;
  INA_CHECK(DISPATCH(c, ina_comm_mpi_broadcast(c, buf, count, dtype, root),
                     ina_comm_nccl_broadcast(c, buf, count, dtype, root, stream)));
fail:
  return st;
}

ina_status_t ina_comm_barrier(ina_comm_t *c, void *stream) {
  ina_status_t st = INA_OK;
  INA_CHECK(validate(c, "barrier", INA_DTYPE_F32, 0, NULL, NULL));
  INA_CHECK(DISPATCH(c, ina_comm_mpi_barrier(c), ina_comm_nccl_barrier(c, stream)));
fail:
  return st;
}

ina_status_t ina_comm_sync(ina_comm_t *c, void *stream) {
  ina_status_t st = INA_OK;
  INA_CHECK(validate(c, "sync", INA_DTYPE_F32, 0, NULL, NULL));
  INA_CHECK(DISPATCH(c, INA_OK, ina_comm_nccl_sync(c, stream)));
fail:
  return st;
}
