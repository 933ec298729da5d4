/* The non-blocking all-to-all of self-sized messages (a2a.h) over MPI: an Isend to each
 * peer at start; at finish a matched probe (MPI_Improbe) per peer gives each message's
 * size, a receive of that size (MPI_Imrecv) takes it, and one poll loop completes the
 * receives and the sends against the communicator's deadline. */
#define INA_LOG_SUBSYS "comm"
#include "comm/a2a.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "core/check.h"

/* Tags above the ones comm_mpi.c's point-to-point uses, wrapping within MPI's minimum
 * tag bound (32767). */
enum { A2A_TAG_FIRST = 0x1000, A2A_TAG_COUNT = 0x6000 };

typedef struct buffer {
  void *p;
  size_t cap;
} buffer_t;

struct ina_comm_a2a {
  ina_comm_t *comm;
  int tag;
  int in_flight;          /* a round started and not finished */
  int failed;             /* a round failed: its requests may still touch the buffers */
  MPI_Request *send_req;  /* [size] */
  MPI_Request *recv_req;  /* [size] */
  buffer_t *recv;         /* [size] this exchange's receive buffers */
  const void **recv_at;   /* [size] what finish hands out */
  size_t *recv_bytes;     /* [size] */
  const void *own;        /* this rank's own send entry, handed back by finish */
  size_t own_bytes;
};

int ina_comm_a2a_tag(const ina_comm_a2a_t *a) { return a ? a->tag : -1; }

void ina_comm_a2a_destroy(ina_comm_a2a_t *a) {
  if (!a) return;
  const int n = a->comm->size;
  int pending = 0;
  for (int p = 0; p < n; p++) {
    if (a->send_req[p] != MPI_REQUEST_NULL) MPI_Request_free(&a->send_req[p]);
    if (a->recv_req[p] != MPI_REQUEST_NULL) {
      MPI_Request_free(&a->recv_req[p]);
      pending = 1;
    }
  }
  /* A receive abandoned by a timeout may still be written by a late peer: its buffers
   * are left to it (the job ends after such a failure in practice). */
  if (!pending)
    for (int p = 0; p < n; p++) free(a->recv[p].p);
  else
    INA_LOG_W(INA_LOG_SUBSYS, "rank %d: leaking the buffers of an exchange whose receive never completed",
              a->comm->rank);
  free(a->send_req);
  free(a->recv_req);
  free(a->recv);
  free(a->recv_at);
  free(a->recv_bytes);
  free(a);
}

ina_status_t ina_comm_a2a_create(ina_comm_t *comm, ina_comm_a2a_t **out) {
  ina_status_t st = INA_OK;
  ina_comm_a2a_t *a = NULL;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "a2a create: out is NULL");
  *out = NULL;
  INA_REQUIRE(comm != NULL, INA_ERR_INVALID_ARGUMENT, "a2a create: communicator is NULL");
  const size_t n = (size_t)comm->size;
  a = calloc(1, sizeof *a);
  INA_CHECK_ALLOC(a);
  a->comm = comm;
  a->tag = A2A_TAG_FIRST + comm->a2a_created++ % A2A_TAG_COUNT;
  a->send_req = malloc(n * sizeof *a->send_req);
  a->recv_req = malloc(n * sizeof *a->recv_req);
  a->recv = calloc(n, sizeof *a->recv);
  a->recv_at = calloc(n, sizeof *a->recv_at);
  a->recv_bytes = calloc(n, sizeof *a->recv_bytes);
  if (!a->send_req || !a->recv_req || !a->recv || !a->recv_at || !a->recv_bytes) {
    free(a->send_req), free(a->recv_req), free(a->recv), free(a->recv_at), free(a->recv_bytes), free(a);
    a = NULL;
    INA_CHECK_ALLOC(a);
  }
  for (size_t p = 0; p < n; p++) a->send_req[p] = a->recv_req[p] = MPI_REQUEST_NULL;
  *out = a;
fail:
  return st;
}

ina_status_t ina_comm_a2a_start(ina_comm_a2a_t *a, const void *const *send, const size_t *send_bytes) {
  ina_status_t st = INA_OK;
  static char empty;
  INA_REQUIRE(a != NULL && send != NULL && send_bytes != NULL, INA_ERR_INVALID_ARGUMENT,
              "a2a start: exchange %p, send %p, send_bytes %p", (void *)a, (const void *)send,
              (const void *)send_bytes);
  ina_comm_t *c = a->comm;
  INA_REQUIRE(!c->broken, INA_ERR_MPI, "a2a start on rank %d: the communicator is broken by an earlier timeout or failure",
              c->rank);
  INA_REQUIRE(!a->in_flight, INA_ERR_INVALID_ARGUMENT, "a2a start on rank %d: the previous round (tag %d) is not finished",
              c->rank, a->tag);
  INA_REQUIRE(!a->failed, INA_ERR_INVALID_ARGUMENT, "a2a start on rank %d: an earlier round (tag %d) failed", c->rank,
              a->tag);
  for (int p = 0; p < c->size; p++) {
    INA_REQUIRE(send_bytes[p] <= (size_t)INT_MAX, INA_ERR_UNSUPPORTED,
                "a2a start on rank %d: %zu bytes to rank %d are more than one message takes", c->rank, send_bytes[p], p);
    INA_REQUIRE(send_bytes[p] == 0 || send[p] != NULL, INA_ERR_INVALID_ARGUMENT,
                "a2a start on rank %d: NULL buffer of %zu bytes for rank %d", c->rank, send_bytes[p], p);
  }
  a->own = send[c->rank];
  a->own_bytes = send_bytes[c->rank];
  a->in_flight = 1;
  for (int p = 0; p < c->size; p++) {
    if (p == c->rank) continue;
    const int rc = MPI_Isend(send_bytes[p] ? send[p] : &empty, (int)send_bytes[p], MPI_BYTE, p, a->tag, c->mpi,
                             &a->send_req[p]);
    if (rc != MPI_SUCCESS) {
      a->failed = 1;
      c->broken = 1;
      return ina_comm_mpi_error(c, "a2a start", rc);
    }
  }
fail:
  return st;
}

static ina_status_t grow(buffer_t *b, size_t bytes) {
  ina_status_t st = INA_OK;
  if (bytes <= b->cap && b->p) return INA_OK;
  void *p = realloc(b->p, bytes ? bytes : 1);
  INA_CHECK_ALLOC(p);
  b->p = p;
  b->cap = bytes;
fail:
  return st;
}

/* The peers whose message has not come, for the timeout's message. */
static void missing_peers(const ina_comm_a2a_t *a, const int *matched, char *out, size_t cap) {
  size_t at = 0;
  out[0] = 0;
  for (int p = 0; p < a->comm->size && at + 16 < cap; p++)
    if (p != a->comm->rank && !matched[p]) at += (size_t)snprintf(out + at, cap - at, "%s%d", at ? " " : "", p);
}

ina_status_t ina_comm_a2a_finish(ina_comm_a2a_t *a, const void *const **recv, const size_t **recv_bytes) {
  ina_status_t st = INA_OK;
  int *matched = NULL;
  INA_REQUIRE(a != NULL && recv != NULL && recv_bytes != NULL, INA_ERR_INVALID_ARGUMENT,
              "a2a finish: exchange %p, recv %p, recv_bytes %p", (void *)a, (const void *)recv, (const void *)recv_bytes);
  INA_REQUIRE(a->in_flight, INA_ERR_INVALID_ARGUMENT, "a2a finish on rank %d: no round started (tag %d)",
              a->comm->rank, a->tag);
  ina_comm_t *c = a->comm;
  const int n = c->size, me = c->rank;
  matched = calloc((size_t)n, sizeof *matched);
  INA_CHECK_ALLOC(matched);
  matched[me] = 1;
  int left = n - 1;
  const double start = ina_comm_now_s();
  const double deadline = c->timeout_s > 0 ? start + c->timeout_s : 0;
  for (int polls = 0;; polls++) {
    for (int p = 0; p < n && left; p++) {
      if (matched[p]) continue;
      int flag = 0, bytes = 0;
      MPI_Message msg;
      MPI_Status status;
      int rc = MPI_Improbe(p, a->tag, c->mpi, &flag, &msg, &status);
      if (rc == MPI_SUCCESS && !flag) continue;
      if (rc == MPI_SUCCESS) rc = MPI_Get_count(&status, MPI_BYTE, &bytes);
      if (rc != MPI_SUCCESS) {
        c->broken = 1;
        st = ina_comm_mpi_error(c, "a2a finish (probe)", rc);
        goto fail;
      }
      st = grow(&a->recv[p], (size_t)bytes);
      if (st != INA_OK) { /* the message is matched: it must still be taken off the wire */
        static char sink;
        MPI_Mrecv(&sink, 0, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
        goto fail;
      }
      rc = MPI_Imrecv(a->recv[p].p, bytes, MPI_BYTE, &msg, &a->recv_req[p]);
      if (rc != MPI_SUCCESS) {
        c->broken = 1;
        st = ina_comm_mpi_error(c, "a2a finish (receive)", rc);
        goto fail;
      }
      a->recv_bytes[p] = (size_t)bytes;
      matched[p] = 1;
      left--;
    }
    int recvs_done = 0, sends_done = 0;
    int rc = MPI_Testall(n, a->recv_req, &recvs_done, MPI_STATUSES_IGNORE);
    if (rc == MPI_SUCCESS) rc = MPI_Testall(n, a->send_req, &sends_done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      c->broken = 1;
      st = ina_comm_mpi_error(c, "a2a finish", rc);
      goto fail;
    }
    if (!left && recvs_done && sends_done) break;
    if (deadline > 0 && ina_comm_now_s() > deadline) {
      char who[256];
      missing_peers(a, matched, who, sizeof who);
      c->broken = 1;
      ina_error(INA_LOG_SUBSYS,
                "a2a finish (tag %d) on rank %d of %d: timed out after %.1f s (INA_COMM_TIMEOUT_S) waiting for %s; "
                "the communicator is now broken",
                a->tag, me, n, c->timeout_s, who[0] ? who : "the transfers to finish");
      st = INA_ERR_MPI;
      goto fail;
    }
    ina_comm_mpi_pause(start, polls);
  }
  a->recv_at[me] = a->own;
  a->recv_bytes[me] = a->own_bytes;
  for (int p = 0; p < n; p++)
    if (p != me) a->recv_at[p] = a->recv[p].p;
  a->in_flight = 0;
  *recv = a->recv_at;
  *recv_bytes = a->recv_bytes;
  free(matched);
  return INA_OK;
fail:
  a->failed = 1;
  free(matched);
  return st;
}
