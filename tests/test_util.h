/* Helpers shared by the C tests: checks that count failures, random inputs, error
 * norms. A test's main returns test_finish(): 0 when every check held, 1 otherwise, or
 * TEST_SKIP (77, ctest's SKIP_RETURN_CODE) when it could not run here.
 *
 * Skipping goes through test_skip (a tool or library is missing) or, for a test that
 * needs a GPU, test_skip_gpu (tests/gpu_test_util.h's test_require_gpus calls it). With
 * INA_REQUIRE_GPU=1 in the environment (any value but empty or "0"), a GPU test that
 * would skip fails instead (exit 1, the reason printed), so a run on a GPU machine
 * cannot pass by skipping its GPU tests: no device visible, a driver that does not
 * start, a build without CUDA, fewer GPUs than ranks. A shell or Python test that needs
 * a GPU follows the same rule: exit 1, not 77, when INA_REQUIRE_GPU is set. */
#ifndef INA_TESTS_TEST_UTIL_H
#define INA_TESTS_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TEST_SKIP 77

static int test_checks_run_ = 0;
static int test_checks_failed_ = 0;

#define CHECK(cond)                                                                      \
  do {                                                                                   \
    test_checks_run_++;                                                                  \
    if (!(cond)) {                                                                       \
      test_checks_failed_++;                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);           \
    }                                                                                    \
  } while (0)

#define CHECKF(cond, ...)                                                                \
  do {                                                                                   \
    test_checks_run_++;                                                                  \
    if (!(cond)) {                                                                       \
      test_checks_failed_++;                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);           \
      fprintf(stderr, __VA_ARGS__);                                                      \
      fputc('\n', stderr);                                                               \
    }                                                                                    \
  } while (0)

/* A call returning ina_status_t that must succeed. */
#define CHECK_OK(call)                                                                   \
  do {                                                                                   \
    int test_s_ = (int)(call);                                                           \
    CHECKF(test_s_ == 0, "%s returned status %d (%s)", #call, test_s_, ina_last_error()); \
  } while (0)

/* Whether INA_REQUIRE_GPU asks GPU tests to fail rather than skip. */
static inline int test_gpu_required(void) {
  const char *v = getenv("INA_REQUIRE_GPU");
  return v && v[0] && strcmp(v, "0") != 0;
}

/* A test that cannot run here for want of something other than a GPU: prints
 * "NAME: skipped (WHY)" and returns TEST_SKIP, for main to return. */
static inline int test_skip(const char *name, const char *why) {
  printf("%s: skipped (%s)\n", name, why);
  fflush(stdout);
  return TEST_SKIP;
}

/* What a GPU test that cannot run here exits with: TEST_SKIP, or 1 under
 * INA_REQUIRE_GPU. Prints nothing (the ranks of an MPI test other than the one that
 * prints test_skip_gpu's line). */
static inline int test_gpu_skip_status(void) { return test_gpu_required() ? 1 : TEST_SKIP; }

/* A test that needs a GPU and cannot run here: prints "NAME: skipped (WHY)" and returns
 * TEST_SKIP; under INA_REQUIRE_GPU prints "NAME: FAILED: ..." to stderr and returns 1.
 * main returns the result. */
static inline int test_skip_gpu(const char *name, const char *why) {
  if (test_gpu_required()) {
    fprintf(stderr, "%s: FAILED: would skip (%s), and INA_REQUIRE_GPU is set\n", name, why);
    fflush(stderr);
    return 1;
  }
  return test_skip(name, why);
}

static inline int test_finish(const char *name) {
  printf("%s: %d checks, %d failed\n", name, test_checks_run_, test_checks_failed_);
  return test_checks_failed_ ? 1 : 0;
}

/* splitmix64: small, seedable, good enough for test data. */
typedef struct { uint64_t s; } test_rng_t;
static inline uint64_t test_rng_next(test_rng_t *r) {
  uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/* Seconds on the monotonic clock, for timeouts and timings in tests. */
static inline double test_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
/* Uniform in [0, 1). */
static inline double test_rng_uniform(test_rng_t *r) {
  return (double)(test_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}
static inline int64_t test_rng_int(test_rng_t *r, int64_t lo, int64_t hi) { /* [lo, hi] */
  return lo + (int64_t)(test_rng_next(r) % (uint64_t)(hi - lo + 1));
}
static inline float test_rng_normal(test_rng_t *r) {
  double u1 = test_rng_uniform(r), u2 = test_rng_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
/* A seed from TEST_SEED in the environment, else fresh from the clock; printed so a
 * failure can be replayed. */
static inline uint64_t test_seed(const char *name) {
  const char *env = getenv("TEST_SEED");
  uint64_t seed;
  if (env) {
    seed = strtoull(env, NULL, 0);
  } else {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    seed = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec;
  }
  printf("%s: seed %llu (TEST_SEED=%llu replays it)\n", name, (unsigned long long)seed,
         (unsigned long long)seed);
  return seed;
}

/* ||a - b|| / ||b|| in double; NaN anywhere gives +inf so it never passes a bound. */
static inline double test_rel_l2(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    if (isnan(a[i]) || isnan(b[i])) return INFINITY;
    double d = (double)a[i] - (double)b[i];
    num += d * d;
    den += (double)b[i] * (double)b[i];
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return sqrt(num / den);
}

/* Fill with a NaN pattern so unwritten outputs are caught. */
static inline void test_poison_f32(float *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = NAN;
}

#endif
