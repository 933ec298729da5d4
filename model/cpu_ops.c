#define INA_LOG_SUBSYS "model"
#include "model/cpu_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

float ina_cpu_dot(const float *a, const float *b, int64_t n) {
  /* Eight independent partial sums: vectorizable, and a shorter error chain than one. */
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
  float tail = 0;
  for (; i < n; i++) tail += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

void ina_cpu_axpy(float a, const float *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

void ina_cpu_tensor_row(const ina_tensor_t *t, int64_t n, float *out) {
  const int64_t k = t->shape[t->ndim - 1];
  const char *row = (const char *)t->data + (size_t)(n * t->stride[0]) * ina_dtype_size(t->dtype);
  ina_to_f32(row, t->dtype, out, (size_t)k);
}

void ina_cpu_linear_row(const ina_linear_t *lin, int64_t n, float *out) {
  const ina_tensor_t *w = &lin->weight;
  ina_cpu_tensor_row(w, n, out);
  if (ina_tensor_is_empty(&lin->scale_inv)) return;
  const int64_t k = w->shape[1];
  const float *scales = (const float *)lin->scale_inv.data + (n / lin->block_rows) * lin->scale_inv.shape[1];
  for (int64_t c = 0; c < k; c++) out[c] *= scales[c / lin->block_cols];
}

typedef struct linear_job {
  const ina_linear_t *lin;
  const float *x;
  int64_t m, k, n;
  float *y;
  float *scratch; /* [workers, k] */
} linear_job_t;

static void linear_rows(void *ctx, int64_t begin, int64_t end, int worker) {
  const linear_job_t *j = ctx;
  float *row = j->scratch + (size_t)worker * (size_t)j->k;
  const int direct = j->lin->weight.dtype == INA_DTYPE_F32 && ina_tensor_is_empty(&j->lin->scale_inv);
  float bias = 0;
  for (int64_t n = begin; n < end; n++) {
    const float *w;
    if (j->k == 0) {
      w = row; /* zero-width weight: the output is the bias alone */
    } else if (direct) {
      w = (const float *)j->lin->weight.data + n * j->k;
    } else {
      ina_cpu_linear_row(j->lin, n, row);
      w = row;
    }
    if (!ina_tensor_is_empty(&j->lin->bias)) {
      ina_to_f32((const char *)j->lin->bias.data + (size_t)n * ina_dtype_size(j->lin->bias.dtype),
                 j->lin->bias.dtype, &bias, 1);
    }
    for (int64_t i = 0; i < j->m; i++) j->y[i * j->n + n] = ina_cpu_dot(j->x + i * j->k, w, j->k) + bias;
  }
}

ina_status_t ina_cpu_linear(ina_threadpool_t *pool, const ina_linear_t *lin, const float *x,
                            int64_t m, float *y) {
  ina_status_t st = INA_OK;
  linear_job_t job = {lin, x, m, lin->weight.shape[1], lin->weight.shape[0], y, NULL};
  INA_REQUIRE(lin->weight.ndim == 2 && (lin->weight.data || job.n * job.k == 0),
              INA_ERR_INVALID_ARGUMENT, "linear: weight is not a loaded 2-D tensor");
  if (m == 0 || job.n == 0) return INA_OK;
  const int workers = ina_threadpool_size(pool);
  job.scratch = malloc((size_t)workers * (size_t)(job.k > 0 ? job.k : 1) * sizeof(float));
  INA_CHECK_ALLOC(job.scratch);
  /* Each weight row is converted once and used for all m inputs; grain keeps chunks big
   * enough to amortize the dispatch. */
  int64_t grain = 4096 / (job.k > 0 ? job.k : 1);
  ina_parallel_for(pool, job.n, grain < 1 ? 1 : grain, linear_rows, &job);
fail:
  free(job.scratch);
  return st;
}

void ina_cpu_layernorm(const float *x, const ina_tensor_t *weight, const ina_tensor_t *bias, int64_t m,
                       int64_t n, float eps, float *y) {
  enum { CHUNK = 256 };
  float w[CHUNK], b[CHUNK];
  const size_t wsize = ina_dtype_size(weight->dtype), bsize = ina_dtype_size(bias->dtype);
  for (int64_t i = 0; i < m; i++) {
    const float *xi = x + i * n;
    float *yi = y + i * n;
    double sum = 0, ss = 0;
    for (int64_t c = 0; c < n; c++) sum += xi[c];
    const double mean = sum / (double)n;
    for (int64_t c = 0; c < n; c++) ss += ((double)xi[c] - mean) * ((double)xi[c] - mean);
    const double inv = 1.0 / sqrt(ss / (double)n + (double)eps);
    for (int64_t c0 = 0; c0 < n; c0 += CHUNK) {
      const int64_t len = n - c0 < CHUNK ? n - c0 : CHUNK;
      ina_to_f32((const char *)weight->data + (size_t)c0 * wsize, weight->dtype, w, (size_t)len);
      ina_to_f32((const char *)bias->data + (size_t)c0 * bsize, bias->dtype, b, (size_t)len);
      for (int64_t c = 0; c < len; c++) yi[c0 + c] = (float)(((double)xi[c0 + c] - mean) * inv) * w[c] + b[c];
    }
  }
}

void ina_cpu_rmsnorm(const float *x, const ina_tensor_t *weight, int64_t m, int64_t n, float eps,
                     int64_t x_stride, float *y, int64_t y_stride) {
  enum { CHUNK = 256 };
  float w[CHUNK];
  const size_t wsize = ina_dtype_size(weight->dtype);
  for (int64_t i = 0; i < m; i++) {
    const float *xi = x + i * x_stride;
    float *yi = y + i * y_stride;
    double ss = 0;
    for (int64_t c = 0; c < n; c++) ss += (double)xi[c] * xi[c];
    const float inv = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    /* the weight is converted in chunks, so any stored dtype works without a buffer */
    for (int64_t c0 = 0; c0 < n; c0 += CHUNK) {
      const int64_t len = n - c0 < CHUNK ? n - c0 : CHUNK;
      ina_to_f32((const char *)weight->data + (size_t)c0 * wsize, weight->dtype, w, (size_t)len);
      for (int64_t c = 0; c < len; c++) yi[c0 + c] = w[c] * (xi[c0 + c] * inv);
    }
  }
}

void ina_cpu_silu_mul(const float *g, const float *u, int64_t count, float *out) {
  for (int64_t i = 0; i < count; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void ina_cpu_rope(float *x, int32_t rope_dim, int64_t pos, const float *inv_freq,
                  float attention_factor, int pairs_layout) {
  const int32_t half = rope_dim / 2;
  for (int32_t i = 0; i < half; i++) {
    /* torch forms the angle in float32: position (as float) times inv_freq */
    const float angle = (float)pos * inv_freq[i];
    const float c = cosf(angle) * attention_factor, s = sinf(angle) * attention_factor;
    float *a = pairs_layout ? &x[2 * i] : &x[i];
    float *b = pairs_layout ? &x[2 * i + 1] : &x[i + half];
    const float xa = *a, xb = *b;
    *a = xa * c - xb * s;
    *b = xb * c + xa * s;
  }
}
