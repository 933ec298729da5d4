/* UCX engine: context and worker, CUDA detection, memory registration and staging. */
#define INA_LOG_SUBSYS "ucx"
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/ucx_blob.h"
#include "comm/ucx_internal.h"
#include "core/check.h"
#include "core/cuda.h"

double ina_ucx_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int ina_ucx_memory_types_have_cuda(uint64_t memory_types) {
  return (memory_types >> UCS_MEMORY_TYPE_CUDA) & 1u;
}

ina_status_t ina_ucx_engine_create(ina_ucx_engine_t **out) {
  ina_status_t st = INA_OK;
  ina_ucx_engine_t *e = NULL;
  ucp_config_t *config = NULL;
  INA_REQUIRE(out, INA_ERR_INVALID_ARGUMENT, "ucx engine create: NULL output");
  *out = NULL;
  e = calloc(1, sizeof *e);
  INA_CHECK_ALLOC(e);

  ucs_status_t us = ucp_config_read(NULL, NULL, &config);
  INA_REQUIRE(us == UCS_OK, INA_ERR_IO, "ucp_config_read: %s", ucs_status_string(us));
  ucp_params_t params = {
      .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
      .features = UCP_FEATURE_RMA,
      .mt_workers_shared = 0,
  };
  us = ucp_init(&params, config, &e->context);
  ucp_config_release(config);
  INA_REQUIRE(us == UCS_OK, INA_ERR_IO, "ucp_init (RMA): %s", ucs_status_string(us));

  ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
  us = ucp_context_query(e->context, &attr);
  INA_REQUIRE(us == UCS_OK, INA_ERR_IO, "ucp_context_query: %s", ucs_status_string(us));
  e->has_cuda = ina_ucx_memory_types_have_cuda(attr.memory_types);

  ucp_worker_params_t wparams = {
      .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
      .thread_mode = UCS_THREAD_MODE_SINGLE,
  };
  us = ucp_worker_create(e->context, &wparams, &e->worker);
  INA_REQUIRE(us == UCS_OK, INA_ERR_IO, "ucp_worker_create: %s", ucs_status_string(us));
  INA_LOG_D(INA_LOG_SUBSYS, "engine ready: memory types 0x%llx, CUDA memory %s",
            (unsigned long long)attr.memory_types, e->has_cuda ? "direct" : "staged");
  *out = e;
  return INA_OK;
fail:
  ina_ucx_engine_destroy(e);
  return st;
}

void ina_ucx_engine_destroy(ina_ucx_engine_t *e) {
  if (!e) return;
  if (e->regions) INA_LOG_W(INA_LOG_SUBSYS, "engine destroyed with regions still registered");
  if (e->worker) ucp_worker_destroy(e->worker);
  if (e->context) ucp_cleanup(e->context);
  free(e);
}

int ina_ucx_engine_has_cuda(const ina_ucx_engine_t *e) { return e ? e->has_cuda : 0; }

int ina_ucx_engine_progress(ina_ucx_engine_t *e) {
  return e ? (int)ucp_worker_progress(e->worker) : 0;
}

ina_status_t ina_ucx_region_register(ina_ucx_engine_t *e, void *base, size_t bytes,
                                     ina_ucx_mem_kind_t kind, ina_ucx_region_t **out) {
  ina_status_t st = INA_OK;
  ina_ucx_region_t *r = NULL;
  INA_REQUIRE(out, INA_ERR_INVALID_ARGUMENT, "ucx region register: NULL output");
  *out = NULL;
  INA_REQUIRE(e && base && bytes > 0, INA_ERR_INVALID_ARGUMENT,
              "ucx region register: NULL engine or empty range (base %p, %zu bytes)", base, bytes);
  INA_REQUIRE(kind == INA_UCX_MEM_HOST || kind == INA_UCX_MEM_CUDA, INA_ERR_INVALID_ARGUMENT,
              "ucx region register: unknown memory kind %d", (int)kind);
  r = calloc(1, sizeof *r);
  INA_CHECK_ALLOC(r);
  r->engine = e;
  r->base = base;
  r->bytes = bytes;
  r->kind = kind;

  void *exposed = base;
  ucs_memory_type_t mem_type = UCS_MEMORY_TYPE_HOST;
  if (kind == INA_UCX_MEM_CUDA && e->has_cuda) {
    mem_type = UCS_MEMORY_TYPE_CUDA;
  } else if (kind == INA_UCX_MEM_CUDA) {
    INA_REQUIRE(ina_cuda_device_count() > 0, INA_ERR_UNSUPPORTED,
                "ucx region register: device region of %zu bytes needs staging through host "
                "memory (this UCX has no CUDA support), but no CUDA device is usable here",
                bytes);
    /* UCX pins the mirror when it registers it for RDMA; core/cuda.h offers no
     * cudaHostAlloc, so copies to and from it are ordinary pageable memcpys. */
    r->mirror = malloc(bytes);
    INA_CHECK_ALLOC(r->mirror);
    /* The mirror starts as a copy, so staging in more than what arrived rewrites the
     * device with its own bytes instead of garbage. */
    INA_CHECK(ina_cuda_memcpy_d2h(r->mirror, base, bytes));
    exposed = r->mirror;
  }

  ucp_mem_map_params_t mparams = {
      .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
      .address = exposed,
      .length = bytes,
      .memory_type = mem_type,
  };
  ucs_status_t us = ucp_mem_map(e->context, &mparams, &r->memh);
  INA_REQUIRE(us == UCS_OK, INA_ERR_IO, "ucp_mem_map of %zu bytes at %p: %s", bytes, exposed,
              ucs_status_string(us));
  us = ucp_rkey_pack(e->context, r->memh, &r->rkey_buf, &r->rkey_len);
  INA_REQUIRE(us == UCS_OK, INA_ERR_IO, "ucp_rkey_pack: %s", ucs_status_string(us));
  r->next = e->regions;
  e->regions = r;
  *out = r;
  return INA_OK;
fail:
  if (r) {
    if (r->memh) ucp_mem_unmap(e->context, r->memh);
    free(r->mirror);
    free(r);
  }
  return st;
}

void ina_ucx_region_deregister(ina_ucx_region_t *r) {
  if (!r) return;
  ina_ucx_engine_t *e = r->engine;
  for (ina_ucx_region_t **link = &e->regions; *link; link = &(*link)->next) {
    if (*link == r) {
      *link = r->next;
      break;
    }
  }
  if (r->rkey_buf) ucp_rkey_buffer_release(r->rkey_buf);
  if (r->memh) ucp_mem_unmap(e->context, r->memh);
  free(r->mirror);
  free(r);
}

uint64_t ina_ucx_region_remote_base(const ina_ucx_region_t *r) {
  if (!r) return 0;
  return (uint64_t)(uintptr_t)(r->mirror ? r->mirror : r->base);
}

int ina_ucx_region_is_staged(const ina_ucx_region_t *r) { return r && r->mirror; }

static ina_status_t check_stage_range(const ina_ucx_region_t *r, size_t offset, size_t bytes) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(r, INA_ERR_INVALID_ARGUMENT, "ucx stage: NULL region");
  INA_REQUIRE(offset <= r->bytes && bytes <= r->bytes - offset, INA_ERR_INVALID_ARGUMENT,
              "ucx stage: range [%zu, +%zu) is outside the region of %zu bytes", offset, bytes,
              r->bytes);
fail:
  return st;
}

ina_status_t ina_ucx_region_stage_out(ina_ucx_region_t *r, size_t offset, size_t bytes) {
  ina_status_t st = INA_OK;
  INA_CHECK(check_stage_range(r, offset, bytes));
  if (r->mirror && bytes > 0) INA_CHECK(ina_cuda_memcpy_d2h(r->mirror + offset, r->base + offset, bytes));
fail:
  return st;
}

ina_status_t ina_ucx_region_stage_in(ina_ucx_region_t *r, size_t offset, size_t bytes) {
  ina_status_t st = INA_OK;
  INA_CHECK(check_stage_range(r, offset, bytes));
  if (r->mirror && bytes > 0) INA_CHECK(ina_cuda_memcpy_h2d(r->base + offset, r->mirror + offset, bytes));
fail:
  return st;
}

ina_ucx_region_t *ina_ucx_find_local_region(ina_ucx_engine_t *e, const void *ptr, size_t length) {
  uintptr_t p = (uintptr_t)ptr;
  for (ina_ucx_region_t *r = e->regions; r; r = r->next) {
    uintptr_t b = (uintptr_t)r->base;
    if (p >= b && p - b <= r->bytes && length <= r->bytes - (p - b)) return r;
  }
  return NULL;
}

ina_status_t ina_ucx_engine_pack_blob(ina_ucx_engine_t *e, ina_ucx_region_t *const *regions,
                                      uint32_t count, void **out_blob, size_t *out_size) {
  ina_status_t st = INA_OK;
  ucp_address_t *address = NULL;
  size_t address_len = 0;
  ina_ucx_blob_region_t *described = NULL;
  INA_REQUIRE(out_blob && out_size, INA_ERR_INVALID_ARGUMENT, "ucx pack blob: NULL output");
  *out_blob = NULL;
  *out_size = 0;
  INA_REQUIRE(e && (regions || count == 0), INA_ERR_INVALID_ARGUMENT,
              "ucx pack blob: NULL engine or regions (count %u)", count);
  if (count > 0) {
    described = calloc(count, sizeof *described);
    INA_CHECK_ALLOC(described);
  }
  for (uint32_t i = 0; i < count; i++) {
    const ina_ucx_region_t *r = regions[i];
    INA_REQUIRE(r && r->engine == e, INA_ERR_INVALID_ARGUMENT,
                "ucx pack blob: region %u is NULL or belongs to another engine", i);
    described[i] = (ina_ucx_blob_region_t){
        .base = ina_ucx_region_remote_base(r),
        .length = r->bytes,
        .mem_kind = (uint32_t)(r->mirror ? INA_UCX_MEM_HOST : r->kind),
        .rkey = r->rkey_buf,
        .rkey_len = r->rkey_len,
    };
  }
  ucs_status_t us = ucp_worker_get_address(e->worker, &address, &address_len);
  INA_REQUIRE(us == UCS_OK, INA_ERR_IO, "ucp_worker_get_address: %s", ucs_status_string(us));
  INA_CHECK(ina_ucx_blob_encode(address, address_len, described, count, out_blob, out_size));
fail:
  if (address) ucp_worker_release_address(e->worker, address);
  free(described);
  return st;
}
