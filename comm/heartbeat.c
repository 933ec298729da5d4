/* The job's heartbeat (heartbeat.h): rank 0's pinger and the other ranks' answerers.
 *
 * Messages (int64 words, on the duplicate communicator):
 *   ping, rank 0 -> rank r, tag PING: sequence number (>= 1; STOP_SEQ ends the
 *   heartbeat), then rank 0's age of every rank in ms;
 *   answer, rank r -> rank 0, tag ANSWER: the sequence number of the ping it answers.
 * Rank 0 keeps at most one ping in flight per peer: a peer that does not answer gets
 * no new pings, so nothing piles up behind a stopped rank.
 *
 * The threads poll their requests every TICK (at most a quarter period): an MPI_Test
 * costs microseconds, so a tick of a few milliseconds keeps the thread near idle. */
#define INA_LOG_SUBSYS "comm"
#include "comm/heartbeat.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_internal.h"
#include "core/check.h"

enum { TAG_PING = 7101, TAG_ANSWER = 7102 };
#define STOP_SEQ (-1)
#define MAX_TICK_S 0.02

typedef struct peer {
  MPI_Request ping_req, answer_req;
  int64_t *ping;       /* [1 + size]: in flight while ping_req is */
  int64_t answer;
  int waiting;         /* a ping went out and its answer has not come */
  double answered_at;  /* monotonic seconds */
} peer_t;

struct ina_heartbeat {
  MPI_Comm mpi;
  int rank, size;
  double period_s, tick_s;
  pthread_t thread;
  atomic_int stop;
  int leaked; /* a request never completed: the communicator and buffers stay */
  pthread_mutex_t mu;
  /* Under mu. Rank 0: ages derive from peers[r].answered_at. Others: the latest ping's
   * ages and when it came. */
  peer_t *peers;        /* rank 0: [size] */
  int64_t *seen_ages;   /* others: [size] */
  double seen_at;
  /* Others: the receive for the next ping. */
  MPI_Request ping_req;
  int64_t *ping_in;     /* [1 + size] */
  int64_t answer_out;   /* on the heap: a send a silent rank 0 never took may still read it */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void nap(double seconds) {
  struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  nanosleep(&ts, NULL);
}

/* 1 when the request completed (or was null), 0 when it is still in flight. An error
 * counts as done: the peer is gone, and the age keeps growing. */
static int test_done(MPI_Request *req) {
  int done = 1;
  if (*req == MPI_REQUEST_NULL) return 1;
  if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
    *req = MPI_REQUEST_NULL;
    return 1;
  }
  return done;
}

/* Waits up to `seconds` for the request; 1 when it completed. */
static int wait_done(MPI_Request *req, double seconds) {
  const double end = now_s() + seconds;
  while (!test_done(req)) {
    if (now_s() > end) return 0;
    nap(1e-3);
  }
  return 1;
}

/* A receive nobody will match: cancelled, and waited for briefly. */
static int cancel_receive(MPI_Request *req) {
  if (*req == MPI_REQUEST_NULL) return 1;
  MPI_Cancel(req);
  return wait_done(req, 1.0);
}

static int64_t age_locked(const ina_heartbeat_t *hb, int r, double now) {
  if (hb->rank == 0) return r == 0 ? 0 : (int64_t)((now - hb->peers[r].answered_at) * 1e3);
  if (r == hb->rank) return 0;
  const int64_t since = (int64_t)((now - hb->seen_at) * 1e3);
  return r == 0 ? since : hb->seen_ages[r] + since;
}

/* ---- rank 0 -------------------------------------------------------------------------- */

static void leader_send_pings(ina_heartbeat_t *hb, int64_t seq) {
  const double now = now_s();
  for (int r = 1; r < hb->size; r++) {
    peer_t *p = &hb->peers[r];
    if (p->waiting || !test_done(&p->ping_req)) continue;
    pthread_mutex_lock(&hb->mu);
    p->ping[0] = seq;
    for (int k = 0; k < hb->size; k++) p->ping[1 + k] = age_locked(hb, k, now);
    pthread_mutex_unlock(&hb->mu);
    if (MPI_Isend(p->ping, 1 + hb->size, MPI_INT64_T, r, TAG_PING, hb->mpi, &p->ping_req) != MPI_SUCCESS)
      continue;
    if (MPI_Irecv(&p->answer, 1, MPI_INT64_T, r, TAG_ANSWER, hb->mpi, &p->answer_req) != MPI_SUCCESS) continue;
    p->waiting = 1;
  }
}

static void leader_collect_answers(ina_heartbeat_t *hb) {
  for (int r = 1; r < hb->size; r++) {
    peer_t *p = &hb->peers[r];
    if (!p->waiting || !test_done(&p->answer_req)) continue;
    p->waiting = 0;
    pthread_mutex_lock(&hb->mu);
    p->answered_at = now_s();
    pthread_mutex_unlock(&hb->mu);
  }
}

/* Stop: the peers that answer get STOP_SEQ; what a silent peer never took is left. */
static void leader_finish(ina_heartbeat_t *hb) {
  for (int r = 1; r < hb->size; r++) {
    peer_t *p = &hb->peers[r];
    if (p->waiting && !wait_done(&p->answer_req, hb->period_s)) {
      if (!cancel_receive(&p->answer_req)) hb->leaked = 1;
      if (!wait_done(&p->ping_req, 0.1)) hb->leaked = 1;
      continue; /* silent: no stop word */
    }
    p->waiting = 0;
    if (!wait_done(&p->ping_req, hb->period_s)) {
      hb->leaked = 1;
      continue;
    }
    p->ping[0] = STOP_SEQ;
    if (MPI_Isend(p->ping, 1 + hb->size, MPI_INT64_T, r, TAG_PING, hb->mpi, &p->ping_req) == MPI_SUCCESS &&
        !wait_done(&p->ping_req, 1.0))
      hb->leaked = 1;
  }
}

static void *leader_main(void *arg) {
  ina_heartbeat_t *hb = arg;
  int64_t seq = 1;
  double next = now_s();
  while (!atomic_load(&hb->stop)) {
    leader_collect_answers(hb);
    if (now_s() >= next) {
      leader_send_pings(hb, seq++);
      next += hb->period_s;
      if (next < now_s()) next = now_s() + hb->period_s; /* this thread was held up */
    }
    nap(hb->tick_s);
  }
  leader_finish(hb);
  return NULL;
}

/* ---- other ranks --------------------------------------------------------------------- */

static int post_ping_receive(ina_heartbeat_t *hb) {
  return MPI_Irecv(hb->ping_in, 1 + hb->size, MPI_INT64_T, 0, TAG_PING, hb->mpi, &hb->ping_req) == MPI_SUCCESS;
}

static void *answerer_main(void *arg) {
  ina_heartbeat_t *hb = arg;
  if (!post_ping_receive(hb)) return NULL;
  for (;;) {
    if (test_done(&hb->ping_req)) {
      const int64_t seq = hb->ping_in[0];
      if (seq == STOP_SEQ) return NULL;
      pthread_mutex_lock(&hb->mu);
      memcpy(hb->seen_ages, hb->ping_in + 1, (size_t)hb->size * sizeof *hb->seen_ages);
      hb->seen_at = now_s();
      pthread_mutex_unlock(&hb->mu);
      hb->answer_out = seq;
      MPI_Request req = MPI_REQUEST_NULL;
      /* Rank 0 posted the receive with the ping: this send completes at once. */
      if (MPI_Isend(&hb->answer_out, 1, MPI_INT64_T, 0, TAG_ANSWER, hb->mpi, &req) == MPI_SUCCESS &&
          !wait_done(&req, 10.0)) {
        hb->leaked = 1;
        return NULL;
      }
      if (!post_ping_receive(hb)) return NULL;
      continue;
    }
    if (atomic_load(&hb->stop)) {
      pthread_mutex_lock(&hb->mu);
      const double silent = now_s() - hb->seen_at;
      pthread_mutex_unlock(&hb->mu);
      if (silent > 4 * hb->period_s) {
        if (!cancel_receive(&hb->ping_req)) hb->leaked = 1;
        return NULL;
      }
    }
    nap(hb->tick_s);
  }
}

/* ---- life cycle ---------------------------------------------------------------------- */

static void heartbeat_free(ina_heartbeat_t *hb) {
  if (hb->peers)
    for (int r = 0; r < hb->size; r++) free(hb->peers[r].ping);
  free(hb->peers);
  free(hb->seen_ages);
  free(hb->ping_in);
  pthread_mutex_destroy(&hb->mu);
  if (hb->mpi != MPI_COMM_NULL) MPI_Comm_free(&hb->mpi);
  free(hb);
}

ina_status_t ina_heartbeat_start(const ina_comm_t *comm, double period_s, ina_heartbeat_t **out) {
  ina_status_t st = INA_OK;
  ina_heartbeat_t *hb = NULL;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "heartbeat: out is NULL");
  *out = NULL;
  INA_REQUIRE(comm != NULL, INA_ERR_INVALID_ARGUMENT, "heartbeat: comm is NULL");
  INA_REQUIRE(period_s >= 1e-3 && period_s <= 60, INA_ERR_INVALID_ARGUMENT,
              "heartbeat: period %g s is outside [0.001, 60]", period_s);
  int level = 0;
  INA_REQUIRE(MPI_Query_thread(&level) == MPI_SUCCESS && level >= MPI_THREAD_MULTIPLE, INA_ERR_UNSUPPORTED,
              "heartbeat: MPI was initialized without MPI_THREAD_MULTIPLE (level %d); the heartbeat "
              "thread needs it", level);
  hb = calloc(1, sizeof *hb);
  INA_CHECK_ALLOC(hb);
  hb->mpi = MPI_COMM_NULL;
  pthread_mutex_init(&hb->mu, NULL);
  hb->rank = comm->rank;
  hb->size = comm->size;
  hb->period_s = period_s;
  hb->tick_s = period_s / 4 < MAX_TICK_S ? period_s / 4 : MAX_TICK_S;
  hb->ping_req = MPI_REQUEST_NULL;
  const int rc = MPI_Comm_dup(comm->mpi, &hb->mpi);
  if (rc != MPI_SUCCESS) {
    hb->mpi = MPI_COMM_NULL;
    INA_CHECK(ina_comm_mpi_error(comm, "heartbeat: MPI_Comm_dup", rc));
  }
  MPI_Comm_set_errhandler(hb->mpi, MPI_ERRORS_RETURN);
  const double now = now_s();
  if (hb->rank == 0) {
    hb->peers = calloc((size_t)hb->size, sizeof *hb->peers);
    INA_CHECK_ALLOC(hb->peers);
    for (int r = 0; r < hb->size; r++) {
      hb->peers[r].ping_req = hb->peers[r].answer_req = MPI_REQUEST_NULL;
      hb->peers[r].answered_at = now;
      hb->peers[r].ping = calloc((size_t)hb->size + 1, sizeof(int64_t));
      INA_CHECK_ALLOC(hb->peers[r].ping);
    }
  } else {
    hb->seen_ages = calloc((size_t)hb->size, sizeof *hb->seen_ages);
    hb->ping_in = calloc((size_t)hb->size + 1, sizeof *hb->ping_in);
    INA_CHECK_ALLOC(hb->seen_ages);
    INA_CHECK_ALLOC(hb->ping_in);
    hb->seen_at = now;
  }
  if (hb->size > 1) {
    const int err = pthread_create(&hb->thread, NULL, hb->rank == 0 ? leader_main : answerer_main, hb);
    INA_REQUIRE(err == 0, INA_ERR_INTERNAL, "heartbeat: pthread_create failed (%d)", err);
  }
  *out = hb;
  return INA_OK;
fail:
  if (hb) heartbeat_free(hb);
  return st;
}

int ina_heartbeat_size(const ina_heartbeat_t *hb) { return hb ? hb->size : 0; }
int ina_heartbeat_rank(const ina_heartbeat_t *hb) { return hb ? hb->rank : -1; }
double ina_heartbeat_period(const ina_heartbeat_t *hb) { return hb ? hb->period_s : 0; }

int64_t ina_heartbeat_age_ms(const ina_heartbeat_t *hb, int rank) {
  if (!hb || rank < 0 || rank >= hb->size) return -1;
  ina_heartbeat_t *h = (ina_heartbeat_t *)hb; /* the lock only */
  pthread_mutex_lock(&h->mu);
  const int64_t age = age_locked(hb, rank, now_s());
  pthread_mutex_unlock(&h->mu);
  return age;
}

int64_t ina_heartbeat_oldest(const ina_heartbeat_t *hb, int *rank) {
  int64_t oldest = 0;
  int who = 0;
  if (hb) {
    ina_heartbeat_t *h = (ina_heartbeat_t *)hb;
    pthread_mutex_lock(&h->mu);
    const double now = now_s();
    for (int r = 0; r < hb->size; r++) {
      const int64_t age = age_locked(hb, r, now);
      if (age > oldest) {
        oldest = age;
        who = r;
      }
    }
    pthread_mutex_unlock(&h->mu);
  }
  if (rank) *rank = who;
  return oldest;
}

void ina_heartbeat_stop(ina_heartbeat_t *hb) {
  if (!hb) return;
  if (hb->size > 1) {
    atomic_store(&hb->stop, 1);
    pthread_join(hb->thread, NULL);
  }
  if (hb->leaked) {
    INA_LOG_I(INA_LOG_SUBSYS, "heartbeat: a silent rank left requests in flight; their buffers stay");
    return;
  }
  heartbeat_free(hb);
}
