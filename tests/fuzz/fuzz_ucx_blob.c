/* Fuzz target: the UCX endpoint blob (comm/ucx_blob.h), which a prefill agent takes from
 * any decode agent's ina.v1.KvTransfer/Prefill request and a decode agent from its
 * prefill agent's GetKvEndpoint answer, before UCX sees the worker address and remote
 * keys inside it.
 *
 * For every input it traps unless: a rejection is INA_ERR_FORMAT with a message and a
 * zeroed view; an accepted blob's address and every remote key lie inside the input, the
 * regions' lengths add up to at most the input, and encoding the view again gives the
 * input's first bytes exactly (the format is canonical: what decodes is what was meant).
 * Everything is freed (LeakSanitizer checks). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/ucx_blob.h"
#include "core/log.h"
#include "tests/fuzz/fuzz_check.h"

static int inside(const uint8_t *data, size_t size, const void *p, size_t len) {
  const uint8_t *q = p;
  return len == 0 || (q >= data && len <= size && (size_t)(q - data) <= size - len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int quiet;
  if (!quiet) {
    ina_log_set_quiet_errors(1);
    quiet = 1;
  }
  ina_ucx_blob_view_t view;
  memset(&view, 0xA5, sizeof view);
  const ina_status_t st = ina_ucx_blob_decode(data, size, &view);
  if (st != INA_OK) {
    FUZZ_REQUIRE(st == INA_ERR_FORMAT, "rejected with status %d", (int)st);
    FUZZ_REQUIRE(view.regions == NULL && view.region_count == 0 && view.address == NULL && view.address_len == 0,
                 "a rejected blob left a view behind");
    FUZZ_REQUIRE(ina_last_error()[0] != '\0', "rejected without a message");
    return 0;
  }
  FUZZ_REQUIRE(inside(data, size, view.address, view.address_len), "the address lies outside the input");
  size_t total = INA_UCX_BLOB_HEADER_BYTES + view.address_len;
  for (uint32_t i = 0; i < view.region_count; i++) {
    FUZZ_REQUIRE(inside(data, size, view.regions[i].rkey, view.regions[i].rkey_len),
                 "region %u's key lies outside the input", i);
    total += INA_UCX_BLOB_REGION_HEADER_BYTES + view.regions[i].rkey_len;
  }
  FUZZ_REQUIRE(total <= size, "the decoded parts (%zu bytes) exceed the input (%zu)", total, size);
  void *again = NULL;
  size_t again_size = 0;
  FUZZ_REQUIRE(ina_ucx_blob_encode(view.address, view.address_len, view.regions, view.region_count, &again,
                                   &again_size) == INA_OK,
               "an accepted blob does not encode again");
  FUZZ_REQUIRE(again_size == total && memcmp(again, data, again_size) == 0,
               "encoding the view again differs from the input");
  free(again);
  ina_ucx_blob_view_release(&view);
  return 0;
}
