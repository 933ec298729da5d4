/* Batches of one-sided transfers: post puts or gets, poll, wait with a timeout. */
#define INA_LOG_SUBSYS "ucx"
#include <stdlib.h>
#include <string.h>

#include "comm/ucx_internal.h"
#include "core/check.h"

/* How long destroying an unfinished batch waits before detaching its requests. */
#define INA_UCX_DESTROY_TIMEOUT_S 5.0

/* A get into a staged device region lands in the mirror; this copies it in afterwards. */
typedef struct ina_ucx_copy_in {
  ina_ucx_region_t *region;
  size_t offset;
  size_t bytes;
} ina_ucx_copy_in_t;

struct ina_ucx_batch {
  ina_ucx_peer_t *peer;
  ina_ucx_op_t op;
  void **requests; /* in-flight UCX requests; NULL entries completed */
  size_t request_count;
  ina_ucx_copy_in_t *copy_ins;
  size_t copy_in_count;
  int done;
};

static const char *op_name(ina_ucx_op_t op) { return op == INA_UCX_PUT ? "put" : "get"; }

static const ina_ucx_remote_region_t *find_remote(const ina_ucx_peer_t *p, uint64_t addr,
                                                  size_t length) {
  for (uint32_t i = 0; i < p->region_count; i++) {
    const ina_ucx_remote_region_t *r = &p->regions[i];
    if (addr >= r->base && addr - r->base <= r->length && length <= r->length - (addr - r->base))
      return r;
  }
  return NULL;
}

/* Checks every in-flight request once; returns the first failure. */
static ina_status_t collect(ina_ucx_batch_t *b, int *out_pending) {
  ina_status_t st = INA_OK;
  int pending = 0;
  for (size_t i = 0; i < b->request_count; i++) {
    void *req = b->requests[i];
    if (!req) continue;
    ucs_status_t us = ucp_request_check_status(req);
    if (us == UCS_INPROGRESS) {
      pending = 1;
      continue;
    }
    ucp_request_free(req);
    b->requests[i] = NULL;
    if (us != UCS_OK && st == INA_OK) {
      st = INA_ERR_IO;
      ina_error(INA_LOG_SUBSYS, "ucx %s batch: transfer %zu failed: %s", op_name(b->op), i,
                ucs_status_string(us));
    }
  }
  *out_pending = pending;
  return st;
}

ina_status_t ina_ucx_batch_test(ina_ucx_batch_t *b, int *out_done) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(b && out_done, INA_ERR_INVALID_ARGUMENT, "ucx batch test: NULL argument");
  *out_done = b->done;
  if (b->done) return INA_OK;
  ucp_worker_progress(b->peer->engine->worker);
  int pending = 0;
  INA_CHECK(collect(b, &pending));
  if (pending) return INA_OK;
  for (size_t i = 0; i < b->copy_in_count; i++) {
    const ina_ucx_copy_in_t *c = &b->copy_ins[i];
    INA_CHECK(ina_ucx_region_stage_in(c->region, c->offset, c->bytes));
  }
  b->done = 1;
  *out_done = 1;
fail:
  return st;
}

ina_status_t ina_ucx_batch_wait(ina_ucx_batch_t *b, double timeout_s) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(b, INA_ERR_INVALID_ARGUMENT, "ucx batch wait: NULL batch");
  double deadline = ina_ucx_now() + timeout_s;
  int done = 0;
  for (;;) {
    INA_CHECK(ina_ucx_batch_test(b, &done));
    if (done) break;
    INA_REQUIRE(ina_ucx_now() <= deadline, INA_ERR_IO,
                "ucx %s batch of %zu requests timed out after %.3f s (peer not answering?)",
                op_name(b->op), b->request_count, timeout_s);
  }
fail:
  return st;
}

void ina_ucx_batch_destroy(ina_ucx_batch_t *b) {
  if (!b) return;
  double deadline = ina_ucx_now() + INA_UCX_DESTROY_TIMEOUT_S;
  int pending = 1;
  while (pending && ina_ucx_now() <= deadline) {
    ucp_worker_progress(b->peer->engine->worker);
    (void)collect(b, &pending);
  }
  for (size_t i = 0; i < b->request_count; i++) {
    if (b->requests[i]) {
      INA_LOG_W(INA_LOG_SUBSYS, "ucx batch destroyed with transfer %zu still in flight", i);
      ucp_request_free(b->requests[i]);
    }
  }
  free(b->requests);
  free(b->copy_ins);
  free(b);
}

/* Keeps the request of one posted operation (NULL: it completed at once). */
static ina_status_t keep_request(ina_ucx_batch_t *b, void *req, const char *what, size_t index) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(!UCS_PTR_IS_ERR(req), INA_ERR_IO, "ucx %s of transfer %zu failed to post: %s",
              what, index, ucs_status_string(UCS_PTR_STATUS(req)));
  if (req) b->requests[b->request_count++] = req;
fail:
  return st;
}

ina_status_t ina_ucx_post(ina_ucx_peer_t *p, ina_ucx_op_t op, const ina_ucx_xfer_t *xfers,
                          size_t count, ina_ucx_batch_t **out) {
  ina_status_t st = INA_OK;
  ina_ucx_batch_t *b = NULL;
  INA_REQUIRE(out, INA_ERR_INVALID_ARGUMENT, "ucx post: NULL output");
  *out = NULL;
  INA_REQUIRE(p && (xfers || count == 0), INA_ERR_INVALID_ARGUMENT,
              "ucx post: NULL peer or transfers (count %zu)", count);
  INA_REQUIRE(op == INA_UCX_PUT || op == INA_UCX_GET, INA_ERR_INVALID_ARGUMENT,
              "ucx post: unknown operation %d", (int)op);
  ina_ucx_engine_t *e = p->engine;
  b = calloc(1, sizeof *b);
  INA_CHECK_ALLOC(b);
  b->peer = p;
  b->op = op;
  b->requests = calloc(count + 1, sizeof *b->requests); /* + 1 for the closing flush */
  INA_CHECK_ALLOC(b->requests);

  /* Validate everything before posting anything, so a bad entry posts nothing. */
  for (size_t i = 0; i < count; i++) {
    const ina_ucx_xfer_t *x = &xfers[i];
    INA_REQUIRE(x->local || x->length == 0, INA_ERR_INVALID_ARGUMENT,
                "ucx %s transfer %zu: NULL local pointer", op_name(op), i);
    INA_REQUIRE(x->length == 0 || find_remote(p, x->remote, x->length), INA_ERR_INVALID_ARGUMENT,
                "ucx %s transfer %zu: remote range [0x%llx, +%zu) is not inside any region the "
                "peer advertised", op_name(op), i, (unsigned long long)x->remote, x->length);
    ina_ucx_region_t *local = ina_ucx_find_local_region(e, x->local, x->length);
    if (local && local->mirror && op == INA_UCX_GET) b->copy_in_count++;
  }
  if (b->copy_in_count > 0) {
    b->copy_ins = calloc(b->copy_in_count, sizeof *b->copy_ins);
    INA_CHECK_ALLOC(b->copy_ins);
    b->copy_in_count = 0;
  }

  for (size_t i = 0; i < count; i++) {
    const ina_ucx_xfer_t *x = &xfers[i];
    if (x->length == 0) continue;
    const ina_ucx_remote_region_t *remote = find_remote(p, x->remote, x->length);
    char *buf = x->local;
    ina_ucx_region_t *local = ina_ucx_find_local_region(e, x->local, x->length);
    if (local && local->mirror) {
      size_t offset = (size_t)(buf - local->base);
      buf = local->mirror + offset;
      if (op == INA_UCX_PUT) {
        INA_CHECK(ina_ucx_region_stage_out(local, offset, x->length));
      } else {
        b->copy_ins[b->copy_in_count++] = (ina_ucx_copy_in_t){local, offset, x->length};
      }
    }
    ucp_request_param_t param = {.op_attr_mask = 0};
    void *req = op == INA_UCX_PUT
                    ? ucp_put_nbx(p->ep, buf, x->length, x->remote, remote->rkey, &param)
                    : ucp_get_nbx(p->ep, buf, x->length, x->remote, remote->rkey, &param);
    INA_CHECK(keep_request(b, req, op_name(op), i));
  }
  /* A completed put only means the local buffer may be reused; the flush makes the
   * batch complete when the data is at the peer. */
  if (op == INA_UCX_PUT && count > 0) {
    ucp_request_param_t param = {.op_attr_mask = 0};
    INA_CHECK(keep_request(b, ucp_ep_flush_nbx(p->ep, &param), "flush", count));
  }
  *out = b;
  return INA_OK;
fail:
  ina_ucx_batch_destroy(b);
  return st;
}
