/* Control commands (scheduler.h, ina_scheduler_control): another thread hands the driver
 * a call of config.control to make between two steps, and waits for its outcome.
 *
 * A command lives on the stack of its caller, which queues it (FIFO, under mu), wakes
 * the run loop and sleeps on control_done. At the start of a step the driver takes the
 * commands off one by one, runs each without the lock (a replica leader first sends it
 * to the followers, which run it at the same place of their message stream) and marks
 * it done under mu. Running before the step's intake is what keeps replicas in lockstep:
 * the command is ordered against requests exactly as its message is against the step's.
 *
 * Nothing is lost on the way out: run_stop and destroy finish the commands still queued
 * unrun and wake their callers, and destroy waits for every caller to leave before it
 * frees the mutex and condition variables they sleep on. */
#define INA_LOG_SUBSYS "scheduler"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "agent/scheduler/scheduler_internal.h"

static void copy_text(char *out, size_t out_size, const char *text) {
  if (out && out_size > 0) snprintf(out, out_size, "%s", text);
}

/* One call of the control function; a failure's reason goes to error. */
static ina_status_t call_control(ina_scheduler_t *s, const void *bytes, size_t size, char *error,
                                 size_t error_size) {
  ina_clear_error(); /* a function failing without a message must not hand back an old one */
  const ina_status_t st = s->control(s->engine, bytes, size, s->control_user_data);
  if (st == INA_OK)
    error[0] = '\0';
  else if (ina_last_error()[0])
    copy_text(error, error_size, ina_last_error());
  else
    snprintf(error, error_size, "control command failed (%s) without recording a reason", ina_status_string(st));
  return st;
}

static void mark_done_locked(ina_scheduler_t *s, sched_control_t *c) {
  c->done = 1;
  pthread_cond_broadcast(&s->control_done);
}

ina_status_t sched_control_run_waiting(ina_scheduler_t *s) {
  /* Only the commands already waiting: one issued meanwhile waits for the next step, so
   * a caller issuing commands back to back cannot hold the requests up. */
  pthread_mutex_lock(&s->mu);
  int32_t left = s->num_controls;
  pthread_mutex_unlock(&s->mu);
  for (; left > 0; left--) {
    pthread_mutex_lock(&s->mu);
    /* A stopping run loop takes no more: run_stop hands the rest back unrun, so a queue
     * of commands does not hold it up. */
    sched_control_t *c = s->run_stop ? NULL : s->control_head;
    if (c) {
      s->control_head = c->next;
      if (!s->control_head) s->control_tail = NULL;
      s->num_controls--;
    }
    pthread_mutex_unlock(&s->mu);
    if (!c) return INA_OK;
    /* Off the queue, the command is the driver's until done: its caller reads the
     * outcome only after seeing done under mu. */
    const ina_status_t sent = sched_replica_send_control(s, c->bytes, c->size);
    if (sent == INA_OK) {
      c->status = call_control(s, c->bytes, c->size, c->error, sizeof c->error);
    } else {
      c->status = sent;
      snprintf(c->error, sizeof c->error, "control: the followers could not be told (%s); the command did not run",
               ina_last_error());
    }
    pthread_mutex_lock(&s->mu);
    mark_done_locked(s, c);
    pthread_mutex_unlock(&s->mu);
    if (sent != INA_OK) return sent;
  }
  return INA_OK;
}

void sched_control_run_follower(ina_scheduler_t *s, const void *bytes, size_t size) {
  char error[1024];
  if (!s->control) {
    INA_LOG_W(INA_LOG_SUBSYS,
              "replicas: the leader sent a %zu-byte control command, but this follower has no control function "
              "(config.control); skipped",
              size);
    return;
  }
  const ina_status_t st = call_control(s, bytes, size, error, sizeof error);
  if (st != INA_OK)
    INA_LOG_W(INA_LOG_SUBSYS, "replicas: a %zu-byte control command failed on this follower (%s: %s); following on",
              size, ina_status_string(st), error);
}

void sched_control_cancel_waiting_locked(ina_scheduler_t *s, const char *why) {
  for (sched_control_t *c = s->control_head, *next; c; c = next) {
    next = c->next;
    c->status = INA_ERR_UNSUPPORTED;
    snprintf(c->error, sizeof c->error, "control: the command did not run: %s", why);
    mark_done_locked(s, c);
  }
  s->control_head = s->control_tail = NULL;
  s->num_controls = 0;
}

void sched_control_wait_callers_locked(ina_scheduler_t *s) {
  while (s->control_callers > 0) pthread_cond_wait(&s->control_done, &s->mu);
}

ina_status_t ina_scheduler_control(ina_scheduler_t *s, const void *bytes, size_t size, char *detail,
                                   size_t detail_size) {
  ina_status_t st = INA_OK;
  sched_control_t cmd;
  memset(&cmd, 0, sizeof cmd);
  copy_text(detail, detail_size, "");
  INA_REQUIRE(s != NULL, INA_ERR_INVALID_ARGUMENT, "control: scheduler is NULL");
  INA_REQUIRE(s->replica_role != SCHED_REPLICA_FOLLOWER, INA_ERR_INVALID_ARGUMENT,
              "control: this scheduler follows rank 0; issue control commands there");
  INA_REQUIRE(s->control != NULL, INA_ERR_INVALID_ARGUMENT,
              "control: the scheduler has no control function (config.control is NULL)");
  INA_REQUIRE(bytes != NULL && size > 0, INA_ERR_INVALID_ARGUMENT,
              "control: the command is empty (%zu bytes%s)", size, bytes ? "" : " at NULL");
  INA_REQUIRE(size <= INA_SCHEDULER_CONTROL_MAX_BYTES, INA_ERR_INVALID_ARGUMENT,
              "control: a command of %zu bytes exceeds the limit of %zu", size,
              (size_t)INA_SCHEDULER_CONTROL_MAX_BYTES);
  cmd.bytes = malloc(size);
  INA_CHECK_ALLOC(cmd.bytes);
  memcpy(cmd.bytes, bytes, size);
  cmd.size = size;

  pthread_mutex_lock(&s->mu);
  const int closing = s->closing;
  const int on_driver = s->in_step && pthread_equal(s->step_thread, pthread_self());
  if (!closing && !on_driver) {
    if (s->control_tail)
      s->control_tail->next = &cmd;
    else
      s->control_head = &cmd;
    s->control_tail = &cmd;
    s->num_controls++;
    s->control_callers++;
    pthread_cond_signal(&s->wake);
    while (!cmd.done) pthread_cond_wait(&s->control_done, &s->mu);
    s->control_callers--;
    if (s->closing) pthread_cond_broadcast(&s->control_done); /* destroy may wait for us */
  }
  pthread_mutex_unlock(&s->mu);
  INA_REQUIRE(!closing, INA_ERR_INVALID_ARGUMENT, "control: the scheduler is shutting down");
  INA_REQUIRE(!on_driver, INA_ERR_INVALID_ARGUMENT,
              "control: called on the driver thread (from a request callback or a control function), which would "
              "wait for itself");
  st = cmd.status;
  copy_text(detail, detail_size, cmd.error);
  free(cmd.bytes);
  return st;
fail:
  copy_text(detail, detail_size, ina_last_error());
  free(cmd.bytes);
  return st;
}
