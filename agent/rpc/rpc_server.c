#define INA_LOG_SUBSYS "rpc"
#include "agent/rpc/rpc_server.h"

#include <grpc/grpc_security.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "agent/rpc/pem_file.h"
#include "agent/rpc/server_internal.h"

/* Server life cycle, method table and the completion-queue threads. What happens to
 * one call is in server_call.c.
 *
 * Shutdown, in the order gRPC requires: stop handing out new call slots, ask the core
 * to shut down (shutdown tag) and cancel every call in flight; the threads keep
 * draining the queue meanwhile, so each call sees its close event and releases its
 * grpc_call. Once the shutdown tag is back the server is destroyed, the queue shut down
 * and drained to its end, the threads joined; then destroy waits for stream owners that
 * still hold a writer, and only then destroys the queue and releases gRPC. */

#define DEFAULT_LISTEN_ADDRESS "127.0.0.1:0"
#define DEFAULT_MAX_MESSAGE_BYTES (4 << 20)
#define DEFAULT_NUM_THREADS 2
#define MAX_NUM_THREADS 64
/* Call slots kept waiting for incoming calls per thread: calls beyond them wait in the
 * core until a slot is handed out again, never fail. */
#define CALL_SLOTS_PER_THREAD 4

#define SERVER_OPTIONS_V1_SIZE \
  (offsetof(ina_rpc_server_options_t, num_threads) + sizeof(int32_t))

static void *cq_thread_main(void *arg) {
  ina_rpc_server_t *s = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type != GRPC_OP_COMPLETE) continue;
    rpc_tag_t *tag = ev.tag;
    if (tag->kind == RPC_TAG_SHUTDOWN) {
      pthread_mutex_lock(&s->lock);
      s->shutdown_done = 1;
      pthread_cond_broadcast(&s->changed);
      pthread_mutex_unlock(&s->lock);
    } else {
      rpc_call_on_event(tag, ev.success);
    }
  }
  return NULL;
}

const rpc_method_t *rpc_server_find_method(const ina_rpc_server_t *server, const char *path) {
  for (size_t i = 0; i < server->n_methods; i++) {
    if (strcmp(server->methods[i].path, path) == 0) return &server->methods[i];
  }
  return NULL;
}

void rpc_server_call_accepted(ina_rpc_server_t *server) {
  pthread_mutex_lock(&server->lock);
  server->active_calls++;
  pthread_mutex_unlock(&server->lock);
}

void rpc_server_call_released(ina_rpc_server_t *server) {
  pthread_mutex_lock(&server->lock);
  server->active_calls--;
  pthread_cond_broadcast(&server->changed);
  pthread_mutex_unlock(&server->lock);
}

/* Insecure credentials, or TLS ones from the certificate and key files. */
static ina_status_t make_credentials(const ina_rpc_server_options_t *o,
                                     grpc_server_credentials **out) {
  ina_status_t st = INA_OK;
  char *cert = NULL, *key = NULL;
  *out = NULL;
  if (!o->tls_cert_file) {
    *out = grpc_insecure_server_credentials_create();
    INA_REQUIRE(*out, INA_ERR_INTERNAL, "rpc server: cannot create insecure credentials");
    return INA_OK;
  }
  INA_CHECK(rpc_read_pem_file("rpc server: TLS certificate", o->tls_cert_file, &cert));
  INA_CHECK(rpc_read_pem_file("rpc server: TLS private key", o->tls_key_file, &key));
  /* gRPC only finds a mismatch when it binds, and reports it as a failure to listen. */
  INA_CHECK(rpc_check_key_pair("rpc server", cert, o->tls_cert_file, key, o->tls_key_file));
  grpc_ssl_pem_key_cert_pair pair = {key, cert};
  *out = grpc_ssl_server_credentials_create_ex(NULL, &pair, 1,
                                               GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE, NULL);
  INA_REQUIRE(*out, INA_ERR_FORMAT, "rpc server: gRPC refused the TLS certificate '%s' / key '%s'",
              o->tls_cert_file, o->tls_key_file);
fail:
  free(cert);
  free(key);
  return st;
}

ina_status_t ina_rpc_server_create(const ina_rpc_server_options_t *options,
                                   ina_rpc_server_t **out) {
  ina_status_t st = INA_OK;
  ina_rpc_server_t *s = NULL;
  grpc_server_credentials *creds = NULL;
  INA_REQUIRE(out, INA_ERR_INVALID_ARGUMENT, "rpc server: out is NULL");
  *out = NULL;
  INA_REQUIRE_VERSIONED(options, SERVER_OPTIONS_V1_SIZE, "rpc server options",
                        "INA_RPC_SERVER_OPTIONS_INIT");
  INA_REQUIRE((options->tls_cert_file == NULL) == (options->tls_key_file == NULL),
              INA_ERR_INVALID_ARGUMENT,
              "rpc server: TLS needs both a certificate and a key file (got cert '%s', key '%s')",
              options->tls_cert_file ? options->tls_cert_file : "(none)",
              options->tls_key_file ? options->tls_key_file : "(none)");
  INA_REQUIRE(options->num_threads <= MAX_NUM_THREADS, INA_ERR_INVALID_ARGUMENT,
              "rpc server: num_threads %d > %d", (int)options->num_threads, MAX_NUM_THREADS);
  const char *address = options->listen_address ? options->listen_address : DEFAULT_LISTEN_ADDRESS;

  s = calloc(1, sizeof *s);
  INA_CHECK_ALLOC(s);
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->changed, NULL);
  s->shutdown_tag.kind = RPC_TAG_SHUTDOWN;
  s->num_threads = options->num_threads > 0 ? options->num_threads : DEFAULT_NUM_THREADS;
  grpc_init();
  s->grpc_initialized = 1;

  INA_CHECK(make_credentials(options, &creds));
  int max_bytes = options->max_message_bytes > 0 ? options->max_message_bytes
                                                 : DEFAULT_MAX_MESSAGE_BYTES;
  grpc_arg args[3] = {
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
       .value.integer = max_bytes},
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
       .value.integer = max_bytes},
      /* gRPC sets SO_REUSEPORT by default, which lets a second agent bind the same port
       * and silently take half the calls; a taken port must be an error instead. */
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0},
  };
  grpc_channel_args channel_args = {3, args};
  /* The queue first: destroy shuts a server down through it. */
  s->cq = grpc_completion_queue_create_for_next(NULL);
  INA_REQUIRE(s->cq, INA_ERR_INTERNAL, "rpc server: cannot create a completion queue");
  s->server = grpc_server_create(&channel_args, NULL);
  INA_REQUIRE(s->server, INA_ERR_INTERNAL, "rpc server: grpc_server_create failed");
  grpc_server_register_completion_queue(s->server, s->cq, NULL);
  s->port = grpc_server_add_http2_port(s->server, address, creds);
  INA_REQUIRE(s->port > 0, INA_ERR_IO,
              "rpc server: cannot listen on '%s' (malformed address, or the port is in use)",
              address);
  grpc_server_credentials_release(creds);
  *out = s;
  return INA_OK;
fail:
  if (creds) grpc_server_credentials_release(creds);
  ina_rpc_server_destroy(s);
  return st;
}

static ina_status_t add_method(ina_rpc_server_t *s, const char *path, ina_rpc_unary_fn unary,
                               ina_rpc_stream_fn stream, void *ctx, const char *bearer_token) {
  ina_status_t st = INA_OK;
  rpc_method_t m = {0};
  INA_REQUIRE(s, INA_ERR_INVALID_ARGUMENT, "rpc server: add method: server is NULL");
  INA_REQUIRE(path && path[0] == '/' && strchr(path + 1, '/') != NULL, INA_ERR_INVALID_ARGUMENT,
              "rpc server: method path '%s' is not of the form /package.Service/Method",
              path ? path : "(null)");
  INA_REQUIRE(unary || stream, INA_ERR_INVALID_ARGUMENT, "rpc server: method %s: handler is NULL",
              path);
  INA_REQUIRE(!s->started, INA_ERR_INVALID_ARGUMENT,
              "rpc server: method %s registered after start", path);
  INA_REQUIRE(!rpc_server_find_method(s, path), INA_ERR_INVALID_ARGUMENT,
              "rpc server: method %s registered twice", path);
  if (s->n_methods == s->cap_methods) {
    size_t cap = s->cap_methods ? 2 * s->cap_methods : 8;
    rpc_method_t *grown = realloc(s->methods, cap * sizeof *grown);
    INA_CHECK_ALLOC(grown);
    s->methods = grown;
    s->cap_methods = cap;
  }
  m.path = strdup(path);
  INA_CHECK_ALLOC(m.path);
  if (bearer_token && bearer_token[0]) {
    m.bearer_token = strdup(bearer_token);
    INA_CHECK_ALLOC(m.bearer_token);
  }
  m.unary = unary;
  m.stream = stream;
  m.ctx = ctx;
  s->methods[s->n_methods++] = m;
  return INA_OK;
fail:
  free(m.path);
  free(m.bearer_token);
  return st;
}

ina_status_t ina_rpc_server_add_unary(ina_rpc_server_t *server, const char *path,
                                      ina_rpc_unary_fn fn, void *ctx, const char *bearer_token) {
  return add_method(server, path, fn, NULL, ctx, bearer_token);
}

ina_status_t ina_rpc_server_add_stream(ina_rpc_server_t *server, const char *path,
                                       ina_rpc_stream_fn fn, void *ctx, const char *bearer_token) {
  return add_method(server, path, NULL, fn, ctx, bearer_token);
}

ina_status_t ina_rpc_server_start(ina_rpc_server_t *server) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(server, INA_ERR_INVALID_ARGUMENT, "rpc server: start: server is NULL");
  INA_REQUIRE(!server->started, INA_ERR_INVALID_ARGUMENT, "rpc server: started twice");
  server->threads = calloc((size_t)server->num_threads, sizeof *server->threads);
  INA_CHECK_ALLOC(server->threads);
  grpc_server_start(server->server);
  server->started = 1;
  for (int i = 0; i < server->num_threads * CALL_SLOTS_PER_THREAD; i++) {
    INA_CHECK(rpc_call_request(server));
  }
  for (int i = 0; i < server->num_threads; i++) {
    int rc = pthread_create(&server->threads[i], NULL, cq_thread_main, server);
    INA_REQUIRE(rc == 0, INA_ERR_INTERNAL, "rpc server: cannot start thread %d of %d (error %d)",
                i, server->num_threads, rc);
    server->threads_started++;
  }
  INA_LOG_I(INA_LOG_SUBSYS, "rpc server: listening on port %d with %d threads, %zu methods",
            server->port, server->num_threads, server->n_methods);
  return INA_OK;
fail:
  return st; /* destroy cleans up whatever was started */
}

int ina_rpc_server_port(const ina_rpc_server_t *server) { return server ? server->port : 0; }

int64_t ina_rpc_server_active_calls(ina_rpc_server_t *server) {
  if (!server) return 0;
  pthread_mutex_lock(&server->lock);
  int64_t n = server->active_calls;
  pthread_mutex_unlock(&server->lock);
  return n;
}

/* With no thread running (never started, or threads failed to start), destroy drives the
 * queue itself until the shutdown tag is back. */
static void drain_inline_until_shutdown_tag(ina_rpc_server_t *s) {
  for (;;) {
    pthread_mutex_lock(&s->lock);
    int done = s->shutdown_done;
    pthread_mutex_unlock(&s->lock);
    if (done) return;
    grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type != GRPC_OP_COMPLETE) return;
    rpc_tag_t *tag = ev.tag;
    if (tag->kind == RPC_TAG_SHUTDOWN) {
      pthread_mutex_lock(&s->lock);
      s->shutdown_done = 1;
      pthread_mutex_unlock(&s->lock);
    } else {
      rpc_call_on_event(tag, ev.success);
    }
  }
}

void ina_rpc_server_destroy(ina_rpc_server_t *server) {
  if (!server) return;
  ina_rpc_server_t *s = server;
  if (s->server) {
    pthread_mutex_lock(&s->lock);
    s->shutting_down = 1;
    pthread_mutex_unlock(&s->lock);
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
    grpc_server_cancel_all_calls(s->server);
    if (s->threads_started > 0) {
      pthread_mutex_lock(&s->lock);
      while (!s->shutdown_done) pthread_cond_wait(&s->changed, &s->lock);
      pthread_mutex_unlock(&s->lock);
    } else {
      drain_inline_until_shutdown_tag(s);
    }
    grpc_server_destroy(s->server);
  }
  if (s->cq) {
    grpc_completion_queue_shutdown(s->cq);
    if (s->threads_started > 0) {
      for (int i = 0; i < s->threads_started; i++) pthread_join(s->threads[i], NULL);
    } else {
      for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type == GRPC_OP_COMPLETE && ((rpc_tag_t *)ev.tag)->kind != RPC_TAG_SHUTDOWN) {
          rpc_call_on_event(ev.tag, ev.success);
        }
      }
    }
  }
  /* Every call has seen its close event; stream owners may still hold writers. */
  pthread_mutex_lock(&s->lock);
  while (s->active_calls > 0) pthread_cond_wait(&s->changed, &s->lock);
  pthread_mutex_unlock(&s->lock);
  if (s->cq) grpc_completion_queue_destroy(s->cq);
  if (s->grpc_initialized) grpc_shutdown();
  for (size_t i = 0; i < s->n_methods; i++) {
    free(s->methods[i].path);
    free(s->methods[i].bearer_token);
  }
  free(s->methods);
  free(s->threads);
  pthread_cond_destroy(&s->changed);
  pthread_mutex_destroy(&s->lock);
  free(s);
}
