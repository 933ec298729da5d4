#define INA_LOG_SUBSYS "rpc"
#include "agent/rpc/pem_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

/* Certificate chains and keys are a few KiB; anything this large is not one. */
#define PEM_MAX_BYTES (1 << 20)

ina_status_t rpc_read_pem_file(const char *what, const char *path, char **out) {
  ina_status_t st = INA_OK;
  FILE *f = NULL;
  char *text = NULL;
  *out = NULL;
  f = fopen(path, "rb");
  INA_REQUIRE(f, INA_ERR_IO, "%s file '%s': cannot open: %s", what, path, strerror(errno));
  long size = -1;
  if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
  INA_REQUIRE(size >= 0 && fseek(f, 0, SEEK_SET) == 0, INA_ERR_IO,
              "%s file '%s': cannot determine its size", what, path);
  INA_REQUIRE(size > 0 && size <= PEM_MAX_BYTES, INA_ERR_FORMAT,
              "%s file '%s': %ld bytes (expected 1 to %d)", what, path, size, PEM_MAX_BYTES);
  text = malloc((size_t)size + 1);
  INA_CHECK_ALLOC(text);
  size_t n = fread(text, 1, (size_t)size, f);
  INA_REQUIRE(n == (size_t)size, INA_ERR_IO, "%s file '%s': read %zu of %ld bytes", what, path,
              n, size);
  text[n] = '\0';
  INA_REQUIRE(strstr(text, "-----BEGIN ") != NULL, INA_ERR_FORMAT,
              "%s file '%s': no PEM block (%zu bytes without a '-----BEGIN' line)", what, path, n);
  fclose(f);
  *out = text;
  return INA_OK;
fail:
  if (f) fclose(f);
  free(text);
  return st;
}
