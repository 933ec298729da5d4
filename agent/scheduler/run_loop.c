/* The run loop: a thread that is the scheduler's driver while it runs. It steps while
 * there are unfinished requests or waiting control commands and sleeps on `wake`
 * otherwise; submit, cancel and control signal `wake`, run_stop sets run_stop and
 * broadcasts it.
 *
 * No lost wake-up: the loop tests num_live, num_controls and run_stop under mu right
 * before waiting, and submit / control / run_stop change them under mu before
 * signalling, so a change either happens before the test (seen) or after the wait began
 * (it wakes the loop). */
#define INA_LOG_SUBSYS "scheduler"
#include <errno.h>
#include <time.h>

#include "core/check.h"
#include "agent/scheduler/scheduler_internal.h"

/* When a step could run nothing although requests are unfinished (pages held outside the
 * scheduler), the loop waits this long before trying again instead of spinning. */
#define IDLE_RETRY_NS 1000000L

static void wait_a_little_locked(ina_scheduler_t *s) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_nsec += IDLE_RETRY_NS;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  (void)pthread_cond_timedwait(&s->wake, &s->mu, &until);
}

/* A failed step is logged at most once a second, with how many failed since. */
static void log_step_failure(ina_status_t st, double *last_log, int64_t *unlogged) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  const double t = (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
  if (t - *last_log < 1.0) {
    (*unlogged)++;
    return;
  }
  if (*unlogged)
    INA_LOG_W(INA_LOG_SUBSYS, "run loop: step failed (%s); its requests were finished with an error (%lld more "
              "failed steps since the last report)", ina_status_string(st), (long long)*unlogged);
  else
    INA_LOG_W(INA_LOG_SUBSYS, "run loop: step failed (%s); its requests were finished with an error",
              ina_status_string(st));
  *last_log = t;
  *unlogged = 0;
}

/* A replica leader's idle wait: at most heartbeat_seconds; 1 when it timed out. */
static int heartbeat_wait_locked(ina_scheduler_t *s) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  const double t = (double)until.tv_sec + 1e-9 * (double)until.tv_nsec + s->heartbeat_seconds;
  until.tv_sec = (time_t)t;
  until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
  return pthread_cond_timedwait(&s->wake, &s->mu, &until) == ETIMEDOUT;
}

/* Something for a step to do: unfinished requests, or commands (they run in a step). */
/* Page references given back by a transfer count as work: a step returns them to the
 * pool (kv_handoff.c), also when nothing else is left to do. */
static int has_work_locked(const ina_scheduler_t *s) {
  return s->num_live > 0 || s->num_controls > 0 || s->num_released > 0;
}

static void *run_loop(void *arg) {
  ina_scheduler_t *s = arg;
  double last_log = -1e9;
  int64_t unlogged = 0;
  pthread_mutex_lock(&s->mu);
  while (!s->run_stop) {
    if (!has_work_locked(s)) {
      if (s->replica_role != SCHED_REPLICA_LEADER) {
        pthread_cond_wait(&s->wake, &s->mu);
        continue;
      }
      /* Idle leader: an empty step now and then keeps the followers in touch. */
      if (!heartbeat_wait_locked(s) || s->run_stop || has_work_locked(s)) continue;
    }
    pthread_mutex_unlock(&s->mu);
    int32_t scheduled = 0;
    const ina_status_t st = sched_step(s, &scheduled);
    if (st != INA_OK) log_step_failure(st, &last_log, &unlogged);
    pthread_mutex_lock(&s->mu);
    /* A step that ran nothing, or failed, waits before the next try instead of spinning. */
    if ((scheduled == 0 || st != INA_OK) && !s->run_stop && s->num_live > 0 && s->num_controls == 0)
      wait_a_little_locked(s);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

ina_status_t ina_scheduler_run_start(ina_scheduler_t *s) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(s != NULL, INA_ERR_INVALID_ARGUMENT, "run start: scheduler is NULL");
  INA_REQUIRE(s->replica_role != SCHED_REPLICA_FOLLOWER, INA_ERR_INVALID_ARGUMENT,
              "run start: this scheduler follows rank 0 (ina_scheduler_follow drives it)");
  pthread_mutex_lock(&s->mu);
  const int busy = s->run_started || s->stepping || s->closing;
  if (!busy) {
    s->run_started = 1;
    s->run_stop = 0;
  }
  pthread_mutex_unlock(&s->mu);
  INA_REQUIRE(!busy, INA_ERR_INVALID_ARGUMENT, "run start: the scheduler already has a driver");
  const int err = pthread_create(&s->run_thread, NULL, run_loop, s);
  if (err != 0) {
    pthread_mutex_lock(&s->mu);
    s->run_started = 0;
    pthread_mutex_unlock(&s->mu);
    INA_REQUIRE(0, err == EAGAIN ? INA_ERR_OUT_OF_MEMORY : INA_ERR_INTERNAL, "run start: pthread_create failed (%d)",
                err);
  }
fail:
  return st;
}

void ina_scheduler_run_stop(ina_scheduler_t *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  const int started = s->run_started;
  if (started) {
    s->run_stop = 1;
    pthread_cond_broadcast(&s->wake);
  }
  pthread_mutex_unlock(&s->mu);
  if (!started) return;
  pthread_join(s->run_thread, NULL);
  pthread_mutex_lock(&s->mu);
  /* Nobody will run them now: their callers must not wait for a step that may never come. */
  sched_control_cancel_waiting_locked(s, "the run loop stopped first");
  s->run_started = 0;
  s->run_stop = 0;
  pthread_mutex_unlock(&s->mu);
}
