/* The non-blocking all-to-all of self-sized messages (comm/a2a.h) under mpirun.
 *
 * Rounds, the same draws on every rank: three exchanges, each round starting all three
 * and finishing them in a drawn order (the same on every rank), so that a finish that
 * took another exchange's message (tags mixed up) or a message out of order shows. Every
 * message is rank p's bytes for rank q in round i of exchange j: sizes drawn from 0 (an
 * empty message) to 300 000 bytes (past MPI's eager limit, so that the large ones go by
 * rendezvous while the receiver is in another exchange's finish), contents a function of
 * (p, q, i, j, byte). Checks: each received buffer equals the expected bytes, the own
 * entry is handed back as this rank's send buffer, a start while a round is in flight
 * is refused, and (INA_COMM_TIMEOUT_S set, last part) a rank that never starts a round
 * makes the others' finish fail naming it, within the timeout. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/a2a.h"
#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "core/log.h"
#include "tests/comm/comm_test_data.h"

#define ROUNDS 24
#define EXCHANGES 3
#define MAX_BYTES 300000

static size_t size_of(uint64_t seed, int i, int j, int p, int q) {
  test_rng_t r = comm_test_rng(seed, p * 1000 + q, (uint64_t)(i * EXCHANGES + j));
  const int kind = (int)test_rng_int(&r, 0, 3);
  return kind == 0 ? 0 : kind == 1 ? (size_t)test_rng_int(&r, 1, 64) : kind == 2 ? (size_t)test_rng_int(&r, 65, 8192)
                                                                                  : (size_t)test_rng_int(&r, 8193, MAX_BYTES);
}

static uint8_t byte_of(int i, int j, int p, int q, size_t b) {
  return (uint8_t)(b * 131u + (size_t)p * 17u + (size_t)q * 29u + (size_t)i * 7u + (size_t)j * 101u);
}

int main(int argc, char **argv) {
  ina_bootstrap_t *boot = NULL;
  if (ina_bootstrap_init(&argc, &argv, &boot) != INA_OK) return 1;
  ina_comm_t *c = NULL;
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_MPI, &c));
  if (!c) return 1;
  const int n = ina_comm_size(c), me = ina_comm_rank(c);
  const uint64_t seed = comm_test_seed("test_a2a");
  ina_comm_a2a_t *ex[EXCHANGES] = {0};
  for (int j = 0; j < EXCHANGES; j++) CHECK_OK(ina_comm_a2a_create(c, &ex[j]));
  CHECK(ina_comm_a2a_tag(ex[0]) != ina_comm_a2a_tag(ex[1]) && ina_comm_a2a_tag(ex[1]) != ina_comm_a2a_tag(ex[2]));
  uint8_t *send[EXCHANGES][64];
  size_t bytes[EXCHANGES][64];
  CHECK(n <= 64);
  for (int j = 0; j < EXCHANGES; j++)
    for (int q = 0; q < n; q++) send[j][q] = malloc(MAX_BYTES);
  for (int i = 0; i < ROUNDS; i++) {
    for (int j = 0; j < EXCHANGES; j++) {
      for (int q = 0; q < n; q++) {
        bytes[j][q] = size_of(seed, i, j, me, q);
        for (size_t b = 0; b < bytes[j][q]; b++) send[j][q][b] = byte_of(i, j, me, q, b);
      }
      CHECK_OK(ina_comm_a2a_start(ex[j], (const void *const *)send[j], bytes[j]));
    }
    if (i == 0) { /* a second start of a round in flight is the caller's bug */
      ina_log_set_quiet_errors(1);
      CHECK(ina_comm_a2a_start(ex[0], (const void *const *)send[0], bytes[0]) == INA_ERR_INVALID_ARGUMENT);
      ina_log_set_quiet_errors(0);
    }
    /* The finishing order, the same on every rank. */
    test_rng_t r = comm_test_rng(seed, -1, 7000 + (uint64_t)i);
    int order[EXCHANGES] = {0, 1, 2};
    for (int k = EXCHANGES - 1; k > 0; k--) {
      const int m = (int)test_rng_int(&r, 0, k), tmp = order[k];
      order[k] = order[m];
      order[m] = tmp;
    }
    for (int k = 0; k < EXCHANGES; k++) {
      const int j = order[k];
      const void *const *got = NULL;
      const size_t *got_bytes = NULL;
      CHECK_OK(ina_comm_a2a_finish(ex[j], &got, &got_bytes));
      if (!got) continue;
      CHECKF(got[me] == send[j][me] && got_bytes[me] == bytes[j][me], "round %d exchange %d: the own entry", i, j);
      for (int p = 0; p < n; p++) {
        const size_t want = size_of(seed, i, j, p, me);
        CHECKF(got_bytes[p] == want, "round %d exchange %d: %zu bytes from rank %d, expected %zu", i, j, got_bytes[p], p, want);
        const uint8_t *m = got[p];
        size_t bad = want;
        for (size_t b = 0; b < want && b < got_bytes[p] && bad == want; b++)
          if (m[b] != byte_of(i, j, p, me, b)) bad = b;
        CHECKF(bad == want, "round %d exchange %d: rank %d's byte %zu differs", i, j, p, bad);
      }
    }
  }
  /* A rank that never starts: the others fail within the timeout, naming it. */
  const char *env = getenv("INA_COMM_TIMEOUT_S");
  const double timeout = env ? atof(env) : 0;
  if (n > 1 && timeout > 0 && timeout <= 10) {
    ina_comm_a2a_t *late = NULL;
    CHECK_OK(ina_comm_a2a_create(c, &late));
    if (me != n - 1) {
      for (int q = 0; q < n; q++) bytes[0][q] = 16;
      CHECK_OK(ina_comm_a2a_start(late, (const void *const *)send[0], bytes[0]));
      const void *const *got = NULL;
      const size_t *got_bytes = NULL;
      const double t0 = test_now_s();
      ina_log_set_quiet_errors(1);
      const ina_status_t st = ina_comm_a2a_finish(late, &got, &got_bytes);
      ina_log_set_quiet_errors(0);
      const double waited = test_now_s() - t0;
      char name[16];
      snprintf(name, sizeof name, "%d", n - 1);
      CHECKF(st == INA_ERR_MPI && strstr(ina_last_error(), "timed out") && strstr(ina_last_error(), name),
             "rank %d: a silent rank %d gave %d: %s", me, n - 1, (int)st, ina_last_error());
      CHECKF(waited >= timeout * 0.9 && waited <= timeout + 2, "rank %d failed after %.2f s (timeout %.1f)", me, waited,
             timeout);
      CHECK(ina_comm_is_broken(c));
    }
    ina_comm_a2a_destroy(late);
  }
  for (int j = 0; j < EXCHANGES; j++) {
    ina_comm_a2a_destroy(ex[j]);
    for (int q = 0; q < n; q++) free(send[j][q]);
  }
  printf("rank %d/%d: %s\n", me, n, test_checks_failed_ ? "FAILED" : "ok");
  ina_comm_destroy(c);
  const int rc = test_finish("test_a2a");
  ina_bootstrap_finalize(boot);
  return rc;
}
