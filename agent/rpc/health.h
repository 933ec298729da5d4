/* The standard gRPC health service (grpc.health.v1.Health, proto/grpc/health/v1/
 * health.proto) on an rpc server: a table of serving statuses by service name, Check
 * and Watch over it.
 *
 * The table starts with the whole server, "", SERVING (gRPC's convention: the process
 * is up); the agent sets it NOT_SERVING while loading or draining, and adds its
 * services by setting their status. Check answers a known name at once and fails with
 * NOT_FOUND for an unknown one. Watch sends the current status (SERVICE_UNKNOWN for an
 * unknown name) and then every change, until the client cancels; a name that becomes
 * known later is reported when it does.
 *
 * Methods are registered without a bearer token, so that load balancers and probes can
 * ask.
 *
 * Ownership: ina_health_create registers the two methods on `server`, which must not be
 * started yet; destroy the health service after the server (the server's handlers use
 * it until then). A failed create sets *out = NULL; destroy(NULL) is a no-op.
 * Thread safety: set_status, set_all and get_status from any thread, concurrently with
 * the server's threads; create and destroy from one thread. */
#ifndef INA_AGENT_RPC_HEALTH_H
#define INA_AGENT_RPC_HEALTH_H

#include "core/status.h"
#include "agent/rpc/rpc_server.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_health ina_health_t;

/* Values of grpc.health.v1.HealthCheckResponse.ServingStatus. */
typedef enum ina_health_status {
  INA_HEALTH_UNKNOWN = 0,
  INA_HEALTH_SERVING = 1,
  INA_HEALTH_NOT_SERVING = 2,
  INA_HEALTH_SERVICE_UNKNOWN = 3 /* only ever sent by Watch, for unknown names */
} ina_health_status_t;

#define INA_HEALTH_CHECK_METHOD "/grpc.health.v1.Health/Check"
#define INA_HEALTH_WATCH_METHOD "/grpc.health.v1.Health/Watch"

ina_status_t ina_health_create(ina_rpc_server_t *server, ina_health_t **out);
void ina_health_destroy(ina_health_t *health);

/* Sets the status of `service` ("" for the whole server; the name is copied and added
 * if new) to SERVING or NOT_SERVING (anything else: INVALID_ARGUMENT), and tells the
 * Watch streams of that name when it changed. */
ina_status_t ina_health_set_status(ina_health_t *health, const char *service,
                                   ina_health_status_t status);

/* Sets every known service, "" included, to `status` (SERVING or NOT_SERVING): what a
 * node does when it starts draining or has finished loading. */
ina_status_t ina_health_set_all(ina_health_t *health, ina_health_status_t status);

/* The status of `service`; INA_HEALTH_SERVICE_UNKNOWN when it is not in the table. */
ina_health_status_t ina_health_get_status(ina_health_t *health, const char *service);

#ifdef __cplusplus
}
#endif
#endif
