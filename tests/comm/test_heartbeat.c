/* The job's heartbeat (comm/heartbeat.h) on 3 ranks, period P = 50 ms:
 *   1. Answers come from the heartbeat's threads: while every main thread sleeps 1 s
 *      without calling MPI, rank 0 still sees every age below AGE_BOUND.
 *   2. A stopped rank's age grows: rank 1 stops itself (SIGSTOP) and rank 0 wakes it
 *      (SIGCONT) after 1 s. Meanwhile rank 0 sees rank 1's age pass 0.8 s while rank 2's
 *      stays below the bound, and rank 2, which learns the ages from rank 0's pings,
 *      sees rank 1's pass 0.7 s. After the wake-up, rank 1's age is back below the bound.
 *   3. Stop ends every rank's heartbeat within a second, the rank 0's last.
 * Error model for AGE_BOUND: an answer is seen at most a period plus two ticks (P/4 each)
 * after the ping that asked for it, and the age is read at most that long after; under an
 * oversubscribed run a thread may also wait a scheduler slice or two. 4 P + 100 ms covers
 * both, and stays far below the 0.8 s a stopped rank reaches. */
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "comm/heartbeat.h"
#include "tests/comm/comm_test_data.h"

#define PERIOD_S 0.05
#define AGE_BOUND_MS ((int64_t)(4 * PERIOD_S * 1e3) + 100)

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* The largest age of `rank` seen over `seconds` of sampling every 10 ms. */
static int64_t max_age_over(const ina_heartbeat_t *hb, int rank, double seconds) {
  int64_t most = 0;
  for (const double end = test_now_s() + seconds; test_now_s() < end; sleep_s(0.01)) {
    const int64_t age = ina_heartbeat_age_ms(hb, rank);
    if (age > most) most = age;
  }
  return most;
}

int main(int argc, char **argv) {
  ina_bootstrap_t *boot = NULL;
  if (ina_bootstrap_init(&argc, &argv, &boot) != INA_OK) return 1;
  ina_comm_t *c = NULL;
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_MPI, &c));
  if (!c) return 1;
  const int rank = ina_comm_rank(c), size = ina_comm_size(c);
  CHECKF(size == 3, "run on 3 ranks, not %d", size);
  if (!ina_bootstrap_thread_multiple(boot)) {
    printf("SKIP: MPI without MPI_THREAD_MULTIPLE\n");
    ina_comm_destroy(c);
    ina_bootstrap_finalize(boot);
    return 77;
  }
  int pids[3] = {0}, mine = (int)getpid();
  CHECK_OK(ina_comm_all_gather(c, &mine, pids, 1, INA_DTYPE_I32, NULL));
  ina_heartbeat_t *hb = NULL;
  CHECK_OK(ina_heartbeat_start(c, PERIOD_S, &hb));
  CHECK(ina_heartbeat_size(hb) == 3 && ina_heartbeat_rank(hb) == rank);
  CHECK(ina_heartbeat_age_ms(hb, 3) == -1 && ina_heartbeat_age_ms(NULL, 0) == -1);
  sleep_s(0.3); /* every thread is up */

  /* 1. Main threads busy elsewhere (asleep, no MPI): the answers still come. */
  if (rank == 0) {
    for (int r = 1; r < 3; r++) {
      const int64_t most = max_age_over(hb, r, 1.0);
      CHECKF(most < AGE_BOUND_MS, "rank %d's age reached %lld ms while its main thread slept (bound %lld)", r,
             (long long)most, (long long)AGE_BOUND_MS);
    }
  } else {
    sleep_s(2.0);
  }
  CHECK_OK(ina_comm_barrier(c, NULL));

  /* 2. Rank 1 stopped for a second. */
  if (rank == 1) {
    CHECK_OK(ina_comm_barrier(c, NULL));
    raise(SIGSTOP); /* rank 0 sends SIGCONT */
  } else if (rank == 0) {
    CHECK_OK(ina_comm_barrier(c, NULL));
    const double t0 = test_now_s();
    int64_t age1 = 0, most2 = 0;
    while (test_now_s() - t0 < 1.0) {
      age1 = ina_heartbeat_age_ms(hb, 1);
      const int64_t a2 = ina_heartbeat_age_ms(hb, 2);
      if (a2 > most2) most2 = a2;
      sleep_s(0.01);
    }
    CHECKF(age1 > 800, "a stopped rank's age is %lld ms after 1 s", (long long)age1);
    CHECKF(most2 < AGE_BOUND_MS, "rank 2's age reached %lld ms while rank 1 was stopped", (long long)most2);
    int oldest_rank = -1;
    const int64_t oldest = ina_heartbeat_oldest(hb, &oldest_rank);
    CHECKF(oldest_rank == 1 && oldest >= age1, "oldest: rank %d at %lld ms", oldest_rank, (long long)oldest);
    kill(pids[1], SIGCONT);
    sleep_s(0.5);
    const int64_t after = max_age_over(hb, 1, 0.5);
    CHECKF(after < AGE_BOUND_MS, "rank 1's age is %lld ms after it was woken", (long long)after);
  } else {
    CHECK_OK(ina_comm_barrier(c, NULL));
    const int64_t seen = max_age_over(hb, 1, 1.0);
    CHECKF(seen > 700, "rank 2 saw rank 1's age reach only %lld ms while it was stopped", (long long)seen);
    CHECKF(ina_heartbeat_age_ms(hb, 2) == 0, "a rank's own age is %lld", (long long)ina_heartbeat_age_ms(hb, 2));
    sleep_s(1.0);
  }
  CHECK_OK(ina_comm_barrier(c, NULL));

  /* 3. Stop: the other ranks first, as the agent does. */
  const double t0 = test_now_s();
  if (rank == 0) sleep_s(0.2);
  ina_heartbeat_stop(hb);
  const double took = test_now_s() - t0;
  CHECKF(took < 1.0, "rank %d: stop took %.2f s", rank, took);
  CHECK_OK(ina_comm_barrier(c, NULL));
  printf("rank %d/%d: %s\n", rank, size, test_checks_failed_ ? "FAILED" : "ok");
  ina_comm_destroy(c);
  const int rc = test_finish("test_heartbeat");
  ina_bootstrap_finalize(boot);
  return rc;
}
