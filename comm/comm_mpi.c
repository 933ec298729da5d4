/* The MPI backend: host buffers, non-blocking MPI calls completed against a deadline so
 * that a dead or hung peer turns into an error instead of a hang. */
#define INA_LOG_SUBSYS "comm"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_internal.h"
#include "core/check.h"

double ina_comm_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double ina_comm_timeout_from_env(void) {
  const char *v = getenv("INA_COMM_TIMEOUT_S");
  if (!v || !v[0]) return 60.0;
  char *end = NULL;
  double s = strtod(v, &end);
  if (end == v || s < 0) {
    INA_LOG_W(INA_LOG_SUBSYS, "INA_COMM_TIMEOUT_S='%s' is not a number >= 0; using 60", v);
    return 60.0;
  }
  return s;
}

ina_status_t ina_comm_mpi_error(const ina_comm_t *c, const char *op, int rc) {
  char msg[MPI_MAX_ERROR_STRING + 1] = "";
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
  ina_error(INA_LOG_SUBSYS, "%s on rank %d of %d: %s", op, c->rank, c->size, msg);
  return INA_ERR_MPI;
}

ina_status_t ina_comm_mpi_wait(ina_comm_t *c, MPI_Request *req, const char *op) {
  const double start = ina_comm_now_s();
  double deadline = c->timeout_s > 0 ? start + c->timeout_s : 0;
  for (int polls = 0;; polls++) {
    int done = 0;
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      c->broken = 1;
      return ina_comm_mpi_error(c, op, rc);
    }
    if (done) return INA_OK;
    if (deadline > 0 && ina_comm_now_s() > deadline) {
      c->broken = 1;
      c->stalled = *req;
      *req = MPI_REQUEST_NULL;
      ina_error(INA_LOG_SUBSYS,
                "%s on rank %d of %d: timed out after %.1f s (INA_COMM_TIMEOUT_S) waiting for "
                "peers; the communicator is now broken",
                op, c->rank, c->size, c->timeout_s);
      return INA_ERR_MPI;
    }
    ina_comm_mpi_pause(start, polls);
  }
}

void ina_comm_mpi_pause(double start, int polls) {
  /* Spin briefly for latency, then nap so that waiting ranks leave the cores to the
   * peers they wait for (ranks are oversubscribed in tests), and an idle follower
   * (waiting for the leader's next step) costs next to nothing: each nap is 1 % of the
   * wait so far, between 50 us and 10 ms, so a wake-up comes at most 1 % of the idle
   * time late (an MPI_Test costs ~0.1 ms here: 1 ms naps kept an idle rank at 11 % of
   * a core). */
  if (polls <= 1000) return;
  const double waited = ina_comm_now_s() - start;
  const double seconds = waited / 100 < 50e-6 ? 50e-6 : waited / 100 > 10e-3 ? 10e-3 : waited / 100;
  struct timespec nap = {0, (long)(seconds * 1e9)};
  nanosleep(&nap, NULL);
}

/* One MPI call that starts a request, then the wait. */
#define MPI_START(call, op)                                       \
  do {                                                            \
    int rc_ = (call);                                             \
    if (rc_ != MPI_SUCCESS) {                                     \
      st = ina_comm_mpi_error(c, op, rc_);                        \
      goto fail;                                                  \
    }                                                             \
  } while (0)

/* Elements move as bytes except where MPI must add them. */
static MPI_Datatype byte_type(ina_dtype_t dtype, int *elem_bytes) {
  *elem_bytes = (int)ina_dtype_size(dtype);
  return MPI_BYTE;
}

ina_status_t ina_comm_mpi_all_reduce(ina_comm_t *c, const void *send, void *recv, size_t count,
                                     ina_dtype_t dtype) {
  ina_status_t st = INA_OK;
  const char *op = "all_reduce";
  float *acc = NULL;
  MPI_Request req = MPI_REQUEST_NULL;
  if (dtype == INA_DTYPE_F32) {
    const void *src = send == recv ? MPI_IN_PLACE : send;
    MPI_START(MPI_Iallreduce(src, recv, (int)count, MPI_FLOAT, MPI_SUM, c->mpi, &req), op);
    INA_CHECK(ina_comm_mpi_wait(c, &req, op));
  } else { /* bf16: widen, reduce in f32, round once */
    acc = malloc((count ? count : 1) * sizeof(float));
    INA_CHECK_ALLOC(acc);
    ina_to_f32(send, INA_DTYPE_BF16, acc, count);
    MPI_START(MPI_Iallreduce(MPI_IN_PLACE, acc, (int)count, MPI_FLOAT, MPI_SUM, c->mpi, &req), op);
    INA_CHECK(ina_comm_mpi_wait(c, &req, op));
    INA_CHECK(ina_from_f32(acc, recv, INA_DTYPE_BF16, count));
  }
fail:
  free(acc);
  return st;
}

ina_status_t ina_comm_mpi_reduce_scatter(ina_comm_t *c, const void *send, void *recv,
                                         size_t recv_count, ina_dtype_t dtype) {
  ina_status_t st = INA_OK;
  const char *op = "reduce_scatter";
  float *acc = NULL;
  MPI_Request req = MPI_REQUEST_NULL;
  if (dtype == INA_DTYPE_F32) {
    MPI_START(MPI_Ireduce_scatter_block(send, recv, (int)recv_count, MPI_FLOAT, MPI_SUM, c->mpi,
                                        &req), op);
    INA_CHECK(ina_comm_mpi_wait(c, &req, op));
  } else {
    size_t total = recv_count * (size_t)c->size;
    acc = malloc((total + recv_count + 1) * sizeof(float));
    INA_CHECK_ALLOC(acc);
    float *mine = acc + total;
    ina_to_f32(send, INA_DTYPE_BF16, acc, total);
    MPI_START(MPI_Ireduce_scatter_block(acc, mine, (int)recv_count, MPI_FLOAT, MPI_SUM, c->mpi,
                                        &req), op);
    INA_CHECK(ina_comm_mpi_wait(c, &req, op));
    INA_CHECK(ina_from_f32(mine, recv, INA_DTYPE_BF16, recv_count));
  }
fail:
  free(acc);
  return st;
}

ina_status_t ina_comm_mpi_all_gather(ina_comm_t *c, const void *send, void *recv, size_t count,
                                     ina_dtype_t dtype) {
  ina_status_t st = INA_OK;
  const char *op = "all_gather";
  MPI_Request req = MPI_REQUEST_NULL;
  int eb;
  MPI_Datatype t = byte_type(dtype, &eb);
  int n = (int)count * eb;
  MPI_START(MPI_Iallgather(send, n, t, recv, n, t, c->mpi, &req), op);
  INA_CHECK(ina_comm_mpi_wait(c, &req, op));
fail:
  return st;
}

ina_status_t ina_comm_mpi_all_to_all_v(ina_comm_t *c, const void *send, const size_t *send_counts,
                                       const size_t *send_displs, void *recv,
                                       const size_t *recv_counts, const size_t *recv_displs,
                                       ina_dtype_t dtype) {
  ina_status_t st = INA_OK;
  const char *op = "all_to_all_v";
  MPI_Request req = MPI_REQUEST_NULL;
  int eb;
  MPI_Datatype t = byte_type(dtype, &eb);
  int *v = malloc(4 * (size_t)c->size * sizeof(int));
  INA_CHECK_ALLOC(v);
  int *sc = v, *sd = v + c->size, *rc = v + 2 * c->size, *rd = v + 3 * c->size;
  size_t soff = 0, roff = 0;
  for (int p = 0; p < c->size; p++) {
    sc[p] = (int)send_counts[p] * eb;
    rc[p] = (int)recv_counts[p] * eb;
    sd[p] = (int)(send_displs ? send_displs[p] : soff) * eb;
    rd[p] = (int)(recv_displs ? recv_displs[p] : roff) * eb;
    soff += send_counts[p];
    roff += recv_counts[p];
  }
  /* MPI wants valid pointers even for empty buffers. */
  static char empty;
  MPI_START(MPI_Ialltoallv(send ? send : &empty, sc, sd, t, recv ? recv : &empty, rc, rd, t,
                           c->mpi, &req), op);
  INA_CHECK(ina_comm_mpi_wait(c, &req, op));
fail:
  free(v);
  return st;
}

ina_status_t ina_comm_mpi_send_recv(ina_comm_t *c, const void *send, size_t send_count,
                                    int send_peer, void *recv, size_t recv_count, int recv_peer,
                                    ina_dtype_t dtype) {
  ina_status_t st = INA_OK;
  const char *op = send_peer >= 0 ? (recv_peer >= 0 ? "send_recv" : "send") : "recv";
  enum { TAG = 0x1a7 };
  MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  int eb;
  MPI_Datatype t = byte_type(dtype, &eb);
  if (recv_peer >= 0)
    MPI_START(MPI_Irecv(recv, (int)recv_count * eb, t, recv_peer, TAG, c->mpi, &reqs[0]), op);
  if (send_peer >= 0)
    MPI_START(MPI_Isend(send, (int)send_count * eb, t, send_peer, TAG, c->mpi, &reqs[1]), op);
  for (int i = 0; i < 2; i++) {
    if (reqs[i] == MPI_REQUEST_NULL) continue;
    INA_CHECK(ina_comm_mpi_wait(c, &reqs[i], op));
  }
  return INA_OK;
fail:
  /* A point-to-point request may be cancelled and freed, unlike a collective one. */
  for (int i = 0; i < 2; i++) {
    if (reqs[i] != MPI_REQUEST_NULL) {
      MPI_Cancel(&reqs[i]);
      MPI_Request_free(&reqs[i]);
    }
  }
  if (c->stalled != MPI_REQUEST_NULL && c->broken) {
    MPI_Cancel(&c->stalled);
    MPI_Request_free(&c->stalled);
  }
  return st;
}

ina_status_t ina_comm_mpi_broadcast(ina_comm_t *c, void *buf, size_t count, ina_dtype_t dtype,
                                    int root) {
  ina_status_t st = INA_OK;
  MPI_Request req = MPI_REQUEST_NULL;
  int eb = 0;
  const MPI_Datatype t = byte_type(dtype, &eb);
  MPI_START(MPI_Ibcast(buf, (int)(count * (size_t)eb), t, root, c->mpi, &req), "broadcast");
  INA_CHECK(ina_comm_mpi_wait(c, &req, "broadcast"));
fail:
  return st;
}

ina_status_t ina_comm_mpi_barrier(ina_comm_t *c) {
  ina_status_t st = INA_OK;
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_START(MPI_Ibarrier(c->mpi, &req), "barrier");
  INA_CHECK(ina_comm_mpi_wait(c, &req, "barrier"));
fail:
  return st;
}
