/* Checked mode (INA_COMM_CHECK=1): the ranks exchange what each is about to do, so a
 * mismatch (different operation, dtype or count) fails on every rank with a message
 * instead of corrupting memory or hanging. */
#define INA_LOG_SUBSYS "comm"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "core/check.h"

/* A stable small id per operation name, so headers compare as integers. */
static int64_t op_id(const char *op) {
  uint64_t h = 1469598103934665603ull;
  for (const char *p = op; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  return (int64_t)(h >> 1);
}

ina_status_t ina_comm_check_header(ina_comm_t *c, const char *op, ina_dtype_t dtype,
                                   size_t count) {
  ina_status_t st = INA_OK;
  MPI_Request req = MPI_REQUEST_NULL;
  int64_t mine[3] = {op_id(op), (int64_t)dtype, (int64_t)count};
  int64_t *all = malloc(3 * (size_t)c->size * sizeof(int64_t));
  INA_CHECK_ALLOC(all);
  int rc = MPI_Iallgather(mine, 3, MPI_INT64_T, all, 3, MPI_INT64_T, c->mpi, &req);
  if (rc != MPI_SUCCESS) {
    st = ina_comm_mpi_error(c, op, rc);
    goto fail;
  }
  INA_CHECK(ina_comm_mpi_wait(c, &req, op));
  for (int r = 0; r < c->size; r++) {
    const int64_t *h = all + 3 * r;
    INA_REQUIRE(h[0] == mine[0], INA_ERR_INVALID_ARGUMENT,
                "%s on rank %d: rank %d is running a different operation (checked mode)", op,
                c->rank, r);
    INA_REQUIRE(h[1] == mine[1], INA_ERR_INVALID_ARGUMENT,
                "%s on rank %d: dtype %s here but %s on rank %d (checked mode)", op, c->rank,
                ina_dtype_name(dtype), ina_dtype_name((ina_dtype_t)h[1]), r);
    INA_REQUIRE(h[2] == mine[2], INA_ERR_INVALID_ARGUMENT,
                "%s on rank %d: count %zu here but %lld on rank %d (checked mode)", op, c->rank,
                count, (long long)h[2], r);
  }
fail:
  free(all);
  return st;
}

ina_status_t ina_comm_check_counts(ina_comm_t *c, const char *op, ina_dtype_t dtype,
                                   const size_t *send_counts, const size_t *recv_counts) {
  ina_status_t st = INA_OK;
  MPI_Request req = MPI_REQUEST_NULL;
  int64_t *buf = NULL;
  INA_CHECK(ina_comm_check_header(c, op, dtype, 0));
  buf = malloc(2 * (size_t)c->size * sizeof(int64_t));
  INA_CHECK_ALLOC(buf);
  int64_t *out = buf, *in = buf + c->size;
  for (int p = 0; p < c->size; p++) out[p] = (int64_t)send_counts[p];
  int rc = MPI_Ialltoall(out, 1, MPI_INT64_T, in, 1, MPI_INT64_T, c->mpi, &req);
  if (rc != MPI_SUCCESS) {
    st = ina_comm_mpi_error(c, op, rc);
    goto fail;
  }
  INA_CHECK(ina_comm_mpi_wait(c, &req, op));
  /* Every rank must learn of a mismatch anywhere, or the others would proceed and hang:
   * agree on the verdict with one more reduction. */
  int bad_peer = -1;
  for (int p = 0; p < c->size && bad_peer < 0; p++)
    if (in[p] != (int64_t)recv_counts[p]) bad_peer = p;
  int local_bad = bad_peer >= 0, any_bad = 0;
  rc = MPI_Iallreduce(&local_bad, &any_bad, 1, MPI_INT, MPI_MAX, c->mpi, &req);
  if (rc != MPI_SUCCESS) {
    st = ina_comm_mpi_error(c, op, rc);
    goto fail;
  }
  INA_CHECK(ina_comm_mpi_wait(c, &req, op));
  INA_REQUIRE(bad_peer < 0, INA_ERR_INVALID_ARGUMENT,
              "%s on rank %d: expects %zu elements from rank %d, which sends %lld (checked mode)",
              op, c->rank, recv_counts[bad_peer], bad_peer, (long long)in[bad_peer]);
  INA_REQUIRE(!any_bad, INA_ERR_INVALID_ARGUMENT,
              "%s on rank %d: another rank's receive counts disagree with its senders (checked "
              "mode)", op, c->rank);
fail:
  free(buf);
  return st;
}
