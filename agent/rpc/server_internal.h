/* Internals shared by rpc_server.c (server life cycle, method table, threads) and
 * server_call.c (the state machine of one call). Not a public header. */
#ifndef INA_AGENT_RPC_SERVER_INTERNAL_H
#define INA_AGENT_RPC_SERVER_INTERNAL_H

#include <grpc/grpc.h>
#include <pthread.h>

#include "agent/rpc/rpc_server.h"

/* A registered method. Immutable once the server has started. */
typedef struct rpc_method {
  char *path;
  ina_rpc_unary_fn unary; /* exactly one of unary / stream is set */
  ina_rpc_stream_fn stream;
  void *ctx;
  char *bearer_token; /* NULL: no check */
} rpc_method_t;

/* Completion-queue tags: every batch names what completed and for which call. */
typedef enum rpc_tag_kind {
  RPC_TAG_NEW_CALL, /* grpc_server_request_call delivered a call */
  RPC_TAG_RECV,     /* the request message arrived */
  RPC_TAG_CLOSE,    /* RECV_CLOSE_ON_SERVER: the call is over, `cancelled` tells how */
  RPC_TAG_SEND,     /* a send batch (metadata, message, status) finished */
  RPC_TAG_SHUTDOWN  /* grpc_server_shutdown_and_notify finished */
} rpc_tag_kind_t;

typedef struct rpc_tag {
  rpc_tag_kind_t kind;
  struct ina_rpc_writer *call; /* NULL for RPC_TAG_SHUTDOWN */
} rpc_tag_t;

struct ina_rpc_server {
  grpc_server *server;
  grpc_completion_queue *cq; /* one queue: requests and every call's batches */
  int port;
  int grpc_initialized;
  rpc_method_t *methods;
  size_t n_methods, cap_methods;

  pthread_t *threads;
  int num_threads;
  int threads_started;
  int started;
  rpc_tag_t shutdown_tag;

  pthread_mutex_t lock; /* guards the fields below */
  pthread_cond_t changed;
  int shutting_down; /* set by destroy: no more grpc_server_request_call */
  int shutdown_done; /* the shutdown tag came back */
  int64_t active_calls;
};

/* rpc_server.c */
const rpc_method_t *rpc_server_find_method(const ina_rpc_server_t *server, const char *path);
void rpc_server_call_accepted(ina_rpc_server_t *server);
void rpc_server_call_released(ina_rpc_server_t *server);

/* server_call.c */
/* Asks gRPC for the next incoming call (a fresh call slot waits on the queue). Does
 * nothing once the server is shutting down. */
ina_status_t rpc_call_request(ina_rpc_server_t *server);
/* Advances the call a completion-queue event belongs to. */
void rpc_call_on_event(rpc_tag_t *tag, int ok);

#endif
