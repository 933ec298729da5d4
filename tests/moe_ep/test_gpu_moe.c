/* ina_gpu_moe_permute and ina_gpu_moe_combine against plain-C references.
 *
 * Permute: a stable counting sort of the entries by expert, checked exactly (counts,
 * offsets, sorted_token incl. the -1 tail, slot_of), on router-like ids (distinct per
 * token), repeated ids, skewed loads (one hot expert), dropped (-1) entries and ids past
 * num_experts (which must also raise INA_GPU_OPS_FLAG_EXPERT_ID), over one and many
 * chunks of entries; a second run must give the same bytes.
 * Combine: out[t] = sum_j w[t,j] * y[slot(t,j)] (+ shared[t]) in double as the reference,
 * within bf16 rounding (rel-L2 <= 1e-2 and elementwise), in place over shared_out too.
 * Outputs are poisoned. Skipped (exit 77) without a CUDA device. */
#include "tests/gpu_ops/gpu_ops_test.h"

#include "moe_ep/moe_gpu.h"

typedef enum { IDS_ROUTER, IDS_REPEATS, IDS_HOT, IDS_DROPPED, IDS_BAD } ids_kind_t;

static const char *kind_name(ids_kind_t k) {
  static const char *names[] = {"router", "repeats", "hot", "dropped", "bad"};
  return names[k];
}

static void make_ids(int32_t *ids, int64_t T, int32_t K, int32_t E, ids_kind_t kind,
                     test_rng_t *rng) {
  for (int64_t t = 0; t < T; t++) {
    for (int32_t j = 0; j < K; j++) {
      int32_t id = (int32_t)test_rng_int(rng, 0, E - 1);
      if (kind == IDS_ROUTER && K <= E) { /* distinct within the token */
        int again;
        do {
          again = 0;
          for (int32_t i = 0; i < j; i++) again |= ids[t * K + i] == id;
          if (again) id = (int32_t)test_rng_int(rng, 0, E - 1);
        } while (again);
      }
      if (kind == IDS_HOT && test_rng_int(rng, 0, 9) < 7) id = E / 2;
      if (kind == IDS_DROPPED && test_rng_int(rng, 0, 4) == 0)
        id = -1 - (int32_t)test_rng_int(rng, 0, 3);
      if (kind == IDS_BAD && test_rng_int(rng, 0, 6) == 0)
        id = E + (int32_t)test_rng_int(rng, 0, 5);
      ids[t * K + j] = id;
    }
  }
}

typedef struct {
  int32_t *counts, *offsets, *sorted, *slot_of;
} perm_t;

/* The reference: a stable counting sort in entry order. */
static void permute_ref(const int32_t *ids, int64_t T, int32_t K, int32_t E, perm_t *r) {
  const int64_t N = T * K;
  memset(r->counts, 0, (size_t)E * 4);
  for (int64_t i = 0; i < N; i++)
    if (ids[i] >= 0 && ids[i] < E) r->counts[ids[i]]++;
  r->offsets[0] = 0;
  for (int32_t x = 0; x < E; x++) r->offsets[x + 1] = r->offsets[x] + r->counts[x];
  for (int64_t i = 0; i < N; i++) r->sorted[i] = -1;
  int32_t *cursor = malloc((size_t)E * 4);
  CHECK(cursor != NULL);
  if (!cursor) return;
  memcpy(cursor, r->offsets, (size_t)E * 4);
  for (int64_t i = 0; i < N; i++) {
    const int32_t x = ids[i];
    if (x < 0 || x >= E) {
      r->slot_of[i] = -1;
      continue;
    }
    r->slot_of[i] = cursor[x]++;
    r->sorted[r->slot_of[i]] = (int32_t)(i / K);
  }
  free(cursor);
}

static void combine_check(int64_t T, int32_t K, int64_t H, const perm_t *ref, int64_t rows,
                          int with_shared, int in_place, test_rng_t *rng, const char *what_in) {
  char what[200];
  snprintf(what, sizeof what, "%s combine H %lld%s%s", what_in, (long long)H,
           with_shared ? " +shared" : "", in_place ? " in place" : "");
  const size_t ny = (size_t)((rows > 0 ? rows : 1) * H), no = (size_t)(T * H);
  uint16_t *y = malloc(ny * 2), *shared = malloc(no * 2), *out = malloc(no * 2);
  float *w = malloc((size_t)(T * K) * 4), *ref_out = malloc(no * 4);
  CHECK(y && shared && out && w && ref_out);
  if (!(y && shared && out && w && ref_out)) goto done;
  fill_bf16(y, ny, 1.0f, rng);
  fill_bf16(shared, no, 0.5f, rng);
  for (int64_t i = 0; i < T * K; i++) w[i] = (float)test_rng_uniform(rng) * 2.0f;
  for (int64_t t = 0; t < T; t++)
    for (int64_t h = 0; h < H; h++) {
      double acc = 0;
      for (int32_t j = 0; j < K; j++) {
        const int32_t s = ref->slot_of[t * K + j];
        if (s >= 0) acc += (double)w[t * K + j] * ina_bf16_to_f32(y[s * H + h]);
      }
      if (with_shared) acc += ina_bf16_to_f32(shared[t * H + h]);
      ref_out[t * H + h] = (float)acc;
    }
  dev_buf_t dy = dev_buf_from(y, ny * 2, 0);
  dev_buf_t dslot = dev_buf_from(ref->slot_of, (size_t)(T * K) * 4, 0);
  dev_buf_t dw = dev_buf_from(w, (size_t)(T * K) * 4, 0);
  dev_buf_t dshared = dev_buf_from(shared, no * 2, 0x55);
  dev_buf_t dout = in_place ? (dev_buf_t){0} : dev_buf_make(no * 2, 0xFF);
  if (!dy.p || !dslot.p || !dw.p || !dshared.p || (!in_place && !dout.p)) goto free_dev;
  CHECK_OK(ina_gpu_moe_combine(T, K, H, dy.p, rows, dslot.p, dw.p, with_shared ? dshared.p : NULL,
                               in_place ? dshared.p : dout.p, NULL));
  CHECK_OK(ina_cuda_synchronize());
  dev_buf_read(in_place ? &dshared : &dout, out, what);
  /* Values are sums of a few products: allow the bf16 rounding of the result plus the
   * fp32 error of the accumulation relative to the terms' size. */
  check_bf16_close(out, ref_out, no, 1e-2, 1e-5 * (K + 1), what);
free_dev:
  dev_buf_free(&dy);
  dev_buf_free(&dslot);
  dev_buf_free(&dw);
  dev_buf_free(&dshared);
  dev_buf_free(&dout);
done:
  free(y);
  free(shared);
  free(out);
  free(w);
  free(ref_out);
}

static void run_case(int64_t T, int32_t K, int32_t E, ids_kind_t kind, int64_t H, test_rng_t *rng) {
  char what[160];
  snprintf(what, sizeof what, "moe T %lld k %d E %d %s", (long long)T, K, E, kind_name(kind));
  const int64_t N = T * K;
  const size_t nn = (size_t)(N > 0 ? N : 1);
  int32_t *ids = malloc(nn * 4);
  perm_t ref = {malloc((size_t)E * 4), malloc((size_t)(E + 1) * 4), malloc(nn * 4), malloc(nn * 4)};
  perm_t got = {malloc((size_t)E * 4), malloc((size_t)(E + 1) * 4), malloc(nn * 4), malloc(nn * 4)};
  perm_t again = {malloc((size_t)E * 4), malloc((size_t)(E + 1) * 4), malloc(nn * 4),
                  malloc(nn * 4)};
  CHECK(ids && ref.counts && ref.offsets && ref.sorted && ref.slot_of && got.counts &&
        got.offsets && got.sorted && got.slot_of && again.counts && again.offsets && again.sorted &&
        again.slot_of);
  if (!(ids && ref.counts && ref.offsets && ref.sorted && ref.slot_of && got.counts &&
        got.offsets && got.sorted && got.slot_of && again.counts && again.offsets && again.sorted &&
        again.slot_of))
    goto done;
  make_ids(ids, T, K, E, kind, rng);
  permute_ref(ids, T, K, E, &ref);

  const size_t ws = ina_gpu_moe_permute_workspace_size(T, K, E);
  dev_buf_t dids = dev_buf_from(ids, (size_t)N * 4, 0);
  dev_buf_t dws = dev_buf_make(ws, 0x77);
  uint32_t zero = 0, flags = 0;
  dev_buf_t dflags = dev_buf_from(&zero, 4, 0);
  for (int run = 0; run < 2; run++) {
    perm_t *out = run == 0 ? &got : &again;
    dev_buf_t dc = dev_buf_make((size_t)E * 4, 0x5A),
              doff = dev_buf_make((size_t)(E + 1) * 4, 0x5A);
    dev_buf_t ds = dev_buf_make((size_t)N * 4, 0x5A), dsl = dev_buf_make((size_t)N * 4, 0x5A);
    ina_gpu_moe_permute_params_t p = INA_GPU_MOE_PERMUTE_PARAMS_INIT;
    p.tokens = T;
    p.top_k = K;
    p.num_experts = E;
    p.ids = dids.p;
    p.expert_counts = dc.p;
    p.expert_offsets = doff.p;
    p.sorted_token = ds.p;
    p.slot_of = dsl.p;
    p.workspace = dws.p;
    p.workspace_bytes = ws;
    p.error_flags = dflags.p;
    CHECK_OK(ina_gpu_moe_permute(&p, NULL));
    CHECK_OK(ina_cuda_synchronize());
    dev_buf_read(&dc, out->counts, what);
    dev_buf_read(&doff, out->offsets, what);
    dev_buf_read(&ds, out->sorted, what);
    dev_buf_read(&dsl, out->slot_of, what);
    dev_buf_free(&dc);
    dev_buf_free(&doff);
    dev_buf_free(&ds);
    dev_buf_free(&dsl);
  }
  dev_buf_read(&dflags, &flags, what);
  dev_buf_read(&dws, NULL, what);
  CHECKF(flags == (kind == IDS_BAD ? INA_GPU_OPS_FLAG_EXPERT_ID : 0u), "%s: error flags 0x%x", what,
         flags);
  CHECKF(memcmp(got.counts, ref.counts, (size_t)E * 4) == 0, "%s: counts differ", what);
  CHECKF(memcmp(got.offsets, ref.offsets, (size_t)(E + 1) * 4) == 0, "%s: offsets differ", what);
  int64_t bad_sorted = 0, bad_slot = 0;
  for (int64_t i = 0; i < N; i++) {
    bad_sorted += got.sorted[i] != ref.sorted[i];
    bad_slot += got.slot_of[i] != ref.slot_of[i];
  }
  CHECKF(bad_sorted == 0, "%s: %lld sorted_token entries differ", what, (long long)bad_sorted);
  CHECKF(bad_slot == 0, "%s: %lld slot_of entries differ", what, (long long)bad_slot);
  CHECKF(memcmp(got.counts, again.counts, (size_t)E * 4) == 0 &&
             memcmp(got.offsets, again.offsets, (size_t)(E + 1) * 4) == 0 &&
             memcmp(got.sorted, again.sorted, (size_t)N * 4) == 0 &&
             memcmp(got.slot_of, again.slot_of, (size_t)N * 4) == 0,
         "%s: a second run differs", what);
  dev_buf_free(&dids);
  dev_buf_free(&dws);
  dev_buf_free(&dflags);

  if (H > 0) {
    const int64_t rows = ref.offsets[E];
    combine_check(T, K, H, &ref, rows, 1, 0, rng, what);
    combine_check(T, K, H, &ref, rows, 0, 0, rng, what);
    combine_check(T, K, H, &ref, rows, 1, 1, rng, what);
  }
done:
  free(ids);
  perm_t *all[] = {&ref, &got, &again};
  for (int i = 0; i < 3; i++) {
    free(all[i]->counts);
    free(all[i]->offsets);
    free(all[i]->sorted);
    free(all[i]->slot_of);
  }
}

static void test_arguments(void) {
  void *d = NULL;
  CHECK_OK(ina_cuda_malloc(0, 1 << 16, &d));
  if (!d) return;
  int32_t *base = d;
  ina_gpu_moe_permute_params_t p = INA_GPU_MOE_PERMUTE_PARAMS_INIT;
  p.tokens = 4;
  p.top_k = 2;
  p.num_experts = 8;
  p.ids = base;
  p.expert_counts = base + 1024;
  p.expert_offsets = base + 2048;
  p.sorted_token = base + 3072;
  p.slot_of = base + 4096;
  p.workspace = base + 8192;
  p.workspace_bytes = ina_gpu_moe_permute_workspace_size(4, 2, 8);
  CHECK(p.workspace_bytes > 0 && p.workspace_bytes % 256 == 0);
  ina_log_set_quiet_errors(1);
  ina_gpu_moe_permute_params_t b = p;
  b.workspace_bytes = 4;
  CHECK(ina_gpu_moe_permute(&b, NULL) == INA_ERR_INVALID_ARGUMENT);
  b = p;
  b.num_experts = 2000;
  CHECK(ina_gpu_moe_permute(&b, NULL) == INA_ERR_INVALID_ARGUMENT);
  b = p;
  b.slot_of = NULL;
  CHECK(ina_gpu_moe_permute(&b, NULL) == INA_ERR_INVALID_ARGUMENT);
  b = p;
  b.workspace = (char *)p.workspace + 4;
  CHECK(ina_gpu_moe_permute(&b, NULL) == INA_ERR_INVALID_ARGUMENT);
  uint16_t *y = (uint16_t *)(base + 12000), *o = (uint16_t *)(base + 14000);
  CHECK(ina_gpu_moe_combine(2, 0, 8, y, 4, base, (float *)base, NULL, o, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gpu_moe_combine(2, 2, 8, y, 4, NULL, (float *)base, NULL, o, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gpu_moe_combine(2, 2, 8, y, 4, base, (float *)base, o + 1, o, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  /* No tokens: zero counts and offsets are still written. */
  int32_t counts[9];
  memset(counts, 0x7F, sizeof counts);
  CHECK_OK(ina_cuda_memcpy_h2d(p.expert_offsets, counts, sizeof counts));
  b = p;
  b.tokens = 0;
  b.workspace = NULL;
  b.workspace_bytes = 0;
  CHECK_OK(ina_gpu_moe_permute(&b, NULL));
  CHECK_OK(ina_cuda_synchronize());
  CHECK_OK(ina_cuda_memcpy_d2h(counts, p.expert_offsets, sizeof counts));
  int zeros = 1;
  for (int i = 0; i < 9; i++) zeros &= counts[i] == 0;
  CHECK(zeros);
  ina_cuda_free(d);
}

/* An expert-parallel rank's permutation: experts [first, first + count) of E kept as
 * id - first, the others dropped without a flag; equal to the reference over the ids
 * mapped that way. */
static void run_range_case(int64_t T, int32_t K, int32_t E, int32_t first, int32_t count, test_rng_t *rng) {
  char what[160];
  snprintf(what, sizeof what, "moe range T %lld k %d experts [%d, %d) of %d", (long long)T, K, first,
           first + count, E);
  const int64_t N = T * K;
  const size_t nn = (size_t)(N > 0 ? N : 1);
  int32_t *ids = malloc(nn * 4), *mapped = malloc(nn * 4);
  perm_t ref = {malloc((size_t)count * 4), malloc((size_t)(count + 1) * 4), malloc(nn * 4), malloc(nn * 4)};
  perm_t got = {malloc((size_t)count * 4), malloc((size_t)(count + 1) * 4), malloc(nn * 4), malloc(nn * 4)};
  if (!ids || !mapped || !ref.counts || !ref.offsets || !ref.sorted || !ref.slot_of || !got.counts ||
      !got.offsets || !got.sorted || !got.slot_of) {
    CHECK(0);
    goto done;
  }
  make_ids(ids, T, K, E, IDS_ROUTER, rng);
  for (int64_t i = 0; i < N; i++) mapped[i] = ids[i] >= first && ids[i] < first + count ? ids[i] - first : -1;
  permute_ref(mapped, T, K, count, &ref);
  const size_t ws = ina_gpu_moe_permute_workspace_size(T, K, count);
  dev_buf_t dids = dev_buf_from(ids, (size_t)N * 4, 0), dws = dev_buf_make(ws, 0x77);
  uint32_t zero = 0, flags = 0;
  dev_buf_t dflags = dev_buf_from(&zero, 4, 0);
  dev_buf_t dc = dev_buf_make((size_t)count * 4, 0x5A), doff = dev_buf_make((size_t)(count + 1) * 4, 0x5A);
  dev_buf_t ds = dev_buf_make((size_t)N * 4, 0x5A), dsl = dev_buf_make((size_t)N * 4, 0x5A);
  ina_gpu_moe_permute_params_t p = INA_GPU_MOE_PERMUTE_PARAMS_INIT;
  p.tokens = T;
  p.top_k = K;
  p.num_experts = count;
  p.first_expert = first;
  p.total_experts = E;
  p.ids = dids.p;
  p.expert_counts = dc.p;
  p.expert_offsets = doff.p;
  p.sorted_token = ds.p;
  p.slot_of = dsl.p;
  p.workspace = dws.p;
  p.workspace_bytes = ws;
  p.error_flags = dflags.p;
  CHECK_OK(ina_gpu_moe_permute(&p, NULL));
  CHECK_OK(ina_cuda_synchronize());
  dev_buf_read(&dc, got.counts, what);
  dev_buf_read(&doff, got.offsets, what);
  dev_buf_read(&ds, got.sorted, what);
  dev_buf_read(&dsl, got.slot_of, what);
  dev_buf_read(&dflags, &flags, what);
  CHECKF(flags == 0, "%s: error flags 0x%x", what, flags);
  CHECKF(memcmp(got.counts, ref.counts, (size_t)count * 4) == 0 &&
             memcmp(got.offsets, ref.offsets, (size_t)(count + 1) * 4) == 0 &&
             memcmp(got.sorted, ref.sorted, (size_t)N * 4) == 0 &&
             memcmp(got.slot_of, ref.slot_of, (size_t)N * 4) == 0,
         "%s: differs from the reference over the mapped ids", what);
  /* A range past the experts is refused. */
  p.first_expert = E - count + 1;
  ina_log_set_quiet_errors(1);
  CHECK(ina_gpu_moe_permute(&p, NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  dev_buf_free(&dids);
  dev_buf_free(&dws);
  dev_buf_free(&dflags);
  dev_buf_free(&dc);
  dev_buf_free(&doff);
  dev_buf_free(&ds);
  dev_buf_free(&dsl);
done:
  free(ids);
  free(mapped);
  perm_t *all[] = {&ref, &got};
  for (int i = 0; i < 2; i++) {
    free(all[i]->counts);
    free(all[i]->offsets);
    free(all[i]->sorted);
    free(all[i]->slot_of);
  }
}

/* Expert counts accumulated over two calls, padding rows (mask < 0) and ids out of range
 * skipped: equal to a count on the host. */
static void run_count_case(int64_t T, int32_t K, int32_t E, test_rng_t *rng) {
  char what[96];
  snprintf(what, sizeof what, "moe count T %lld k %d E %d", (long long)T, K, E);
  const int64_t N = T * K;
  int32_t *ids = malloc((size_t)(N > 0 ? N : 1) * 4), *mask = malloc((size_t)(T > 0 ? T : 1) * 4);
  uint64_t *want = calloc((size_t)E, sizeof *want), *got = calloc((size_t)E, sizeof *got);
  if (!ids || !mask || !want || !got) {
    CHECK(0);
    goto done;
  }
  for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)test_rng_int(rng, -1, E); /* -1 and E: skipped */
  for (int64_t t = 0; t < T; t++) mask[t] = test_rng_int(rng, 0, 3) == 0 ? -1 : (int32_t)t;
  for (int run = 0; run < 2; run++)
    for (int64_t i = 0; i < N; i++)
      if (mask[i / K] >= 0 && ids[i] >= 0 && ids[i] < E) want[ids[i]]++;
  dev_buf_t dids = dev_buf_from(ids, (size_t)N * 4, 0), dmask = dev_buf_from(mask, (size_t)T * 4, 0);
  dev_buf_t dcounts = dev_buf_from(got, (size_t)E * 8, 0);
  for (int run = 0; run < 2; run++)
    CHECK_OK(ina_gpu_moe_count(dids.p, T, K, dmask.p, E, dcounts.p, NULL));
  CHECK_OK(ina_cuda_synchronize());
  dev_buf_read(&dcounts, got, what);
  CHECKF(memcmp(got, want, (size_t)E * 8) == 0, "%s: counts differ from the host's", what);
  ina_log_set_quiet_errors(1);
  CHECK(ina_gpu_moe_count(dids.p, T, 0, dmask.p, E, dcounts.p, NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  dev_buf_free(&dids);
  dev_buf_free(&dmask);
  dev_buf_free(&dcounts);
done:
  free(ids);
  free(mask);
  free(want);
  free(got);
}

/* Dropping padding rows: random ids and masks against the host's rule; the other rows'
 * ids stay as they were. */
static void run_drop_case(int64_t T, int32_t K, int32_t E, test_rng_t *rng) {
  char what[96];
  snprintf(what, sizeof what, "moe drop rows T %lld k %d", (long long)T, K);
  const int64_t N = T * K;
  int32_t *ids = malloc((size_t)(N > 0 ? N : 1) * 4), *mask = malloc((size_t)(T > 0 ? T : 1) * 4);
  int32_t *want = malloc((size_t)(N > 0 ? N : 1) * 4), *got = malloc((size_t)(N > 0 ? N : 1) * 4);
  if (!ids || !mask || !want || !got) {
    CHECK(0);
    goto done;
  }
  for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)test_rng_int(rng, -1, E);
  for (int64_t t = 0; t < T; t++) mask[t] = test_rng_int(rng, 0, 3) == 0 ? -1 - (int32_t)test_rng_int(rng, 0, 5)
                                                                          : (int32_t)test_rng_int(rng, 0, 1000);
  for (int64_t i = 0; i < N; i++) want[i] = mask[i / K] < 0 ? -1 : ids[i];
  dev_buf_t dids = dev_buf_from(ids, (size_t)N * 4, 0), dmask = dev_buf_from(mask, (size_t)T * 4, 0);
  CHECK_OK(ina_gpu_moe_drop_rows(dids.p, T, K, dmask.p, NULL));
  CHECK_OK(ina_cuda_synchronize());
  dev_buf_read(&dids, got, what);
  CHECKF(memcmp(got, want, (size_t)N * 4) == 0, "%s: ids differ from the host's", what);
  ina_log_set_quiet_errors(1);
  CHECK(ina_gpu_moe_drop_rows(dids.p, T, 0, dmask.p, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gpu_moe_drop_rows(dids.p, T, K, NULL, NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  dev_buf_free(&dids);
  dev_buf_free(&dmask);
done:
  free(ids);
  free(mask);
  free(want);
  free(got);
}

/* Slot rows: random experts' offsets and slots (replicas, empty and malformed slots)
 * against the cut computed on the host. */
static void run_slot_rows_case(int32_t E, int32_t slots, test_rng_t *rng) {
  char what[64];
  snprintf(what, sizeof what, "moe slot rows E %d slots %d", E, slots);
  int32_t *off = malloc(((size_t)E + 1) * 4), *info = malloc((size_t)slots * 12);
  int32_t *begins = malloc((size_t)slots * 4), *ends = malloc((size_t)slots * 4);
  if (!off || !info || !begins || !ends) {
    CHECK(0);
    goto done;
  }
  off[0] = 0;
  for (int32_t x = 0; x < E; x++) off[x + 1] = off[x] + (int32_t)test_rng_int(rng, 0, 40);
  for (int32_t s = 0; s < slots; s++) {
    const int32_t r = (int32_t)test_rng_int(rng, 1, 4);
    info[3 * s] = test_rng_int(rng, 0, 9) == 0 ? -1 : (int32_t)test_rng_int(rng, 0, E - 1);
    info[3 * s + 1] = test_rng_int(rng, 0, 19) == 0 ? r : (int32_t)test_rng_int(rng, 0, r - 1); /* r: malformed */
    info[3 * s + 2] = r;
  }
  dev_buf_t doff = dev_buf_from(off, ((size_t)E + 1) * 4, 0), dinfo = dev_buf_from(info, (size_t)slots * 12, 0);
  dev_buf_t db = dev_buf_make((size_t)slots * 4, 0x5A), de = dev_buf_make((size_t)slots * 4, 0x5A);
  CHECK_OK(ina_gpu_moe_slot_rows(doff.p, E, dinfo.p, slots, db.p, de.p, NULL));
  CHECK_OK(ina_cuda_synchronize());
  dev_buf_read(&db, begins, what);
  dev_buf_read(&de, ends, what);
  int32_t wrong = 0;
  for (int32_t s = 0; s < slots; s++) {
    const int32_t x = info[3 * s], j = info[3 * s + 1], r = info[3 * s + 2];
    int64_t b = 0, e = 0;
    if (x >= 0 && j < r) {
      const int64_t n = off[x + 1] - off[x];
      b = off[x] + n * j / r;
      e = off[x] + n * (j + 1) / r;
    }
    wrong += begins[s] != b || ends[s] != e;
  }
  CHECKF(wrong == 0, "%s: %d slots' rows differ from the host's cut", what, wrong);
  dev_buf_free(&doff);
  dev_buf_free(&dinfo);
  dev_buf_free(&db);
  dev_buf_free(&de);
done:
  free(off);
  free(info);
  free(begins);
  free(ends);
}

int main(int argc, char **argv) {
  test_rng_t rng;
  const int skip = gpu_test_start("test_gpu_moe", argc, argv, &rng);
  if (skip) return skip;
  test_arguments();
  /* T, k, E, ids, hidden (0: permute only) */
  run_case(1, 1, 1, IDS_ROUTER, 8, &rng);
  run_case(1, 8, 256, IDS_ROUTER, 7168, &rng);
  run_case(7, 6, 160, IDS_ROUTER, 129, &rng);
  run_case(64, 8, 256, IDS_ROUTER, 7168, &rng);
  run_case(64, 8, 32, IDS_DROPPED, 1000, &rng);
  run_case(100, 6, 64, IDS_BAD, 64, &rng);
  run_case(300, 8, 8, IDS_REPEATS, 7, &rng);
  run_case(255, 8, 256, IDS_HOT, 256, &rng);   /* 2040 entries: one chunk */
  run_case(257, 8, 256, IDS_ROUTER, 32, &rng); /* 2056 entries: two chunks */
  run_case(1000, 3, 1024, IDS_ROUTER, 0, &rng);
  run_case(gpu_test_quick ? 3000 : 40000, 8, 256, IDS_ROUTER, 0, &rng);
  run_case(gpu_test_quick ? 2000 : 20000, 8, 256, IDS_HOT, 0, &rng);
  run_case(gpu_test_quick ? 2000 : 20000, 6, 160, IDS_DROPPED, 0, &rng);
  run_case(5000, 8, 1, IDS_REPEATS, 0, &rng);
  const int random_cases = gpu_test_quick ? 5 : 30;
  for (int i = 0; i < random_cases; i++) {
    const int32_t E = (int32_t)test_rng_int(&rng, 1, i % 4 == 0 ? 1024 : 256);
    const int32_t K = (int32_t)test_rng_int(&rng, 1, 9);
    const int64_t T = test_rng_int(&rng, 1, i % 3 == 0 ? 6000 : 300);
    const ids_kind_t kind = (ids_kind_t)test_rng_int(&rng, 0, 4);
    const int64_t H = T * K <= 3000 ? test_rng_int(&rng, 1, 2100) : 0;
    run_case(T, K, E, kind, H, &rng);
  }
  run_range_case(64, 8, 256, 128, 128, &rng);
  run_range_case(300, 6, 64, 0, 21, &rng);
  run_range_case(gpu_test_quick ? 2000 : 20000, 8, 256, 37, 64, &rng);
  run_range_case(5, 2, 8, 7, 1, &rng);
  run_count_case(1, 6, 64, &rng);
  run_drop_case(1, 8, 256, &rng);
  run_drop_case(333, 6, 64, &rng);
  run_drop_case(gpu_test_quick ? 2000 : 20000, 8, 256, &rng);
  run_slot_rows_case(8, 5, &rng);
  run_slot_rows_case(256, 300, &rng);
  run_count_case(300, 8, 256, &rng);
  run_count_case(gpu_test_quick ? 2000 : 20000, 6, 160, &rng);
  return test_finish("test_gpu_moe");
}
