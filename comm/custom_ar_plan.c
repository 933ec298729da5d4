/* Host-side decisions of the custom all-reduce: buffer layout and algorithm choice
 * (comm/custom_ar_plan.h). No device code, so every build has it and the CPU tests run it. */
#define INA_LOG_SUBSYS "custom_ar"
#include "comm/custom_ar_plan.h"

#include "core/check.h"

static uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

ina_status_t ina_car_layout_init(uint64_t capacity_bytes, int nranks, ina_car_layout_t *out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "custom_ar layout: out is NULL");
  INA_REQUIRE(capacity_bytes > 0 && capacity_bytes <= ((uint64_t)1 << 40), INA_ERR_INVALID_ARGUMENT,
              "custom_ar layout: capacity %llu bytes must be in [1, 2^40]",
              (unsigned long long)capacity_bytes);
  INA_REQUIRE(nranks >= 1 && nranks <= INA_CAR_MAX_RANKS, INA_ERR_INVALID_ARGUMENT,
              "custom_ar layout: %d ranks must be in [1, %d]", nranks, INA_CAR_MAX_RANKS);
  const uint64_t cap = round_up(capacity_bytes, INA_CAR_REGION_ALIGN);
  const uint64_t n = (uint64_t)nranks;
  /* A stripe holds at most ceil(units / n) units of at most INA_CAR_MAX_COLS elements, and
   * units x unit x 2 bytes fit the capacity. */
  const uint64_t slot_elems = round_up((cap / 2 + n - 1) / n + INA_CAR_MAX_COLS, INA_CAR_GRANULE);
  uint64_t at = 0;
  out->capacity = cap;
  out->ll_capacity = cap < INA_CAR_LL_MAX_BYTES ? cap : INA_CAR_LL_MAX_BYTES;
  out->fp8_slot_elems = slot_elems;
  out->fp8_slot_bytes =
      round_up(slot_elems + slot_elems / INA_CAR_GRANULE * 4, INA_CAR_REGION_ALIGN);
  out->flags = at;
  at = round_up(at + 8u * INA_CAR_FLAG_KINDS * INA_CAR_MAX_BLOCKS * INA_CAR_MAX_RANKS,
                INA_CAR_REGION_ALIGN);
  out->epochs = at;
  at = round_up(at + 8u * INA_CAR_MAX_BLOCKS, INA_CAR_REGION_ALIGN);
  for (int p = 0; p < 2; p++) {
    out->ll[p] = at;
    at += n * (out->ll_capacity / INA_CAR_LL_PAYLOAD_BYTES) * INA_CAR_LL_LINE_BYTES;
  }
  out->input = at;
  at += cap;
  out->stage[0] = at;
  at += cap;
  out->stage[1] = at;
  at += cap;
  out->fp8_recv = at;
  at += n * out->fp8_slot_bytes;
  out->reduced = at;
  at += cap;
  out->total = at;
fail:
  return st;
}

size_t ina_car_default_one_shot_max_bytes(int nranks) {
  /* Two ranks move the same bytes either way (one-shot reads the peer's whole input,
   * two-shot half of it twice), and one-shot has one barrier fewer. With more ranks
   * one-shot reads (n-1)x the data against two-shot's 2(n-1)/n x. Starting points, to be
   * replaced by measurements (bench_custom_ar). */
  if (nranks <= 2) return (size_t)8 << 20;
  if (nranks <= 4) return (size_t)512 << 10;
  return (size_t)256 << 10;
}

size_t ina_car_ll_auto_max_bytes(int nranks, int epilogue) {
  /* LL sends twice the bytes (a flag word per payload word) but needs no barrier and no
   * round trip: it wins while latency dominates. On two H200s (bench_custom_ar, graph
   * replays) plain LL beats one-shot up to 256 KiB (5.4 vs 6.1 us) and loses at 512 KiB
   * (7.1 vs 6.7 us). Fused with the epilogue, whose rows each take one CTA, LL already
   * lost at 16 rows of 7168 (229 KiB: 12.5 vs 9.2 us for one-shot). More ranks multiply
   * LL's writes: unmeasured, same limits. */
  (void)nranks;
  return epilogue ? (size_t)128 << 10 : (size_t)256 << 10;
}

static const char *mode_name(int mode) {
  switch (mode) {
    case INA_CAR_MODE_BF16: return "bf16";
    case INA_CAR_MODE_F32: return "f32";
    case INA_CAR_MODE_FP8: return "fp8";
    default: return "unknown";
  }
}

/* Shape checks that hold whatever the algorithm. */
static ina_status_t check_shape(const ina_car_request_t *r) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(r->mode == INA_CAR_MODE_BF16 || r->mode == INA_CAR_MODE_F32 ||
                  r->mode == INA_CAR_MODE_FP8,
              INA_ERR_INVALID_ARGUMENT, "custom_ar: unknown mode %d", r->mode);
  INA_REQUIRE(r->algo >= INA_CAR_ALGO_AUTO && r->algo <= INA_CAR_ALGO_LL,
              INA_ERR_INVALID_ARGUMENT, "custom_ar: unknown algorithm %d", r->algo);
  INA_REQUIRE(r->nranks >= 1, INA_ERR_INVALID_ARGUMENT, "custom_ar: %d ranks", r->nranks);
  INA_REQUIRE(r->count <= ((uint64_t)1 << 40), INA_ERR_INVALID_ARGUMENT,
              "custom_ar: count %llu is too large", (unsigned long long)r->count);
  if (r->rows == 0 && r->cols == 0) return INA_OK; /* no epilogue */
  INA_REQUIRE(r->mode != INA_CAR_MODE_F32, INA_ERR_UNSUPPORTED,
              "custom_ar: the fused epilogue takes bf16 (modes bf16 and fp8), not f32");
  INA_REQUIRE(r->rows >= 1 && r->cols >= 8 && r->cols % 8 == 0 && r->cols <= INA_CAR_MAX_COLS,
              INA_ERR_INVALID_ARGUMENT,
              "custom_ar epilogue: rows %lld must be >= 1 and cols %lld a multiple of 8 in "
              "[8, %d]",
              (long long)r->rows, (long long)r->cols, INA_CAR_MAX_COLS);
  INA_REQUIRE(r->mode != INA_CAR_MODE_FP8 || r->cols % INA_CAR_GRANULE == 0,
              INA_ERR_UNSUPPORTED,
              "custom_ar epilogue: fp8 mode needs cols (%lld) to be a multiple of %d so rows "
              "are whole FP8 blocks",
              (long long)r->cols, INA_CAR_GRANULE);
  INA_REQUIRE((uint64_t)r->rows * (uint64_t)r->cols == r->count, INA_ERR_INVALID_ARGUMENT,
              "custom_ar epilogue: rows %lld x cols %lld != count %llu", (long long)r->rows,
              (long long)r->cols, (unsigned long long)r->count);
fail:
  return st;
}

ina_status_t ina_car_choose(const ina_car_request_t *r, int *algo, ina_car_plan_t *plan) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(r && algo && plan, INA_ERR_INVALID_ARGUMENT, "custom_ar choose: NULL argument");
  INA_CHECK(check_shape(r));
  const int epilogue = r->cols > 0;
  const uint64_t unit_elems = epilogue ? (uint64_t)r->cols : INA_CAR_GRANULE;
  const uint64_t units = (r->count + unit_elems - 1) / unit_elems;
  /* The kernels process whole units, so the regions must hold the padded count. */
  const uint64_t padded_bytes = units * unit_elems * (uint64_t)ina_car_in_elem_bytes(r->mode);
  const uint64_t in_bytes = r->count * (uint64_t)ina_car_in_elem_bytes(r->mode);
  const int fits = r->peer_access && r->nranks <= INA_CAR_MAX_RANKS && r->blocks >= 1 &&
                   r->blocks <= INA_CAR_MAX_BLOCKS && padded_bytes <= r->capacity;

  INA_REQUIRE(r->mode != INA_CAR_MODE_FP8 ||
                  (r->algo != INA_CAR_ALGO_ONE_SHOT && r->algo != INA_CAR_ALGO_LL),
              INA_ERR_UNSUPPORTED, "custom_ar: fp8 mode is two-shot only (%s requested)",
              r->algo == INA_CAR_ALGO_LL ? "ll" : "one-shot");
  if (r->algo == INA_CAR_ALGO_NCCL || !fits) {
    INA_REQUIRE(r->have_nccl, INA_ERR_UNSUPPORTED,
                "custom_ar: %s all-reduce of %llu elements needs the NCCL fallback (%s), but "
                "the communicator has no NCCL backend",
                mode_name(r->mode), (unsigned long long)r->count,
                r->algo == INA_CAR_ALGO_NCCL ? "requested"
                : !r->peer_access            ? "no peer access"
                                             : "larger than the registered buffers");
    *algo = INA_CAR_ALGO_NCCL;
    return INA_OK;
  }
  const int ll_fits = padded_bytes <= r->ll_capacity;
  if (r->mode == INA_CAR_MODE_FP8) *algo = INA_CAR_ALGO_TWO_SHOT;
  else if (r->algo == INA_CAR_ALGO_LL) *algo = ll_fits ? INA_CAR_ALGO_LL : INA_CAR_ALGO_ONE_SHOT;
  else if (r->algo != INA_CAR_ALGO_AUTO) *algo = r->algo;
  else if (ll_fits && in_bytes <= ina_car_ll_auto_max_bytes(r->nranks, epilogue))
    *algo = INA_CAR_ALGO_LL;
  else *algo = in_bytes <= r->one_shot_max_bytes ? INA_CAR_ALGO_ONE_SHOT : INA_CAR_ALGO_TWO_SHOT;
  plan->algo = *algo;
  plan->mode = r->mode;
  plan->nranks = r->nranks;
  plan->blocks = r->blocks;
  plan->count = (int64_t)r->count;
  plan->unit_elems = (int64_t)unit_elems;
  plan->units = (int64_t)units;
fail:
  return st;
}
