/* The NCCL backend: device buffers, operations enqueued on a CUDA stream. The unique id
 * is broadcast over the communicator's MPI twin. Completion and failure detection are in
 * ina_comm_nccl_sync: it polls the stream and ncclCommGetAsyncError against the deadline
 * and aborts the NCCL communicator on timeout, so a dead peer cannot hang the caller. */
#define INA_LOG_SUBSYS "comm"
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdlib.h>
#include <time.h>

#include "comm/comm_internal.h"
#include "core/check.h"

struct ina_comm_nccl {
  ncclComm_t comm;
  float *scratch; /* one device float for the barrier */
};

#define NCCL_OR_FAIL(c, call, op)                                                        \
  do {                                                                                   \
    ncclResult_t r_ = (call);                                                            \
    INA_REQUIRE(r_ == ncclSuccess, INA_ERR_NCCL, "%s on rank %d of %d: %s: %s", op,      \
                (c)->rank, (c)->size, #call, ncclGetErrorString(r_));                    \
  } while (0)

#define CUDA_OR_FAIL(c, call, op)                                                        \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    INA_REQUIRE(e_ == cudaSuccess, INA_ERR_CUDA, "%s on rank %d of %d: %s: %s", op,      \
                (c)->rank, (c)->size, #call, cudaGetErrorString(e_));                    \
  } while (0)

static ncclDataType_t nccl_type(ina_dtype_t dtype, size_t *scale) {
  *scale = 1;
  switch (dtype) {
    case INA_DTYPE_F32: return ncclFloat32;
    case INA_DTYPE_BF16: return ncclBfloat16;
    case INA_DTYPE_F16: return ncclFloat16;
    case INA_DTYPE_I32: return ncclInt32;
    case INA_DTYPE_I64: return ncclInt64;
    default: *scale = ina_dtype_size(dtype); return ncclUint8; /* moved as bytes */
  }
}

ina_status_t ina_comm_nccl_create(ina_comm_t *c) {
  ina_status_t st = INA_OK;
  ncclUniqueId id;
  const char *op = "nccl init";
  c->nccl = calloc(1, sizeof(*c->nccl));
  INA_CHECK_ALLOC(c->nccl);
  if (c->rank == 0) NCCL_OR_FAIL(c, ncclGetUniqueId(&id), op);
  int rc = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, c->mpi);
  if (rc != MPI_SUCCESS) {
    st = ina_comm_mpi_error(c, "nccl init (unique id broadcast)", rc);
    goto fail;
  }
  NCCL_OR_FAIL(c, ncclCommInitRank(&c->nccl->comm, c->size, id, c->rank), op);
  CUDA_OR_FAIL(c, cudaMalloc((void **)&c->nccl->scratch, sizeof(float)), op);
  return INA_OK;
fail:
  ina_comm_nccl_destroy(c);
  return st;
}

void ina_comm_nccl_destroy(ina_comm_t *c) {
  if (!c->nccl) return;
  if (c->nccl->comm) {
    if (c->broken) ncclCommAbort(c->nccl->comm);
    else ncclCommDestroy(c->nccl->comm);
  }
  cudaFree(c->nccl->scratch);
  free(c->nccl);
  c->nccl = NULL;
}

ina_status_t ina_comm_nccl_all_reduce(ina_comm_t *c, const void *send, void *recv, size_t count,
                                      ina_dtype_t dtype, void *stream) {
  ina_status_t st = INA_OK;
  size_t scale;
  ncclDataType_t t = nccl_type(dtype, &scale);
  NCCL_OR_FAIL(c, ncclAllReduce(send, recv, count, t, ncclSum, c->nccl->comm,
                                (cudaStream_t)stream), "all_reduce");
fail:
  return st;
}

ina_status_t ina_comm_nccl_all_gather(ina_comm_t *c, const void *send, void *recv, size_t count,
                                      ina_dtype_t dtype, void *stream) {
  ina_status_t st = INA_OK;
  size_t scale;
  ncclDataType_t t = nccl_type(dtype, &scale);
  NCCL_OR_FAIL(c, ncclAllGather(send, recv, count * scale, t, c->nccl->comm,
                                (cudaStream_t)stream), "all_gather");
fail:
  return st;
}

ina_status_t ina_comm_nccl_reduce_scatter(ina_comm_t *c, const void *send, void *recv,
                                          size_t recv_count, ina_dtype_t dtype, void *stream) {
  ina_status_t st = INA_OK;
  size_t scale;
  ncclDataType_t t = nccl_type(dtype, &scale);
  NCCL_OR_FAIL(c, ncclReduceScatter(send, recv, recv_count, t, ncclSum, c->nccl->comm,
                                    (cudaStream_t)stream), "reduce_scatter");
fail:
  return st;
}

ina_status_t ina_comm_nccl_all_to_all_v(ina_comm_t *c, const void *send,
                                        const size_t *send_counts, const size_t *send_displs,
                                        void *recv, const size_t *recv_counts,
                                        const size_t *recv_displs, ina_dtype_t dtype,
                                        void *stream) {
  ina_status_t st = INA_OK;
  const char *op = "all_to_all_v";
  size_t scale, eb = ina_dtype_size(dtype), soff = 0, roff = 0;
  ncclDataType_t t = nccl_type(dtype, &scale);
  NCCL_OR_FAIL(c, ncclGroupStart(), op);
  for (int p = 0; p < c->size; p++) {
    size_t sd = send_displs ? send_displs[p] : soff, rd = recv_displs ? recv_displs[p] : roff;
    if (send_counts[p])
      NCCL_OR_FAIL(c, ncclSend((const char *)send + sd * eb, send_counts[p] * scale, t, p,
                               c->nccl->comm, (cudaStream_t)stream), op);
    if (recv_counts[p])
      NCCL_OR_FAIL(c, ncclRecv((char *)recv + rd * eb, recv_counts[p] * scale, t, p,
                               c->nccl->comm, (cudaStream_t)stream), op);
    soff += send_counts[p];
    roff += recv_counts[p];
  }
  NCCL_OR_FAIL(c, ncclGroupEnd(), op);
  return INA_OK;
fail:
  ncclGroupEnd();
  return st;
}

ina_status_t ina_comm_nccl_send_recv(ina_comm_t *c, const void *send, size_t send_count,
                                     int send_peer, void *recv, size_t recv_count, int recv_peer,
                                     ina_dtype_t dtype, void *stream) {
  ina_status_t st = INA_OK;
  const char *op = "send_recv";
  size_t scale;
  ncclDataType_t t = nccl_type(dtype, &scale);
  NCCL_OR_FAIL(c, ncclGroupStart(), op);
  if (send_peer >= 0)
    NCCL_OR_FAIL(c, ncclSend(send, send_count * scale, t, send_peer, c->nccl->comm,
                             (cudaStream_t)stream), op);
  if (recv_peer >= 0)
    NCCL_OR_FAIL(c, ncclRecv(recv, recv_count * scale, t, recv_peer, c->nccl->comm,
                             (cudaStream_t)stream), op);
  NCCL_OR_FAIL(c, ncclGroupEnd(), op);
  return INA_OK;
fail:
  ncclGroupEnd();
  return st;
}

ina_status_t ina_comm_nccl_broadcast(ina_comm_t *c, void *buf, size_t count, ina_dtype_t dtype,
                                     int root, void *stream) {
  ina_status_t st = INA_OK;
  size_t scale;
  ncclDataType_t t = nccl_type(dtype, &scale);
  NCCL_OR_FAIL(c, ncclBroadcast(buf, buf, count * scale, t, root, c->nccl->comm,
                                (cudaStream_t)stream), "broadcast");
fail:
  return st;
}

ina_status_t ina_comm_nccl_barrier(ina_comm_t *c, void *stream) {
  ina_status_t st = INA_OK;
  /* A one-element all-reduce orders the stream after every rank's earlier work. */
  NCCL_OR_FAIL(c, ncclAllReduce(c->nccl->scratch, c->nccl->scratch, 1, ncclFloat32, ncclSum,
                                c->nccl->comm, (cudaStream_t)stream), "barrier");
  INA_CHECK(ina_comm_nccl_sync(c, stream));
fail:
  return st;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

ina_status_t ina_comm_nccl_sync(ina_comm_t *c, void *stream) {
  ina_status_t st = INA_OK;
  const char *op = "sync";
  double deadline = c->timeout_s > 0 ? now_s() + c->timeout_s : 0;
  struct timespec nap = {0, 20000};
  for (;;) {
    cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
    if (e == cudaSuccess) return INA_OK;
    CUDA_OR_FAIL(c, e == cudaErrorNotReady ? cudaSuccess : e, op);
    ncclResult_t async = ncclSuccess;
    NCCL_OR_FAIL(c, ncclCommGetAsyncError(c->nccl->comm, &async), op);
    if (async != ncclSuccess) {
      c->broken = 1;
      ncclCommAbort(c->nccl->comm);
      c->nccl->comm = NULL;
      INA_REQUIRE(0, INA_ERR_NCCL, "%s on rank %d of %d: asynchronous NCCL error: %s", op,
                  c->rank, c->size, ncclGetErrorString(async));
    }
    if (deadline > 0 && now_s() > deadline) {
      c->broken = 1;
      ncclCommAbort(c->nccl->comm);
      c->nccl->comm = NULL;
      INA_REQUIRE(0, INA_ERR_NCCL,
                  "%s on rank %d of %d: timed out after %.1f s (INA_COMM_TIMEOUT_S); the NCCL "
                  "communicator was aborted", op, c->rank, c->size, c->timeout_s);
    }
    nanosleep(&nap, NULL);
  }
fail:
  return st;
}
