/* Encoding and validation of UCX endpoint blobs (layout in ucx_blob.h). Integers are
 * written byte by byte so the format does not depend on the host's endianness or on
 * the alignment of the buffer it arrives in. */
#define INA_LOG_SUBSYS "ucx"
#include "comm/ucx_blob.h"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"

static void put_u16(uint8_t *p, uint16_t v) {
  for (int i = 0; i < 2; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get_u32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

ina_status_t ina_ucx_blob_encode(const void *address, size_t address_len,
                                 const ina_ucx_blob_region_t *regions, uint32_t region_count,
                                 void **out_blob, size_t *out_size) {
  ina_status_t st = INA_OK;
  uint8_t *blob = NULL;
  INA_REQUIRE(out_blob && out_size, INA_ERR_INVALID_ARGUMENT, "ucx blob encode: NULL output");
  *out_blob = NULL;
  *out_size = 0;
  INA_REQUIRE(address && address_len > 0 && address_len <= UINT32_MAX, INA_ERR_INVALID_ARGUMENT,
              "ucx blob encode: worker address of %zu bytes is empty or too long", address_len);
  INA_REQUIRE(regions || region_count == 0, INA_ERR_INVALID_ARGUMENT,
              "ucx blob encode: regions is NULL but region_count is %u", region_count);
  size_t size = INA_UCX_BLOB_HEADER_BYTES + address_len;
  for (uint32_t i = 0; i < region_count; i++) {
    INA_REQUIRE(regions[i].rkey && regions[i].rkey_len > 0 && regions[i].rkey_len <= UINT32_MAX,
                INA_ERR_INVALID_ARGUMENT, "ucx blob encode: region %u has an empty or oversized "
                "remote key (%zu bytes)", i, regions[i].rkey_len);
    size += INA_UCX_BLOB_REGION_HEADER_BYTES + regions[i].rkey_len;
  }
  blob = malloc(size);
  INA_CHECK_ALLOC(blob);
  uint8_t *p = blob;
  put_u32(p, INA_UCX_BLOB_MAGIC);
  put_u16(p + 4, INA_UCX_BLOB_VERSION);
  put_u16(p + 6, 0);
  put_u32(p + 8, (uint32_t)address_len);
  put_u32(p + 12, region_count);
  p += INA_UCX_BLOB_HEADER_BYTES;
  memcpy(p, address, address_len);
  p += address_len;
  for (uint32_t i = 0; i < region_count; i++) {
    put_u64(p, regions[i].base);
    put_u64(p + 8, regions[i].length);
    put_u32(p + 16, regions[i].mem_kind);
    put_u32(p + 20, (uint32_t)regions[i].rkey_len);
    p += INA_UCX_BLOB_REGION_HEADER_BYTES;
    memcpy(p, regions[i].rkey, regions[i].rkey_len);
    p += regions[i].rkey_len;
  }
  *out_blob = blob;
  *out_size = size;
  return INA_OK;
fail:
  free(blob);
  return st;
}

ina_status_t ina_ucx_blob_decode(const void *blob, size_t size, ina_ucx_blob_view_t *out_view) {
  ina_status_t st = INA_OK;
  ina_ucx_blob_region_t *regions = NULL;
  INA_REQUIRE(out_view, INA_ERR_INVALID_ARGUMENT, "ucx blob decode: NULL view");
  memset(out_view, 0, sizeof *out_view);
  INA_REQUIRE(blob || size == 0, INA_ERR_INVALID_ARGUMENT, "ucx blob decode: NULL blob");
  const uint8_t *b = blob;
  INA_REQUIRE(size >= INA_UCX_BLOB_HEADER_BYTES, INA_ERR_FORMAT,
              "ucx blob: truncated: %zu bytes, the header alone needs %u", size,
              INA_UCX_BLOB_HEADER_BYTES);
  uint32_t magic = get_u32(b);
  INA_REQUIRE(magic == INA_UCX_BLOB_MAGIC, INA_ERR_FORMAT,
              "ucx blob: wrong magic 0x%08x at offset 0 (expected 0x%08x): not an endpoint blob",
              magic, INA_UCX_BLOB_MAGIC);
  uint16_t version = get_u16(b + 4);
  INA_REQUIRE(version == INA_UCX_BLOB_VERSION, INA_ERR_FORMAT,
              "ucx blob: unsupported version %u at offset 4 (this build reads version %u)",
              version, INA_UCX_BLOB_VERSION);
  /* Reserved stays 0 in version 1: a blob decodes to one meaning only. */
  INA_REQUIRE(get_u16(b + 6) == 0, INA_ERR_FORMAT, "ucx blob: reserved field at offset 6 is %u, not 0",
              get_u16(b + 6));
  uint32_t address_len = get_u32(b + 8);
  uint32_t region_count = get_u32(b + 12);
  size_t off = INA_UCX_BLOB_HEADER_BYTES;
  INA_REQUIRE(address_len > 0 && address_len <= size - off, INA_ERR_FORMAT,
              "ucx blob: worker address length %u at offset 8 is zero or reaches past the end "
              "(%zu bytes left)", address_len, size - off);
  out_view->address = b + off;
  out_view->address_len = address_len;
  off += address_len;
  /* Each region needs at least its fixed header, which bounds a corrupt count before
   * anything is allocated for it. */
  INA_REQUIRE(region_count <= (size - off) / INA_UCX_BLOB_REGION_HEADER_BYTES, INA_ERR_FORMAT,
              "ucx blob: region count %u at offset 12 does not fit in the %zu bytes left",
              region_count, size - off);
  if (region_count > 0) {
    regions = calloc(region_count, sizeof *regions);
    INA_CHECK_ALLOC(regions);
  }
  for (uint32_t i = 0; i < region_count; i++) {
    INA_REQUIRE(size - off >= INA_UCX_BLOB_REGION_HEADER_BYTES, INA_ERR_FORMAT,
                "ucx blob: truncated: region %u header at offset %zu needs %u bytes, %zu left",
                i, off, INA_UCX_BLOB_REGION_HEADER_BYTES, size - off);
    ina_ucx_blob_region_t *r = &regions[i];
    r->base = get_u64(b + off);
    r->length = get_u64(b + off + 8);
    r->mem_kind = get_u32(b + off + 16);
    uint32_t rkey_len = get_u32(b + off + 20);
    off += INA_UCX_BLOB_REGION_HEADER_BYTES;
    INA_REQUIRE(rkey_len > 0 && rkey_len <= size - off, INA_ERR_FORMAT,
                "ucx blob: region %u remote key length %u at offset %zu is zero or reaches past "
                "the end (%zu bytes left)", i, rkey_len, off - 4, size - off);
    INA_REQUIRE(r->base + r->length >= r->base, INA_ERR_FORMAT,
                "ucx blob: region %u [0x%llx, +%llu) wraps around the address space", i,
                (unsigned long long)r->base, (unsigned long long)r->length);
    r->rkey = b + off;
    r->rkey_len = rkey_len;
    off += rkey_len;
  }
  INA_REQUIRE(off == size, INA_ERR_FORMAT,
              "ucx blob: %zu trailing bytes after the last region (offset %zu of %zu)",
              size - off, off, size);
  out_view->regions = regions;
  out_view->region_count = region_count;
  return INA_OK;
fail:
  free(regions);
  if (out_view) memset(out_view, 0, sizeof *out_view);
  return st;
}

void ina_ucx_blob_view_release(ina_ucx_blob_view_t *view) {
  if (!view) return;
  free(view->regions);
  memset(view, 0, sizeof *view);
}
