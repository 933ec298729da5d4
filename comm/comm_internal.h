/* Inside comm/: the communicator's state and the backends' entry points. Not a public
 * header: only the sources of comm/ include it. */
#ifndef INA_COMM_COMM_INTERNAL_H
#define INA_COMM_COMM_INTERNAL_H

#include <mpi.h>
#include <stdint.h>

#include "comm/comm.h"

struct ina_comm_nccl; /* comm_nccl.c */

struct ina_comm {
  MPI_Comm mpi; /* owned; MPI_ERRORS_RETURN; also carries the NCCL bootstrap */
  int rank, size;
  ina_comm_backend_t backend;
  double timeout_s;    /* 0 = wait forever */
  int check;           /* INA_COMM_CHECK: header exchange before each collective */
  int broken;          /* a timeout or failure left the communicator unusable */
  MPI_Request stalled; /* the request abandoned by a timeout, MPI_REQUEST_NULL if none */
  int a2a_created;     /* exchanges made on it (comm/a2a.h): the next one's tag */
  struct ina_comm_nccl *nccl;
};

/* Takes ownership of `mpi` (freed on failure too). Collective over its ranks. */
ina_status_t ina_comm_create_from_mpi(MPI_Comm mpi, ina_comm_backend_t backend, ina_comm_t **out);

/* Records an error naming op, rank and the MPI error string; returns INA_ERR_MPI. */
ina_status_t ina_comm_mpi_error(const ina_comm_t *comm, const char *op, int rc);
/* Waits for *req against the communicator's deadline. On timeout the request is kept as
 * comm->stalled, the communicator is marked broken and INA_ERR_MPI is returned. */
ina_status_t ina_comm_mpi_wait(ina_comm_t *comm, MPI_Request *req, const char *op);
/* The pause between two polls of a wait that began at `start` (ina_comm_now_s) and has
 * polled `polls` times: none at first, then naps growing with the wait. */
void ina_comm_mpi_pause(double start, int polls);
double ina_comm_now_s(void); /* monotonic seconds */
/* Seconds from INA_COMM_TIMEOUT_S (default 60). */
double ina_comm_timeout_from_env(void);

/* Checked mode: all ranks agree on (op, dtype, count) or all fail. */
ina_status_t ina_comm_check_header(ina_comm_t *comm, const char *op, ina_dtype_t dtype,
                                   size_t count);
/* Checked mode for all-to-all: recv_counts[p] equals peer p's send_counts[me]. */
ina_status_t ina_comm_check_counts(ina_comm_t *comm, const char *op, ina_dtype_t dtype,
                                   const size_t *send_counts, const size_t *recv_counts);

/* MPI backend (comm_mpi.c): host buffers, arguments already validated. */
ina_status_t ina_comm_mpi_all_reduce(ina_comm_t *c, const void *send, void *recv, size_t count,
                                     ina_dtype_t dtype);
ina_status_t ina_comm_mpi_all_gather(ina_comm_t *c, const void *send, void *recv, size_t count,
                                     ina_dtype_t dtype);
ina_status_t ina_comm_mpi_reduce_scatter(ina_comm_t *c, const void *send, void *recv,
                                         size_t recv_count, ina_dtype_t dtype);
ina_status_t ina_comm_mpi_all_to_all_v(ina_comm_t *c, const void *send, const size_t *send_counts,
                                       const size_t *send_displs, void *recv,
                                       const size_t *recv_counts, const size_t *recv_displs,
                                       ina_dtype_t dtype);
ina_status_t ina_comm_mpi_send_recv(ina_comm_t *c, const void *send, size_t send_count,
                                    int send_peer, void *recv, size_t recv_count, int recv_peer,
                                    ina_dtype_t dtype);
ina_status_t ina_comm_mpi_broadcast(ina_comm_t *c, void *buf, size_t count, ina_dtype_t dtype,
                                    int root);
ina_status_t ina_comm_mpi_barrier(ina_comm_t *c);

/* NCCL backend (comm_nccl.c, builds with NCCL only): device buffers on `stream`. */
ina_status_t ina_comm_nccl_create(ina_comm_t *c);
void ina_comm_nccl_destroy(ina_comm_t *c);
ina_status_t ina_comm_nccl_all_reduce(ina_comm_t *c, const void *send, void *recv, size_t count,
                                      ina_dtype_t dtype, void *stream);
ina_status_t ina_comm_nccl_all_gather(ina_comm_t *c, const void *send, void *recv, size_t count,
                                      ina_dtype_t dtype, void *stream);
ina_status_t ina_comm_nccl_reduce_scatter(ina_comm_t *c, const void *send, void *recv,
                                          size_t recv_count, ina_dtype_t dtype, void *stream);
ina_status_t ina_comm_nccl_all_to_all_v(ina_comm_t *c, const void *send,
                                        const size_t *send_counts, const size_t *send_displs,
                                        void *recv, const size_t *recv_counts,
                                        const size_t *recv_displs, ina_dtype_t dtype,
                                        void *stream);
ina_status_t ina_comm_nccl_send_recv(ina_comm_t *c, const void *send, size_t send_count,
                                     int send_peer, void *recv, size_t recv_count, int recv_peer,
                                     ina_dtype_t dtype, void *stream);
ina_status_t ina_comm_nccl_broadcast(ina_comm_t *c, void *buf, size_t count, ina_dtype_t dtype,
                                     int root, void *stream);
ina_status_t ina_comm_nccl_barrier(ina_comm_t *c, void *stream);
ina_status_t ina_comm_nccl_sync(ina_comm_t *c, void *stream);

#endif
