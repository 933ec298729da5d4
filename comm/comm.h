/* Communicators: collectives and point-to-point between the ranks of one group.
 *
 * A communicator is made by comm/bootstrap.h (world, node, split) and has a backend:
 *   INA_COMM_BACKEND_MPI   host buffers; `stream` arguments are ignored.
 *   INA_COMM_BACKEND_NCCL  device buffers, enqueued on `stream` (a cudaStream_t, NULL =
 *                          default stream); only in builds with NCCL (else
 *                          INA_ERR_UNSUPPORTED). Completion: ina_comm_sync.
 *
 * Counts are in elements of `dtype`. Reductions are sums over f32 or bf16; the MPI
 * backend reduces bf16 by converting to f32, reducing in f32 and rounding once, so the
 * result does not depend on the reduction order beyond f32 rounding. NCCL rounds bf16
 * after each addition, so with more than two ranks its bf16 sums depend on NCCL's
 * order (within a few bf16 ulps of the sum of magnitudes). Data movement
 * (all-gather, all-to-all, send/recv) accepts every dtype.
 *
 * Failure behaviour. Every operation returns an ina_status_t; messages name the
 * operation, the rank and the MPI/NCCL error string. MPI communicators use
 * MPI_ERRORS_RETURN. Operations that wait on peers run non-blocking and poll against a
 * deadline of INA_COMM_TIMEOUT_S seconds (default 60; 0 waits forever): a peer that died
 * or hangs makes the others fail within that time instead of hanging. After a timeout
 * the communicator is broken: later operations fail at once. Whether to end the job
 * (ina_bootstrap_abort) is the caller's choice; ina_comm_destroy waits one more timeout
 * for the stalled operation and leaks its MPI resources if it never completes. The
 * stalled operation may still read or write its buffers if the late peer ever arrives:
 * a caller that goes on after a timeout must keep them alive (or end the job).
 *
 * Checked mode (INA_COMM_CHECK=1, read at creation): before each all-reduce, all-gather,
 * reduce-scatter and all-to-all the ranks exchange a small header (operation, dtype,
 * count; for all-to-all also the per-peer counts) and fail with INA_ERR_INVALID_ARGUMENT,
 * naming the disagreeing rank, instead of corrupting memory or hanging; the communicator
 * stays usable. Barrier and send/recv are not checked (they time out instead). Cost: one
 * extra latency-bound all-gather of a 24-byte header per operation (all-to-all: that, an
 * all-to-all of 8 bytes per peer and a 1-element all-reduce) — for debugging, not
 * production.
 *
 * Ownership: the caller destroys each communicator before finalizing the bootstrap.
 * Thread safety: one thread at a time per communicator; distinct communicators may be
 * used from distinct threads when the bootstrap reports MPI_THREAD_MULTIPLE. */
#ifndef INA_COMM_COMM_H
#define INA_COMM_COMM_H

#include <stddef.h>

#include "core/dtype.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_comm ina_comm_t;

typedef enum ina_comm_backend {
  INA_COMM_BACKEND_MPI = 0,
  INA_COMM_BACKEND_NCCL = 1,
} ina_comm_backend_t;

/* 1 when this build has the NCCL backend. */
int ina_comm_have_nccl(void);

/* NULL is a no-op. Collective over the communicator's ranks. */
void ina_comm_destroy(ina_comm_t *comm);
int ina_comm_rank(const ina_comm_t *comm);
int ina_comm_size(const ina_comm_t *comm);
ina_comm_backend_t ina_comm_backend(const ina_comm_t *comm);
/* Seconds an operation may wait for peers (0 = forever); starts at INA_COMM_TIMEOUT_S. */
void ina_comm_set_timeout(ina_comm_t *comm, double seconds);
double ina_comm_timeout(const ina_comm_t *comm);
/* 1 after a timeout or a failed operation left the communicator unusable. */
int ina_comm_is_broken(const ina_comm_t *comm);

/* recv[i] = sum over ranks of send[i], i < count. send == recv is allowed (in place). */
ina_status_t ina_comm_all_reduce(ina_comm_t *comm, const void *send, void *recv, size_t count,
                                 ina_dtype_t dtype, void *stream);
/* recv[r * count + i] = send of rank r [i]; recv holds size * count elements. send and
 * recv must not overlap (likewise for reduce-scatter and all-to-all). */
ina_status_t ina_comm_all_gather(ina_comm_t *comm, const void *send, void *recv, size_t count,
                                 ina_dtype_t dtype, void *stream);
/* send holds size * recv_count elements; rank r gets the sum of every rank's block r. */
ina_status_t ina_comm_reduce_scatter(ina_comm_t *comm, const void *send, void *recv,
                                     size_t recv_count, ina_dtype_t dtype, void *stream);
/* All-to-all with per-peer counts: the send_counts[p] elements at send + send_displs[p]
 * go to peer p, which stores them at its recv + recv_displs[me]. The arrays have size
 * entries; displacements (in elements) may be NULL for packed buffers in rank order.
 * recv_counts[p] must equal peer p's send_counts[me] (checked in checked mode). */
ina_status_t ina_comm_all_to_all_v(ina_comm_t *comm, const void *send, const size_t *send_counts,
                                   const size_t *send_displs, void *recv,
                                   const size_t *recv_counts, const size_t *recv_displs,
                                   ina_dtype_t dtype, void *stream);
/* A send may not complete (NCCL: the stream does not move on) until the peer posts the
 * matching receive: two ranks that both send first deadlock until the timeout. Order
 * them, or use ina_comm_send_recv. */
ina_status_t ina_comm_send(ina_comm_t *comm, const void *buf, size_t count, ina_dtype_t dtype,
                           int peer, void *stream);
ina_status_t ina_comm_recv(ina_comm_t *comm, void *buf, size_t count, ina_dtype_t dtype,
                           int peer, void *stream);
/* Simultaneous send to send_peer and receive from recv_peer (a ring step) without the
 * deadlock of a blocking send followed by a receive. */
ina_status_t ina_comm_send_recv(ina_comm_t *comm, const void *send, size_t send_count,
                                int send_peer, void *recv, size_t recv_count, int recv_peer,
                                ina_dtype_t dtype, void *stream);
/* buf (count elements) of rank `root` to every rank's buf. Not checked in checked mode. */
ina_status_t ina_comm_broadcast(ina_comm_t *comm, void *buf, size_t count, ina_dtype_t dtype,
                                int root, void *stream);
ina_status_t ina_comm_barrier(ina_comm_t *comm, void *stream);
/* NCCL: waits for `stream` while polling for asynchronous NCCL errors; aborts the NCCL
 * communicator on timeout. MPI: no-op (its operations complete before returning). */
ina_status_t ina_comm_sync(ina_comm_t *comm, void *stream);

#ifdef __cplusplus
}
#endif
#endif
