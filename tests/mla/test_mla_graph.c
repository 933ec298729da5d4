/* ina_mla_run captured once in a CUDA graph, then replayed after re-planning with new
 * lengths of the same bucket (batch from 0 to max_batch, new query and KV lengths, new
 * page tables and data in the same buffers): every replay must match the CPU reference,
 * a replay without a new plan must give the same answer again, and a batch-0 plan must
 * leave the outputs untouched.
 *
 * Timeout-safe: the stream is polled against a deadline instead of waited on, so a hung
 * kernel fails the test with a message instead of blocking until ctest kills it.
 * Skipped (exit 77) without a GPU. */
#include <time.h>
#include <unistd.h>

#include "tests/gpu_test_util.h"
#include "tests/mla/mla_test_gpu.h"

#if INA_HAVE_CUDA
#include <cuda_runtime.h>

#define WAIT_SECONDS 60.0

typedef struct bucket {
  const char *name;
  mla_shape_t s; /* batch = max_batch */
  int32_t kv_max;
  int rounds;
} bucket_t;

static const bucket_t buckets[] = {
    {"h16 bf16 p64, batch <= 16, q <= 4 (64 rows: wgmma)",
     {16, 16, 4, 16, 512, 64, 64, INA_MLA_CACHE_BF16, MLA_LAYOUT_PACKED, 0, 0, 0.0f}, 3000, 5},
    {"h128 bf16 p16, batch <= 6, q <= 2 (wgmma)",
     {6, 6, 2, 128, 512, 64, 16, INA_MLA_CACHE_BF16, MLA_LAYOUT_PACKED, 0, 0, 0.0f}, 2500, 4},
    {"h128 fp8 p16, batch <= 6, q <= 2 (wgmma)",
     {6, 6, 2, 128, 512, 64, 16, INA_MLA_CACHE_FP8, MLA_LAYOUT_PACKED, 0, 0, 0.0f}, 2500, 4},
    {"h16 fp8 p16, batch <= 8, q <= 2",
     {8, 8, 2, 16, 512, 64, 16, INA_MLA_CACHE_FP8, MLA_LAYOUT_PACKED, 0, 0, 0.0f}, 5000, 4},
    {"generic 64+16 bf16 h3 p16, batch <= 6, q <= 3",
     {6, 6, 3, 3, 64, 16, 16, INA_MLA_CACHE_BF16, MLA_LAYOUT_PACKED, 0, 0, 0.0f}, 2000, 4},
};

/* Polls the stream until it is idle; a GPU that does not finish within the deadline
 * ends the program (nothing later could run on it). */
static int wait_stream(cudaStream_t stream, const char *what) {
  const double deadline = test_now_s() + WAIT_SECONDS;
  cudaError_t e;
  while ((e = cudaStreamQuery(stream)) == cudaErrorNotReady) {
    if (test_now_s() > deadline) {
      fprintf(stderr, "test_mla_graph: %s: no completion after %.0f s (hung kernel)\n", what, WAIT_SECONDS);
      fflush(stderr);
      _exit(1);
    }
    struct timespec nap = {0, 200000};
    nanosleep(&nap, NULL);
  }
  CHECKF(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

/* Lengths of one round: batch in 0..max_batch (0 when `empty`). */
static int32_t draw(const bucket_t *bk, test_rng_t *rng, int empty, int32_t *q_lens, int32_t *kv_lens) {
  const int32_t batch = empty ? 0 : (int32_t)test_rng_int(rng, 1, bk->s.max_batch);
  for (int32_t b = 0; b < batch; b++) {
    q_lens[b] = (int32_t)test_rng_int(rng, 1, bk->s.max_q_len);
    kv_lens[b] = (int32_t)test_rng_int(rng, q_lens[b], bk->kv_max);
  }
  return batch;
}

static void run_bucket(const bucket_t *bk, test_rng_t *rng, ina_threadpool_t *pool, cudaStream_t stream) {
  const int32_t B = bk->s.max_batch;
  int32_t *q_lens = malloc(sizeof(int32_t) * (size_t)B), *kv_lens = malloc(sizeof(int32_t) * (size_t)B);
  mla_case_t cap, c;
  mla_dev_t d;
  ina_mla_plan_info_t info;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  uint16_t *out = NULL, *first = NULL;
  float *lse = NULL;
  memset(&cap, 0, sizeof cap);
  memset(&c, 0, sizeof c);
  memset(&d, 0, sizeof d);
  CHECK(q_lens && kv_lens);
  if (!q_lens || !kv_lens) goto done;

  /* Buffers sized by the bucket's largest step. */
  for (int32_t b = 0; b < B; b++) {
    q_lens[b] = bk->s.max_q_len;
    kv_lens[b] = bk->kv_max;
  }
  mla_shape_t s = bk->s;
  s.softmax_scale = 0.0722f;
  CHECK(mla_case_build(&cap, &s, q_lens, kv_lens, rng, pool, 0));
  CHECK_OK(mla_dev_alloc(&d, &cap, 0));
  if (!d.ws) goto done;
  out = malloc(2 * (size_t)cap.out_elems);
  first = malloc(2 * (size_t)cap.out_elems);
  lse = malloc(4 * (size_t)cap.tokens * (size_t)s.num_heads);
  CHECK(out && first && lse);
  if (!out || !first || !lse) goto done;

  /* The softmax scale is a kernel argument, fixed at capture like every pointer. */
  s.softmax_scale = (float)(test_rng_uniform(rng) * 0.2 + 0.02);
  for (int round = 0; round <= bk->rounds; round++) {
    /* Round 0 plans and captures; the last round plans an empty batch. */
    const int empty = round == bk->rounds;
    s.batch = draw(bk, rng, empty, q_lens, kv_lens);
    mla_case_free(&c);
    if (!mla_case_build(&c, &s, q_lens, kv_lens, rng, pool, 1)) {
      CHECKF(0, "%s: building round %d failed: %s", bk->name, round, ina_last_error());
      goto done;
    }
    CHECK_OK(mla_dev_upload(&d, &c));
    ina_mla_plan_params_t pp = mla_plan_params(&c, 0);
    ina_mla_run_params_t rp = mla_run_params(&c, &d);
    CHECK_OK(ina_mla_plan(&pp, d.host_ws, d.ws, stream, &info));
    if (round == 0) {
      CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
      CHECK_OK(ina_mla_run(&info, d.ws, &rp, stream));
      CHECK(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
      CHECK(graph && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
      if (!exec) goto done;
    }
    CHECK(cudaGraphLaunch(exec, stream) == cudaSuccess);
    if (!wait_stream(stream, bk->name)) goto done;
    CHECK_OK(ina_cuda_memcpy_d2h(out, d.out, 2 * (size_t)c.out_elems));
    const size_t lse_n = (size_t)(c.tokens > 0 ? c.tokens : 1) * (size_t)s.num_heads;
    CHECK_OK(ina_cuda_memcpy_d2h(lse, d.lse, 4 * lse_n));

    if (empty) {
      CHECKF(mla_stray_writes(&c, out) == 0, "%s: a batch-0 replay wrote outputs", bk->name);
      printf("  %-44s round %d: batch 0, outputs untouched\n", bk->name, round);
      continue;
    }
    char what[160];
    snprintf(what, sizeof what, "%s round %d", bk->name, round);
    double out_err = 0, lse_err = 0;
    const double lse_bound = s.format == INA_MLA_CACHE_FP8 ? 1e-3 : 1e-4;
    CHECKF(mla_case_compare(&c, out, lse, lse_bound, what, &out_err, &lse_err),
           "%s: graph replay differs from the reference", what);
    printf("  %-44s round %d: batch %2d tokens %3d max splits %3d: out %.2e lse %.2e\n", bk->name,
           round, s.batch, c.tokens, info.num_splits_max, out_err, lse_err);

    if (round == 1) { /* replay again on the same plan: same bits */
      memcpy(first, out, 2 * (size_t)c.out_elems);
      CHECK_OK(mla_dev_upload(&d, &c));
      CHECK(cudaGraphLaunch(exec, stream) == cudaSuccess);
      if (!wait_stream(stream, what)) goto done;
      CHECK_OK(ina_cuda_memcpy_d2h(out, d.out, 2 * (size_t)c.out_elems));
      CHECKF(memcmp(first, out, 2 * (size_t)c.out_elems) == 0, "%s: a second replay changed the output", what);
    }
  }
done:
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  mla_dev_free(&d);
  mla_case_free(&c);
  mla_case_free(&cap);
  free(out);
  free(first);
  free(lse);
  free(q_lens);
  free(kv_lens);
}

int main(void) {
  const int skip = test_require_gpus("test_mla_graph", 1);
  if (skip) return skip;
  test_rng_t rng = {test_seed("test_mla_graph")};
  ina_threadpool_t *pool = NULL;
  cudaStream_t stream = NULL;
  CHECK_OK(ina_threadpool_create(0, &pool));
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  for (size_t i = 0; i < sizeof buckets / sizeof *buckets; i++) run_bucket(&buckets[i], &rng, pool, stream);
  if (stream) cudaStreamDestroy(stream);
  ina_threadpool_destroy(pool);
  return test_finish("test_mla_graph");
}

#else /* a build without CUDA has no graphs to capture */
int main(void) {
  return test_skip_gpu("test_mla_graph", "this build has no CUDA");
}
#endif
