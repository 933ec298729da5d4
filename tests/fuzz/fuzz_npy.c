/* Fuzz target: NumPy .npy files, as ina_npy_read reads golden fixtures and logits dumps.
 * Each input is a whole file.
 *
 * For every input it traps unless:
 *  - ina_npy_read_memory either fails with INA_ERR_FORMAT or INA_ERR_UNSUPPORTED, the
 *    tensor left empty and a message naming the file, or gives a CPU tensor of <f4, <i4
 *    or <i8 whose shape x dtype size is exactly the bytes after the header (the file's
 *    tail), which it holds unchanged;
 *  - ina_npy_read on the same bytes as a file gives the same verdict and the same tensor;
 *  - an accepted array written again with ina_npy_write has its data on a 64-byte
 *    boundary and reads back to the same dtype, shape and bytes.
 * Everything is freed (LeakSanitizer checks). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/npy.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_files.h"

#define NAME "fuzz.npy"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_files_init();
  return 0;
}

static const ina_status_t kFailures[] = {INA_ERR_FORMAT, INA_ERR_UNSUPPORTED, INA_OK};

static int is_empty_tensor(const ina_tensor_t *t) {
  static const ina_tensor_t zero;
  return memcmp(t, &zero, sizeof zero) == 0;
}

/* A read tensor: dtype, layout and the bytes it holds (the last nbytes of the file). */
static size_t check_tensor(const ina_tensor_t *t, const uint8_t *data, size_t size) {
  FUZZ_REQUIRE(t->dtype == INA_DTYPE_F32 || t->dtype == INA_DTYPE_I32 || t->dtype == INA_DTYPE_I64,
               "dtype %s read", ina_dtype_name(t->dtype));
  FUZZ_REQUIRE(t->ndim >= 0 && t->ndim <= INA_MAX_DIMS, "ndim %d read", t->ndim);
  FUZZ_REQUIRE(t->device.type == INA_DEVICE_CPU && t->owns_data && t->data != NULL,
               "not an owned CPU tensor");
  FUZZ_REQUIRE(ina_tensor_is_contiguous(t), "not contiguous");
  uint64_t numel = 1;
  int empty = 0;
  for (int d = 0; d < t->ndim; d++) {
    FUZZ_REQUIRE(t->shape[d] >= 0, "dim %d is %lld", d, (long long)t->shape[d]);
    if (t->shape[d] == 0) empty = 1;
    else FUZZ_REQUIRE(!__builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel), "overflow");
  }
  uint64_t nbytes = 0;
  FUZZ_REQUIRE(!__builtin_mul_overflow(numel, (uint64_t)ina_dtype_size(t->dtype), &nbytes),
               "shape x dtype size overflows, yet it was accepted");
  if (empty) nbytes = 0;
  FUZZ_REQUIRE(ina_tensor_nbytes(t) == nbytes, "ina_tensor_nbytes %zu, shape x size %llu",
               ina_tensor_nbytes(t), (unsigned long long)nbytes);
  /* The prefix is at least 10 bytes and the header at least 1. */
  FUZZ_REQUIRE(nbytes + 11 <= size, "%llu data bytes from a %zu-byte file",
               (unsigned long long)nbytes, size);
  FUZZ_REQUIRE(memcmp(t->data, data + size - nbytes, (size_t)nbytes) == 0,
               "the data is not the file's last %llu bytes", (unsigned long long)nbytes);
  return (size_t)nbytes;
}

static void require_same_tensor(const ina_tensor_t *a, const ina_tensor_t *b, size_t nbytes,
                                const char *what) {
  FUZZ_REQUIRE(a->dtype == b->dtype && a->ndim == b->ndim &&
                   memcmp(a->shape, b->shape, sizeof a->shape) == 0 &&
                   memcmp(a->data, b->data, nbytes) == 0,
               "%s: a different tensor", what);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ina_tensor_t t, from_file;
  memset(&t, 0xab, sizeof t); /* garbage, to see it reset */
  ina_clear_error();
  ina_status_t st = ina_npy_read_memory(data, size, NAME, &t);
  size_t nbytes = 0;
  if (st != INA_OK) {
    FUZZ_REQUIRE(is_empty_tensor(&t), "a failed read left the tensor set");
    fuzz_require_error("ina_npy_read_memory", st, kFailures, NAME);
  } else {
    nbytes = check_tensor(&t, data, size);
  }

  const char *path = fuzz_as_file(data, size);
  ina_clear_error();
  ina_status_t st_file = ina_npy_read(path, &from_file);
  FUZZ_REQUIRE(st_file == st, "the file gives status %d, the memory %d (%s)", (int)st_file, (int)st,
               ina_last_error());
  if (st_file != INA_OK) {
    FUZZ_REQUIRE(is_empty_tensor(&from_file), "a failed read left the tensor set");
    fuzz_require_error("ina_npy_read", st_file, kFailures, path);
  } else {
    require_same_tensor(&t, &from_file, nbytes, "the file");
    ina_tensor_release(&from_file);
  }

  if (st == INA_OK) {
    const char *out = fuzz_scratch_path("rewrite.npy");
    ina_clear_error();
    FUZZ_REQUIRE(ina_npy_write(out, t.dtype, t.ndim, t.shape, t.data) == INA_OK,
                 "an accepted array does not write back: %s", ina_last_error());
    size_t n = 0;
    uint8_t *bytes = fuzz_read_whole_file(out, &n);
    FUZZ_REQUIRE(n >= nbytes && (n - nbytes) % 64 == 0, "written data starts at byte %zu",
                 n - nbytes);
    ina_tensor_t back;
    FUZZ_REQUIRE(ina_npy_read_memory(bytes, n, out, &back) == INA_OK,
                 "ina's own file does not read back: %s", ina_last_error());
    require_same_tensor(&t, &back, nbytes, "the rewritten file");
    ina_tensor_release(&back);
    free(bytes);
    ina_tensor_release(&t);
  }
  return 0;
}
