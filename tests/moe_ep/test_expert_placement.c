/* Expert placements (moe_ep/expert_placement.h): the contiguous placement, validation with
 * the offence named, copies, equality and digests, on fixed cases and random ones. */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "moe_ep/expert_placement.h"
#include "tests/test_util.h"

static void expect_invalid(const ina_expert_placement_t *p, const char *part) {
  ina_log_set_quiet_errors(1);
  const ina_status_t st = ina_expert_placement_validate(p);
  ina_log_set_quiet_errors(0);
  CHECKF(st == INA_ERR_INVALID_ARGUMENT && strstr(ina_last_error(), part) != NULL,
         "validate returned %d (%s), expected INVALID_ARGUMENT saying '%s'", (int)st,
         ina_last_error(), part);
}

static void check_contiguous(void) {
  /* 8 experts over 3 ranks: 2, 3, 3 -> [0, 2), [2, 5), [5, 8) in 3 slots each. */
  ina_expert_placement_t p;
  CHECK_OK(ina_expert_placement_init_contiguous(3, 2, 8, &p));
  CHECK(p.ep == 3 && p.slots_per_rank == 3 && p.num_moe_layers == 2 && p.num_experts == 8);
  const int32_t want[3][3] = {{0, 1, -1}, {2, 3, 4}, {5, 6, 7}};
  for (int32_t l = 0; l < 2; l++)
    for (int32_t r = 0; r < 3; r++)
      for (int32_t s = 0; s < 3; s++)
        CHECKF(ina_expert_placement_slot(&p, l, r, s) == want[r][s], "layer %d rank %d slot %d: %d",
               l, r, s, ina_expert_placement_slot(&p, l, r, s));
  CHECK_OK(ina_expert_placement_validate(&p));
  ina_expert_placement_free(&p);
  ina_expert_placement_free(&p); /* freeing twice is harmless */
  /* One rank holds everything. */
  CHECK_OK(ina_expert_placement_init_contiguous(1, 1, 5, &p));
  CHECK(p.slots_per_rank == 5 && ina_expert_placement_slot(&p, 0, 0, 4) == 4);
  ina_expert_placement_free(&p);
}

static void check_invalid(void) {
  ina_expert_placement_t p;
  CHECK_OK(ina_expert_placement_init_contiguous(2, 3, 6, &p));
  /* Layer 2 loses expert 4. */
  p.slot_expert[ina_expert_placement_index(&p, 2, 1, 1)] = -1;
  expect_invalid(&p, "MoE layer 2: logical expert 4 has no slot");
  /* Out of range, named with its place. */
  p.slot_expert[ina_expert_placement_index(&p, 2, 1, 1)] = 6;
  expect_invalid(&p, "MoE layer 2, rank 1, slot 1: expert 6 is outside [0, 6)");
  p.slot_expert[ina_expert_placement_index(&p, 2, 1, 1)] = -2;
  expect_invalid(&p, "expert -2 is outside");
  /* Twice on one rank. */
  p.slot_expert[ina_expert_placement_index(&p, 2, 1, 1)] = 3;
  expect_invalid(&p, "rank 1, slot 1: the rank already holds expert 3");
  ina_expert_placement_free(&p);
  /* The same expert on two ranks is a replica, and a slot may stay empty. */
  CHECK_OK(ina_expert_placement_init(2, 4, 1, 6, &p));
  const int32_t map[8] = {0, 1, 2, 3, 3, 4, 5, -1};
  memcpy(p.slot_expert, map, sizeof map);
  CHECK_OK(ina_expert_placement_validate(&p));
  ina_expert_placement_free(&p);
  /* Bad sizes. */
  ina_log_set_quiet_errors(1);
  CHECK(ina_expert_placement_init(0, 1, 1, 1, &p) == INA_ERR_INVALID_ARGUMENT && !p.slot_expert);
  CHECK(ina_expert_placement_init(1, 0, 1, 1, &p) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_expert_placement_init(1, 1, -1, 1, &p) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_expert_placement_init(1, 1, 1, 0, &p) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_expert_placement_init(65536, 65536, 2, 1, &p) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_expert_placement_validate(NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
}

/* Random placements: validity agrees with a direct count, copies are equal with equal
 * digests, and one changed slot changes both. */
static void check_random(test_rng_t *rng) {
  for (int iter = 0; iter < 300; iter++) {
    const int32_t ep = (int32_t)test_rng_int(rng, 1, 5), E = (int32_t)test_rng_int(rng, 1, 12);
    const int32_t slots = (int32_t)test_rng_int(rng, 1, E + 1), layers = (int32_t)test_rng_int(rng, 0, 3);
    ina_expert_placement_t p, q;
    CHECK_OK(ina_expert_placement_init(ep, slots, layers, E, &p));
    for (int32_t i = 0; i < ep * slots * layers; i++)
      p.slot_expert[i] = (int32_t)test_rng_int(rng, -1, E - 1);
    int valid = 1;
    for (int32_t l = 0; l < layers; l++) {
      for (int32_t x = 0; x < E; x++) {
        int placed = 0;
        for (int32_t r = 0; r < ep; r++) {
          int on_rank = 0;
          for (int32_t s = 0; s < slots; s++) on_rank += ina_expert_placement_slot(&p, l, r, s) == x;
          valid &= on_rank <= 1;
          placed += on_rank;
        }
        valid &= placed >= 1;
      }
    }
    ina_log_set_quiet_errors(1);
    const ina_status_t st = ina_expert_placement_validate(&p);
    ina_log_set_quiet_errors(0);
    CHECKF((st == INA_OK) == valid, "iteration %d: validate says %d, the count says %s", iter,
           (int)st, valid ? "valid" : "invalid");
    CHECK_OK(ina_expert_placement_copy(&p, &q));
    CHECK(ina_expert_placement_equal(&p, &q));
    CHECK(ina_expert_placement_digest(&p) == ina_expert_placement_digest(&q));
    if (layers > 0) {
      const int32_t i = (int32_t)test_rng_int(rng, 0, ep * slots * layers - 1);
      q.slot_expert[i] = q.slot_expert[i] == 0 ? 1 : 0;
      CHECK(!ina_expert_placement_equal(&p, &q));
      CHECK(ina_expert_placement_digest(&p) != ina_expert_placement_digest(&q));
    }
    ina_expert_placement_free(&p);
    ina_expert_placement_free(&q);
  }
}

int main(void) {
  test_rng_t rng = {test_seed("test_expert_placement")};
  check_contiguous();
  check_invalid();
  check_random(&rng);
  return test_finish("test_expert_placement");
}
