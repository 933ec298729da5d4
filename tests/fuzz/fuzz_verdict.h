/* What every verdict of a proto/validate.h validator must look like, whatever request it
 * judged, checked by the fuzz targets of the two validated requests.
 *
 * fuzz_verdict_take runs a validator with the message buffer the agent's handlers use
 * (INA_RPC_MESSAGE_MAX bytes) and traps unless:
 *  - the status is INA_OK with code OK and message "", or INA_ERR_INVALID_ARGUMENT with
 *    code INVALID_ARGUMENT, RESOURCE_EXHAUSTED or FAILED_PRECONDITION, or
 *    INA_ERR_OUT_OF_MEMORY with code INTERNAL, and then with a non-empty message;
 *  - the message is NUL-terminated inside the buffer;
 *  - a NULL buffer and code give the same status, and buffers of 1, 2 and 24 bytes (heap
 *    blocks of exactly that size, so AddressSanitizer sees any write past them) give the
 *    same status and code with the message truncated to a NUL-terminated prefix.
 *
 * Ownership: the verdict is the caller's (plain struct); req and limits are borrowed.
 * Thread safety: reentrant. */
#ifndef INA_TESTS_FUZZ_FUZZ_VERDICT_H
#define INA_TESTS_FUZZ_FUZZ_VERDICT_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "agent/rpc/rpc_status.h"
#include "proto/validate.h"
#include "tests/fuzz/fuzz_check.h"

/* The handlers answer a rejected request with (ina_rpc_code_t)code. */
_Static_assert((int)INA_PROTO_CODE_OK == (int)INA_RPC_OK, "code OK");
_Static_assert((int)INA_PROTO_CODE_INVALID_ARGUMENT == (int)INA_RPC_INVALID_ARGUMENT, "code 3");
_Static_assert((int)INA_PROTO_CODE_RESOURCE_EXHAUSTED == (int)INA_RPC_RESOURCE_EXHAUSTED, "code 8");
_Static_assert((int)INA_PROTO_CODE_FAILED_PRECONDITION == (int)INA_RPC_FAILED_PRECONDITION, "code 9");
_Static_assert((int)INA_PROTO_CODE_INTERNAL == (int)INA_RPC_INTERNAL, "code 13");

/* A validator behind one signature; req and limits point to its own types. */
typedef ina_status_t (*fuzz_validate_fn)(const void *req, const void *limits, char *msg,
                                         size_t msg_size, ina_proto_code_t *code);

typedef struct fuzz_verdict {
  ina_status_t status;
  ina_proto_code_t code;
  char msg[INA_RPC_MESSAGE_MAX];
} fuzz_verdict_t;

/* Not a code: what `code` holds until a validator sets it. */
#define FUZZ_CODE_UNSET ((ina_proto_code_t)99)

static inline void fuzz_verdict_take(fuzz_validate_fn validate, const void *req,
                                     const void *limits, fuzz_verdict_t *v) {
  memset(v->msg, 0x5a, sizeof v->msg); /* a verdict must write its message */
  v->code = FUZZ_CODE_UNSET;
  v->status = validate(req, limits, v->msg, sizeof v->msg, &v->code);
  FUZZ_REQUIRE(memchr(v->msg, '\0', sizeof v->msg) != NULL, "message not NUL-terminated");
  switch (v->status) {
  case INA_OK:
    FUZZ_REQUIRE(v->code == INA_PROTO_CODE_OK && v->msg[0] == '\0',
                 "INA_OK with code %d and message \"%s\"", (int)v->code, v->msg);
    break;
  case INA_ERR_INVALID_ARGUMENT:
    FUZZ_REQUIRE(v->code == INA_PROTO_CODE_INVALID_ARGUMENT ||
                     v->code == INA_PROTO_CODE_RESOURCE_EXHAUSTED ||
                     v->code == INA_PROTO_CODE_FAILED_PRECONDITION,
                 "INVALID_ARGUMENT status with code %d (\"%s\")", (int)v->code, v->msg);
    FUZZ_REQUIRE(v->msg[0] != '\0', "code %d without a message", (int)v->code);
    break;
  case INA_ERR_OUT_OF_MEMORY:
    FUZZ_REQUIRE(v->code == INA_PROTO_CODE_INTERNAL && v->msg[0] != '\0',
                 "OUT_OF_MEMORY status with code %d and message \"%s\"", (int)v->code, v->msg);
    break;
  default:
    FUZZ_REQUIRE(false, "undocumented status %d (%s)", (int)v->status,
                 ina_status_string(v->status));
  }

  ina_status_t bare = validate(req, limits, NULL, 0, NULL);
  FUZZ_REQUIRE(bare == v->status, "status %d without a buffer, %d with one", (int)bare,
               (int)v->status);

  static const size_t kShortSizes[] = {1, 2, 24};
  const size_t full_len = strlen(v->msg);
  for (size_t i = 0; i < sizeof kShortSizes / sizeof kShortSizes[0]; i++) {
    const size_t k = kShortSizes[i];
    char *buf = malloc(k);
    FUZZ_REQUIRE(buf != NULL, "no memory for %zu bytes", k);
    memset(buf, 0x5a, k);
    ina_proto_code_t code = FUZZ_CODE_UNSET;
    ina_status_t st = validate(req, limits, buf, k, &code);
    FUZZ_REQUIRE(st == v->status && code == v->code,
                 "%zu-byte buffer: status %d code %d, full buffer: status %d code %d", k,
                 (int)st, (int)code, (int)v->status, (int)v->code);
    const size_t want = full_len < k - 1 ? full_len : k - 1;
    FUZZ_REQUIRE(memchr(buf, '\0', k) != NULL && strlen(buf) == want &&
                     memcmp(buf, v->msg, want) == 0,
                 "%zu-byte buffer: message is not a NUL-terminated prefix of \"%s\"", k, v->msg);
    free(buf);
  }
}

/* Whether msg starts with one of `fields` (NULL-terminated list of field paths) followed
 * by ':', '[' or '.': a rejection names the field the client got wrong. */
static inline bool fuzz_names_field(const char *msg, const char *const *fields) {
  for (; *fields; fields++) {
    size_t n = strlen(*fields);
    if (strncmp(msg, *fields, n) == 0 && msg[n] != '\0' && strchr(":[.", msg[n])) return true;
  }
  return false;
}

/* Two decodings of one request must be judged alike. */
static inline void fuzz_verdict_same(const fuzz_verdict_t *a, const fuzz_verdict_t *b) {
  FUZZ_REQUIRE(a->status == b->status && a->code == b->code && strcmp(a->msg, b->msg) == 0,
               "re-decoded request judged differently: \"%s\" (code %d) vs \"%s\" (code %d)",
               a->msg, (int)a->code, b->msg, (int)b->code);
}

#endif
