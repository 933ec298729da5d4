/* UCX transfer engine: one-sided puts and gets between processes, first used to move
 * KV pages between agents.
 *
 * Usage: create an engine, register the memory peers may access, pack an endpoint
 * blob (worker address + remote keys) and ship it to the peers by any means (MPI,
 * gRPC); each peer connects from the blob and posts batches of (local pointer, remote
 * address, length) transfers, then polls or waits for the batch.
 *
 * GPU memory: when this UCX build handles CUDA memory (ina_ucx_engine_has_cuda), device
 * regions are registered as they are. Otherwise (Debian's UCX) a device region gets a
 * host mirror of the same size (a copy of the device bytes at registration) and peers
 * access the mirror: the owner copies device → mirror with ina_ucx_region_stage_out
 * before peers read, and mirror → device with ina_ucx_region_stage_in after peers wrote. Local device pointers in a batch are
 * staged by the engine itself (copied out before a put, copied in after a get).
 *
 * Ownership: the engine owns nothing the caller passes in; regions, peers and batches
 * are freed by their destroy functions and must be freed before the engine. Memory
 * named in a batch must stay valid until the batch has completed.
 * Thread safety: none. An engine and everything made from it belong to one thread
 * (UCX thread mode single). */
#ifndef INA_COMM_UCX_ENGINE_H
#define INA_COMM_UCX_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_ucx_engine ina_ucx_engine_t;
typedef struct ina_ucx_region ina_ucx_region_t;
typedef struct ina_ucx_peer ina_ucx_peer_t;
typedef struct ina_ucx_batch ina_ucx_batch_t;

typedef enum ina_ucx_mem_kind {
  INA_UCX_MEM_HOST = 0, /* ordinary host memory */
  INA_UCX_MEM_CUDA = 1, /* CUDA device memory (cudaMalloc) */
} ina_ucx_mem_kind_t;

typedef enum ina_ucx_op {
  INA_UCX_PUT = 0, /* local → remote */
  INA_UCX_GET = 1, /* remote → local */
} ina_ucx_op_t;

/* One transfer of a batch. `local` lies in memory of this process (host memory, or a
 * device region registered with this engine); `remote` is an address inside a region
 * the peer advertised in its blob. */
typedef struct ina_ucx_xfer {
  void *local;
  uint64_t remote;
  size_t length;
} ina_ucx_xfer_t;

/* --- engine ---------------------------------------------------------------------- */

/* Creates a UCP context (RMA feature) and one worker. UCX reads its usual environment
 * (UCX_TLS, UCX_NET_DEVICES, ...). *out is NULL on failure. */
ina_status_t ina_ucx_engine_create(ina_ucx_engine_t **out);
/* NULL is a no-op. */
void ina_ucx_engine_destroy(ina_ucx_engine_t *engine);
/* 1 when UCX accepts CUDA device memory directly, 0 when device regions are staged. */
int ina_ucx_engine_has_cuda(const ina_ucx_engine_t *engine);
/* Pure rule behind ina_ucx_engine_has_cuda: does a UCP memory-types mask (the
 * `memory_types` of ucp_context_attr_t, one bit per ucs_memory_type_t) include CUDA? */
int ina_ucx_memory_types_have_cuda(uint64_t memory_types);
/* Drives the worker once; returns nonzero when it made progress. */
int ina_ucx_engine_progress(ina_ucx_engine_t *engine);

/* --- memory regions -------------------------------------------------------------- */

/* Registers [base, base + bytes) for remote access. A CUDA region without UCX CUDA
 * support gets a host mirror (see the top of this file); without a usable CUDA device
 * that returns INA_ERR_UNSUPPORTED. *out is NULL on failure. */
ina_status_t ina_ucx_region_register(ina_ucx_engine_t *engine, void *base, size_t bytes,
                                     ina_ucx_mem_kind_t kind, ina_ucx_region_t **out);
/* NULL is a no-op. */
void ina_ucx_region_deregister(ina_ucx_region_t *region);
/* The address peers use for the region's first byte (the mirror's for staged regions). */
uint64_t ina_ucx_region_remote_base(const ina_ucx_region_t *region);
/* 1 when the region is accessed through a host mirror. */
int ina_ucx_region_is_staged(const ina_ucx_region_t *region);
/* Staged regions only (no-ops otherwise): copy [offset, offset + bytes) device → mirror
 * (before peers read it) or mirror → device (after peers wrote it). */
ina_status_t ina_ucx_region_stage_out(ina_ucx_region_t *region, size_t offset, size_t bytes);
ina_status_t ina_ucx_region_stage_in(ina_ucx_region_t *region, size_t offset, size_t bytes);

/* --- endpoint blobs and peers ---------------------------------------------------- */

/* Packs this engine's worker address and the remote keys of `regions` (may be NULL when
 * count is 0) into a new blob; the caller frees *out_blob with free(). */
ina_status_t ina_ucx_engine_pack_blob(ina_ucx_engine_t *engine, ina_ucx_region_t *const *regions,
                                      uint32_t count, void **out_blob, size_t *out_size);
/* Connects to the engine that packed `blob` (possibly this one) and unpacks its remote
 * keys. The blob is not kept. *out is NULL on failure. */
ina_status_t ina_ucx_peer_connect(ina_ucx_engine_t *engine, const void *blob, size_t size,
                                  ina_ucx_peer_t **out);
/* Closes the endpoint (flushing what is still in flight, for at most a few seconds).
 * NULL is a no-op. */
void ina_ucx_peer_disconnect(ina_ucx_peer_t *peer);
uint32_t ina_ucx_peer_region_count(const ina_ucx_peer_t *peer);
/* 1 once UCX reported the endpoint failed (the peer process died or its connection
 * broke: endpoints use peer error handling, so such operations fail rather than hang);
 * then disconnect it. 1 for NULL. */
int ina_ucx_peer_failed(const ina_ucx_peer_t *peer);
/* Remote base address and length of the peer's region `index`. */
ina_status_t ina_ucx_peer_region(const ina_ucx_peer_t *peer, uint32_t index, uint64_t *out_base,
                                 uint64_t *out_length);

/* --- batches of transfers -------------------------------------------------------- */

/* Posts `count` transfers to `peer` as one batch. Each remote range must lie inside one
 * advertised region of the peer. A completed put batch is visible at the peer (the
 * batch ends with an endpoint flush). *out is NULL on failure; transfers already posted
 * by a failed call are waited for before it returns. */
ina_status_t ina_ucx_post(ina_ucx_peer_t *peer, ina_ucx_op_t op, const ina_ucx_xfer_t *xfers,
                          size_t count, ina_ucx_batch_t **out);
/* Progresses the worker once and sets *out_done to 1 when every transfer of the batch
 * completed; a failed transfer returns its error. */
ina_status_t ina_ucx_batch_test(ina_ucx_batch_t *batch, int *out_done);
/* Polls until the batch completes or `timeout_s` seconds pass; a timeout returns
 * INA_ERR_IO and leaves the batch in flight (wait again, or destroy it). */
ina_status_t ina_ucx_batch_wait(ina_ucx_batch_t *batch, double timeout_s);
/* Frees the batch. One still in flight is waited for (up to a few seconds) so UCX does
 * not write into memory the caller is about to free. NULL is a no-op. */
void ina_ucx_batch_destroy(ina_ucx_batch_t *batch);

/* Waits until every operation posted to `peer` completed at the peer, or `timeout_s`
 * passes (INA_ERR_IO). */
ina_status_t ina_ucx_peer_flush(ina_ucx_peer_t *peer, double timeout_s);

#ifdef __cplusplus
}
#endif
#endif
