/* UCX peers: endpoints created from a blob, their remote keys, flush and close. */
#define INA_LOG_SUBSYS "ucx"
#include <stdlib.h>
#include <string.h>

#include "comm/ucx_blob.h"
#include "comm/ucx_internal.h"
#include "core/check.h"

/* How long closing an endpoint may wait for its operations to drain. */
#define INA_UCX_CLOSE_TIMEOUT_S 5.0

ina_status_t ina_ucx_wait_request(ina_ucx_engine_t *e, void **request, double timeout_s,
                                  const char *what) {
  ina_status_t st = INA_OK;
  void *req = *request;
  if (req == NULL) return INA_OK; /* completed immediately */
  INA_REQUIRE(!UCS_PTR_IS_ERR(req), INA_ERR_IO, "%s failed: %s", what,
              ucs_status_string(UCS_PTR_STATUS(req)));
  double deadline = ina_ucx_now() + timeout_s;
  ucs_status_t us;
  while ((us = ucp_request_check_status(req)) == UCS_INPROGRESS) {
    ucp_worker_progress(e->worker);
    if (ina_ucx_now() > deadline) break;
  }
  INA_REQUIRE(us != UCS_INPROGRESS, INA_ERR_IO, "%s timed out after %.3f s", what, timeout_s);
  ucp_request_free(req);
  *request = NULL;
  INA_REQUIRE(us == UCS_OK, INA_ERR_IO, "%s failed: %s", what, ucs_status_string(us));
fail:
  return st;
}

/* UCX reports a failed endpoint (the peer died, its connection broke) here, from inside
 * a progress call on the engine's thread: operations on it then complete with errors
 * instead of hanging or ending the process. */
static void on_endpoint_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
  (void)ep;
  ina_ucx_peer_t *p = arg;
  /* Info, not a warning: a peer that exits normally ends its endpoints this way too; a
   * transfer that needed the peer reports its own failure. */
  if (!p->failed)
    INA_LOG_I(INA_LOG_SUBSYS, "ucx endpoint closed: %s (the peer went away)", ucs_status_string(status));
  p->failed = 1;
}

ina_status_t ina_ucx_peer_connect(ina_ucx_engine_t *e, const void *blob, size_t size,
                                  ina_ucx_peer_t **out) {
  ina_status_t st = INA_OK;
  ina_ucx_peer_t *p = NULL;
  ina_ucx_blob_view_t view = {0};
  INA_REQUIRE(out, INA_ERR_INVALID_ARGUMENT, "ucx peer connect: NULL output");
  *out = NULL;
  INA_REQUIRE(e, INA_ERR_INVALID_ARGUMENT, "ucx peer connect: NULL engine");
  INA_CHECK(ina_ucx_blob_decode(blob, size, &view));
  p = calloc(1, sizeof *p);
  INA_CHECK_ALLOC(p);
  p->engine = e;
  ucp_ep_params_t params = {
      .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER,
      .address = view.address,
      .err_mode = UCP_ERR_HANDLING_MODE_PEER,
      .err_handler = {.cb = on_endpoint_error, .arg = p},
  };
  ucs_status_t us = ucp_ep_create(e->worker, &params, &p->ep);
  INA_REQUIRE(us == UCS_OK, INA_ERR_IO, "ucp_ep_create from a %zu-byte worker address: %s",
              view.address_len, ucs_status_string(us));
  if (view.region_count > 0) {
    p->regions = calloc(view.region_count, sizeof *p->regions);
    INA_CHECK_ALLOC(p->regions);
  }
  for (uint32_t i = 0; i < view.region_count; i++) {
    us = ucp_ep_rkey_unpack(p->ep, view.regions[i].rkey, &p->regions[i].rkey);
    INA_REQUIRE(us == UCS_OK, INA_ERR_FORMAT, "ucx blob: remote key of region %u: %s", i,
                ucs_status_string(us));
    p->regions[i].base = view.regions[i].base;
    p->regions[i].length = view.regions[i].length;
    p->region_count = i + 1;
  }
  ina_ucx_blob_view_release(&view);
  *out = p;
  return INA_OK;
fail:
  ina_ucx_blob_view_release(&view);
  ina_ucx_peer_disconnect(p);
  return st;
}

ina_status_t ina_ucx_peer_flush(ina_ucx_peer_t *p, double timeout_s) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(p, INA_ERR_INVALID_ARGUMENT, "ucx peer flush: NULL peer");
  ucp_request_param_t param = {.op_attr_mask = 0};
  void *req = ucp_ep_flush_nbx(p->ep, &param);
  st = ina_ucx_wait_request(p->engine, &req, timeout_s, "ucx endpoint flush");
  /* A timed-out flush is released: it completes, unobserved, when the peer answers. */
  if (req) ucp_request_free(req);
fail:
  return st;
}

void ina_ucx_peer_disconnect(ina_ucx_peer_t *p) {
  if (!p) return;
  for (uint32_t i = 0; i < p->region_count; i++) ucp_rkey_destroy(p->regions[i].rkey);
  free(p->regions);
  if (p->ep) {
    /* A failed endpoint has nobody to drain towards: close it at once. */
    ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = p->failed ? UCP_EP_CLOSE_FLAG_FORCE : 0};
    void *req = ucp_ep_close_nbx(p->ep, &param);
    if (ina_ucx_wait_request(p->engine, &req, INA_UCX_CLOSE_TIMEOUT_S, "ucx endpoint close") !=
            INA_OK &&
        req) {
      /* The peer is gone or stuck: release the close rather than hang; the worker's
       * destruction reclaims the endpoint. */
      ucp_request_free(req);
    }
  }
  free(p);
}

uint32_t ina_ucx_peer_region_count(const ina_ucx_peer_t *p) { return p ? p->region_count : 0; }

int ina_ucx_peer_failed(const ina_ucx_peer_t *p) { return p ? p->failed : 1; }

ina_status_t ina_ucx_peer_region(const ina_ucx_peer_t *p, uint32_t index, uint64_t *out_base,
                                 uint64_t *out_length) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(p && out_base && out_length, INA_ERR_INVALID_ARGUMENT,
              "ucx peer region: NULL argument");
  INA_REQUIRE(index < p->region_count, INA_ERR_INVALID_ARGUMENT,
              "ucx peer region: index %u out of range (peer advertised %u regions)", index,
              p->region_count);
  *out_base = p->regions[index].base;
  *out_length = p->regions[index].length;
fail:
  return st;
}
