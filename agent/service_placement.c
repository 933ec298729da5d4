/* ina.v1.Placement: GetPlacement answers the placement in force and its generation (1 for
 * the one the job started with: each EP rank holds its contiguous share of the experts);
 * ApplyPlacement, an admin call, checks a new one and switches every rank to it between
 * two steps. Admin calls need the agent's bearer token; an agent started without one
 * refuses them (PERMISSION_DENIED) unless it was told to leave them open.
 *
 * How a switch runs: ApplyPlacement calls are serialized by apply_mu. The handler checks
 * the generation and the message, then hands the placement to the scheduler as a control
 * command, which runs on every rank's driver thread at the same point of the step
 * stream (ina_agent_placement_control): the engines agree, move the experts and commit or
 * roll back together, and requests in flight simply continue in the next step. */
#define INA_LOG_SUBSYS "agent"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "ina/v1/placement.pb-c.h"
#include "agent/agent_internal.h"
#include "agent/placement_proto.h"
#include "agent/rpc/rpc_pb.h"

#define GET_PLACEMENT_METHOD "/ina.v1.Placement/GetPlacement"
#define APPLY_PLACEMENT_METHOD "/ina.v1.Placement/ApplyPlacement"

static placement_shape_t job_shape(const ina_agent_t *agent) {
  const placement_shape_t shape = {agent->tp, agent->dp, agent->ep, agent->placement.num_moe_layers,
                                   agent->placement.num_experts};
  return shape;
}

ina_status_t ina_agent_placement_control(ina_engine_t *engine, const void *bytes, size_t size,
                                     void *user_data) {
  ina_status_t st = INA_OK;
  ina_expert_placement_t p = {0};
  int dry_run = 0;
  int64_t moved = 0;
  INA_CHECK(placement_command_decode(bytes, size, &p, &dry_run));
  INA_CHECK(ina_engine_apply_placement(engine, &p, dry_run, &moved));
  if (user_data) ((ina_agent_t *)user_data)->placement_bytes_moved = moved;
fail:
  ina_expert_placement_free(&p);
  return st;
}

static ina_rpc_code_t get_placement(void *ctx, const ina_rpc_request_t *request,
                                    ina_rpc_reply_t *reply) {
  ina_agent_t *agent = ctx;
  Ina__V1__GetPlacementRequest *req =
      ina__v1__get_placement_request__unpack(NULL, request->size, request->bytes);
  if (!req)
    return ina_rpc_error(reply->message, INA_RPC_INVALID_ARGUMENT,
                         "request: %zu bytes are not an ina.v1.GetPlacementRequest", request->size);
  ina__v1__get_placement_request__free_unpacked(req, NULL);
  const placement_shape_t shape = job_shape(agent);
  pthread_mutex_lock(&agent->lock);
  const ina_status_t st = placement_pack_response(&agent->placement, &shape, agent->placement_generation,
                                                  &reply->bytes, &reply->size);
  pthread_mutex_unlock(&agent->lock);
  if (st != INA_OK) return ina_rpc_error(reply->message, INA_RPC_INTERNAL, "cannot pack the response");
  return INA_RPC_OK;
}

/* The engine's verdict as a status code. */
static ina_rpc_code_t apply_error(ina_status_t st, const char *detail, char *message) {
  switch (st) {
    case INA_ERR_INVALID_ARGUMENT:
      return ina_rpc_error(message, INA_RPC_INVALID_ARGUMENT, "placement: %s", detail);
    case INA_ERR_OUT_OF_MEMORY:
      return ina_rpc_error(message, INA_RPC_RESOURCE_EXHAUSTED, "placement: %s", detail);
    case INA_ERR_UNSUPPORTED:
      return ina_rpc_error(message, INA_RPC_FAILED_PRECONDITION, "placement: %s", detail);
    default:
      return ina_rpc_error(message, INA_RPC_INTERNAL, "placement: %s (%s)", detail,
                           ina_status_string(st));
  }
}

/* Checks and runs one request; apply_mu held. */
static ina_rpc_code_t apply_locked(ina_agent_t *agent, const Ina__V1__ApplyPlacementRequest *req,
                                   ina_rpc_reply_t *reply) {
  ina_rpc_code_t code = INA_RPC_OK;
  ina_expert_placement_t p = {0};
  uint8_t *command = NULL;
  size_t command_size = 0;
  char detail[INA_RPC_MESSAGE_MAX] = "";
  pthread_mutex_lock(&agent->lock);
  const uint64_t generation = agent->placement_generation;
  const agent_state_t state = agent->state;
  pthread_mutex_unlock(&agent->lock);
  if (state != AGENT_SERVING && state != AGENT_STARTING)
    return ina_rpc_error(reply->message, INA_RPC_UNAVAILABLE, "the agent is stopping");
  if (req->expected_generation == 0)
    return ina_rpc_error(reply->message, INA_RPC_FAILED_PRECONDITION,
                         "expected_generation: missing (0); set it to the generation in force, %llu "
                         "(GetPlacement shows it), so that a placement applied meanwhile is not overwritten",
                         (unsigned long long)generation);
  if (req->expected_generation != generation)
    return ina_rpc_error(reply->message, INA_RPC_FAILED_PRECONDITION,
                         "expected_generation: %llu, but generation %llu is in force (another "
                         "placement was applied since; GetPlacement shows it)",
                         (unsigned long long)req->expected_generation, (unsigned long long)generation);
  const placement_shape_t shape = job_shape(agent);
  code = placement_from_proto(req->placement, &shape, &p, reply->message);
  if (code != INA_RPC_OK) return code;
  if (placement_command_encode(&p, req->dry_run, &command, &command_size) != INA_OK) {
    code = ina_rpc_error(reply->message, INA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  const double t0 = agent_now_seconds();
  agent->placement_bytes_moved = 0;
  const ina_status_t st =
      ina_scheduler_control(agent->scheduler, command, command_size, detail, sizeof detail);
  const double seconds = agent_now_seconds() - t0;
  if (st != INA_OK) {
    code = apply_error(st, detail, reply->message);
    goto done;
  }
  uint64_t now = generation;
  if (!req->dry_run) {
    pthread_mutex_lock(&agent->lock);
    ina_expert_placement_t old = agent->placement;
    agent->placement = p;
    p = old;
    now = ++agent->placement_generation;
    pthread_mutex_unlock(&agent->lock);
    INA_LOG_I(INA_LOG_SUBSYS, "placement generation %llu applied in %.1f ms, %lld bytes of experts moved",
              (unsigned long long)now, seconds * 1e3, (long long)agent->placement_bytes_moved);
  }
  Ina__V1__ApplyPlacementResponse resp = INA__V1__APPLY_PLACEMENT_RESPONSE__INIT;
  resp.generation = now;
  resp.apply_ms = (uint64_t)(seconds * 1e3 + 0.5);
  resp.bytes_moved = (uint64_t)agent->placement_bytes_moved;
  if (ina_rpc_pack(&resp.base, &reply->bytes, &reply->size) != INA_OK)
    code = ina_rpc_error(reply->message, INA_RPC_INTERNAL, "cannot pack the response");
done:
  free(command);
  ina_expert_placement_free(&p);
  return code;
}

static ina_rpc_code_t apply_placement(void *ctx, const ina_rpc_request_t *request,
                                      ina_rpc_reply_t *reply) {
  ina_agent_t *agent = ctx;
  Ina__V1__ApplyPlacementRequest *req =
      ina__v1__apply_placement_request__unpack(NULL, request->size, request->bytes);
  if (!req)
    return ina_rpc_error(reply->message, INA_RPC_INVALID_ARGUMENT,
                         "request: %zu bytes are not an ina.v1.ApplyPlacementRequest", request->size);
  pthread_mutex_lock(&agent->apply_mu);
  const ina_rpc_code_t code = apply_locked(agent, req, reply);
  pthread_mutex_unlock(&agent->apply_mu);
  ina__v1__apply_placement_request__free_unpacked(req, NULL);
  return code;
}

/* An admin call of an agent without an admin token that was not told to open them. */
static ina_rpc_code_t admin_refused(void *ctx, const ina_rpc_request_t *request,
                                    ina_rpc_reply_t *reply) {
  (void)ctx;
  (void)request;
  return ina_rpc_error(reply->message, INA_RPC_PERMISSION_DENIED,
                       "admin calls are refused: ina-agent was started without an admin token; "
                       "restart it with --admin-token-file F (or --admin-token T) and call with "
                       "that token (ina place --admin-token-file F)");
}

ina_status_t agent_register_placement_service(ina_agent_t *agent, const char *admin_token,
                                              int allow_unauthenticated) {
  ina_status_t st = INA_OK;
  const int has_token = admin_token && admin_token[0];
  INA_CHECK(ina_rpc_server_add_unary(agent->server, GET_PLACEMENT_METHOD, get_placement, agent, NULL));
  const int served = has_token || allow_unauthenticated;
  INA_CHECK(ina_rpc_server_add_unary(agent->server, APPLY_PLACEMENT_METHOD,
                                     served ? apply_placement : admin_refused, agent,
                                     has_token ? admin_token : NULL));
  if (!has_token && allow_unauthenticated)
    INA_LOG_W(INA_LOG_SUBSYS,
              "admin calls (ApplyPlacement) are open to any client: no admin token and "
              "--allow-unauthenticated-admin; give --admin-token-file F to require one");
fail:
  return st;
}
