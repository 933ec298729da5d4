/* Expert placements (moe_ep/expert_placement.h). */
#define INA_LOG_SUBSYS "model"
#include "moe_ep/expert_placement.h"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"

ina_status_t ina_expert_placement_init(int32_t ep, int32_t slots_per_rank, int32_t num_moe_layers,
                                       int32_t num_experts, ina_expert_placement_t *out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "expert placement: out is NULL");
  memset(out, 0, sizeof *out);
  INA_REQUIRE(ep >= 1 && slots_per_rank >= 1 && num_moe_layers >= 0 && num_experts >= 0,
              INA_ERR_INVALID_ARGUMENT,
              "expert placement: ep %d and slots_per_rank %d must be positive, MoE layers %d and "
              "experts %d not negative",
              ep, slots_per_rank, num_moe_layers, num_experts);
  INA_REQUIRE(num_experts >= 1 || num_moe_layers == 0, INA_ERR_INVALID_ARGUMENT,
              "expert placement: %d MoE layers without routed experts (a model without experts "
              "has no MoE layers)",
              num_moe_layers);
  const int64_t slots = (int64_t)ep * slots_per_rank * (num_moe_layers > 0 ? num_moe_layers : 1);
  INA_REQUIRE(slots <= INT32_MAX, INA_ERR_INVALID_ARGUMENT,
              "expert placement: %lld slots in all (ep %d x %d slots x %d layers) is too many",
              (long long)slots, ep, slots_per_rank, num_moe_layers);
  out->slot_expert = malloc((size_t)slots * sizeof *out->slot_expert);
  INA_CHECK_ALLOC(out->slot_expert);
  for (int64_t i = 0; i < slots; i++) out->slot_expert[i] = -1;
  out->ep = ep;
  out->slots_per_rank = slots_per_rank;
  out->num_moe_layers = num_moe_layers;
  out->num_experts = num_experts;
fail:
  return st;
}

ina_status_t ina_expert_placement_init_contiguous(int32_t ep, int32_t num_moe_layers,
                                                  int32_t num_experts, ina_expert_placement_t *out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(ep >= 1 && num_experts >= 0, INA_ERR_INVALID_ARGUMENT,
              "expert placement: ep %d must be positive and experts %d not negative", ep, num_experts);
  /* One slot per rank (empty) when there are no experts to place. */
  INA_CHECK(ina_expert_placement_init(ep, num_experts > 0 ? (num_experts + ep - 1) / ep : 1,
                                      num_moe_layers, num_experts, out));
  for (int32_t l = 0; l < num_moe_layers; l++)
    for (int32_t r = 0; r < ep; r++) {
      const int32_t begin = (int32_t)((int64_t)num_experts * r / ep);
      const int32_t end = (int32_t)((int64_t)num_experts * (r + 1) / ep);
      for (int32_t x = begin; x < end; x++)
        out->slot_expert[ina_expert_placement_index(out, l, r, x - begin)] = x;
    }
fail:
  return st;
}

ina_status_t ina_expert_placement_copy(const ina_expert_placement_t *src, ina_expert_placement_t *out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(src != NULL && src->slot_expert != NULL, INA_ERR_INVALID_ARGUMENT,
              "expert placement: copy of an empty placement");
  INA_CHECK(ina_expert_placement_init(src->ep, src->slots_per_rank, src->num_moe_layers,
                                      src->num_experts, out));
  memcpy(out->slot_expert, src->slot_expert,
         (size_t)src->ep * (size_t)src->slots_per_rank *
             (size_t)(src->num_moe_layers > 0 ? src->num_moe_layers : 1) * sizeof *out->slot_expert);
fail:
  return st;
}

void ina_expert_placement_free(ina_expert_placement_t *p) {
  if (!p) return;
  free(p->slot_expert);
  memset(p, 0, sizeof *p);
}

ina_status_t ina_expert_placement_validate(const ina_expert_placement_t *p) {
  ina_status_t st = INA_OK;
  int32_t *holder = NULL; /* per logical expert: the last rank seen holding it, or -1 */
  INA_REQUIRE(p != NULL && p->slot_expert != NULL && p->ep >= 1 && p->slots_per_rank >= 1 &&
                  p->num_experts >= 0 && p->num_moe_layers >= 0 &&
                  (p->num_experts >= 1 || p->num_moe_layers == 0),
              INA_ERR_INVALID_ARGUMENT, "expert placement: empty or malformed");
  holder = malloc(((size_t)p->num_experts + 1) * sizeof *holder);
  INA_CHECK_ALLOC(holder);
  for (int32_t l = 0; l < p->num_moe_layers; l++) {
    for (int32_t x = 0; x < p->num_experts; x++) holder[x] = -1;
    for (int32_t r = 0; r < p->ep; r++)
      for (int32_t s = 0; s < p->slots_per_rank; s++) {
        const int32_t x = ina_expert_placement_slot(p, l, r, s);
        if (x == -1) continue;
        INA_REQUIRE(x >= 0 && x < p->num_experts, INA_ERR_INVALID_ARGUMENT,
                    "expert placement: MoE layer %d, rank %d, slot %d: expert %d is outside "
                    "[0, %d)",
                    l, r, s, x, p->num_experts);
        INA_REQUIRE(holder[x] != r, INA_ERR_INVALID_ARGUMENT,
                    "expert placement: MoE layer %d, rank %d, slot %d: the rank already holds "
                    "expert %d in another slot",
                    l, r, s, x);
        holder[x] = r;
      }
    for (int32_t x = 0; x < p->num_experts; x++)
      INA_REQUIRE(holder[x] >= 0, INA_ERR_INVALID_ARGUMENT,
                  "expert placement: MoE layer %d: logical expert %d has no slot", l, x);
  }
fail:
  free(holder);
  return st;
}

int ina_expert_placement_equal(const ina_expert_placement_t *a, const ina_expert_placement_t *b) {
  if (a->ep != b->ep || a->slots_per_rank != b->slots_per_rank ||
      a->num_moe_layers != b->num_moe_layers || a->num_experts != b->num_experts)
    return 0;
  const size_t n = (size_t)a->ep * (size_t)a->slots_per_rank * (size_t)a->num_moe_layers;
  return n == 0 || memcmp(a->slot_expert, b->slot_expert, n * sizeof *a->slot_expert) == 0;
}

uint64_t ina_expert_placement_digest(const ina_expert_placement_t *p) {
  /* FNV-1a over the sizes and slots. */
  uint64_t h = 14695981039346656037ull;
  const int32_t head[4] = {p->ep, p->slots_per_rank, p->num_moe_layers, p->num_experts};
  const size_t n = (size_t)p->ep * (size_t)p->slots_per_rank * (size_t)p->num_moe_layers;
  for (size_t i = 0; i < 4 + n; i++) {
    const uint32_t v = (uint32_t)(i < 4 ? head[i] : p->slot_expert[i - 4]);
    for (int b = 0; b < 4; b++) {
      h ^= (v >> (8 * b)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  return h;
}

int32_t ina_expert_placement_find_slot(const ina_expert_placement_t *p, int32_t layer, int32_t rank, int32_t x) {
  for (int32_t s = 0; s < p->slots_per_rank; s++)
    if (ina_expert_placement_slot(p, layer, rank, s) == x) return s;
  return -1;
}

int32_t ina_expert_placement_source(const ina_expert_placement_t *p, int32_t layer, int32_t x) {
  for (int32_t r = 0; r < p->ep; r++)
    if (ina_expert_placement_find_slot(p, layer, r, x) >= 0) return r;
  return -1;
}
