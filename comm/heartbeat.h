/* The job's heartbeat: a liveness signal that the ranks answer from threads of their
 * own, beside the collectives.
 *
 * Why a thread of its own: a rank's main thread may sit in a long step or wait in a
 * collective for seconds, so the collectives cannot tell a slow rank from a stopped one
 * before their timeout (INA_COMM_TIMEOUT_S). The heartbeat thread answers whatever the
 * main thread does; a rank that stops answering is stopped (SIGSTOP), dead or wedged.
 *
 * How: rank 0 sends every other rank a ping each period on a duplicate of the
 * communicator (its messages never mix with the collectives'), and records when each
 * answered. Each ping carries rank 0's ages of every rank, so the other ranks (a node
 * server reporting its node's ranks) know them too: rank 0's figure at the ping plus
 * the time since it, which also grows when rank 0 itself goes silent.
 *
 * Needs MPI_THREAD_MULTIPLE (the thread calls MPI beside the main thread):
 * ina_heartbeat_start refuses with INA_ERR_UNSUPPORTED without it.
 *
 * Thread safety: start and stop on one thread; the age accessors from any thread. */
#ifndef INA_COMM_HEARTBEAT_H
#define INA_COMM_HEARTBEAT_H

#include <stdint.h>

#include "comm/comm.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_heartbeat ina_heartbeat_t;

/* Collective over comm's ranks (it duplicates the communicator). period_s in
 * [0.001, 60]. The communicator is only read: it may go on serving collectives. On
 * failure *out = NULL. */
ina_status_t ina_heartbeat_start(const ina_comm_t *comm, double period_s, ina_heartbeat_t **out);
int ina_heartbeat_size(const ina_heartbeat_t *hb);
int ina_heartbeat_rank(const ina_heartbeat_t *hb);
double ina_heartbeat_period(const ina_heartbeat_t *hb);
/* Milliseconds since `rank` last answered. On rank 0: measured (0 for rank 0 itself).
 * On another rank: rank 0's figure at its latest ping plus the time since that ping (for
 * rank 0: the time since its latest ping; for the calling rank: 0). -1 for a rank
 * outside the communicator or a NULL heartbeat. */
int64_t ina_heartbeat_age_ms(const ina_heartbeat_t *hb, int rank);
/* The rank with the largest age and that age (ms); rank 0 of a one-rank job and age 0
 * when every rank is current. */
int64_t ina_heartbeat_oldest(const ina_heartbeat_t *hb, int *rank);
/* Ends the thread and frees the heartbeat; NULL is a no-op. Rank 0 tells every rank
 * that still answers to stop; another rank waits for that word as long as rank 0 keeps
 * pinging (rank 0 stops after the others), and leaves once rank 0 was silent for four
 * periods. Requests a silent peer never completed are left in place, with the duplicate
 * communicator (the job is ending). */
void ina_heartbeat_stop(ina_heartbeat_t *hb);

#ifdef __cplusplus
}
#endif

#endif
