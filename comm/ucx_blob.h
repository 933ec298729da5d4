/* The byte image of a UCX endpoint: a worker address plus the remote keys of the
 * memory regions a peer may read and write. It travels over any byte transport (MPI,
 * gRPC) and is decoded by the receiving engine; this file only encodes and validates.
 *
 * Layout, little-endian, no padding:
 *   header   u32 magic "INAU" (0x55414E49), u16 version (1), u16 reserved (0),
 *            u32 address_len, u32 region_count
 *   address  address_len bytes
 *   regions  region_count times: u64 base, u64 length, u32 mem_kind, u32 rkey_len,
 *            rkey_len bytes
 *
 * Thread safety: all functions are reentrant. */
#ifndef INA_COMM_UCX_BLOB_H
#define INA_COMM_UCX_BLOB_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define INA_UCX_BLOB_MAGIC 0x55414E49u /* "INAU" read as little-endian bytes */
#define INA_UCX_BLOB_VERSION 1u
#define INA_UCX_BLOB_HEADER_BYTES 16u
#define INA_UCX_BLOB_REGION_HEADER_BYTES 24u

/* One advertised region. `rkey` points into the blob (decode) or the caller's bytes
 * (encode); it is never owned by this struct. */
typedef struct ina_ucx_blob_region {
  uint64_t base;     /* remote virtual address of the first byte peers may access */
  uint64_t length;   /* bytes */
  uint32_t mem_kind; /* ina_ucx_mem_kind_t of the owner's memory (informational) */
  const void *rkey;
  size_t rkey_len;
} ina_ucx_blob_region_t;

/* A decoded blob. `address` and every region's `rkey` point into the decoded bytes, so
 * those must outlive the view; `regions` is owned by the view (free it with
 * ina_ucx_blob_view_release). */
typedef struct ina_ucx_blob_view {
  const void *address;
  size_t address_len;
  ina_ucx_blob_region_t *regions;
  uint32_t region_count;
} ina_ucx_blob_view_t;

/* Serializes into a new malloc'ed buffer: *out_blob (caller frees with free()) of
 * *out_size bytes. `regions` may be NULL when region_count is 0. On failure
 * *out_blob = NULL and *out_size = 0. */
ina_status_t ina_ucx_blob_encode(const void *address, size_t address_len,
                                 const ina_ucx_blob_region_t *regions, uint32_t region_count,
                                 void **out_blob, size_t *out_size);

/* Validates and decodes `blob` (size bytes): rejects a truncated header, a wrong magic
 * or version, and any length that reaches past the end, with INA_ERR_FORMAT and a
 * message naming the field and offset. On failure the view is zeroed. */
ina_status_t ina_ucx_blob_decode(const void *blob, size_t size, ina_ucx_blob_view_t *out_view);

/* Frees view->regions and zeroes the view; NULL is a no-op. */
void ina_ucx_blob_view_release(ina_ucx_blob_view_t *view);

#ifdef __cplusplus
}
#endif
#endif
