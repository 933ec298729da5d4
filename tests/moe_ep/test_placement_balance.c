/* The expert load balancer (moe_ep/placement_balance.h) over random loads (uniform, Zipf,
 * all zero, one hot expert, sparse, huge counts) and many (layers, experts, ep, slots)
 * shapes. Every result must be a valid expert map in the documented layout, with
 * replica counts that follow the highest-load-per-replica rule, a heaviest rank that no
 * single move or swap improves, and the same output for the same input; placement_pack
 * the same for arbitrary replica counts, which also reach its make-room path. Fixed
 * cases: a packing that greedy alone gets wrong, a layer better off without replicas, a
 * hot expert that must be replicated, the rank loads of a map with replicas, uniform
 * loads that must balance exactly, and the error cases. One hot expert with half of the
 * tokens: never worse than the contiguous start-up placement, strictly better when the
 * other ranks have room for every other expert (both follow from trying no replicas
 * first, see test_hot_expert). placement_rebalance against random maps in force: a kept
 * layer is the map in force, which the plan does not beat; a replaced one is a renumbering
 * of the plan with the most replicas left in place (every renumbering tried up to ep 7);
 * no layer ends worse than a valid map in force that fits. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_ep/placement_balance.h"
#include "tests/test_util.h"

/* The same tolerance the refinement's floor allows, widened for sums in another order. */
#define LOCAL_OPT_TOL 1e-6

typedef struct shape {
  int32_t layers, experts, ep, slots;
} shape_t;

static size_t map_size(shape_t s) { return (size_t)s.layers * (size_t)s.ep * (size_t)s.slots; }

/* The loads the balancer works with: a layer that counted no token is uniform. */
static void effective_load(const uint64_t *load, int32_t experts, uint64_t *out) {
  uint64_t any = 0;
  for (int32_t e = 0; e < experts; e++) any |= load[e];
  for (int32_t e = 0; e < experts; e++) out[e] = any ? load[e] : 1;
}

static double max_of(const double *v, int32_t n) {
  double m = v[0];
  for (int32_t i = 1; i < n; i++) m = v[i] > m ? v[i] : m;
  return m;
}

/* The start-up placement: rank r holds experts [E r / ep, E (r + 1) / ep) from slot 0.
 * Needs slots >= ceil(E / ep). */
static void contiguous_layer(int32_t experts, int32_t ep, int32_t slots, int32_t *map) {
  for (int32_t r = 0; r < ep; r++) {
    int32_t n = 0;
    for (int32_t e = (int32_t)((int64_t)experts * r / ep);
         e < (int32_t)((int64_t)experts * (r + 1) / ep); e++)
      map[r * slots + n++] = e;
    while (n < slots) map[r * slots + n++] = -1;
  }
}

/* One layer's map: slots in range, each rank's experts increasing from slot 0 and then
 * only empty slots (so no expert twice on a rank), every expert placed. Fills replicas[]. */
static int check_layer_valid(shape_t s, int32_t l, const int32_t *map, int32_t *replicas) {
  int ok = 1;
  for (int32_t e = 0; e < s.experts; e++) replicas[e] = 0;
  for (int32_t r = 0; r < s.ep; r++) {
    const int32_t *row = map + (size_t)r * s.slots;
    int32_t prev = -1, empty = 0;
    for (int32_t i = 0; i < s.slots; i++) {
      const int32_t x = row[i];
      if (x == -1) {
        empty = 1;
        continue;
      }
      if (x < 0 || x >= s.experts || empty || x <= prev) {
        CHECKF(0, "layer %d rank %d slot %d: expert %d (previous %d%s) breaks the layout", l, r, i, x,
               prev, empty ? ", after an empty slot" : "");
        ok = 0;
        break;
      }
      prev = x;
      replicas[x]++;
    }
  }
  for (int32_t e = 0; e < s.experts; e++)
    if (replicas[e] < 1) {
      CHECKF(0, "layer %d: expert %d has no slot", l, e);
      ok = 0;
    }
  return ok;
}

/* Replica counts: an expert with r >= 2 got its last replica while its load per replica
 * was the highest among experts that could still take one, so w_a / (r_a - 1) >= w_b / r_b
 * for every b below ep replicas; and slots stay empty only when no expert with load could
 * take another replica. */
static void check_replica_rule(shape_t s, int32_t l, const uint64_t *w, const int32_t *replicas) {
  for (int32_t a = 0; a < s.experts; a++) {
    if (replicas[a] < 2) continue;
    for (int32_t b = 0; b < s.experts; b++)
      if (replicas[b] < s.ep)
        CHECKF((double)w[a] / (replicas[a] - 1) >= (double)w[b] / replicas[b],
               "layer %d: expert %d (load %llu, %d replicas) got a replica before expert %d (load "
               "%llu, %d replicas)",
               l, a, (unsigned long long)w[a], replicas[a], b, (unsigned long long)w[b], replicas[b]);
  }
}

/* Whether moving one replica from rank m to rank k, or swapping one of m's with one of
 * k's, would bring the heavier of the two below `top` by more than the tolerance. */
static int improvable(shape_t s, const int32_t *map, const uint64_t *w, const int32_t *replicas,
                      const double *load, int32_t m, double top) {
  const double floor = top * (1 - LOCAL_OPT_TOL);
  for (int32_t k = 0; k < s.ep; k++) {
    if (k == m) continue;
    const int32_t *on_m = map + (size_t)m * s.slots, *on_k = map + (size_t)k * s.slots;
    int32_t used_k = 0;
    while (used_k < s.slots && on_k[used_k] >= 0) used_k++;
    for (int32_t i = 0; i < s.slots && on_m[i] >= 0; i++) {
      const int32_t x = on_m[i];
      int k_has_x = 0;
      for (int32_t j = 0; j < used_k; j++) k_has_x |= on_k[j] == x;
      if (k_has_x) continue;
      const double wx = (double)w[x] / replicas[x];
      /* j == used_k stands for a free slot of k, when there is one. */
      for (int32_t j = 0; j <= used_k && j < s.slots; j++) {
        double moved = wx;
        if (j < used_k) {
          const int32_t y = on_k[j];
          int m_has_y = 0;
          for (int32_t t = 0; t < s.slots && on_m[t] >= 0; t++) m_has_y |= on_m[t] == y;
          if (m_has_y) continue;
          moved -= (double)w[y] / replicas[y];
        }
        if (moved <= 0) continue;
        if (top - moved < floor && load[k] + moved < floor) return 1;
      }
    }
  }
  return 0;
}

/* A rank at the top load that no exchange improves must exist (the refinement stops at
 * one). Returns the layer's max rank load. */
static double check_local_optimum(shape_t s, int32_t l, const int32_t *map, const uint64_t *w,
                                  const int32_t *replicas) {
  double *load = malloc((size_t)s.ep * sizeof *load);
  CHECK(placement_rank_loads(w, s.experts, s.ep, s.slots, map, load) == 0);
  const double top = max_of(load, s.ep);
  int settled = 0;
  for (int32_t m = 0; m < s.ep && !settled; m++)
    if (load[m] >= top * (1 - 1e-12)) settled = !improvable(s, map, w, replicas, load, m, top);
  CHECKF(settled,
         "layer %d (%d experts, ep %d, %d slots): the heaviest rank (load %g) can still "
         "shed load by one move or swap",
         l, s.experts, s.ep, s.slots, top);
  free(load);
  return top;
}

/* Balances, checks every property above and that a second run gives the same map.
 * `map` must hold map_size(s) entries; returns 0 when placement_balance succeeded. */
static int balance_and_check(shape_t s, const uint64_t *load, int32_t *map) {
  char error[256];
  const int rc = placement_balance(load, s.layers, s.experts, s.ep, s.slots, map, error, sizeof error);
  CHECKF(rc == 0, "placement_balance(%d layers, %d experts, ep %d, %d slots): %s", s.layers, s.experts,
         s.ep, s.slots, error);
  if (rc != 0) return -1;
  int32_t *again = malloc(map_size(s) * sizeof *again);
  CHECK(placement_balance(load, s.layers, s.experts, s.ep, s.slots, again, error, sizeof error) == 0);
  CHECKF(memcmp(map, again, map_size(s) * sizeof *map) == 0,
         "two runs on one input differ (%d experts, ep %d, %d slots)", s.experts, s.ep, s.slots);
  free(again);
  int32_t *replicas = malloc((size_t)s.experts * sizeof *replicas);
  uint64_t *w = malloc((size_t)s.experts * sizeof *w);
  for (int32_t l = 0; l < s.layers; l++) {
    const int32_t *layer_map = map + (size_t)l * s.ep * s.slots;
    if (!check_layer_valid(s, l, layer_map, replicas)) continue;
    effective_load(load + (size_t)l * s.experts, s.experts, w);
    check_replica_rule(s, l, w, replicas);
    check_local_optimum(s, l, layer_map, w, replicas);
  }
  free(replicas);
  free(w);
  return 0;
}

/* ---- random loads ----------------------------------------------------------------------- */

enum { LOAD_UNIFORM, LOAD_ZIPF, LOAD_ZERO, LOAD_HOT, LOAD_SPARSE, LOAD_HUGE, LOAD_KINDS };
static const char *const kLoadNames[LOAD_KINDS] = {"uniform", "zipf", "zero", "hot", "sparse", "huge"};

static void random_layer_load(test_rng_t *rng, int kind, int32_t experts, uint64_t *load) {
  const double zipf_s = 0.5 + 1.5 * test_rng_uniform(rng);
  const int32_t hot = (int32_t)test_rng_int(rng, 0, experts - 1);
  uint64_t others = 0;
  for (int32_t e = 0; e < experts; e++) {
    switch (kind) {
    case LOAD_UNIFORM: load[e] = (uint64_t)test_rng_int(rng, 0, 1000); break;
    case LOAD_ZIPF: /* expert e is the k-th most popular for a random k */
      load[e] = (uint64_t)(100000.0 / pow((double)test_rng_int(rng, 1, experts), zipf_s));
      break;
    case LOAD_ZERO: load[e] = 0; break;
    case LOAD_HOT: load[e] = e == hot ? 0 : (uint64_t)test_rng_int(rng, 1, 1000); break;
    case LOAD_SPARSE:
      load[e] = test_rng_uniform(rng) < 0.7 ? 0 : (uint64_t)test_rng_int(rng, 1, 50);
      break;
    default: load[e] = ((uint64_t)1 << 50) + (uint64_t)test_rng_int(rng, 0, (int64_t)1 << 40); break;
    }
    others += load[e];
  }
  if (kind == LOAD_HOT) load[hot] = others; /* half of the layer's tokens */
}

static shape_t random_shape(test_rng_t *rng) {
  shape_t s;
  s.layers = (int32_t)test_rng_int(rng, 1, 4);
  s.ep = (int32_t)test_rng_int(rng, 1, 12);
  s.experts = (int32_t)test_rng_int(rng, 1, 48);
  const int32_t least = (s.experts + s.ep - 1) / s.ep;
  /* Mostly a few spare slots per rank, as deployments have; sometimes any count. */
  s.slots = test_rng_uniform(rng) < 0.8 ? least + (int32_t)test_rng_int(rng, 0, 3)
                                        : (int32_t)test_rng_int(rng, least, s.experts);
  if (s.slots > s.experts) s.slots = s.experts;
  return s;
}

static void test_random(test_rng_t *rng) {
  int runs[LOAD_KINDS] = {0}, not_worse = 0, compared = 0;
  for (int iter = 0; iter < 3000; iter++) {
    const shape_t s = random_shape(rng);
    const int kind = iter % LOAD_KINDS;
    uint64_t *load = malloc((size_t)s.layers * s.experts * sizeof *load);
    int32_t *map = malloc(map_size(s) * sizeof *map);
    for (int32_t l = 0; l < s.layers; l++)
      random_layer_load(rng, kind, s.experts, load + (size_t)l * s.experts);
    runs[kind]++;
    if (balance_and_check(s, load, map) == 0) {
      /* Not guaranteed (greedy packing with local moves is a heuristic), so only counted:
       * how often the result is no worse than the contiguous start-up placement. */
      int32_t *contiguous = malloc((size_t)s.ep * s.slots * sizeof *contiguous);
      double *a = malloc((size_t)s.ep * sizeof *a), *b = malloc((size_t)s.ep * sizeof *b);
      contiguous_layer(s.experts, s.ep, s.slots, contiguous);
      for (int32_t l = 0; l < s.layers; l++) {
        const uint64_t *w = load + (size_t)l * s.experts;
        CHECK(placement_rank_loads(w, s.experts, s.ep, s.slots, map + (size_t)l * s.ep * s.slots, a) ==
              0);
        CHECK(placement_rank_loads(w, s.experts, s.ep, s.slots, contiguous, b) == 0);
        not_worse += max_of(a, s.ep) <= max_of(b, s.ep) * (1 + 1e-12);
        compared++;
      }
      free(contiguous);
      free(a);
      free(b);
    }
    free(load);
    free(map);
  }
  printf("random: ");
  for (int k = 0; k < LOAD_KINDS; k++)
    printf("%d %s%s", runs[k], kLoadNames[k], k + 1 < LOAD_KINDS ? ", " : "");
  printf(" inputs; max rank load no worse than contiguous in %d of %d layers\n", not_worse, compared);
}

/* ---- placement_pack: replica counts given ---------------------------------------------- */

/* Packs one layer with the given counts and checks the layout, that each expert has
 * exactly its count, the local optimum and determinism. */
static void pack_and_check(shape_t s, const uint64_t *load, const int32_t *want) {
  int32_t *map = malloc((size_t)s.ep * s.slots * sizeof *map),
          *again = malloc((size_t)s.ep * s.slots * sizeof *map);
  int32_t *got = malloc((size_t)s.experts * sizeof *got);
  uint64_t *w = malloc((size_t)s.experts * sizeof *w);
  char error[256];
  const int rc = placement_pack(load, want, s.experts, s.ep, s.slots, map, error, sizeof error);
  CHECKF(rc == 0, "placement_pack(%d experts, ep %d, %d slots): %s", s.experts, s.ep, s.slots, error);
  if (rc == 0 && check_layer_valid(s, 0, map, got)) {
    for (int32_t e = 0; e < s.experts; e++)
      CHECKF(got[e] == want[e], "expert %d: %d replicas placed, %d asked (ep %d, %d slots)", e, got[e],
             want[e], s.ep, s.slots);
    effective_load(load, s.experts, w);
    check_local_optimum(s, 0, map, w, got);
    CHECK(placement_pack(load, want, s.experts, s.ep, s.slots, again, error, sizeof error) == 0);
    CHECK(memcmp(map, again, (size_t)s.ep * s.slots * sizeof *map) == 0);
  }
  free(map);
  free(again);
  free(got);
  free(w);
}

/* Arbitrary counts (not the balancer's rule) often leave the last expert's copies with
 * free slots only on ranks that hold it already, so packing must make room. */
static void test_pack_random(test_rng_t *rng) {
  for (int iter = 0; iter < 3000; iter++) {
    shape_t s = random_shape(rng);
    s.layers = 1;
    uint64_t *load = malloc((size_t)s.experts * sizeof *load);
    int32_t *replicas = malloc((size_t)s.experts * sizeof *replicas);
    random_layer_load(rng, iter % LOAD_KINDS, s.experts, load);
    for (int32_t e = 0; e < s.experts; e++) replicas[e] = 1;
    const int64_t extra = test_rng_int(rng, 0, (int64_t)s.ep * s.slots - s.experts);
    for (int64_t i = 0, tries = 0; i < extra && tries < 100 * extra; tries++) {
      const int32_t e = (int32_t)test_rng_int(rng, 0, s.experts - 1);
      if (replicas[e] < s.ep) replicas[e]++, i++;
    }
    pack_and_check(s, load, replicas);
    free(load);
    free(replicas);
  }
  /* Loads {20, 2, 50, 0, 3, 2}, experts 3 and 5 twice, 2 ranks of 4 slots: rank 0 takes
   * 50, rank 1 fills up with 20, 3, 2 and 1 (expert 5), rank 0 takes the other copy of 5
   * and a copy of 3 (load 0); the second copy of 3 then finds free slots only on rank 0,
   * which holds 3 already. Making room moves expert 1 (2 tokens) over: 53 against 24, and
   * no placement does better (expert 2's rank holds 3 more experts, at least 0 + 1 + 2). */
  const shape_t s = {1, 6, 2, 4};
  const uint64_t load[6] = {20, 2, 50, 0, 3, 2};
  const int32_t replicas[6] = {1, 1, 1, 2, 1, 2};
  pack_and_check(s, load, replicas);
  int32_t map[8];
  double r[2];
  CHECK(placement_pack(load, replicas, 6, 2, 4, map, NULL, 0) == 0);
  CHECK(placement_rank_loads(load, 6, 2, 4, map, r) == 0);
  CHECKF(r[0] == 53 && r[1] == 24, "rank loads %g and %g, want 53 and 24", r[0], r[1]);
}

/* ---- placement_rebalance: relative to the map in force ---------------------------------- */

/* Valid for the agent, in any slot order: experts in range, none twice on a rank, all placed. */
static int layer_valid_any_order(int32_t experts, int32_t ep, int32_t slots, const int32_t *map) {
  unsigned char *holds = calloc((size_t)ep * experts, 1);
  int ok = 1;
  for (int32_t r = 0; r < ep && ok; r++)
    for (int32_t i = 0; i < slots && ok; i++) {
      const int32_t x = map[r * slots + i];
      if (x < -1 || x >= experts || (x >= 0 && holds[r * experts + x]++)) ok = 0;
    }
  for (int32_t e = 0; e < experts && ok; e++) {
    int placed = 0;
    for (int32_t r = 0; r < ep; r++) placed |= holds[r * experts + e];
    ok = placed;
  }
  free(holds);
  return ok;
}

/* Replicas of planned rank p (on rank perm[p], or p when perm is NULL) whose expert that
 * rank holds in `now`. */
static int64_t overlap_of(int32_t ep, int32_t slots, const int32_t *plan, int32_t now_slots,
                          const int32_t *now, const int32_t *perm) {
  int64_t common = 0;
  for (int32_t p = 0; p < ep; p++) {
    const int32_t r = perm ? perm[p] : p;
    for (int32_t i = 0; i < slots; i++)
      for (int32_t j = 0; j < now_slots && plan[p * slots + i] >= 0; j++)
        common += plan[p * slots + i] == now[r * now_slots + j];
  }
  return common;
}

/* The largest overlap over every renumbering of the planned ranks (ep <= 7). */
static int64_t best_overlap(int32_t ep, int32_t slots, const int32_t *plan, int32_t now_slots,
                            const int32_t *now) {
  int32_t perm[8], c[8] = {0};
  for (int32_t i = 0; i < ep; i++) perm[i] = i;
  int64_t best = overlap_of(ep, slots, plan, now_slots, now, perm);
  /* Heap's algorithm: every permutation once. */
  for (int32_t i = 1; i < ep;) {
    if (c[i] < i) {
      const int32_t j = i % 2 ? c[i] : 0, t = perm[j];
      perm[j] = perm[i];
      perm[i] = t;
      const int64_t o = overlap_of(ep, slots, plan, now_slots, now, perm);
      best = o > best ? o : best;
      c[i]++;
      i = 1;
    } else {
      c[i++] = 0;
    }
  }
  return best;
}

/* Whether out's rows are fresh's rows in some order. */
static int same_rows(int32_t ep, int32_t slots, const int32_t *out, const int32_t *fresh) {
  unsigned char *taken = calloc((size_t)ep, 1);
  int ok = 1;
  for (int32_t r = 0; r < ep && ok; r++) {
    int32_t p = 0;
    while (p < ep &&
           (taken[p] || memcmp(out + r * slots, fresh + p * slots, (size_t)slots * sizeof *out)))
      p++;
    if (p == ep)
      ok = 0;
    else
      taken[p] = 1;
  }
  free(taken);
  return ok;
}

static double layer_max(const uint64_t *w, int32_t experts, int32_t ep, int32_t slots,
                        const int32_t *map) {
  double *r = malloc((size_t)ep * sizeof *r), m = -1;
  if (placement_rank_loads(w, experts, ep, slots, map, r) == 0) m = max_of(r, ep);
  free(r);
  return m; /* -1: a loaded expert has no slot */
}

/* A random map in force with now_slots slots: a balanced map for other loads, its ranks
 * and slots shuffled; now and then a layer missing an expert, which must be replaced. */
static void random_in_force(test_rng_t *rng, shape_t s, int32_t now_slots, int32_t *now) {
  const shape_t ns = {s.layers, s.experts, s.ep, now_slots};
  uint64_t *load = malloc((size_t)s.layers * s.experts * sizeof *load);
  for (int32_t l = 0; l < s.layers; l++)
    random_layer_load(rng, (int)test_rng_int(rng, 0, LOAD_KINDS - 1), s.experts,
                      load + (size_t)l * s.experts);
  char error[200];
  CHECK(placement_balance(load, ns.layers, ns.experts, ns.ep, ns.slots, now, error, sizeof error) == 0);
  for (int32_t l = 0; l < s.layers; l++) {
    int32_t *layer = now + (size_t)l * s.ep * now_slots;
    for (int32_t r = s.ep - 1; r > 0; r--) { /* swap whole ranks */
      const int32_t q = (int32_t)test_rng_int(rng, 0, r);
      for (int32_t i = 0; i < now_slots; i++) {
        const int32_t t = layer[r * now_slots + i];
        layer[r * now_slots + i] = layer[q * now_slots + i];
        layer[q * now_slots + i] = t;
      }
    }
    for (int32_t r = 0; r < s.ep; r++)
      for (int32_t i = now_slots - 1; i > 0; i--) {
        const int32_t j = (int32_t)test_rng_int(rng, 0, i), t = layer[r * now_slots + i];
        layer[r * now_slots + i] = layer[r * now_slots + j];
        layer[r * now_slots + j] = t;
      }
    if (test_rng_uniform(rng) < 0.1) { /* drop every replica of one expert */
      const int32_t gone = (int32_t)test_rng_int(rng, 0, s.experts - 1);
      for (int32_t i = 0; i < s.ep * now_slots; i++)
        if (layer[i] == gone) layer[i] = -1;
    }
  }
  free(load);
}

static void test_rebalance_random(test_rng_t *rng) {
  int kept_layers = 0, layers = 0;
  for (int iter = 0; iter < 1500; iter++) {
    const shape_t s = random_shape(rng);
    const int32_t least = (s.experts + s.ep - 1) / s.ep;
    const int32_t now_slots =
        (int32_t)test_rng_int(rng, least, s.slots + 1 < s.experts ? s.slots + 1 : s.experts);
    uint64_t *load = malloc((size_t)s.layers * s.experts * sizeof *load),
             *w = malloc((size_t)s.experts * sizeof *w);
    int32_t *now = malloc((size_t)s.layers * s.ep * now_slots * sizeof *now);
    int32_t *out = malloc(map_size(s) * sizeof *out), *again = malloc(map_size(s) * sizeof *out);
    int32_t *fresh = malloc(map_size(s) * sizeof *out);
    unsigned char *kept = malloc((size_t)s.layers);
    random_in_force(rng, s, now_slots, now);
    for (int32_t l = 0; l < s.layers; l++)
      random_layer_load(rng, iter % LOAD_KINDS, s.experts, load + (size_t)l * s.experts);
    char error[256];
    int rc = placement_rebalance(load, now, now_slots, s.layers, s.experts, s.ep, s.slots, out, kept,
                                 error, sizeof error);
    CHECKF(rc == 0, "placement_rebalance: %s", error);
    CHECK(placement_balance(load, s.layers, s.experts, s.ep, s.slots, fresh, error, sizeof error) == 0);
    CHECK(placement_rebalance(load, now, now_slots, s.layers, s.experts, s.ep, s.slots, again, NULL,
                              error, sizeof error) == 0);
    CHECK(rc != 0 || memcmp(out, again, map_size(s) * sizeof *out) == 0);
    for (int32_t l = 0; l < s.layers && rc == 0; l++) {
      const int32_t *o = out + (size_t)l * s.ep * s.slots, *f = fresh + (size_t)l * s.ep * s.slots;
      const int32_t *n = now + (size_t)l * s.ep * now_slots;
      effective_load(load + (size_t)l * s.experts, s.experts, w);
      const int now_valid = layer_valid_any_order(s.experts, s.ep, now_slots, n);
      const double now_max = layer_max(w, s.experts, s.ep, now_slots, n);
      const double fresh_max = layer_max(w, s.experts, s.ep, s.slots, f);
      layers++;
      kept_layers += kept[l];
      CHECKF(layer_valid_any_order(s.experts, s.ep, s.slots, o), "rebalanced layer %d is not valid", l);
      if (kept[l]) {
        CHECK(now_valid && now_slots <= s.slots);
        CHECKF(fresh_max >= now_max * (1 - 1e-6), "layer %d kept at %g though the plan reaches %g", l,
               now_max, fresh_max);
        for (int32_t r = 0; r < s.ep; r++)
          for (int32_t i = 0; i < s.slots; i++)
            CHECK(o[r * s.slots + i] == (i < now_slots ? n[r * now_slots + i] : -1));
      } else {
        CHECKF(same_rows(s.ep, s.slots, o, f), "layer %d: not a renumbering of the plan", l);
        if (now_valid && now_slots <= s.slots)
          CHECKF(fresh_max < now_max * (1 + 1e-6), "layer %d replaced at %g by a plan at %g", l,
                 now_max, fresh_max);
        const int64_t got = overlap_of(s.ep, s.slots, o, now_slots, n, NULL);
        CHECKF(got >= overlap_of(s.ep, s.slots, f, now_slots, n, NULL),
               "layer %d: renumbering lost overlap", l);
        if (s.ep <= 7)
          CHECKF(got == best_overlap(s.ep, s.slots, f, now_slots, n),
                 "layer %d (ep %d): overlap %lld, the best renumbering has %lld", l, s.ep,
                 (long long)got, (long long)best_overlap(s.ep, s.slots, f, now_slots, n));
      }
      /* Never worse than the map in force, when that map is valid and fits. */
      if (now_valid && now_slots <= s.slots)
        CHECKF(layer_max(w, s.experts, s.ep, s.slots, o) <= now_max * (1 + 1e-9),
               "layer %d: %g after, %g before", l, layer_max(w, s.experts, s.ep, s.slots, o), now_max);
    }
    free(load);
    free(w);
    free(now);
    free(out);
    free(again);
    free(fresh);
    free(kept);
  }
  printf("rebalance: %d of %d layers kept their map in force\n", kept_layers, layers);
}

/* One rank: every map has max/mean 1, so the map in force stays, slot order and all. */
static void test_rebalance_keeps_one_rank(void) {
  const uint64_t load[8] = {5, 0, 9, 1, 1, 30, 2, 8};
  const int32_t now[8] = {3, 7, 0, 5, 1, 6, 2, 4};
  int32_t out[8];
  unsigned char kept = 0;
  CHECK(placement_rebalance(load, now, 8, 1, 8, 1, 8, out, &kept, NULL, 0) == 0);
  CHECK(kept == 1 && memcmp(out, now, sizeof now) == 0);
}

static void test_rebalance_errors(void) {
  const uint64_t load[16] = {0};
  int32_t now[16] = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7}, out[16];
  char error[200] = "";
  CHECK(placement_rebalance(load, now, 0, 1, 8, 1, 8, out, NULL, error, sizeof error) == -1 &&
        strstr(error, "slots_per_rank 0 is outside [1, 8]"));
  CHECK(placement_rebalance(load, now, 9, 1, 8, 1, 8, out, NULL, error, sizeof error) == -1 &&
        strstr(error, "slots_per_rank 9 is outside [1, 8]"));
  CHECK(placement_rebalance(load, now, 8, 1, 8, 1, 9, out, NULL, error, sizeof error) == -1 &&
        strstr(error, "slots_per_rank 9 exceeds the 8 experts"));
  now[13] = 8;
  CHECK(placement_rebalance(load, now, 8, 2, 8, 1, 8, out, NULL, error, sizeof error) == -1 &&
        strstr(error, "layer 1 rank 0 slot 5 holds expert 8, outside [0, 8)"));
}

/* ---- fixed cases ------------------------------------------------------------------------ */

/* Loads {3, 3, 2, 2, 2, 0} on 2 ranks of 3 slots: heaviest-first greedy packing gives
 * {3, 2, 2} and {3, 2, 0} (7 and 5); one swap reaches the optimum 6 and 6. */
static void test_refinement_fixes_greedy(void) {
  const shape_t s = {1, 6, 2, 3};
  const uint64_t load[6] = {3, 3, 2, 2, 2, 0};
  int32_t map[6];
  double rank_load[2];
  if (balance_and_check(s, load, map) != 0) return;
  CHECK(placement_rank_loads(load, 6, 2, 3, map, rank_load) == 0);
  CHECKF(rank_load[0] == 6 && rank_load[1] == 6, "rank loads %g and %g, want 6 and 6", rank_load[0],
         rank_load[1]);
}

/* Loads {78, 2278, 838, 618, 744} on 2 ranks of 4 slots: replicating the hot expert 1
 * (and then 2 and 4) splits each over both ranks and leaves 618 and 78 to even them out:
 * 2548 at best. Without replicas, 2278 alone against the other four is perfect. */
static void test_fewer_replicas_win(void) {
  const shape_t s = {1, 5, 2, 4};
  const uint64_t load[5] = {78, 2278, 838, 618, 744};
  int32_t map[8];
  double r[2];
  if (balance_and_check(s, load, map) != 0) return;
  CHECK(placement_rank_loads(load, 5, 2, 4, map, r) == 0);
  CHECKF(r[0] == 2278 && r[1] == 2278, "rank loads %g and %g, want 2278 and 2278", r[0], r[1]);
  int used = 0;
  for (int i = 0; i < 8; i++) used += map[i] >= 0;
  CHECKF(used == 5, "%d slots used, want 5 (no replica)", used);
}

/* Expert 0 with 700 tokens, seven others with 100, on 4 ranks of 3 slots: one copy leaves
 * 700 on its rank; 2, 3 and 4 copies give 450, 433 and 375, and a fifth extra replica
 * (of expert 1) gains nothing, so 4 copies and 375. */
static void test_hot_expert_replicated(void) {
  const shape_t s = {1, 8, 4, 3};
  const uint64_t load[8] = {700, 100, 100, 100, 100, 100, 100, 100};
  int32_t map[12];
  double r[4];
  if (balance_and_check(s, load, map) != 0) return;
  int copies = 0, used = 0;
  for (int i = 0; i < 12; i++) {
    copies += map[i] == 0;
    used += map[i] >= 0;
  }
  CHECKF(copies == 4 && used == 11, "expert 0 has %d replicas, %d slots used; want 4 and 11", copies,
         used);
  CHECK(placement_rank_loads(load, 8, 4, 3, map, r) == 0);
  CHECKF(max_of(r, 4) == 375, "max rank load %g, want 375", max_of(r, 4));
}

static void test_rank_loads(void) {
  /* Expert 0 on both ranks: 10 tokens split 5 and 5. */
  const uint64_t load[3] = {10, 4, 6};
  const int32_t map[4] = {0, 1, 0, 2};
  double r[2];
  CHECK(placement_rank_loads(load, 3, 2, 2, map, r) == 0);
  CHECKF(r[0] == 9 && r[1] == 11, "rank loads %g, %g; want 9, 11", r[0], r[1]);
  const int32_t lost[4] = {0, 1, 0, -1};      /* expert 2 (6 tokens) has no slot */
  const int32_t outside[4] = {0, 1, 3, 2};    /* expert 3 does not exist */
  const int32_t idle_lost[4] = {0, 2, 0, -1}; /* expert 1 has no slot: fine without tokens */
  const uint64_t idle1[3] = {10, 0, 6};
  CHECK(placement_rank_loads(load, 3, 2, 2, lost, r) == -1);
  CHECK(placement_rank_loads(load, 3, 2, 2, outside, r) == -1);
  CHECK(placement_rank_loads(idle1, 3, 2, 2, idle_lost, r) == 0);
  CHECKF(r[0] == 11 && r[1] == 5, "rank loads %g, %g; want 11, 5", r[0], r[1]);
}

/* One expert carrying half of the tokens L, others >= 1 token each, >= 2 experts per
 * contiguous rank. The trial without extra replicas packs the hot expert alone onto rank
 * 0 (load L / 2) and the others, heaviest first, onto the other ranks until they are
 * full: rank 0 ends with L / 2 plus the n0 = E - 1 - (ep - 1) S smallest others (when
 * positive), every other rank with at most L / 2. The contiguous placement's hot rank
 * carries L / 2 plus at least max(1, n0) others. The balancer keeps the best trial and
 * refining never raises the max, so its max rank load is <= the contiguous one's, and
 * strictly lower when n0 <= 0. Whether the hot expert is replicated is counted only:
 * on 2 ranks a single copy can balance perfectly. */
static void test_hot_expert(test_rng_t *rng) {
  int strict = 0, replicated = 0;
  const int iters = 600;
  for (int iter = 0; iter < iters; iter++) {
    shape_t s;
    s.layers = 1;
    s.ep = (int32_t)test_rng_int(rng, 2, 12);
    s.experts = (int32_t)test_rng_int(rng, 2 * s.ep, 64);
    const int32_t least = (s.experts + s.ep - 1) / s.ep;
    s.slots = least + (int32_t)test_rng_int(rng, (int64_t)s.ep * least > s.experts ? 0 : 1, 2);
    if (s.slots > s.experts) s.slots = s.experts;
    uint64_t *load = malloc((size_t)s.experts * sizeof *load);
    int32_t *map = malloc(map_size(s) * sizeof *map), *contiguous = malloc(map_size(s) * sizeof *map);
    double *a = malloc((size_t)s.ep * sizeof *a), *b = malloc((size_t)s.ep * sizeof *b);
    random_layer_load(rng, LOAD_HOT, s.experts, load);
    int32_t hot = 0;
    for (int32_t e = 1; e < s.experts; e++) hot = load[e] > load[hot] ? e : hot;
    if (balance_and_check(s, load, map) == 0) {
      int32_t copies = 0;
      for (size_t i = 0; i < map_size(s); i++) copies += map[i] == hot;
      replicated += copies >= 2;
      contiguous_layer(s.experts, s.ep, s.slots, contiguous);
      CHECK(placement_rank_loads(load, s.experts, s.ep, s.slots, map, a) == 0);
      CHECK(placement_rank_loads(load, s.experts, s.ep, s.slots, contiguous, b) == 0);
      const double balanced = max_of(a, s.ep), start = max_of(b, s.ep);
      if ((int64_t)(s.ep - 1) * s.slots >= s.experts - 1) {
        strict++;
        CHECKF(balanced < start,
               "hot expert %d of %d (ep %d, %d slots): max rank load %g, contiguous %g", hot, s.experts,
               s.ep, s.slots, balanced, start);
      } else {
        CHECKF(balanced <= start * (1 + 1e-12),
               "hot expert %d of %d (ep %d, %d slots): max rank load %g, contiguous %g", hot, s.experts,
               s.ep, s.slots, balanced, start);
      }
    }
    free(load);
    free(map);
    free(contiguous);
    free(a);
    free(b);
  }
  printf(
      "hot expert: %d layers (%d where strictly better is guaranteed); hot expert replicated in %d\n",
      iters, strict, replicated);
}

/* Equal loads with experts filling the slots exactly: every rank gets the same load. */
static void test_uniform_exact(test_rng_t *rng) {
  for (int iter = 0; iter < 200; iter++) {
    shape_t s = {(int32_t)test_rng_int(rng, 1, 3), 0, (int32_t)test_rng_int(rng, 1, 16),
                 (int32_t)test_rng_int(rng, 1, 12)};
    s.experts = s.ep * s.slots;
    const uint64_t each = (uint64_t)test_rng_int(rng, iter % 2 ? 0 : 1, 1000); /* 0: all-zero layers */
    uint64_t *load = malloc((size_t)s.layers * s.experts * sizeof *load);
    int32_t *map = malloc(map_size(s) * sizeof *map);
    double *r = malloc((size_t)s.ep * sizeof *r);
    for (size_t i = 0; i < (size_t)s.layers * s.experts; i++) load[i] = each;
    if (balance_and_check(s, load, map) == 0)
      for (int32_t l = 0; l < s.layers; l++) {
        uint64_t w[1024];
        effective_load(load + (size_t)l * s.experts, s.experts, w);
        CHECK(placement_rank_loads(w, s.experts, s.ep, s.slots, map + (size_t)l * s.ep * s.slots, r) ==
              0);
        for (int32_t k = 0; k < s.ep; k++)
          CHECKF(r[k] == (double)w[0] * s.slots, "%d experts x %llu tokens on ep %d: rank %d load %g",
                 s.experts, (unsigned long long)w[0], s.ep, k, r[k]);
      }
    free(load);
    free(map);
    free(r);
  }
}

static void expect_error(const char *what, int32_t layers, int32_t experts, int32_t ep, int32_t slots,
                         const char *want) {
  uint64_t load[64] = {0};
  int32_t map[64];
  char error[200] = "";
  const int rc = placement_balance(load, layers, experts, ep, slots, map, error, sizeof error);
  CHECKF(rc == -1 && strstr(error, want), "%s: rc %d, error '%s' (want one holding '%s')", what, rc,
         error, want);
}

static void test_errors(void) {
  expect_error("no layers", 0, 8, 1, 8, "layers 0");
  expect_error("no experts", 1, 0, 1, 1, "experts 0");
  expect_error("no ranks", 1, 8, 0, 8, "ep 0");
  expect_error("no slots", 1, 8, 1, 0, "slots_per_rank 0");
  expect_error("negative experts", 1, -3, 1, 1, "experts -3");
  expect_error("too few slots", 2, 8, 3, 2,
               "ep 3 x slots_per_rank 2 = 6 slots cannot hold the 8 experts");
  expect_error("too few slots, one rank", 1, 8, 1, 7, "7 slots cannot hold the 8 experts");
  expect_error("more slots than experts", 1, 8, 1, 9, "slots_per_rank 9 exceeds the 8 experts");
  expect_error("overflowing sizes", 1, 8, INT32_MAX, 2, "too large");
  /* A short buffer still gets a terminated prefix; none at all is allowed. */
  uint64_t load[8] = {0};
  int32_t map[8];
  char small[8];
  memset(small, 'x', sizeof small);
  CHECK(placement_balance(load, 1, 8, 1, 9, map, small, sizeof small) == -1);
  CHECK(memchr(small, '\0', sizeof small) != NULL);
  CHECK(placement_balance(load, 1, 8, 1, 9, map, NULL, 0) == -1);
  /* placement_pack: counts outside [1, ep] or more replicas than slots. */
  const int32_t none[3] = {1, 0, 1}, too_many[3] = {1, 3, 1}, crowded[3] = {2, 2, 1};
  char error[200] = "";
  CHECK(placement_pack(load, none, 3, 2, 2, map, error, sizeof error) == -1 &&
        strstr(error, "expert 1: 0 replicas"));
  CHECK(placement_pack(load, too_many, 3, 2, 2, map, error, sizeof error) == -1 &&
        strstr(error, "expert 1: 3 replicas, outside [1, ep 2]"));
  CHECK(placement_pack(load, crowded, 3, 2, 2, map, error, sizeof error) == -1 &&
        strstr(error, "5 replicas exceed ep 2 x slots_per_rank 2"));
  CHECK(placement_pack(load, none, 3, 1, 2, map, error, sizeof error) == -1 &&
        strstr(error, "cannot hold the 3 experts"));
}

int main(void) {
  test_rng_t rng = {test_seed("test_placement_balance")};
  test_errors();
  test_rank_loads();
  test_refinement_fixes_greedy();
  test_fewer_replicas_win();
  test_hot_expert_replicated();
  test_rebalance_keeps_one_rank();
  test_rebalance_errors();
  test_uniform_exact(&rng);
  test_hot_expert(&rng);
  test_random(&rng);
  test_pack_random(&rng);
  test_rebalance_random(&rng);
  return test_finish("test_placement_balance");
}
