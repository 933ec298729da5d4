/* The GPU index-key append (ina_dsa_gpu_append, attention/dsa_gpu.h) against the host's
 * ina_dsa_index_key_store on the same keys, cache byte for cache byte.
 *
 * Cases: page sizes 1 and 64, head dims 16, 40 and 128, BF16 keys and both FP8 layouts
 * (inline, paged), plus odd ones (17 dims with FP8 scales at odd addresses, a bf16 cache
 * 2 bytes past an aligned address). Each writes rows to random distinct (page, slot)
 * targets covering about two thirds of the cache, in shuffled order; some rows carry a
 * negative page id (skipped: the padding rows of a graph bucket) and a few a slot outside
 * the page (skipped too); k rows have padding past head_dim (NaN bf16, which would change
 * every FP8 byte of the row if it were read). Keys: random values of widely varied
 * magnitude, and rows made for the quantizer's corners: all zeros, signed zeros, one
 * large value over tiny ones (e4m3 subnormals and underflow to zero), bf16 subnormals
 * (an f32-denormal amax and scale), the largest bf16 values, and exact rounding ties
 * (amax 448, so scale 1, and values halfway between e4m3 neighbours).
 *
 * The check: the cache and 4 KiB guards on both sides start with random poison; the
 * expectation is that poison with ina_dsa_index_key_store applied for every row that is
 * not skipped (its f32 key being the bf16 row widened). The whole allocation must equal
 * it: every written key and scale bit-exact, every untouched slot, padding byte and guard
 * byte still poison (so a skipped row or a stray write anywhere shows).
 *
 * Also: num_tokens 0 enqueues nothing; a CUDA graph captured once replays correctly with
 * other keys, page ids and slots in the same buffers; the argument checks (run first,
 * also without a device: nothing they pass reaches a launch).
 *
 * Mutations (reasoned through; each fails the byte comparison): the scale rounded to a
 * power of two or taken as a reciprocal product (FP8 bytes and scales differ on most
 * rows); amax over head_dim + 1 values (the NaN padding); a skipped row written to page
 * 0 or to slot page_size (poison of another slot or a guard); the scale written at the
 * inline offset in the paged layout (a key byte of the next slot); rows past num_tokens
 * read (there are none, the grid is exact) or the last partial CTA dropped (num_tokens
 * is not a multiple of 4 in several cases).
 *
 * Skipped (exit 77) without a GPU; INA_REQUIRE_GPU=1 makes that a failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/dsa.h"
#include "attention/dsa_gpu.h"
#include "core/dtype.h"
#include "core/log.h"
#include "tests/gpu_test_util.h"

#define NAME "test_dsa_append_gpu"

#if INA_HAVE_CUDA
#include <cuda_runtime.h>

typedef enum { KEYS_BF16, KEYS_FP8_INLINE, KEYS_FP8_PAGED } key_layout_t;
static const char *layout_name[] = {"bf16", "fp8-inline", "fp8-paged"};

static ina_dsa_index_cache_t cache_of(key_layout_t layout, const void *keys, int32_t ps, int32_t dim) {
  if (layout == KEYS_BF16) return ina_dsa_index_cache_dense(INA_DSA_KEY_BF16, keys, ps, dim);
  if (layout == KEYS_FP8_INLINE) return ina_dsa_index_cache_fp8_inline(keys, ps, dim);
  return ina_dsa_index_cache_fp8_paged(keys, ps, dim);
}

/* ---- argument checks (no device needed) --------------------------------------------- */

static void test_arguments(void) {
  uint16_t k[64];
  int32_t pages[2] = {0, 1}, slots[2] = {0, 1};
  _Alignas(16) char cache[1024];
  ina_dsa_gpu_append_params_t p = INA_DSA_GPU_APPEND_PARAMS_INIT;
  p.num_tokens = 2;
  p.k = k;
  p.page_ids = pages;
  p.slots = slots;
  p.cache = ina_dsa_index_cache_dense(INA_DSA_KEY_BF16, cache, 4, 16);
  /* p is valid (and would launch on host pointers): only variants that must fail are run. */
  ina_dsa_gpu_append_params_t q;
  CHECK(ina_dsa_gpu_append(NULL, NULL) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.struct_size = 0; /* not initialized with the INIT macro */
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.version = 0;
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.num_tokens = -1;
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.k = NULL;
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.page_ids = NULL;
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.slots = NULL;
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.cache.keys = NULL;
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.k_stride = 15;
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.k_stride = -16;
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.cache = ina_dsa_index_cache_dense(INA_DSA_KEY_F32, cache, 4, 16);
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_UNSUPPORTED);
  q = p;
  q.cache.format = (ina_dsa_key_format_t)7;
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.cache.page_size = 0;
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.cache.head_dim = 0;
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.cache.token_stride = 30; /* a bf16 key of 16 dims is 32 bytes */
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.cache.page_stride = 0;
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.cache = ina_dsa_index_cache_dense(INA_DSA_KEY_FP8, cache, 4, 16); /* scale_stride 0 */
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.cache = ina_dsa_index_cache_fp8_paged(cache, 4, 16);
  q.cache.scale_stride = 2; /* two slots' scales would overlap */
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.cache.keys = cache + 1;
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_UNSUPPORTED);
  q = p;
  q.cache.token_stride = 33;
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_UNSUPPORTED);
  q = p;
  q.cache.page_stride = 4 * 32 + 1;
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_UNSUPPORTED);
  q = p;
  q.k = (const uint16_t *)((const char *)k + 1);
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_ERR_UNSUPPORTED);
  /* Nothing to write: no launch, no pointer needed. */
  q = p;
  q.num_tokens = 0;
  q.k = NULL;
  q.page_ids = q.slots = NULL;
  q.cache.keys = NULL;
  CHECK(ina_dsa_gpu_append(&q, NULL) == INA_OK);
}

#define CUDA_OK(call) CHECKF((call) == cudaSuccess, "%s failed", #call)
#define GUARD 4096

typedef struct append_case {
  int32_t page_size, dim;
  key_layout_t layout;
  int32_t key_offset; /* bytes the cache starts past an aligned address */
} append_case_t;

typedef enum {
  ROW_RANDOM, ROW_ZERO, ROW_SIGNED_ZERO, ROW_ONE_LARGE, ROW_SUBNORMAL, ROW_HUGE, ROW_TIES, ROW_KINDS
} row_kind_t;

static float bf16_round(float x) { return ina_bf16_to_f32(ina_f32_to_bf16(x)); }

/* One key row of `kind` as bf16 bits. */
static void make_row(row_kind_t kind, int32_t dim, test_rng_t *rng, uint16_t *row) {
  const float mag = (float)exp(2.0 * test_rng_normal(rng));
  const int all_zero = mag > 1.0f; /* ROW_SIGNED_ZERO: half the rows only +-0 */
  for (int32_t d = 0; d < dim; d++) {
    float x = 0.0f;
    switch (kind) {
    case ROW_RANDOM: x = mag * test_rng_normal(rng); break;
    case ROW_ZERO: x = 0.0f; break;
    case ROW_SIGNED_ZERO:
      if (all_zero || test_rng_int(rng, 0, 1)) x = test_rng_int(rng, 0, 1) ? -0.0f : 0.0f;
      else x = 1e-3f * test_rng_normal(rng);
      break;
    case ROW_ONE_LARGE: /* scale 67: the rest are e4m3 subnormals, or round to +-0 */
      x = d == 0 ? 3e4f : 0.3f * test_rng_normal(rng) * (test_rng_int(rng, 0, 1) ? 1.0f : 1e-3f);
      break;
    case ROW_SUBNORMAL: x = ldexpf(test_rng_normal(rng), -128 - (int)test_rng_int(rng, 0, 4)); break;
    case ROW_HUGE: x = (test_rng_int(rng, 0, 1) ? 1.0f : -1.0f) * ldexpf(1.0f + 0.9921875f * (float)test_rng_uniform(rng), 127); break;
    case ROW_TIES:
      /* amax 448 -> scale 1; multiples of 1/64 below 16 fall on and between e4m3 values. */
      x = d == 0 ? 448.0f : (float)test_rng_int(rng, -1024, 1024) / 64.0f;
      break;
    default: break;
    }
    row[d] = ina_f32_to_bf16(bf16_round(x));
  }
}

/* Host and device buffers of one case. */
typedef struct bufs {
  size_t cache_bytes, total; /* total = GUARD + cache_bytes + GUARD (+ key_offset) */
  uint8_t *poison, *want, *got;
  void *d_cache;
  uint16_t *d_k;
  int32_t *d_pages, *d_slots;
} bufs_t;

static void bufs_free(bufs_t *b) {
  free(b->poison);
  free(b->want);
  free(b->got);
  cudaFree(b->d_cache);
  cudaFree(b->d_k);
  cudaFree(b->d_pages);
  cudaFree(b->d_slots);
  memset(b, 0, sizeof *b);
}

/* Rows of one step: keys, page ids, slots; writes the expectation into b->want. */
typedef struct rows {
  int32_t n;
  int64_t k_stride; /* 0 = dim */
  uint16_t *k;
  int32_t *pages, *slots;
  int32_t written, skipped;
} rows_t;

static void rows_free(rows_t *r) {
  free(r->k);
  free(r->pages);
  free(r->slots);
  memset(r, 0, sizeof *r);
}

/* k_stride < 0: 0 or dim + 5 at random. */
static void make_rows(const append_case_t *c, int32_t num_pages, int32_t n, int64_t k_stride,
                      test_rng_t *rng, rows_t *r) {
  memset(r, 0, sizeof *r);
  const int32_t ps = c->page_size, dim = c->dim, capacity = num_pages * ps;
  r->n = n;
  r->k_stride = k_stride >= 0 ? k_stride : test_rng_int(rng, 0, 1) ? 0 : dim + 5;
  const int64_t stride = r->k_stride ? r->k_stride : dim;
  r->k = malloc(sizeof(uint16_t) * (size_t)(stride * (n ? n : 1)));
  for (int64_t i = 0; i < stride * n; i++) r->k[i] = 0x7FC1; /* NaN padding */
  r->pages = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  r->slots = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  int32_t *perm = malloc(sizeof(int32_t) * (size_t)capacity);
  for (int32_t i = 0; i < capacity; i++) perm[i] = i;
  for (int32_t i = capacity - 1; i > 0; i--) {
    const int32_t j = (int32_t)test_rng_int(rng, 0, i), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  int32_t next = 0;
  for (int32_t i = 0; i < n; i++) {
    const int64_t u = test_rng_int(rng, 0, 99);
    make_row(u < 70 ? ROW_RANDOM : (row_kind_t)(1 + u % (ROW_KINDS - 1)), dim, rng, r->k + i * stride);
    if (u < 12 || next >= capacity) { /* a padding row */
      r->pages[i] = u % 3 == 0 ? -1 : u % 3 == 1 ? INT32_MIN : -(int32_t)test_rng_int(rng, 2, 1000);
      r->slots[i] = (int32_t)test_rng_int(rng, 0, ps - 1);
      r->skipped++;
    } else if (u < 14) { /* a real page, a slot outside it */
      r->pages[i] = (int32_t)test_rng_int(rng, 0, num_pages - 1);
      r->slots[i] = u == 12 ? ps : -1;
      r->skipped++;
    } else {
      r->pages[i] = perm[next] / ps;
      r->slots[i] = perm[next] % ps;
      next++;
      r->written++;
    }
  }
  free(perm);
}

/* The host's store of every row that is not skipped, over the poison. */
static int expect_rows(const append_case_t *c, const rows_t *r, bufs_t *b) {
  memcpy(b->want, b->poison, b->total);
  const ina_dsa_index_cache_t host = cache_of(c->layout, b->want + GUARD + c->key_offset, c->page_size, c->dim);
  const int64_t stride = r->k_stride ? r->k_stride : c->dim;
  float *key = malloc(sizeof(float) * (size_t)c->dim);
  int ok = 1;
  for (int32_t i = 0; i < r->n && ok; i++) {
    if (r->pages[i] < 0 || r->slots[i] < 0 || r->slots[i] >= c->page_size) continue;
    for (int32_t d = 0; d < c->dim; d++) key[d] = ina_bf16_to_f32(r->k[i * stride + d]);
    const ina_status_t st = ina_dsa_index_key_store(&host, r->pages[i], r->slots[i], key, c->dim);
    CHECK_OK(st);
    ok = st == INA_OK;
  }
  free(key);
  return ok;
}

static int upload_rows(const append_case_t *c, const rows_t *r, const bufs_t *b) {
  const int64_t stride = r->k_stride ? r->k_stride : c->dim;
  const int ok = cudaMemcpy(b->d_cache, b->poison, b->total, cudaMemcpyHostToDevice) == cudaSuccess &&
                 cudaMemcpy(b->d_k, r->k, sizeof(uint16_t) * (size_t)(stride * r->n), cudaMemcpyHostToDevice) == cudaSuccess &&
                 cudaMemcpy(b->d_pages, r->pages, sizeof(int32_t) * (size_t)r->n, cudaMemcpyHostToDevice) == cudaSuccess &&
                 cudaMemcpy(b->d_slots, r->slots, sizeof(int32_t) * (size_t)r->n, cudaMemcpyHostToDevice) == cudaSuccess;
  CHECKF(ok, "upload failed");
  return ok;
}

static ina_dsa_gpu_append_params_t params_of(const append_case_t *c, const rows_t *r, const bufs_t *b) {
  ina_dsa_gpu_append_params_t p = INA_DSA_GPU_APPEND_PARAMS_INIT;
  p.num_tokens = r->n;
  p.k = b->d_k;
  p.k_stride = r->k_stride;
  p.page_ids = b->d_pages;
  p.slots = b->d_slots;
  p.cache = cache_of(c->layout, (char *)b->d_cache + GUARD + c->key_offset, c->page_size, c->dim);
  return p;
}

/* The device allocation against the expectation, byte for byte; names the first difference. */
static void compare(const char *what, const append_case_t *c, bufs_t *b, cudaStream_t stream) {
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaMemcpy(b->got, b->d_cache, b->total, cudaMemcpyDeviceToHost));
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < b->total; i++)
    if (b->got[i] != b->want[i]) {
      if (first < 0) first = (int64_t)i;
      bad++;
    }
  if (bad) {
    const int64_t off = first - GUARD - c->key_offset;
    const ina_dsa_index_cache_t h = cache_of(c->layout, NULL, c->page_size, c->dim);
    const char *where = off < 0 || off >= (int64_t)b->cache_bytes ? "a guard" : "the cache";
    CHECKF(0, "%s: %lld bytes differ from the host's store; first at cache byte %lld (%s, page %lld, "
           "byte %lld of the page): gpu 0x%02x, want 0x%02x (poison 0x%02x)", what, (long long)bad,
           (long long)off, where, off >= 0 ? (long long)(off / h.page_stride) : -1LL,
           off >= 0 ? (long long)(off % h.page_stride) : -1LL, b->got[first], b->want[first],
           b->poison[first]);
  }
}

static int bufs_alloc(const append_case_t *c, int32_t num_pages, int32_t max_rows, int64_t max_stride,
                      test_rng_t *rng, bufs_t *b) {
  memset(b, 0, sizeof *b);
  const ina_dsa_index_cache_t h = cache_of(c->layout, NULL, c->page_size, c->dim);
  b->cache_bytes = (size_t)(h.page_stride * num_pages);
  b->total = GUARD + (size_t)c->key_offset + b->cache_bytes + GUARD;
  b->poison = malloc(b->total);
  b->want = malloc(b->total);
  b->got = malloc(b->total);
  for (size_t i = 0; i < b->total; i++) b->poison[i] = (uint8_t)test_rng_next(rng);
  const int ok = cudaMalloc(&b->d_cache, b->total) == cudaSuccess &&
                 cudaMalloc((void **)&b->d_k, sizeof(uint16_t) * (size_t)(max_stride * max_rows)) == cudaSuccess &&
                 cudaMalloc((void **)&b->d_pages, sizeof(int32_t) * (size_t)max_rows) == cudaSuccess &&
                 cudaMalloc((void **)&b->d_slots, sizeof(int32_t) * (size_t)max_rows) == cudaSuccess;
  CHECKF(ok, "device allocation failed");
  return ok;
}

static void run_case(const append_case_t *c, test_rng_t *rng, cudaStream_t stream) {
  const int32_t num_pages = c->page_size == 1 ? 300 : 12;
  const int32_t capacity = num_pages * c->page_size;
  const int32_t n = (int32_t)test_rng_int(rng, capacity / 2, capacity * 3 / 4) | 1; /* not a multiple of 4 */
  char what[128];
  snprintf(what, sizeof what, "p%d d%d %s%s", c->page_size, c->dim, layout_name[c->layout],
           c->key_offset ? " (cache at +offset)" : "");
  bufs_t b;
  rows_t r;
  make_rows(c, num_pages, n, -1, rng, &r);
  if (bufs_alloc(c, num_pages, n, c->dim + 5, rng, &b) && expect_rows(c, &r, &b) && upload_rows(c, &r, &b)) {
    ina_dsa_gpu_append_params_t p = params_of(c, &r, &b);
    CHECK_OK(ina_dsa_gpu_append(&p, stream));
    compare(what, c, &b, stream);
    /* num_tokens 0: nothing moves (the cache keeps the rows just written). */
    p.num_tokens = 0;
    CHECK_OK(ina_dsa_gpu_append(&p, stream));
    compare(what, c, &b, stream);
    printf("  %s: %d rows (%d written, %d skipped), k_stride %lld: bit-exact, the rest untouched\n", what,
           r.n, r.written, r.skipped, (long long)r.k_stride);
  }
  bufs_free(&b);
  rows_free(&r);
}

/* Captured once, replayed with other rows in the same buffers. */
static void test_graph(test_rng_t *rng, cudaStream_t stream) {
  const append_case_t c = {64, 128, KEYS_FP8_PAGED, 0};
  const int32_t num_pages = 12, n = 301;
  bufs_t b;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  if (!bufs_alloc(&c, num_pages, n, c.dim + 5, rng, &b)) {
    bufs_free(&b);
    return;
  }
  for (int round = 0; round < 3; round++) {
    rows_t r;
    make_rows(&c, num_pages, n, c.dim + 5, rng, &r); /* the captured k_stride every round */
    if (expect_rows(&c, &r, &b) && upload_rows(&c, &r, &b)) {
      if (!exec) {
        const ina_dsa_gpu_append_params_t p = params_of(&c, &r, &b);
        CUDA_OK(cudaStreamSynchronize(stream));
        CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        CHECK_OK(ina_dsa_gpu_append(&p, stream));
        CUDA_OK(cudaStreamEndCapture(stream, &graph));
        CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      }
      if (exec) {
        CUDA_OK(cudaGraphLaunch(exec, stream));
        char what[64];
        snprintf(what, sizeof what, "graph replay %d", round);
        compare(what, &c, &b, stream);
        printf("  graph replay %d: %d rows (%d written, %d skipped): bit-exact\n", round, n, r.written, r.skipped);
      }
    }
    rows_free(&r);
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  bufs_free(&b);
}

int main(void) {
  test_arguments();
  const int skip = test_require_gpus(NAME, 1);
  if (skip) return test_checks_failed_ ? test_finish(NAME) : skip;
  test_rng_t rng = {test_seed(NAME)};
  char dev[128];
  printf(NAME ": %s\n", ina_cuda_device_name(0, dev, sizeof dev));
  cudaStream_t stream = NULL;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  const int32_t page_sizes[] = {1, 64}, dims[] = {16, 40, 128};
  for (int pi = 0; pi < 2; pi++)
    for (int di = 0; di < 3; di++)
      for (int li = 0; li < 3; li++) {
        const append_case_t c = {page_sizes[pi], dims[di], (key_layout_t)li, 0};
        run_case(&c, &rng, stream);
      }
  /* FP8 scales and rows at odd addresses; a bf16 cache at 2 (mod 4). */
  const append_case_t odd[] = {{1, 17, KEYS_FP8_INLINE, 1}, {64, 17, KEYS_FP8_PAGED, 3},
                               {64, 40, KEYS_BF16, 2}, {1, 128, KEYS_FP8_INLINE, 1}};
  for (size_t i = 0; i < sizeof odd / sizeof *odd; i++) run_case(&odd[i], &rng, stream);
  printf("graph\n");
  test_graph(&rng, stream);
  if (stream) cudaStreamDestroy(stream);
  return test_finish(NAME);
}

#else /* a build without CUDA has no kernel to test (the stub refuses every call) */
int main(void) { return test_skip_gpu(NAME, "this build has no CUDA"); }
#endif
