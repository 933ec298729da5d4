/* Helpers shared by the control command tests: a digest of a command's bytes and
 * random command payloads. Include after tests/test_util.h. */
#ifndef INA_TESTS_CONTROL_TEST_UTIL_H
#define INA_TESTS_CONTROL_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* FNV-1a over the bytes: enough to tell commands apart in the records. */
static inline uint64_t control_digest(const void *bytes, size_t size) {
  const uint8_t *p = bytes;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/* A command: opcode, then random bytes up to `size` in all (size >= 1). */
static inline void control_payload(test_rng_t *rng, uint8_t op, uint8_t *out, size_t size) {
  out[0] = op;
  for (size_t i = 1; i < size; i++) out[i] = (uint8_t)test_rng_next(rng);
}

#endif
