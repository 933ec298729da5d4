/* The expert load balancer (moe_ep/placement_balance.h): replica counts, greedy packing
 * and a local refinement, one MoE layer at a time. */
#include "moe_ep/placement_balance.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An exchange must lower the heavier rank of its pair by at least this fraction of the
 * heaviest load: smaller gains are rounding noise of the sums, not worth moving weights
 * for, and the floor makes every exchange a real step down so the refinement ends. A
 * trial with more replicas must beat one with fewer by as much to be preferred. */
#define MIN_GAIN 1e-9

/* Counts of extra replicas tried per layer: every count up to this many, else this many
 * steps evenly spread from none to all. */
#define REPLICA_TRIALS 64

/* Candidate exchanges the refinement may examine per packing. Real shapes (hundreds of
 * experts, a few spare slots per rank) converge in a small fraction of it; the budget
 * only bounds the time of shapes with very many slots per rank. */
#define REFINE_BUDGET ((int64_t)1 << 22)

/* An expert and its load per replica, the key that orders the packing. */
typedef struct keyed {
  double per_replica;
  int32_t expert;
} keyed_t;

/* One layer's working state. A rank's replicas are held[r * slots .. + count[r]) in no
 * particular order; holds[r * experts + e] says whether rank r has a replica of e. */
typedef struct balancer {
  int32_t experts, ep, slots;
  double *weight;       /* [experts] load of each expert as balanced */
  int32_t *replicas;    /* [experts] replica count of each expert */
  keyed_t *by_load;     /* [experts] experts by load per replica, heaviest first */
  int32_t *extra;       /* [ep * slots - experts + 1] who gets each extra replica, in turn */
  int32_t n_extra;      /* entries of extra[] (fewer when the rest would carry nothing) */
  double *rank_load;    /* [ep] sum of the loads per replica a rank holds */
  int32_t *count;       /* [ep] replicas a rank holds */
  int32_t *held;        /* [ep * slots] */
  unsigned char *holds; /* [ep * experts] */
} balancer_t;

__attribute__((format(printf, 3, 4))) static int fail(char *error, size_t error_size, const char *fmt,
                                                      ...) {
  if (error_size > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error, error_size, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* The size checks both entry points share; 0 when the shape can be balanced. */
static int check_shape(int32_t layers, int32_t experts, int32_t ep, int32_t slots_per_rank, char *error,
                       size_t error_size) {
  if (layers < 1 || experts < 1 || ep < 1 || slots_per_rank < 1)
    return fail(error, error_size,
                "layers %d, experts %d, ep %d and slots_per_rank %d must each be at least 1", layers,
                experts, ep, slots_per_rank);
  const int64_t slots = (int64_t)ep * slots_per_rank;
  if (slots > INT32_MAX || (int64_t)ep * experts > INT32_MAX ||
      (uint64_t)slots * (uint64_t)layers > SIZE_MAX / sizeof(int32_t))
    return fail(error, error_size, "%d layers x ep %d x slots_per_rank %d (and %d experts): too large",
                layers, ep, slots_per_rank, experts);
  if (slots < experts)
    return fail(error, error_size,
                "ep %d x slots_per_rank %d = %lld slots cannot hold the %d experts (each needs one)",
                ep, slots_per_rank, (long long)slots, experts);
  if (slots_per_rank > experts)
    return fail(error, error_size,
                "slots_per_rank %d exceeds the %d experts (a rank holds each expert at most once)",
                slots_per_rank, experts);
  return 0;
}

static void balancer_free(balancer_t *b) {
  free(b->weight);
  free(b->replicas);
  free(b->by_load);
  free(b->extra);
  free(b->rank_load);
  free(b->count);
  free(b->held);
  free(b->holds);
}

static int balancer_init(balancer_t *b, int32_t experts, int32_t ep, int32_t slots, char *error,
                         size_t error_size) {
  const size_t total = (size_t)ep * (size_t)slots;
  *b = (balancer_t){experts, ep, slots, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL};
  b->weight = malloc((size_t)experts * sizeof *b->weight);
  b->replicas = malloc((size_t)experts * sizeof *b->replicas);
  b->by_load = malloc((size_t)experts * sizeof *b->by_load);
  b->extra = malloc((total - (size_t)experts + 1) * sizeof *b->extra);
  b->rank_load = malloc((size_t)ep * sizeof *b->rank_load);
  b->count = malloc((size_t)ep * sizeof *b->count);
  b->held = malloc(total * sizeof *b->held);
  b->holds = malloc((size_t)ep * (size_t)experts);
  if (b->weight && b->replicas && b->by_load && b->extra && b->rank_load && b->count && b->held &&
      b->holds)
    return 0;
  balancer_free(b);
  return fail(error, error_size, "out of memory for a layer of %d experts over %zu slots", experts,
              total);
}

static double per_replica(const balancer_t *b, int32_t e) { return b->weight[e] / b->replicas[e]; }

/* weight[] from one layer's counts: uniform when the layer counted no token. */
static void set_weights(balancer_t *b, const uint64_t *load) {
  uint64_t any = 0;
  for (int32_t e = 0; e < b->experts; e++) any |= load[e];
  for (int32_t e = 0; e < b->experts; e++) b->weight[e] = any == 0 ? 1.0 : (double)load[e];
}

/* ---- 1. replica counts ------------------------------------------------------------------ */

/* The order in which spare slots become replicas: each to the expert with the highest load
 * per replica (ties: the lower index) among those that may have another (fewer than ep
 * replicas, load > 0). */
static void order_extra_replicas(balancer_t *b) {
  for (int32_t e = 0; e < b->experts; e++) b->replicas[e] = 1;
  const int32_t spare = b->ep * b->slots - b->experts;
  for (b->n_extra = 0; b->n_extra < spare; b->n_extra++) {
    int32_t best = -1;
    for (int32_t e = 0; e < b->experts; e++)
      if (b->replicas[e] < b->ep && b->weight[e] > 0 &&
          (best < 0 || per_replica(b, e) > per_replica(b, best)))
        best = e;
    if (best < 0) break;
    b->replicas[best]++;
    b->extra[b->n_extra] = best;
  }
}

/* replicas[] of the trial with the first n extra replicas. */
static void take_extra_replicas(balancer_t *b, int32_t n) {
  for (int32_t e = 0; e < b->experts; e++) b->replicas[e] = 1;
  for (int32_t i = 0; i < n; i++) b->replicas[b->extra[i]]++;
}

/* ---- 2. packing ------------------------------------------------------------------------- */

/* Heaviest per replica first; equal loads by increasing expert index. */
static int heavier_first(const void *a, const void *b) {
  const keyed_t *x = a, *y = b;
  if (x->per_replica != y->per_replica) return x->per_replica > y->per_replica ? -1 : 1;
  return (x->expert > y->expert) - (x->expert < y->expert);
}

static void sort_by_load(balancer_t *b) {
  for (int32_t e = 0; e < b->experts; e++) b->by_load[e] = (keyed_t){per_replica(b, e), e};
  qsort(b->by_load, (size_t)b->experts, sizeof *b->by_load, heavier_first);
}

/* A rank's load summed afresh from its replicas, so that no rounding drift accumulates
 * over the moves. */
static void sum_rank(balancer_t *b, int32_t r) {
  double sum = 0;
  for (int32_t i = 0; i < b->count[r]; i++) sum += per_replica(b, b->held[(size_t)r * b->slots + i]);
  b->rank_load[r] = sum;
}

static void add_replica(balancer_t *b, int32_t r, int32_t e) {
  b->held[(size_t)r * b->slots + b->count[r]++] = e;
  b->holds[(size_t)r * b->experts + e] = 1;
  sum_rank(b, r);
}

/* Removes the replica at position i of rank r (the rank's last one takes its place). */
static void remove_replica(balancer_t *b, int32_t r, int32_t i) {
  int32_t *h = b->held + (size_t)r * b->slots;
  b->holds[(size_t)r * b->experts + h[i]] = 0;
  h[i] = h[--b->count[r]];
  sum_rank(b, r);
}

static int rank_holds(const balancer_t *b, int32_t r, int32_t e) {
  return b->holds[(size_t)r * b->experts + e];
}

/* Every rank with a free slot already holds expert x: moves a replica y from a full rank j
 * lacking x into a free slot of a rank k lacking y, choosing the move that leaves the
 * heavier of j (after x joins it) and k lightest, and returns j. Such a move exists while
 * x still lacks a replica: x has fewer than ep, so some rank j lacks it and, having no free
 * slot, holds `slots` experts; a rank k with a free slot holds x and at most slots - 2
 * others, so one of j's experts is missing on k. */
static int32_t make_room(balancer_t *b, int32_t x) {
  int32_t best_j = -1, best_k = -1, best_i = -1;
  double best_max = 0;
  for (int32_t j = 0; j < b->ep; j++) {
    if (b->count[j] < b->slots || rank_holds(b, j, x)) continue;
    for (int32_t k = 0; k < b->ep; k++) {
      if (b->count[k] == b->slots) continue;
      for (int32_t i = 0; i < b->count[j]; i++) {
        const int32_t y = b->held[(size_t)j * b->slots + i];
        if (rank_holds(b, k, y)) continue;
        const double wy = per_replica(b, y), load_j = b->rank_load[j] - wy + per_replica(b, x),
                     load_k = b->rank_load[k] + wy, m = load_j > load_k ? load_j : load_k;
        if (best_j < 0 || m < best_max) {
          best_j = j, best_k = k, best_i = i;
          best_max = m;
        }
      }
    }
  }
  const int32_t y = b->held[(size_t)best_j * b->slots + best_i];
  remove_replica(b, best_j, best_i);
  add_replica(b, best_k, y);
  return best_j;
}

/* Replicas from the heaviest onto the least loaded rank that may take them. Needs
 * replicas[e] in [1, ep] and their sum at most ep * slots. */
static void pack(balancer_t *b) {
  memset(b->count, 0, (size_t)b->ep * sizeof *b->count);
  memset(b->holds, 0, (size_t)b->ep * (size_t)b->experts);
  for (int32_t r = 0; r < b->ep; r++) b->rank_load[r] = 0;
  for (int32_t o = 0; o < b->experts; o++) {
    const int32_t x = b->by_load[o].expert;
    for (int32_t copy = 0; copy < b->replicas[x]; copy++) {
      int32_t to = -1;
      for (int32_t r = 0; r < b->ep; r++)
        if (b->count[r] < b->slots && !rank_holds(b, r, x) &&
            (to < 0 || b->rank_load[r] < b->rank_load[to]))
          to = r;
      add_replica(b, to >= 0 ? to : make_room(b, x), x);
    }
  }
}

/* ---- 3. refinement ---------------------------------------------------------------------- */

/* Moving replica i of the heaviest rank to rank k (into a free slot when j < 0, else in
 * exchange for k's replica j), and the heavier of the two ranks afterwards. */
typedef struct exchange {
  int32_t k, i, j;
  double new_max;
} exchange_t;

static void consider(exchange_t *best, double top, double load_k, double moved, int32_t k, int32_t i,
                     int32_t j) {
  if (moved <= 0) return;
  const double a = top - moved, c = load_k + moved, m = a > c ? a : c;
  if (m < best->new_max) *best = (exchange_t){k, i, j, m};
}

static int32_t heaviest_rank(const balancer_t *b) {
  int32_t m = 0;
  for (int32_t r = 1; r < b->ep; r++)
    if (b->rank_load[r] > b->rank_load[m]) m = r;
  return m;
}

static void refine(balancer_t *b) {
  int64_t budget = REFINE_BUDGET;
  while (budget > 0) {
    const int32_t m = heaviest_rank(b);
    const double top = b->rank_load[m];
    const int32_t *on_m = b->held + (size_t)m * b->slots;
    exchange_t best = {-1, -1, -1, top - MIN_GAIN * top};
    for (int32_t k = 0; k < b->ep; k++) {
      if (k == m || b->rank_load[k] >= top) continue;
      const int32_t *on_k = b->held + (size_t)k * b->slots;
      for (int32_t i = 0; i < b->count[m]; i++) {
        const int32_t x = on_m[i];
        if (rank_holds(b, k, x)) continue;
        const double wx = per_replica(b, x);
        if (b->count[k] < b->slots) consider(&best, top, b->rank_load[k], wx, k, i, -1);
        for (int32_t j = 0; j < b->count[k]; j++)
          if (!rank_holds(b, m, on_k[j]))
            consider(&best, top, b->rank_load[k], wx - per_replica(b, on_k[j]), k, i, j);
        budget -= b->count[k] + 1;
      }
    }
    if (best.k < 0) return;
    const int32_t x = on_m[best.i];
    remove_replica(b, m, best.i);
    if (best.j >= 0) {
      const int32_t y = b->held[(size_t)best.k * b->slots + best.j];
      remove_replica(b, best.k, best.j);
      add_replica(b, m, y);
    }
    add_replica(b, best.k, x);
  }
}

/* ---- the layer's map -------------------------------------------------------------------- */

/* Packs and refines the replicas[] of b; returns the max rank load. */
static double pack_and_refine(balancer_t *b) {
  sort_by_load(b);
  pack(b);
  refine(b);
  return b->rank_load[heaviest_rank(b)];
}

/* Each rank's experts in increasing order from its first slot, then empty slots. */
static void write_layer(const balancer_t *b, int32_t *slot_expert) {
  for (int32_t r = 0; r < b->ep; r++) {
    int32_t *out = slot_expert + (size_t)r * b->slots, n = 0;
    for (int32_t e = 0; e < b->experts; e++)
      if (rank_holds(b, r, e)) out[n++] = e;
    while (n < b->slots) out[n++] = -1;
  }
}

int placement_balance(const uint64_t *load, int32_t layers, int32_t experts, int32_t ep,
                      int32_t slots_per_rank, int32_t *slot_expert, char *error, size_t error_size) {
  balancer_t b;
  if (check_shape(layers, experts, ep, slots_per_rank, error, error_size) != 0 ||
      balancer_init(&b, experts, ep, slots_per_rank, error, error_size) != 0)
    return -1;
  const size_t layer_slots = (size_t)ep * (size_t)slots_per_rank;
  for (int32_t l = 0; l < layers; l++) {
    set_weights(&b, load + (size_t)l * experts);
    order_extra_replicas(&b);
    /* More replicas are not always better: a replica on every rank adds the same load to
     * each and takes away a piece that could even out the others. So try several counts
     * (prefixes of the extra-replica order, the fewest first) and keep the lowest max
     * rank load. */
    const int32_t trials = b.n_extra < REPLICA_TRIALS ? b.n_extra : REPLICA_TRIALS;
    double best = 0, mean = 0;
    for (int32_t e = 0; e < experts; e++) mean += b.weight[e] / ep;
    /* No trial gets below the mean rank load, so one that reaches it ends the search. */
    for (int32_t t = 0; t <= trials && (t == 0 || best > mean + MIN_GAIN * mean); t++) {
      take_extra_replicas(&b, trials == 0 ? 0 : (int32_t)((int64_t)b.n_extra * t / trials));
      const double top = pack_and_refine(&b);
      if (t == 0 || top < best - MIN_GAIN * best) {
        best = top;
        write_layer(&b, slot_expert + (size_t)l * layer_slots);
      }
    }
  }
  balancer_free(&b);
  return 0;
}

int placement_pack(const uint64_t *load, const int32_t *replicas, int32_t experts, int32_t ep,
                   int32_t slots_per_rank, int32_t *slot_expert, char *error, size_t error_size) {
  if (check_shape(1, experts, ep, slots_per_rank, error, error_size) != 0) return -1;
  int64_t total = 0;
  for (int32_t e = 0; e < experts; e++) {
    if (replicas[e] < 1 || replicas[e] > ep)
      return fail(error, error_size, "expert %d: %d replicas, outside [1, ep %d]", e, replicas[e], ep);
    total += replicas[e];
  }
  if (total > (int64_t)ep * slots_per_rank)
    return fail(error, error_size, "%lld replicas exceed ep %d x slots_per_rank %d slots",
                (long long)total, ep, slots_per_rank);
  balancer_t b;
  if (balancer_init(&b, experts, ep, slots_per_rank, error, error_size) != 0) return -1;
  set_weights(&b, load);
  memcpy(b.replicas, replicas, (size_t)experts * sizeof *replicas);
  pack_and_refine(&b);
  write_layer(&b, slot_expert);
  balancer_free(&b);
  return 0;
}

int placement_rank_loads(const uint64_t *load, int32_t experts, int32_t ep, int32_t slots_per_rank,
                         const int32_t *slot_expert, double *rank_load) {
  const size_t n = (size_t)ep * (size_t)slots_per_rank;
  for (size_t i = 0; i < n; i++)
    if (slot_expert[i] < -1 || slot_expert[i] >= experts) return -1;
  for (int32_t r = 0; r < ep; r++) rank_load[r] = 0;
  /* Expert by expert, so that no scratch array is needed: count its replicas, then give
   * each holder its share. */
  for (int32_t e = 0; e < experts; e++) {
    int64_t replicas = 0;
    for (size_t i = 0; i < n; i++) replicas += slot_expert[i] == e;
    if (replicas == 0) {
      if (load[e] > 0) return -1;
      continue;
    }
    const double share = (double)load[e] / (double)replicas;
    for (size_t i = 0; i < n; i++)
      if (slot_expert[i] == e) rank_load[i / (size_t)slots_per_rank] += share;
  }
  return 0;
}

/* ---- relative to the map in force ------------------------------------------------------- */

/* Scratch of the assignment of n planned ranks to n ranks, 1-based as the method has it. */
typedef struct assignment {
  int64_t *u, *v, *minv; /* [n + 1] row and column potentials, least reduced cost per column */
  int32_t *match, *way;  /* [n + 1] planned rank (1-based) on each rank; the path to it */
  unsigned char *used;   /* [n + 1] */
} assignment_t;

/* The renumbering rank_of[p] of planned ranks p that maximizes the summed overlap[p * n + r]
 * (replicas planned for p that rank r holds already): the Hungarian method on the costs
 * -overlap, adding one planned rank at a time along a shortest augmenting path. Integer
 * costs keep it exact; ties go to lower indices. */
static void assign_max_overlap(int32_t n, const int32_t *overlap, assignment_t *a, int32_t *rank_of) {
  for (int32_t j = 0; j <= n; j++) a->u[j] = a->v[j] = 0, a->match[j] = 0;
  for (int32_t i = 1; i <= n; i++) {
    int32_t j0 = 0; /* column 0 is the root of the path: planned rank i, not yet placed */
    a->match[0] = i;
    for (int32_t j = 0; j <= n; j++) a->minv[j] = INT64_MAX, a->used[j] = 0;
    do {
      a->used[j0] = 1;
      const int32_t i0 = a->match[j0];
      int64_t delta = INT64_MAX;
      int32_t j1 = 0;
      for (int32_t j = 1; j <= n; j++) {
        if (a->used[j]) continue;
        const int64_t reduced = -(int64_t)overlap[(size_t)(i0 - 1) * n + (j - 1)] - a->u[i0] - a->v[j];
        if (reduced < a->minv[j]) a->minv[j] = reduced, a->way[j] = j0;
        if (a->minv[j] < delta) delta = a->minv[j], j1 = j;
      }
      for (int32_t j = 0; j <= n; j++) {
        if (a->used[j]) {
          a->u[a->match[j]] += delta;
          a->v[j] -= delta;
        } else {
          a->minv[j] -= delta;
        }
      }
      j0 = j1;
    } while (a->match[j0] != 0);
    do { /* flip the path back to the root */
      const int32_t j1 = a->way[j0];
      a->match[j0] = a->match[j1];
      j0 = j1;
    } while (j0 != 0);
  }
  for (int32_t j = 1; j <= n; j++) rank_of[a->match[j] - 1] = j - 1;
}

/* Everything placement_rebalance needs besides its arguments. */
typedef struct rebalance_scratch {
  uint64_t *weight;             /* [experts] the loads as balanced (uniform when all 0) */
  double *now_load, *plan_load; /* [ep] */
  int32_t *overlap;             /* [ep * ep] */
  int32_t *rank_of;             /* [ep] */
  int32_t *layer;               /* [ep * slots_per_rank] the planned layer before renumbering */
  unsigned char *holds;         /* [ep * experts] in force: rank r holds expert e */
  assignment_t a;
} rebalance_scratch_t;

static void rebalance_scratch_free(rebalance_scratch_t *s) {
  free(s->weight);
  free(s->now_load);
  free(s->plan_load);
  free(s->overlap);
  free(s->rank_of);
  free(s->layer);
  free(s->holds);
  free(s->a.u);
  free(s->a.v);
  free(s->a.minv);
  free(s->a.match);
  free(s->a.way);
  free(s->a.used);
}

static int rebalance_scratch_init(rebalance_scratch_t *s, int32_t experts, int32_t ep, int32_t slots) {
  const size_t n = (size_t)ep + 1;
  memset(s, 0, sizeof *s);
  s->weight = malloc((size_t)experts * sizeof *s->weight);
  s->now_load = malloc((size_t)ep * sizeof *s->now_load);
  s->plan_load = malloc((size_t)ep * sizeof *s->plan_load);
  s->overlap = malloc((size_t)ep * (size_t)ep * sizeof *s->overlap);
  s->rank_of = malloc((size_t)ep * sizeof *s->rank_of);
  s->layer = malloc((size_t)ep * (size_t)slots * sizeof *s->layer);
  s->holds = malloc((size_t)ep * (size_t)experts);
  s->a.u = malloc(n * sizeof *s->a.u);
  s->a.v = malloc(n * sizeof *s->a.v);
  s->a.minv = malloc(n * sizeof *s->a.minv);
  s->a.match = malloc(n * sizeof *s->a.match);
  s->a.way = malloc(n * sizeof *s->a.way);
  s->a.used = malloc(n);
  if (s->weight && s->now_load && s->plan_load && s->overlap && s->rank_of && s->layer && s->holds &&
      s->a.u && s->a.v && s->a.minv && s->a.match && s->a.way && s->a.used)
    return 0;
  rebalance_scratch_free(s);
  return -1;
}

/* Whether a layer's map is one the agent accepts: every expert placed, none twice on a
 * rank. */
static int layer_is_valid(rebalance_scratch_t *s, int32_t experts, int32_t ep, const int32_t *map,
                          int32_t slots) {
  memset(s->holds, 0, (size_t)ep * (size_t)experts);
  for (int32_t r = 0; r < ep; r++)
    for (int32_t i = 0; i < slots; i++) {
      const int32_t x = map[(size_t)r * slots + i];
      if (x < 0) continue;
      if (s->holds[(size_t)r * experts + x]) return 0;
      s->holds[(size_t)r * experts + x] = 1;
    }
  for (int32_t e = 0; e < experts; e++) {
    int32_t r = 0;
    while (r < ep && !s->holds[(size_t)r * experts + e]) r++;
    if (r == ep) return 0;
  }
  return 1;
}

/* Whether the planned layer beats the one in force: its max rank load is lower by more
 * than MIN_GAIN. */
static int plan_is_better(rebalance_scratch_t *s, const uint64_t *load, int32_t experts, int32_t ep,
                          const int32_t *now, int32_t now_slots, const int32_t *plan, int32_t slots) {
  uint64_t any = 0;
  for (int32_t e = 0; e < experts; e++) any |= load[e];
  for (int32_t e = 0; e < experts; e++) s->weight[e] = any ? load[e] : 1;
  if (placement_rank_loads(s->weight, experts, ep, now_slots, now, s->now_load) != 0) return 1;
  placement_rank_loads(s->weight, experts, ep, slots, plan, s->plan_load);
  double now_max = 0, plan_max = 0;
  for (int32_t r = 0; r < ep; r++) {
    now_max = s->now_load[r] > now_max ? s->now_load[r] : now_max;
    plan_max = s->plan_load[r] > plan_max ? s->plan_load[r] : plan_max;
  }
  return plan_max < now_max - MIN_GAIN * now_max;
}

/* Renumbers the ranks of the planned layer so that the most replicas stay where they are. */
static void align_ranks(rebalance_scratch_t *s, int32_t experts, int32_t ep, const int32_t *now,
                        int32_t now_slots, int32_t *plan, int32_t slots) {
  memset(s->holds, 0, (size_t)ep * (size_t)experts);
  for (int32_t r = 0; r < ep; r++)
    for (int32_t i = 0; i < now_slots; i++) {
      const int32_t x = now[(size_t)r * now_slots + i];
      if (x >= 0) s->holds[(size_t)r * experts + x] = 1;
    }
  for (int32_t p = 0; p < ep; p++)
    for (int32_t r = 0; r < ep; r++) {
      int32_t common = 0;
      for (int32_t i = 0; i < slots; i++) {
        const int32_t x = plan[(size_t)p * slots + i];
        common += x >= 0 && s->holds[(size_t)r * experts + x];
      }
      s->overlap[(size_t)p * ep + r] = common;
    }
  assign_max_overlap(ep, s->overlap, &s->a, s->rank_of);
  memcpy(s->layer, plan, (size_t)ep * (size_t)slots * sizeof *plan);
  for (int32_t p = 0; p < ep; p++)
    memcpy(plan + (size_t)s->rank_of[p] * slots, s->layer + (size_t)p * slots,
           (size_t)slots * sizeof *plan);
}

int placement_rebalance(const uint64_t *load, const int32_t *in_force, int32_t in_force_slots,
                        int32_t layers, int32_t experts, int32_t ep, int32_t slots_per_rank,
                        int32_t *slot_expert, unsigned char *kept, char *error, size_t error_size) {
  if (placement_balance(load, layers, experts, ep, slots_per_rank, slot_expert, error, error_size) != 0)
    return -1;
  if (in_force_slots < 1 || in_force_slots > experts)
    return fail(error, error_size, "the map in force: slots_per_rank %d is outside [1, %d]",
                in_force_slots, experts);
  if ((int64_t)ep * in_force_slots > INT32_MAX ||
      (uint64_t)ep * (uint64_t)in_force_slots * (uint64_t)layers > SIZE_MAX / sizeof *in_force)
    return fail(error, error_size, "the map in force: %d layers x ep %d x %d slots: too large", layers,
                ep, in_force_slots);
  const size_t now_layer = (size_t)ep * (size_t)in_force_slots,
               plan_layer = (size_t)ep * (size_t)slots_per_rank;
  for (size_t i = 0; i < now_layer * (size_t)layers; i++)
    if (in_force[i] < -1 || in_force[i] >= experts)
      return fail(error, error_size,
                  "the map in force: layer %zu rank %zu slot %zu holds expert %d, outside [0, %d)",
                  i / now_layer, i % now_layer / (size_t)in_force_slots, i % (size_t)in_force_slots,
                  in_force[i], experts);
  rebalance_scratch_t s;
  if (rebalance_scratch_init(&s, experts, ep, slots_per_rank) != 0)
    return fail(error, error_size, "out of memory for renumbering %d ranks", ep);
  for (int32_t l = 0; l < layers; l++) {
    const int32_t *now = in_force + (size_t)l * now_layer;
    int32_t *plan = slot_expert + (size_t)l * plan_layer;
    const int keep = in_force_slots <= slots_per_rank &&
                     layer_is_valid(&s, experts, ep, now, in_force_slots) &&
                     !plan_is_better(&s, load + (size_t)l * experts, experts, ep, now, in_force_slots,
                                     plan, slots_per_rank);
    if (kept) kept[l] = (unsigned char)keep;
    if (keep) {
      for (int32_t r = 0; r < ep; r++)
        for (int32_t i = 0; i < slots_per_rank; i++)
          plan[(size_t)r * slots_per_rank + i] =
              i < in_force_slots ? now[(size_t)r * in_force_slots + i] : -1;
    } else {
      align_ranks(&s, experts, ep, now, in_force_slots, plan, slots_per_rank);
    }
  }
  rebalance_scratch_free(&s);
  return 0;
}
