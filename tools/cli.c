#include "tools/cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_parse_int(const char *option, const char *text, int64_t min, int64_t max, int64_t *out) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(text, &end, 0);
  if (errno || end == text || *end != '\0' || v < min || v > max) {
    fprintf(stderr, "ina: %s: '%s' is not an integer in [%lld, %lld]\n", option, text,
            (long long)min, (long long)max);
    return 1;
  }
  *out = v;
  return 0;
}

int cli_parse_float(const char *option, const char *text, double min, double max, double *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(text, &end);
  if (errno || end == text || *end != '\0' || !(v >= min && v <= max)) {
    fprintf(stderr, "ina: %s: '%s' is not a number in [%g, %g]\n", option, text, min, max);
    return 1;
  }
  *out = v;
  return 0;
}

int cli_parse_ids(const char *option, const char *text, int32_t **ids, int32_t *count) {
  int32_t n = 1;
  for (const char *p = text; *p; p++) n += *p == ',';
  int32_t *v = malloc((size_t)n * sizeof *v);
  if (!v) return 1;
  const char *p = text;
  for (int32_t i = 0; i < n; i++) {
    char *end = NULL;
    errno = 0;
    long long x = strtoll(p, &end, 10);
    if (errno || end == p || (*end != ',' && *end != '\0') || x < 0 || x > INT32_MAX) {
      fprintf(stderr, "ina: %s: '%s' is not a comma-separated list of token ids\n", option, text);
      free(v);
      return 1;
    }
    v[i] = (int32_t)x;
    p = end + (*end == ',');
  }
  *ids = v;
  *count = n;
  return 0;
}

int cli_parse_weight_dtype(const char *option, const char *text, ina_dtype_t *out) {
  if (strcmp(text, "f32") == 0) *out = INA_DTYPE_F32;
  else if (strcmp(text, "bf16") == 0) *out = INA_DTYPE_BF16;
  else if (strcmp(text, "fp8") == 0) *out = INA_DTYPE_FP8_E4M3;
  else {
    fprintf(stderr, "ina: %s: '%s' is not one of f32, bf16, fp8\n", option, text);
    return 1;
  }
  return 0;
}
