/* Device presence and result reporting for the benchmarks (bench/bench_util.h). */
#include "bench/bench_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/cuda.h"

#define MAX_RESULTS 512

typedef struct {
  char name[96];
  double value;
  char unit[16];
  char formula[256];
} result_t;

static result_t g_results[MAX_RESULTS];
static int g_result_count;

int ina_bench_no_device(const char *program) {
  char name[128];
  if (ina_cuda_device_count() == 0) {
    printf("%s: no CUDA device, skipped\n", program);
    return 1;
  }
  printf("device %s\n", ina_cuda_device_name(0, name, sizeof name));
  return 0;
}

void ina_bench_result(const char *name, double value, const char *unit, const char *formula) {
  printf("%s %.6g %s %s\n", name, value, unit, formula);
  fflush(stdout);
  if (g_result_count == MAX_RESULTS) return; /* printed; only the JSON line misses it */
  result_t *r = &g_results[g_result_count++];
  snprintf(r->name, sizeof r->name, "%s", name);
  r->value = value;
  snprintf(r->unit, sizeof r->unit, "%s", unit);
  snprintf(r->formula, sizeof r->formula, "%s", formula);
}

void ina_bench_json_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') printf("\\%c", c);
    else if (c < 0x20) printf("\\u%04x", c);
    else putchar(c);
  }
  putchar('"');
}

void ina_bench_print_json(const char *bench) {
  char device[128];
  printf("{\"bench\": ");
  ina_bench_json_string(bench);
  printf(", \"device\": ");
  ina_bench_json_string(ina_cuda_device_name(0, device, sizeof device));
  printf(", \"results\": [");
  for (int i = 0; i < g_result_count; i++) {
    const result_t *r = &g_results[i];
    printf("%s{\"name\": ", i ? ", " : "");
    ina_bench_json_string(r->name);
    /* JSON has no NaN or infinity. */
    if (isfinite(r->value)) printf(", \"value\": %.6g, \"unit\": ", r->value);
    else printf(", \"value\": null, \"unit\": ");
    ina_bench_json_string(r->unit);
    printf(", \"formula\": ");
    ina_bench_json_string(r->formula);
    putchar('}');
  }
  printf("]}\n");
  fflush(stdout);
}
