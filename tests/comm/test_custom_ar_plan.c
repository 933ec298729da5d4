/* CPU tests of the custom all-reduce's host logic and arithmetic (no GPU needed):
 *   - the registered-buffer layout (alignment, disjoint regions, counter slots);
 *   - the algorithm choice: thresholds, fallbacks, unsupported combinations;
 *   - the partition's synchronization invariant, by simulating the kernels' phases on the
 *     real partition functions: every element a CTA reads from a peer after a barrier was
 *     written before it by the peer's CTA with the same index, and every output element
 *     is written exactly once on every rank;
 *   - the FP8 block quantization against core's reference (ina_fp8_quantize_blocks);
 *   - the CPU model of every mode against the fp64 sum within the stated bounds (the FP8
 *     bound is derived in tests/comm/custom_ar_model.h). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/custom_ar_math.h"
#include "comm/custom_ar_plan.h"
#include "core/dtype.h"
#include "core/log.h"
#include "tests/comm/custom_ar_model.h"
#include "tests/test_util.h"

/* ---- layout ------------------------------------------------------------------------------ */

static void test_layout(void) {
  const uint64_t caps[] = {1, 4095, 4096, 4097, (uint64_t)8 << 20, ((uint64_t)256 << 20) + 3};
  for (size_t k = 0; k < sizeof caps / sizeof caps[0]; k++)
    for (int n = 1; n <= INA_CAR_MAX_RANKS; n++) {
      ina_car_layout_t l;
      CHECK_OK(ina_car_layout_init(caps[k], n, &l));
      CHECK(l.capacity >= caps[k] && l.capacity % INA_CAR_REGION_ALIGN == 0 &&
            l.capacity - caps[k] < INA_CAR_REGION_ALIGN);
      const uint64_t starts[] = {l.flags,    l.epochs,   l.ll[0],    l.ll[1],   l.input,
                                 l.stage[0], l.stage[1], l.fp8_recv, l.reduced, l.fp8_slot_bytes};
      for (int i = 0; i < 10; i++) CHECK(starts[i] % INA_CAR_REGION_ALIGN == 0);
      /* In address order, disjoint, everything zeroed at creation (before input) first. */
      const uint64_t ll_bytes = (uint64_t)n * l.ll_capacity / 8 * 16;
      CHECK(l.ll_capacity ==
            (l.capacity < INA_CAR_LL_MAX_BYTES ? l.capacity : INA_CAR_LL_MAX_BYTES));
      CHECK(l.flags == 0 && l.epochs < l.ll[0] && l.ll[0] + ll_bytes <= l.ll[1] &&
            l.ll[1] + ll_bytes <= l.input && l.input + l.capacity <= l.stage[0] &&
            l.stage[0] + l.capacity <= l.stage[1] && l.stage[1] + l.capacity <= l.fp8_recv &&
            l.fp8_recv + (uint64_t)n * l.fp8_slot_bytes <= l.reduced &&
            l.reduced + l.capacity == l.total);
      /* Parity 3 is parity 1; the last source's lines end the region. */
      CHECK(ina_car_ll_slot(&l, 0, 0) == l.ll[0]);
      CHECK(ina_car_ll_slot(&l, 3, n - 1) + ll_bytes / n == l.ll[1] + ll_bytes);
      /* An FP8 slot holds values and scales of fp8_slot_elems elements. */
      CHECK(l.fp8_slot_elems % INA_CAR_GRANULE == 0 &&
            l.fp8_slot_elems + l.fp8_slot_elems / INA_CAR_GRANULE * 4 <= l.fp8_slot_bytes);
      CHECK(ina_car_fp8_recv_slot(&l, n - 1) + l.fp8_slot_bytes <= l.reduced);
      /* Every counter slot is distinct, 8-byte aligned and inside its region. */
      const uint64_t last_flag = ina_car_flag_offset(&l, INA_CAR_FLAG_KINDS - 1,
                                                     INA_CAR_MAX_BLOCKS - 1, INA_CAR_MAX_RANKS - 1);
      CHECK(last_flag + 8 <= l.epochs);
      CHECK(ina_car_flag_offset(&l, 0, 0, 1) == l.flags + 8);
      CHECK(ina_car_flag_offset(&l, 0, 1, 0) == l.flags + 8 * INA_CAR_MAX_RANKS);
      CHECK(ina_car_flag_offset(&l, 1, 0, 0) ==
            l.flags + 8 * INA_CAR_MAX_RANKS * INA_CAR_MAX_BLOCKS);
      CHECK(ina_car_epoch_offset(&l, INA_CAR_MAX_BLOCKS - 1) + 8 <= l.ll[0]);
      /* FP8 regions: values [0, cap/2) then scales for cap/2 values. */
      CHECK(ina_car_fp8_scales_offset(&l) % 16 == 0 &&
            ina_car_fp8_scales_offset(&l) + l.capacity / 2 / INA_CAR_GRANULE * 4 <= l.capacity);
    }
  ina_car_layout_t l;
  ina_log_set_quiet_errors(1);
  CHECK(ina_car_layout_init(0, 2, &l) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_car_layout_init(4096, 0, &l) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_car_layout_init(4096, INA_CAR_MAX_RANKS + 1, &l) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
}

/* ---- algorithm choice -------------------------------------------------------------------- */

static ina_car_request_t base_request(void) {
  ina_car_request_t r;
  memset(&r, 0, sizeof r);
  r.mode = INA_CAR_MODE_BF16;
  r.algo = INA_CAR_ALGO_AUTO;
  r.nranks = 2;
  r.peer_access = 1;
  r.have_nccl = 1;
  r.capacity = (uint64_t)8 << 20;
  r.one_shot_max_bytes = (uint64_t)64 << 10;
  r.blocks = 132;
  return r;
}

static int choose(const ina_car_request_t *r, int *algo, ina_car_plan_t *plan) {
  ina_log_set_quiet_errors(1);
  int st = (int)ina_car_choose(r, algo, plan);
  ina_log_set_quiet_errors(0);
  return st;
}

static void test_choose(void) {
  ina_car_request_t r = base_request();
  ina_car_plan_t p;
  int algo = -1;

  /* AUTO: one-shot up to the threshold (input bytes), two-shot above. */
  r.count = 32768; /* 64 KiB of bf16 */
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_ONE_SHOT);
  CHECK(p.algo == algo && p.units == 256 && p.unit_elems == 128 && p.count == 32768 &&
        p.blocks == 132 && p.nranks == 2);
  r.count = 32769;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_TWO_SHOT && p.units == 257);
  r.mode = INA_CAR_MODE_F32;
  r.count = 16384;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_ONE_SHOT);
  r.count = 16385;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_TWO_SHOT);
  /* FP8 is two-shot whatever the size; one-shot is refused. */
  r.mode = INA_CAR_MODE_FP8;
  r.count = 1;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_TWO_SHOT);
  r.algo = INA_CAR_ALGO_ONE_SHOT;
  CHECK(choose(&r, &algo, &p) == INA_ERR_UNSUPPORTED);
  /* Forced algorithms are kept when they fit. */
  r = base_request();
  r.count = 1000000;
  r.algo = INA_CAR_ALGO_ONE_SHOT;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_ONE_SHOT);
  r.count = 3;
  r.algo = INA_CAR_ALGO_TWO_SHOT;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_TWO_SHOT && p.units == 1);
  r.algo = INA_CAR_ALGO_NCCL;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_NCCL);
  r.have_nccl = 0;
  CHECK(choose(&r, &algo, &p) == INA_ERR_UNSUPPORTED);

  /* Capacity: the padded count (whole 128-element units) must fit. */
  r = base_request();
  r.count = r.capacity / 2; /* exactly full, a multiple of 128 */
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_TWO_SHOT);
  r.count = r.capacity / 2 + 1;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_NCCL);
  r.algo = INA_CAR_ALGO_ONE_SHOT; /* a preference, still falls back */
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_NCCL);
  r.have_nccl = 0;
  CHECK(choose(&r, &algo, &p) == INA_ERR_UNSUPPORTED);
  r = base_request(); /* a capacity that is not whole granules (layouts always are) */
  r.capacity = 1000;
  r.count = 384; /* 3 granules: 768 bytes */
  CHECK(choose(&r, &algo, &p) == INA_OK && algo != INA_CAR_ALGO_NCCL);
  r.count = 499; /* 998 bytes fit, but its 4 whole granules (1024 bytes) do not */
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_NCCL);
  r.capacity = 4096;
  r.mode = INA_CAR_MODE_F32;
  r.count = 1024;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo != INA_CAR_ALGO_NCCL);
  r.count++;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_NCCL);

  /* No peer access, too many ranks or no grid: NCCL, or unsupported without it. */
  r = base_request();
  r.count = 100;
  r.peer_access = 0;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_NCCL);
  r.have_nccl = 0;
  CHECK(choose(&r, &algo, &p) == INA_ERR_UNSUPPORTED);
  r = base_request();
  r.count = 100;
  r.nranks = INA_CAR_MAX_RANKS + 1;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_NCCL);
  r = base_request();
  r.count = 100;
  r.blocks = INA_CAR_MAX_BLOCKS + 1;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_NCCL);

  /* Epilogue shapes. */
  r = base_request();
  r.rows = 3;
  r.cols = 7168;
  r.count = 3 * 7168;
  CHECK(choose(&r, &algo, &p) == INA_OK && p.unit_elems == 7168 && p.units == 3);
  r.mode = INA_CAR_MODE_FP8;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_TWO_SHOT && p.units == 3);
  r.cols = 136;
  r.count = 3 * 136;
  CHECK(choose(&r, &algo, &p) == INA_ERR_UNSUPPORTED); /* fp8 rows must be whole blocks */
  r.mode = INA_CAR_MODE_BF16;
  CHECK(choose(&r, &algo, &p) == INA_OK);
  r.mode = INA_CAR_MODE_F32;
  CHECK(choose(&r, &algo, &p) == INA_ERR_UNSUPPORTED);
  r.mode = INA_CAR_MODE_BF16;
  r.count = 3 * 136 + 1;
  CHECK(choose(&r, &algo, &p) == INA_ERR_INVALID_ARGUMENT); /* rows x cols != count */
  r.cols = 12;
  r.count = 36;
  CHECK(choose(&r, &algo, &p) == INA_ERR_INVALID_ARGUMENT); /* cols % 8 */
  r.cols = INA_CAR_MAX_COLS + 8;
  r.count = 3 * (uint64_t)r.cols;
  CHECK(choose(&r, &algo, &p) == INA_ERR_INVALID_ARGUMENT);
  r.cols = INA_CAR_MAX_COLS;
  r.count = 3 * (uint64_t)r.cols;
  CHECK(choose(&r, &algo, &p) == INA_OK);
  r.rows = 0;
  r.count = 0;
  CHECK(choose(&r, &algo, &p) == INA_ERR_INVALID_ARGUMENT);
  /* Bad enums. */
  r = base_request();
  r.mode = 7;
  CHECK(choose(&r, &algo, &p) == INA_ERR_INVALID_ARGUMENT);
  r = base_request();
  r.algo = 9;
  CHECK(choose(&r, &algo, &p) == INA_ERR_INVALID_ARGUMENT);

  /* LL: AUTO takes it up to its threshold when the lines hold the padded input; asked
   * for, it is kept while it fits and becomes one-shot above; never for FP8. */
  r = base_request();
  r.ll_capacity = (uint64_t)1 << 20;
  r.one_shot_max_bytes = (uint64_t)4 << 20;
  r.count = ina_car_ll_auto_max_bytes(2, 0) / 2;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_LL && p.algo == algo);
  r.count++;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_ONE_SHOT);
  r.algo = INA_CAR_ALGO_LL;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_LL);
  r.count = r.ll_capacity / 2;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_LL);
  r.count++; /* one element more: its padded granule does not fit the lines */
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_ONE_SHOT);
  r.mode = INA_CAR_MODE_F32;
  r.count = r.ll_capacity / 4;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_LL);
  r.mode = INA_CAR_MODE_FP8;
  CHECK(choose(&r, &algo, &p) == INA_ERR_UNSUPPORTED);
  r = base_request();
  r.ll_capacity = (uint64_t)1 << 20;
  r.rows = 4;
  r.cols = 7168;
  r.count = 4 * 7168;
  r.one_shot_max_bytes = (uint64_t)4 << 20;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_LL && p.unit_elems == 7168);
  /* With the epilogue AUTO stops LL earlier: 16 rows (229 KiB) are one-shot, while the
   * same bytes without it are LL. */
  r.rows = 16;
  r.count = 16 * 7168;
  CHECK(ina_car_ll_auto_max_bytes(2, 1) < r.count * 2 &&
        r.count * 2 <= ina_car_ll_auto_max_bytes(2, 0));
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_ONE_SHOT);
  r.rows = r.cols = 0;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_LL);
  r.rows = 4;
  r.cols = 7168;
  r.count = 4 * 7168;
  r.algo = INA_CAR_ALGO_NCCL;
  CHECK(choose(&r, &algo, &p) == INA_OK && algo == INA_CAR_ALGO_NCCL);

  /* Default thresholds shrink with the rank count. */
  CHECK(ina_car_default_one_shot_max_bytes(2) == (size_t)8 << 20);
  CHECK(ina_car_default_one_shot_max_bytes(4) == (size_t)512 << 10);
  CHECK(ina_car_default_one_shot_max_bytes(8) == (size_t)256 << 10);
}

/* ---- partition and synchronization invariant --------------------------------------------- */

static void test_split(test_rng_t *rng) {
  for (int trial = 0; trial < 2000; trial++) {
    const int64_t n = test_rng_int(rng, 0, 100000);
    const int parts = (int)test_rng_int(rng, 1, 300);
    int64_t prev_end = 0, lo = INT64_MAX, hi = 0;
    for (int i = 0; i < parts; i++) {
      int64_t b = 0, e = 0;
      ina_car_split(n, parts, i, &b, &e);
      CHECK(b == prev_end && e >= b);
      prev_end = e;
      if (e - b < lo) lo = e - b;
      if (e - b > hi) hi = e - b;
    }
    CHECK(prev_end == n && hi - lo <= 1);
  }
}

/* Per-rank record of which CTA last wrote each element of a region (-1 = nobody). */
typedef struct {
  int32_t *writer[INA_CAR_MAX_RANKS];
} region_t;

static void region_init(region_t *g, int nranks, int64_t n) {
  for (int r = 0; r < nranks; r++) {
    g->writer[r] = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    for (int64_t e = 0; e < n; e++) g->writer[r][e] = -1;
  }
}

static void region_free(region_t *g, int nranks) {
  for (int r = 0; r < nranks; r++) free(g->writer[r]);
}

/* Simulates one run's phases on the partition functions the kernels use. Returns the
 * number of violations: a read of peer data not written by the same-index CTA before the
 * barrier, a region element written twice in one phase, or an output element not written
 * exactly once. */
static long simulate(const ina_car_plan_t *p, int zero_copy, int epilogue) {
  const int n = p->nranks, two_shot = p->algo == INA_CAR_ALGO_TWO_SHOT;
  const int fp8 = p->mode == INA_CAR_MODE_FP8;
  const int64_t ue = p->unit_elems, padded = p->units * ue;
  const int staged = !two_shot || fp8 || !zero_copy; /* phase 0 writes the read region */
  region_t in_region, reduced;
  region_init(&in_region, n, padded);
  region_init(&reduced, n, padded);
  uint8_t *outs[INA_CAR_MAX_RANKS];
  long bad = 0;
  for (int r = 0; r < n; r++) outs[r] = calloc((size_t)(p->count > 0 ? p->count : 1), 1);

  /* Phase 0: CTA b stages range b of every stripe (of everything for one-shot). */
  if (staged) {
    for (int r = 0; r < n; r++)
      for (int b = 0; b < p->blocks; b++)
        for (int s = 0; s < (two_shot ? n : 1); s++) {
          int64_t u0, u1;
          ina_car_block_units(p, s, b, &u0, &u1);
          for (int64_t e = u0 * ue; e < u1 * ue; e++) {
            bad += in_region.writer[r][e] != -1;
            in_region.writer[r][e] = b;
          }
        }
    for (int r = 0; r < n; r++)
      for (int64_t e = 0; e < padded; e++) bad += in_region.writer[r][e] == -1;
  }
  /* READY. Phase 1: one-shot sums its range from every rank; two-shot its own stripe. */
  for (int r = 0; r < n; r++)
    for (int b = 0; b < p->blocks; b++) {
      int64_t u0, u1;
      ina_car_block_units(p, two_shot ? r : 0, b, &u0, &u1);
      for (int64_t e = u0 * ue; e < u1 * ue; e++) {
        for (int s = 0; s < n; s++)
          if (staged) bad += in_region.writer[s][e] != b;
        if (two_shot) {
          bad += reduced.writer[r][e] != -1;
          reduced.writer[r][e] = b;
        }
        if ((!two_shot || !epilogue) && e < p->count) outs[r][e]++;
      }
    }
  /* MID. Phase 2 (two-shot): gather range b of the other stripes (all, with the epilogue,
   * which normalizes whole rows). */
  if (two_shot)
    for (int r = 0; r < n; r++)
      for (int b = 0; b < p->blocks; b++)
        for (int s = 0; s < n; s++) {
          if (s == r && !epilogue) continue;
          int64_t u0, u1;
          ina_car_block_units(p, s, b, &u0, &u1);
          for (int64_t e = u0 * ue; e < u1 * ue; e++) {
            bad += reduced.writer[s][e] != b;
            if (e < p->count) outs[r][e]++;
          }
        }
  for (int r = 0; r < n; r++) {
    for (int64_t e = 0; e < p->count; e++) bad += outs[r][e] != 1;
    free(outs[r]);
  }
  region_free(&in_region, n);
  region_free(&reduced, n);
  return bad;
}

static void test_partition(test_rng_t *rng) {
  static const int grids[] = {1, 2, 3, 7, 64, 132, 256};
  for (int trial = 0; trial < 400; trial++) {
    ina_car_request_t r = base_request();
    r.nranks = (int)test_rng_int(rng, 1, INA_CAR_MAX_RANKS);
    r.blocks = grids[test_rng_int(rng, 0, 6)];
    r.mode = (int)test_rng_int(rng, 0, 2);
    static const int algos[] = {INA_CAR_ALGO_ONE_SHOT, INA_CAR_ALGO_TWO_SHOT, INA_CAR_ALGO_LL};
    r.algo = r.mode == INA_CAR_MODE_FP8 ? INA_CAR_ALGO_TWO_SHOT : algos[test_rng_int(rng, 0, 2)];
    r.ll_capacity = (uint64_t)1 << 20;
    const int epilogue = r.mode != INA_CAR_MODE_F32 && test_rng_int(rng, 0, 2) == 0;
    if (epilogue) {
      r.cols =
          r.mode == INA_CAR_MODE_FP8 ? 128 * test_rng_int(rng, 1, 8) : 8 * test_rng_int(rng, 1, 40);
      r.rows = test_rng_int(rng, 1, 40);
      r.count = (uint64_t)(r.rows * r.cols);
    } else {
      r.count = (uint64_t)test_rng_int(rng, 1, trial % 4 == 0 ? 3 : 20000);
    }
    ina_car_plan_t p;
    int algo = 0;
    CHECK_OK(ina_car_choose(&r, &algo, &p));
    const int zero_copy = (int)test_rng_int(rng, 0, 1);
    const long bad = simulate(&p, zero_copy, epilogue);
    CHECKF(bad == 0,
           "%ld violations: algo %d mode %d ranks %d blocks %d count %lld unit %lld zero_copy %d",
           bad, p.algo, p.mode, p.nranks, p.blocks, (long long)p.count, (long long)p.unit_elems,
           zero_copy);
    /* The kernels touch whole units: they must lie inside the regions. */
    CHECK((uint64_t)(p.units * p.unit_elems) * (uint64_t)ina_car_in_elem_bytes(p.mode) <=
          r.capacity);
    if (p.algo == INA_CAR_ALGO_LL)
      CHECK((uint64_t)(p.units * p.unit_elems) * (uint64_t)ina_car_in_elem_bytes(p.mode) <=
            r.ll_capacity);
  }
}

/* The largest FP8 stripe of a plan, in elements. */
static int64_t largest_stripe(const ina_car_plan_t *p) {
  int64_t most = 0;
  for (int s = 0; s < p->nranks; s++) {
    int64_t s0 = 0, s1 = 0;
    ina_car_stripe_units(p, s, &s0, &s1);
    if ((s1 - s0) * p->unit_elems > most) most = (s1 - s0) * p->unit_elems;
  }
  return most;
}

/* Every FP8 stripe that fits the capacity fits an fp8_recv slot: the fullest runs, with
 * and without rows, on random capacities and rank counts. */
static void test_fp8_slots(test_rng_t *rng) {
  for (int trial = 0; trial < 300; trial++) {
    ina_car_request_t r = base_request();
    r.mode = INA_CAR_MODE_FP8;
    r.nranks = (int)test_rng_int(rng, 1, INA_CAR_MAX_RANKS);
    r.capacity = (uint64_t)test_rng_int(rng, 1, 16384) * INA_CAR_REGION_ALIGN;
    ina_car_layout_t l;
    CHECK_OK(ina_car_layout_init(r.capacity, r.nranks, &l));
    if (trial % 2) {
      r.cols = 128 * test_rng_int(rng, 1, INA_CAR_MAX_COLS / 128);
      r.rows = (int64_t)(l.capacity / 2 / (uint64_t)r.cols);
      if (r.rows == 0) continue;
      r.count = (uint64_t)(r.rows * r.cols);
    } else {
      r.count = l.capacity / 2 - (uint64_t)test_rng_int(rng, 0, 127);
    }
    ina_car_plan_t p;
    int algo = 0;
    CHECK_OK(ina_car_choose(&r, &algo, &p));
    CHECK(algo == INA_CAR_ALGO_TWO_SHOT);
    CHECKF((uint64_t)largest_stripe(&p) <= l.fp8_slot_elems,
           "fp8 stripe of %lld elements > slot of %llu (ranks %d, capacity %llu, rows %lld)",
           (long long)largest_stripe(&p), (unsigned long long)l.fp8_slot_elems, r.nranks,
           (unsigned long long)l.capacity, (long long)r.rows);
  }
}

/* ---- FP8 arithmetic ---------------------------------------------------------------------- */

/* One block through ina_car_quantize must equal core's reference, byte and scale. */
static void check_block_against_reference(const float *x, int len) {
  uint8_t ref_q[INA_CAR_GRANULE], q[INA_CAR_GRANULE];
  float ref_scale = 0.0f, amax = 0.0f;
  CHECK_OK(ina_fp8_quantize_blocks(x, 1, len, 1, INA_CAR_GRANULE, ref_q, &ref_scale));
  for (int i = 0; i < len; i++) amax = fmaxf(amax, fabsf(x[i]));
  const float s = ina_fp8_rule_scale_inv(amax);
  int bad = 0;
  for (int i = 0; i < len; i++) {
    q[i] = ina_car_quantize(x[i], s);
    bad += q[i] != ref_q[i];
  }
  CHECKF(bad == 0 && memcmp(&s, &ref_scale, sizeof s) == 0,
         "fp8 block of %d: %d bytes differ from the reference, scale %a vs %a", len, bad,
         (double)s, (double)ref_scale);
}

static void test_fp8_quantize(test_rng_t *rng) {
  float x[INA_CAR_GRANULE];
  for (int trial = 0; trial < 3000; trial++) {
    const int len = trial % 5 == 0 ? (int)test_rng_int(rng, 1, INA_CAR_GRANULE) : INA_CAR_GRANULE;
    const double scale = ldexp(1.0, (int)test_rng_int(rng, -60, 60));
    for (int i = 0; i < len; i++) {
      double v = test_rng_normal(rng) * scale;
      if (trial % 7 == 0 && i % 13 == 0) v *= 1e-4; /* values deep in e4m3's subnormals */
      x[i] = trial % 2 ? (float)v : ina_bf16_to_f32(ina_f32_to_bf16((float)v));
    }
    check_block_against_reference(x, len);
  }
  /* Edge blocks: all zero, one non-zero, exact powers of two, the amax itself. */
  memset(x, 0, sizeof x);
  check_block_against_reference(x, INA_CAR_GRANULE);
  x[5] = -3.0f;
  check_block_against_reference(x, INA_CAR_GRANULE);
  for (int i = 0; i < INA_CAR_GRANULE; i++) x[i] = ldexpf(1.0f, (i % 40) - 20) * (i % 2 ? -1 : 1);
  check_block_against_reference(x, INA_CAR_GRANULE);
  for (int i = 0; i < INA_CAR_GRANULE; i++) x[i] = 448.0f;
  check_block_against_reference(x, INA_CAR_GRANULE);
  /* The dequantized amax element is exact: q = 448 and scale * 448 ~ amax. */
  x[0] = 1.7f;
  const float s = ina_fp8_rule_scale_inv(448.0f);
  CHECK(ina_car_quantize(448.0f, s) == 0x7E && ina_car_fp8_value(0x7E, s) == 448.0f);
}

/* ---- the model against the exact sum ----------------------------------------------------- */

/* Rank inputs as f32 (bf16-representable unless f32), with per-block magnitude spread. */
static void make_inputs(test_rng_t *rng, int mode, int nranks, size_t count, int spread,
                        float **xs, void **raw) {
  for (int r = 0; r < nranks; r++) {
    for (size_t i = 0; i < count; i++) {
      double v = test_rng_normal(rng);
      if (spread) {
        const int e = (int)(((i / INA_CAR_GRANULE) * 2654435761u + (unsigned)r * 40503u) % 41) - 20;
        v = ldexp(v, e);
        if (i % 97 == 3) v *= 300.0; /* an outlier per block pushes the rest down the scale */
        if ((i / INA_CAR_GRANULE) % 11 == 5) v = 0.0; /* an all-zero block */
      }
      if (mode == INA_CAR_MODE_F32) {
        xs[r][i] = (float)v;
        ((float *)raw[r])[i] = (float)v;
      } else {
        const uint16_t b = ina_f32_to_bf16((float)v);
        xs[r][i] = ina_bf16_to_f32(b);
        ((uint16_t *)raw[r])[i] = b;
      }
    }
  }
}

static void test_model_bounds(test_rng_t *rng) {
  double worst_fp8_ratio = 0, worst_fp8_l2 = 0, worst_coarse = 0;
  for (int trial = 0; trial < 120; trial++) {
    const int mode = trial % 3, nranks = (int)test_rng_int(rng, 1, INA_CAR_MAX_RANKS);
    const size_t count = (size_t)test_rng_int(rng, 1, trial % 10 == 0 ? 200 : 6000);
    const int spread = trial % 2;
    float *xs[INA_CAR_MAX_RANKS];
    void *raw[INA_CAR_MAX_RANKS];
    const void *craw[INA_CAR_MAX_RANKS];
    const float *cxs[INA_CAR_MAX_RANKS];
    for (int r = 0; r < nranks; r++) {
      xs[r] = malloc(count * sizeof(float));
      raw[r] = malloc(count * 4);
      craw[r] = raw[r];
      cxs[r] = xs[r];
    }
    make_inputs(rng, mode, nranks, count, spread, xs, raw);
    void *out = malloc(count * 4);
    double *sum = malloc(count * sizeof(double)), *abs_sum = malloc(count * sizeof(double));
    double *bound = malloc(count * sizeof(double)), *coarse = malloc(count * sizeof(double));
    car_model_all_reduce(mode, nranks, craw, count, out);
    car_model_exact(nranks, cxs, count, sum, abs_sum);
    long bad = 0;
    double num = 0, den = 0;
    if (mode == INA_CAR_MODE_FP8) {
      car_model_fp8_bound(nranks, cxs, count, bound);
      car_model_block_amax_sum(nranks, cxs, count, coarse);
    }
    for (size_t i = 0; i < count; i++) {
      const double o = mode == INA_CAR_MODE_F32 ? ((float *)out)[i]
                                                : ina_bf16_to_f32(((uint16_t *)out)[i]);
      const double err = fabs(o - sum[i]);
      double b = 0;
      if (mode == INA_CAR_MODE_F32) b = nranks * 0x1p-24 * abs_sum[i];
      else if (mode == INA_CAR_MODE_BF16)
        b = 0x1p-8 * fabs(sum[i]) * (1 + 0x1p-20) + nranks * 0x1p-24 * abs_sum[i];
      else {
        b = bound[i];
        if (b > 0 && err / b > worst_fp8_ratio) worst_fp8_ratio = err / b;
        if (coarse[i] > 0 && err / coarse[i] > worst_coarse) worst_coarse = err / coarse[i];
        bad += err > 2.15 * 0x1p-4 * coarse[i];
      }
      bad += !(err <= b);
      num += err * err;
      den += sum[i] * sum[i];
    }
    CHECKF(bad == 0, "mode %d ranks %d count %zu spread %d: %ld elements over the bound", mode,
           nranks, count, spread, bad);
    if (mode == INA_CAR_MODE_FP8 && den > 0) {
      const double l2 = sqrt(num / den);
      if (l2 > worst_fp8_l2) worst_fp8_l2 = l2;
      CHECKF(l2 <= 0.1, "fp8 rel L2 %g over 0.1 (ranks %d count %zu)", l2, nranks, count);
    }
    for (int r = 0; r < nranks; r++) {
      free(xs[r]);
      free(raw[r]);
    }
    free(out);
    free(sum);
    free(abs_sum);
    free(bound);
    free(coarse);
  }
  printf("fp8 model: worst err/bound %.3f, worst err/(sum of block amax) %.4f (2^-4 = %.4f), "
         "worst rel L2 %.4f\n",
         worst_fp8_ratio, worst_coarse, 0x1p-4, worst_fp8_l2);
  /* The bound is meant to be tight enough to catch a missing rounding step. */
  CHECK(worst_fp8_ratio > 0.2);
}

/* The epilogue model: the residual rounds once per add; y has unit RMS for unit weights. */
static void test_epilogue_model(test_rng_t *rng) {
  const int64_t rows = 3, cols = 256;
  uint16_t x[3 * 256], res[3 * 256], res0[3 * 256];
  float w[256];
  double y[3 * 256];
  for (int64_t i = 0; i < rows * cols; i++) {
    x[i] = ina_f32_to_bf16(test_rng_normal(rng));
    res0[i] = res[i] = ina_f32_to_bf16(4.0f * test_rng_normal(rng));
  }
  for (int64_t c = 0; c < cols; c++) w[c] = 1.0f;
  car_model_epilogue(x, rows, cols, res, w, 0.0f, y);
  long bad = 0;
  for (int64_t r = 0; r < rows; r++) {
    double ss = 0;
    for (int64_t c = 0; c < cols; c++) {
      const int64_t i = r * cols + c;
      const float want =
          ina_bf16_to_f32(ina_f32_to_bf16(ina_bf16_to_f32(res0[i]) + ina_bf16_to_f32(x[i])));
      bad += ina_bf16_to_f32(res[i]) != want;
      ss += y[i] * y[i];
    }
    bad += fabs(sqrt(ss / (double)cols) - 1.0) > 1e-12;
  }
  CHECK(bad == 0);
}

int main(void) {
  test_rng_t rng = {test_seed("test_custom_ar_plan")};
  test_layout();
  test_fp8_slots(&rng);
  test_choose();
  test_split(&rng);
  test_partition(&rng);
  test_fp8_quantize(&rng);
  test_model_bounds(&rng);
  test_epilogue_model(&rng);
  return test_finish("test_custom_ar_plan");
}
