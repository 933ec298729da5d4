/* Liveness: the job's heartbeat (comm/heartbeat.h) read as health.
 *
 * A rank that has not answered the heartbeat for heartbeat_timeout_s is silent: health
 * answers NOT_SERVING for every service, GetHealth names the rank (state FAILED, with
 * its age), and Generate answers UNAVAILABLE, since the steps that need that rank cannot
 * run. Requests in flight are left to the collectives: if the rank stays silent, their
 * timeout (INA_COMM_TIMEOUT_S, longer than the heartbeat's) fails them and ends the job;
 * if it answers again first, health goes back to SERVING and they carry on.
 *
 * A thread checks every tenth of the timeout, so a silent rank shows within 1.1 timeouts
 * of its last answer. Transitions are logged once each, never per check. */
#define INA_LOG_SUBSYS "agent"

#include <stdio.h>
#include <time.h>

#include "comm/heartbeat.h"
#include "core/check.h"
#include "agent/agent_internal.h"

int agent_silent_locked(const ina_agent_t *agent, char *message, size_t size) {
  if (agent->silent_rank < 0) return 0;
  snprintf(message, size,
           "rank %d has not answered the heartbeat for %.1f s (timeout %.1f s): stopped, dead or "
           "wedged",
           (int)agent->silent_rank, 1e-3 * (double)agent->silent_ms, agent->heartbeat_timeout_s);
  return 1;
}

/* One check: moves the silent state and health on a change. */
static void check_heartbeat(ina_agent_t *agent) {
  int rank = 0;
  const int64_t oldest = ina_heartbeat_oldest(agent->heartbeat, &rank);
  const int silent = (double)oldest > 1e3 * agent->heartbeat_timeout_s;
  pthread_mutex_lock(&agent->lock);
  const int was_silent = agent->silent_rank >= 0;
  if (silent) {
    agent->silent_rank = rank;
    agent->silent_ms = oldest;
  } else {
    agent->silent_rank = -1;
    agent->silent_ms = 0;
  }
  if (silent && !was_silent) {
    if (agent->health) ina_health_set_all(agent->health, INA_HEALTH_NOT_SERVING);
    INA_LOG_W(INA_LOG_SUBSYS, "rank %d has not answered the heartbeat for %.1f s: NOT_SERVING", rank,
              1e-3 * (double)oldest);
  } else if (!silent && was_silent) {
    if (agent->health && agent->state == AGENT_SERVING) {
      ina_health_set_status(agent->health, "", INA_HEALTH_SERVING);
      ina_health_set_status(agent->health, INA_AGENT_NODE_SERVICE, INA_HEALTH_SERVING);
      if (!agent->node_server) {
        ina_health_set_status(agent->health, INA_AGENT_INFERENCE_SERVICE, INA_HEALTH_SERVING);
        ina_health_set_status(agent->health, INA_AGENT_PLACEMENT_SERVICE, INA_HEALTH_SERVING);
      }
    }
    INA_LOG_W(INA_LOG_SUBSYS, "every rank answers the heartbeat again%s",
              agent->state == AGENT_SERVING ? ": SERVING" : "");
  }
  pthread_mutex_unlock(&agent->lock);
}

static void *liveness_main(void *arg) {
  ina_agent_t *agent = arg;
  const double tick = agent->heartbeat_timeout_s / 10;
  const struct timespec pause = {(time_t)tick, (long)((tick - (double)(time_t)tick) * 1e9)};
  while (!atomic_load(&agent->liveness_stop)) {
    check_heartbeat(agent);
    nanosleep(&pause, NULL);
  }
  return NULL;
}

ina_status_t agent_liveness_start(ina_agent_t *agent) {
  ina_status_t st = INA_OK;
  agent->silent_rank = -1;
  if (!agent->heartbeat || ina_heartbeat_size(agent->heartbeat) < 2) return INA_OK;
  const int err = pthread_create(&agent->liveness_thread, NULL, liveness_main, agent);
  INA_REQUIRE(err == 0, INA_ERR_INTERNAL, "liveness: pthread_create failed (%d)", err);
  agent->liveness_started = 1;
fail:
  return st;
}

void agent_liveness_stop(ina_agent_t *agent) {
  if (!agent->liveness_started) return;
  atomic_store(&agent->liveness_stop, 1);
  pthread_join(agent->liveness_thread, NULL);
  agent->liveness_started = 0;
}
