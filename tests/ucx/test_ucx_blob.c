/* Endpoint blob codec: random round trips, and every kind of malformed blob rejected
 * with INA_ERR_FORMAT and a message naming the problem. Needs no UCX worker. */
#include <stdlib.h>
#include <string.h>

#include "comm/ucx_blob.h"
#include "core/log.h"
#include "tests/test_util.h"

static void fill_random(test_rng_t *rng, uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)test_rng_next(rng);
}

/* Encodes a random blob; `keys` holds the key bytes the regions point into. */
static void make_blob(test_rng_t *rng, uint32_t regions, void **blob, size_t *size,
                      uint8_t *address, size_t *address_len, ina_ucx_blob_region_t *desc,
                      uint8_t keys[][64]) {
  *address_len = (size_t)test_rng_int(rng, 1, 200);
  fill_random(rng, address, *address_len);
  for (uint32_t i = 0; i < regions; i++) {
    fill_random(rng, keys[i], 64);
    desc[i] = (ina_ucx_blob_region_t){
        .base = test_rng_next(rng) >> 2,
        .length = test_rng_next(rng) >> 40,
        .mem_kind = (uint32_t)test_rng_int(rng, 0, 1),
        .rkey = keys[i],
        .rkey_len = (size_t)test_rng_int(rng, 1, 64),
    };
  }
  CHECK_OK(ina_ucx_blob_encode(address, *address_len, desc, regions, blob, size));
}

static void test_round_trip(test_rng_t *rng) {
  for (int iter = 0; iter < 50; iter++) {
    uint32_t regions = (uint32_t)test_rng_int(rng, 0, 8);
    uint8_t address[200], keys[8][64];
    size_t address_len, size;
    ina_ucx_blob_region_t desc[8];
    void *blob = NULL;
    make_blob(rng, regions, &blob, &size, address, &address_len, desc, keys);
    ina_ucx_blob_view_t view;
    CHECK_OK(ina_ucx_blob_decode(blob, size, &view));
    CHECK(view.address_len == address_len && memcmp(view.address, address, address_len) == 0);
    CHECK(view.region_count == regions);
    for (uint32_t i = 0; i < regions && i < view.region_count; i++) {
      const ina_ucx_blob_region_t *r = &view.regions[i];
      CHECKF(r->base == desc[i].base && r->length == desc[i].length &&
                 r->mem_kind == desc[i].mem_kind && r->rkey_len == desc[i].rkey_len &&
                 memcmp(r->rkey, desc[i].rkey, r->rkey_len) == 0,
             "iteration %d region %u differs after the round trip", iter, i);
    }
    ina_ucx_blob_view_release(&view);
    CHECK(view.regions == NULL && view.region_count == 0);
    free(blob);
  }
}

/* Decoding must fail with INA_ERR_FORMAT, a zeroed view and a message containing `what`. */
static void expect_reject(const void *blob, size_t size, const char *what, const char *label) {
  ina_ucx_blob_view_t view;
  memset(&view, 0xAB, sizeof view);
  ina_status_t st = ina_ucx_blob_decode(blob, size, &view);
  CHECKF(st == INA_ERR_FORMAT, "%s: status %d, expected INA_ERR_FORMAT", label, (int)st);
  CHECKF(strstr(ina_last_error(), what) != NULL, "%s: message '%s' lacks '%s'", label,
         ina_last_error(), what);
  CHECKF(view.regions == NULL && view.address == NULL && view.region_count == 0,
         "%s: view not zeroed", label);
}

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void test_malformed(test_rng_t *rng) {
  uint8_t address[200], keys[8][64];
  size_t address_len, size;
  ina_ucx_blob_region_t desc[8];
  void *blob = NULL;
  make_blob(rng, 3, &blob, &size, address, &address_len, desc, keys);
  uint8_t *b = blob, *copy = malloc(size + 8);

  /* Every proper prefix is rejected; the header ones say "truncated". */
  for (size_t n = 0; n < size; n++) {
    ina_ucx_blob_view_t view;
    CHECKF(ina_ucx_blob_decode(b, n, &view) == INA_ERR_FORMAT, "prefix of %zu of %zu bytes", n,
           size);
  }
  expect_reject(b, 7, "truncated", "7-byte blob");

  memcpy(copy, b, size);
  copy[0] ^= 0x01;
  expect_reject(copy, size, "magic", "wrong magic");

  memcpy(copy, b, size);
  copy[4] = 2;
  expect_reject(copy, size, "version 2", "wrong version");

  memcpy(copy, b, size);
  put_u32(copy + 8, (uint32_t)size);
  expect_reject(copy, size, "past the end", "address length past the end");

  memcpy(copy, b, size);
  put_u32(copy + 8, 0);
  expect_reject(copy, size, "worker address length 0", "empty address");

  memcpy(copy, b, size);
  put_u32(copy + 12, 0xFFFFFFFFu);
  expect_reject(copy, size, "region count", "huge region count");

  /* The first region's rkey length field sits right after the address and 20 bytes of
   * the region header. */
  memcpy(copy, b, size);
  put_u32(copy + 16 + address_len + 20, 1u << 30);
  expect_reject(copy, size, "remote key length", "rkey length past the end");

  memcpy(copy, b, size);
  memset(copy + size, 0, 8);
  expect_reject(copy, size + 8, "trailing", "trailing bytes");

  /* Encoding refuses inputs it could not describe. */
  void *out = (void *)1;
  size_t out_size = 1;
  CHECK(ina_ucx_blob_encode(NULL, 4, NULL, 0, &out, &out_size) == INA_ERR_INVALID_ARGUMENT);
  CHECK(out == NULL && out_size == 0);
  ina_ucx_blob_region_t empty_key = {.base = 1, .length = 1, .rkey = keys[0], .rkey_len = 0};
  CHECK(ina_ucx_blob_encode(address, 4, &empty_key, 1, &out, &out_size) ==
        INA_ERR_INVALID_ARGUMENT);
  free(copy);
  free(blob);
}

int main(void) {
  ina_log_set_quiet_errors(1);
  test_rng_t rng = {test_seed("test_ucx_blob")};
  test_round_trip(&rng);
  test_malformed(&rng);
  return test_finish("test_ucx_blob");
}
