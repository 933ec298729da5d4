/* A non-blocking all-to-all of messages whose sizes only their senders know.
 *
 * Every rank sends one message to every other rank (possibly empty) and receives one
 * from each. ina_comm_a2a_start posts the sends and returns at once; the caller computes
 * while they travel; ina_comm_a2a_finish receives one message from each peer (each
 * buffer sized from its message: no counts round first) and completes the sends. This is
 * the shape of an expert-parallel exchange split in two halves (moe_ep/dispatch.h), so
 * that one micro-batch's exchange overlaps another's compute.
 *
 * Several exchanges may be in flight on one communicator at once, each with a tag of its
 * own: the n-th exchange created on a communicator gets the n-th tag, so every rank must
 * create them in the same order (as with any collective). A message is matched by
 * (peer, tag): exchange A's finish never takes exchange B's message, and two rounds of
 * one exchange arrive in order (MPI does not overtake).
 *
 * Host buffers, over the communicator's MPI part whatever its backend. Progress: the
 * sends move when MPI progresses (small messages at once, large ones when the receiver
 * reaches finish); finish waits against the communicator's deadline (INA_COMM_TIMEOUT_S)
 * and on a timeout marks the communicator broken, as every operation of comm.h does.
 *
 * Ownership: the send buffers are borrowed from start until finish returns (or until
 * destroy, after a failure); the received ones belong to the exchange and stay valid
 * until its next start. Thread safety: as the communicator. */
#ifndef INA_COMM_A2A_H
#define INA_COMM_A2A_H

#include <stddef.h>

#include "comm/comm.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_comm_a2a ina_comm_a2a_t;

/* Not collective, but every rank creates its exchanges in the same order (the tags). */
ina_status_t ina_comm_a2a_create(ina_comm_t *comm, ina_comm_a2a_t **out);
/* Frees an exchange; sends still in flight after a failure are released to MPI. */
void ina_comm_a2a_destroy(ina_comm_a2a_t *a);

/* Posts send[p] (send_bytes[p] bytes) to every peer p other than this rank; this rank's
 * own entry is not sent (finish hands it back). INA_ERR_INVALID_ARGUMENT for a round
 * already in flight or a message over 2^31 - 1 bytes. */
ina_status_t ina_comm_a2a_start(ina_comm_a2a_t *a, const void *const *send, const size_t *send_bytes);

/* Receives the round's message from every peer and waits for this rank's sends.
 * *recv[p] and *recv_bytes[p] (arrays of the communicator's size, owned by the exchange)
 * are peer p's message; this rank's own entry is its send buffer. Collective in effect:
 * it returns once every peer has started this round. */
ina_status_t ina_comm_a2a_finish(ina_comm_a2a_t *a, const void *const **recv, const size_t **recv_bytes);

/* The tag of the exchange's messages (tests). */
int ina_comm_a2a_tag(const ina_comm_a2a_t *a);

#ifdef __cplusplus
}
#endif

#endif
