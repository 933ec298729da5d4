#define INA_LOG_SUBSYS "rpc"
#include "agent/rpc/health.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "grpc/health/v1/health.pb-c.h"
#include "agent/rpc/rpc_pb.h"

/* The table is a small array (a handful of services); the Watch streams are a list.
 * One lock guards both and is held while writing to the streams, so that every stream
 * sees the changes of its service in order. Lock order: health, then a writer's (inside
 * ina_rpc_writer_*); the server calls on_watch_cancel without holding any writer lock. */

typedef struct service_entry {
  char *name;
  ina_health_status_t status;
} service_entry_t;

typedef struct watcher {
  ina_health_t *health;
  ina_rpc_writer_t *writer;
  char *service;
  ina_health_status_t last_sent;
  struct watcher *prev, *next;
} watcher_t;

struct ina_health {
  pthread_mutex_t lock;
  service_entry_t *entries;
  size_t n_entries, cap_entries;
  watcher_t *watchers;
};

static service_entry_t *find_locked(ina_health_t *h, const char *name) {
  for (size_t i = 0; i < h->n_entries; i++) {
    if (strcmp(h->entries[i].name, name) == 0) return &h->entries[i];
  }
  return NULL;
}

static ina_health_status_t status_locked(ina_health_t *h, const char *name) {
  service_entry_t *e = find_locked(h, name);
  return e ? e->status : INA_HEALTH_SERVICE_UNKNOWN;
}

/* Sends `status` on a Watch stream unless it already has it. A stream whose call has
 * ended refuses the write; its on_cancel is on the way and removes it. */
static void notify_locked(watcher_t *w, ina_health_status_t status) {
  if (w->last_sent == status) return;
  Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  resp.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)status;
  uint8_t buf[16]; /* one enum field: at most 11 bytes */
  size_t n = grpc__health__v1__health_check_response__pack(&resp, buf);
  if (ina_rpc_writer_write(w->writer, buf, n) == INA_OK) w->last_sent = status;
}

static ina_status_t set_locked(ina_health_t *h, const char *service, ina_health_status_t status) {
  ina_status_t st = INA_OK;
  service_entry_t *e = find_locked(h, service);
  if (!e) {
    if (h->n_entries == h->cap_entries) {
      size_t cap = h->cap_entries ? 2 * h->cap_entries : 8;
      service_entry_t *grown = realloc(h->entries, cap * sizeof *grown);
      INA_CHECK_ALLOC(grown);
      h->entries = grown;
      h->cap_entries = cap;
    }
    char *name = strdup(service);
    INA_CHECK_ALLOC(name);
    e = &h->entries[h->n_entries++];
    e->name = name;
  }
  e->status = status;
  for (watcher_t *w = h->watchers; w; w = w->next) {
    if (strcmp(w->service, service) == 0) notify_locked(w, status);
  }
fail:
  return st;
}

static ina_rpc_code_t check_handler(void *ctx, const ina_rpc_request_t *request,
                                    ina_rpc_reply_t *reply) {
  ina_health_t *h = ctx;
  Grpc__Health__V1__HealthCheckRequest *req =
      grpc__health__v1__health_check_request__unpack(NULL, request->size, request->bytes);
  if (!req) {
    return ina_rpc_error(reply->message, INA_RPC_INVALID_ARGUMENT,
                         "%s: %zu request bytes are not a grpc.health.v1.HealthCheckRequest",
                         request->method, request->size);
  }
  ina_health_status_t status = ina_health_get_status(h, req->service);
  ina_rpc_code_t code = INA_RPC_OK;
  if (status == INA_HEALTH_SERVICE_UNKNOWN) {
    code = ina_rpc_error(reply->message, INA_RPC_NOT_FOUND, "unknown service '%s'", req->service);
  } else {
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)status;
    if (ina_rpc_pack(&resp.base, &reply->bytes, &reply->size) != INA_OK) {
      code = ina_rpc_error(reply->message, INA_RPC_RESOURCE_EXHAUSTED,
                           "%s: out of memory packing the response", request->method);
    }
  }
  grpc__health__v1__health_check_request__free_unpacked(req, NULL);
  return code;
}

static void unlink_locked(ina_health_t *h, watcher_t *w) {
  if (w->prev) {
    w->prev->next = w->next;
  } else {
    h->watchers = w->next;
  }
  if (w->next) w->next->prev = w->prev;
  w->prev = w->next = NULL;
}

/* The Watch call ended (client cancelled, deadline, shutdown): forget the stream. */
static void on_watch_cancel(void *ctx, ina_rpc_writer_t *writer) {
  watcher_t *w = ctx;
  ina_health_t *h = w->health;
  pthread_mutex_lock(&h->lock);
  unlink_locked(h, w);
  pthread_mutex_unlock(&h->lock);
  ina_rpc_writer_finish(writer, INA_RPC_CANCELLED, NULL);
  free(w->service);
  free(w);
}

static void watch_handler(void *ctx, const ina_rpc_request_t *request, ina_rpc_writer_t *writer) {
  ina_health_t *h = ctx;
  char msg[INA_RPC_MESSAGE_MAX];
  Grpc__Health__V1__HealthCheckRequest *req =
      grpc__health__v1__health_check_request__unpack(NULL, request->size, request->bytes);
  if (!req) {
    snprintf(msg, sizeof msg, "%s: %zu request bytes are not a grpc.health.v1.HealthCheckRequest",
             request->method, request->size);
    ina_rpc_writer_finish(writer, INA_RPC_INVALID_ARGUMENT, msg);
    return;
  }
  watcher_t *w = calloc(1, sizeof *w);
  char *service = strdup(req->service);
  grpc__health__v1__health_check_request__free_unpacked(req, NULL);
  if (!w || !service) {
    free(w);
    free(service);
    snprintf(msg, sizeof msg, "%s: out of memory registering the stream", request->method);
    ina_rpc_writer_finish(writer, INA_RPC_RESOURCE_EXHAUSTED, msg);
    return;
  }
  w->health = h;
  w->writer = writer;
  w->service = service;
  w->last_sent = INA_HEALTH_UNKNOWN; /* never a table value: the first notify always sends */
  pthread_mutex_lock(&h->lock);
  w->next = h->watchers;
  if (h->watchers) h->watchers->prev = w;
  h->watchers = w;
  notify_locked(w, status_locked(h, service));
  pthread_mutex_unlock(&h->lock);
  /* From here the stream lives until its call ends: on_watch_cancel finishes it. */
  ina_rpc_writer_on_cancel(writer, on_watch_cancel, w);
}

ina_status_t ina_health_create(ina_rpc_server_t *server, ina_health_t **out) {
  ina_status_t st = INA_OK;
  ina_health_t *h = NULL;
  INA_REQUIRE(out, INA_ERR_INVALID_ARGUMENT, "health: out is NULL");
  *out = NULL;
  INA_REQUIRE(server, INA_ERR_INVALID_ARGUMENT, "health: server is NULL");
  h = calloc(1, sizeof *h);
  INA_CHECK_ALLOC(h);
  pthread_mutex_init(&h->lock, NULL);
  INA_CHECK(set_locked(h, "", INA_HEALTH_SERVING));
  INA_CHECK(ina_rpc_server_add_unary(server, INA_HEALTH_CHECK_METHOD, check_handler, h, NULL));
  INA_CHECK(ina_rpc_server_add_stream(server, INA_HEALTH_WATCH_METHOD, watch_handler, h, NULL));
  *out = h;
  return INA_OK;
fail:
  /* A method registered before the failure still points at h: the server must be
   * destroyed without being started, as after any failed setup. */
  ina_health_destroy(h);
  return st;
}

void ina_health_destroy(ina_health_t *health) {
  if (!health) return;
  /* Watch streams end (and free their watcher) when the server cancels them at its
   * destruction; any left means the server is still alive and may call into them. */
  if (health->watchers) {
    INA_LOG_E(INA_LOG_SUBSYS, "health: destroyed before its server, with Watch streams open; "
                              "leaving them allocated");
  }
  for (size_t i = 0; i < health->n_entries; i++) free(health->entries[i].name);
  free(health->entries);
  pthread_mutex_destroy(&health->lock);
  free(health);
}

static ina_status_t check_settable(const char *what, ina_health_status_t status) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(status == INA_HEALTH_SERVING || status == INA_HEALTH_NOT_SERVING,
              INA_ERR_INVALID_ARGUMENT,
              "health: %s: status %d is not SERVING (1) or NOT_SERVING (2)", what, (int)status);
fail:
  return st;
}

ina_status_t ina_health_set_status(ina_health_t *health, const char *service,
                                   ina_health_status_t status) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(health && service, INA_ERR_INVALID_ARGUMENT,
              "health: set_status: health and service must not be NULL");
  INA_CHECK(check_settable(service, status));
  pthread_mutex_lock(&health->lock);
  st = set_locked(health, service, status);
  pthread_mutex_unlock(&health->lock);
fail:
  return st;
}

ina_status_t ina_health_set_all(ina_health_t *health, ina_health_status_t status) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(health, INA_ERR_INVALID_ARGUMENT, "health: set_all: health is NULL");
  INA_CHECK(check_settable("every service", status));
  pthread_mutex_lock(&health->lock);
  for (size_t i = 0; i < health->n_entries && st == INA_OK; i++) {
    st = set_locked(health, health->entries[i].name, status);
  }
  pthread_mutex_unlock(&health->lock);
fail:
  return st;
}

ina_health_status_t ina_health_get_status(ina_health_t *health, const char *service) {
  if (!health || !service) return INA_HEALTH_SERVICE_UNKNOWN;
  pthread_mutex_lock(&health->lock);
  ina_health_status_t status = status_locked(health, service);
  pthread_mutex_unlock(&health->lock);
  return status;
}
