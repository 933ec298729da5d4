/* Private structures of the UCX engine, shared by ucx_engine.c, ucx_peer.c and
 * ucx_xfer.c. Not a public header. */
#ifndef INA_COMM_UCX_INTERNAL_H
#define INA_COMM_UCX_INTERNAL_H

#include <ucp/api/ucp.h>

#include "comm/ucx_engine.h"

struct ina_ucx_engine {
  ucp_context_h context;
  ucp_worker_h worker;
  int has_cuda;
  ina_ucx_region_t *regions; /* registered regions, for finding staged local pointers */
};

struct ina_ucx_region {
  ina_ucx_engine_t *engine;
  char *base; /* the caller's memory */
  size_t bytes;
  ina_ucx_mem_kind_t kind;
  char *mirror; /* host copy peers access, for a CUDA region UCX cannot reach; else NULL */
  ucp_mem_h memh;
  void *rkey_buf;
  size_t rkey_len;
  ina_ucx_region_t *next;
};

typedef struct ina_ucx_remote_region {
  uint64_t base;
  uint64_t length;
  ucp_rkey_h rkey;
} ina_ucx_remote_region_t;

struct ina_ucx_peer {
  ina_ucx_engine_t *engine;
  ucp_ep_h ep;
  ina_ucx_remote_region_t *regions;
  uint32_t region_count;
  int failed; /* UCX reported the endpoint failed (the peer is gone) */
};

/* Seconds on a monotonic clock. */
double ina_ucx_now(void);
/* Progresses until `request` (a ucs_status_ptr_t from a *_nbx call) completes or
 * `timeout_s` passes; releases the request once complete. On timeout returns INA_ERR_IO
 * and leaves the request in *request (still owned by the caller); otherwise sets it to
 * NULL. `what` names the operation in messages. */
ina_status_t ina_ucx_wait_request(ina_ucx_engine_t *engine, void **request, double timeout_s,
                                  const char *what);
/* The registered region of `engine` that holds [ptr, ptr + length), or NULL. */
ina_ucx_region_t *ina_ucx_find_local_region(ina_ucx_engine_t *engine, const void *ptr,
                                            size_t length);

#endif
