/* Request validators: every rule of ina_validate_generate_request and
 * ina_validate_apply_placement_request is broken once on a fresh random valid request,
 * and the status, gRPC code and exact message (field path and values) are checked. */
#include "proto/validate.h"
#include "tests/test_util.h"

enum { ITERS = 40 };

/* Checks one verdict: status, code and the exact message. */
static void expect_verdict(ina_status_t st, ina_proto_code_t code, const char *msg,
                           ina_proto_code_t want_code, const char *want_msg, int line) {
  ina_status_t want_st = want_code == INA_PROTO_CODE_OK ? INA_OK : INA_ERR_INVALID_ARGUMENT;
  CHECKF(st == want_st && code == want_code && strcmp(msg, want_msg) == 0,
         "line %d: got status %d code %d \"%s\", want status %d code %d \"%s\"", line, (int)st,
         (int)code, msg, (int)want_st, (int)want_code, want_msg);
}

/* ---- GenerateRequest ---------------------------------------------------------------- */

static char *dup_str(const char *s) {
  char *d = malloc(strlen(s) + 1);
  strcpy(d, s);
  return d;
}

/* A valid random request for `lim`, malloc'd throughout (free with
 * protobuf_c_message_free_unpacked). */
static Ina__V1__GenerateRequest *make_generate(test_rng_t *r, const ina_generate_limits_t *lim) {
  Ina__V1__GenerateRequest *g = malloc(sizeof *g);
  ina__v1__generate_request__init(g);
  char id[32];
  snprintf(id, sizeof id, "req-%u", (unsigned)test_rng_int(r, 0, 999999));
  g->request_id = dup_str(id);
  g->n_prompt_token_ids = (size_t)test_rng_int(r, 1, 40);
  g->prompt_token_ids = malloc(sizeof(uint32_t) * g->n_prompt_token_ids);
  for (size_t i = 0; i < g->n_prompt_token_ids; i++)
    g->prompt_token_ids[i] = (uint32_t)test_rng_int(r, 0, lim->vocab_size - 1);
  g->max_tokens = (uint32_t)test_rng_int(r, 1, lim->max_context_tokens - g->n_prompt_token_ids);
  if (test_rng_int(r, 0, 3) != 0) {
    Ina__V1__SamplingParams *s = malloc(sizeof *s);
    ina__v1__sampling_params__init(s);
    s->temperature = (float)test_rng_uniform(r) * 2.0f;
    s->top_p = (float)test_rng_uniform(r);
    s->top_k = (uint32_t)test_rng_int(r, 0, lim->vocab_size);
    s->min_p = (float)test_rng_uniform(r) * 0.99f;
    s->repetition_penalty = (float)test_rng_uniform(r) * 2.0f;
    s->seed = test_rng_next(r);
    g->sampling = s;
  }
  /* Distinct stop ids: consecutive ids from a random start, modulo vocab_size. */
  g->n_stop_token_ids = (size_t)test_rng_int(r, 0, 8);
  if (g->n_stop_token_ids > lim->vocab_size) g->n_stop_token_ids = lim->vocab_size;
  g->stop_token_ids = g->n_stop_token_ids ? malloc(sizeof(uint32_t) * g->n_stop_token_ids) : NULL;
  uint32_t start = (uint32_t)test_rng_int(r, 0, lim->vocab_size - 1);
  for (size_t i = 0; i < g->n_stop_token_ids; i++)
    g->stop_token_ids[i] = (uint32_t)((start + i) % lim->vocab_size);
  g->ignore_eos = (protobuf_c_boolean)test_rng_int(r, 0, 1);
  g->stream_interval = (uint32_t)test_rng_int(r, 0, INA_PROTO_MAX_STREAM_INTERVAL);
  return g;
}

static void set_request_id(Ina__V1__GenerateRequest *g, const char *id) {
  free(g->request_id);
  g->request_id = dup_str(id);
}

static Ina__V1__SamplingParams *ensure_sampling(Ina__V1__GenerateRequest *g) {
  if (!g->sampling) {
    g->sampling = malloc(sizeof *g->sampling);
    ina__v1__sampling_params__init(g->sampling);
  }
  return g->sampling;
}

/* Which rule to break. */
typedef enum {
  G_VALID, G_ID_EMPTY, G_ID_LONG, G_ID_MAX_LEN, G_ID_SPACE, G_PROMPT_EMPTY, G_PROMPT_VOCAB,
  G_PROMPT_LAST_ID, G_MAX_TOKENS_ZERO, G_CONTEXT, G_CONTEXT_EXACT, G_TEMP_INF, G_TEMP_NEG,
  G_TEMP_HIGH, G_TOP_P, G_TOP_K, G_MIN_P, G_REP_PENALTY, G_STOP_COUNT, G_STOP_VOCAB, G_STOP_DUP,
  G_STREAM_INTERVAL, G_CASES
} generate_case_t;

static void test_generate_case(test_rng_t *r, generate_case_t c) {
  ina_generate_limits_t lim = {.vocab_size = (uint32_t)test_rng_int(r, 2, 200000),
                               .max_context_tokens = (uint32_t)test_rng_int(r, 41, 200000)};
  Ina__V1__GenerateRequest *g = make_generate(r, &lim);
  char want[256] = "";
  ina_proto_code_t want_code = INA_PROTO_CODE_INVALID_ARGUMENT;
  const size_t k = (size_t)test_rng_int(r, 0, (int64_t)g->n_prompt_token_ids - 1);
  switch (c) {
    case G_VALID: want_code = INA_PROTO_CODE_OK; break;
    case G_ID_EMPTY: set_request_id(g, ""); snprintf(want, sizeof want, "request_id: empty"); break;
    case G_ID_LONG:
    case G_ID_MAX_LEN: {
      char id[INA_PROTO_MAX_REQUEST_ID_LEN + 2];
      size_t n = INA_PROTO_MAX_REQUEST_ID_LEN + (c == G_ID_LONG);
      memset(id, 'x', n);
      id[n] = '\0';
      set_request_id(g, id);
      if (c == G_ID_LONG) snprintf(want, sizeof want, "request_id: longer than 128 bytes");
      else want_code = INA_PROTO_CODE_OK;
      break;
    }
    case G_ID_SPACE: set_request_id(g, "ab c"); snprintf(want, sizeof want, "request_id[2]: byte 0x20 is not printable ASCII (0x21..0x7e)"); break;
    case G_PROMPT_EMPTY:
      free(g->prompt_token_ids);
      g->prompt_token_ids = NULL;
      g->n_prompt_token_ids = 0;
      snprintf(want, sizeof want, "prompt_token_ids: empty");
      break;
    case G_PROMPT_VOCAB:
      g->prompt_token_ids[k] = lim.vocab_size + (uint32_t)test_rng_int(r, 0, 5);
      snprintf(want, sizeof want, "prompt_token_ids[%zu]: %u >= vocab_size %u", k, g->prompt_token_ids[k], lim.vocab_size);
      break;
    case G_PROMPT_LAST_ID: g->prompt_token_ids[k] = lim.vocab_size - 1; want_code = INA_PROTO_CODE_OK; break;
    case G_MAX_TOKENS_ZERO: g->max_tokens = 0; snprintf(want, sizeof want, "max_tokens: 0 (must be >= 1)"); break;
    case G_CONTEXT:
      g->max_tokens = lim.max_context_tokens - (uint32_t)g->n_prompt_token_ids + 1;
      snprintf(want, sizeof want, "max_tokens: %u + %zu prompt tokens > max_context_tokens %u", g->max_tokens,
               g->n_prompt_token_ids, lim.max_context_tokens);
      break;
    case G_CONTEXT_EXACT:
      g->max_tokens = lim.max_context_tokens - (uint32_t)g->n_prompt_token_ids;
      want_code = INA_PROTO_CODE_OK;
      break;
    case G_TEMP_INF: ensure_sampling(g)->temperature = INFINITY; snprintf(want, sizeof want, "sampling.temperature: inf is not finite"); break;
    case G_TEMP_NEG: ensure_sampling(g)->temperature = -0.5f; snprintf(want, sizeof want, "sampling.temperature: -0.5 is outside [0, 100]"); break;
    case G_TEMP_HIGH: ensure_sampling(g)->temperature = 100.5f; snprintf(want, sizeof want, "sampling.temperature: 100.5 is outside [0, 100]"); break;
    case G_TOP_P: ensure_sampling(g)->top_p = 1.25f; snprintf(want, sizeof want, "sampling.top_p: 1.25 is outside [0, 1]"); break;
    case G_TOP_K:
      ensure_sampling(g)->top_k = lim.vocab_size + 1;
      snprintf(want, sizeof want, "sampling.top_k: %u > vocab_size %u", lim.vocab_size + 1, lim.vocab_size);
      break;
    case G_MIN_P: ensure_sampling(g)->min_p = 1.0f; snprintf(want, sizeof want, "sampling.min_p: 1 is outside [0, 1)"); break;
    case G_REP_PENALTY: ensure_sampling(g)->repetition_penalty = 10.5f; snprintf(want, sizeof want, "sampling.repetition_penalty: 10.5 is outside [0, 10]"); break;
    case G_STOP_COUNT:
      free(g->stop_token_ids);
      g->n_stop_token_ids = INA_PROTO_MAX_STOP_IDS + 1;
      g->stop_token_ids = malloc(sizeof(uint32_t) * g->n_stop_token_ids);
      for (size_t i = 0; i < g->n_stop_token_ids; i++) g->stop_token_ids[i] = 0;
      snprintf(want, sizeof want, "stop_token_ids: 65 ids > 64 allowed");
      break;
    case G_STOP_VOCAB:
    case G_STOP_DUP: {
      if (g->n_stop_token_ids < 2) { /* make room for the broken entry */
        free(g->stop_token_ids);
        g->n_stop_token_ids = 2;
        g->stop_token_ids = malloc(sizeof(uint32_t) * 2);
        g->stop_token_ids[0] = 0;
        g->stop_token_ids[1] = 1;
      }
      size_t j = (size_t)test_rng_int(r, 1, (int64_t)g->n_stop_token_ids - 1);
      size_t i = (size_t)test_rng_int(r, 0, (int64_t)j - 1);
      if (c == G_STOP_VOCAB) {
        g->stop_token_ids[j] = lim.vocab_size;
        snprintf(want, sizeof want, "stop_token_ids[%zu]: %u >= vocab_size %u", j, lim.vocab_size, lim.vocab_size);
      } else {
        g->stop_token_ids[j] = g->stop_token_ids[i];
        snprintf(want, sizeof want, "stop_token_ids[%zu]: %u duplicates stop_token_ids[%zu]", j, g->stop_token_ids[i], i);
      }
      break;
    }
    case G_STREAM_INTERVAL: g->stream_interval = 1025; snprintf(want, sizeof want, "stream_interval: 1025 > 1024"); break;
    case G_CASES: break;
  }
  char msg[256];
  ina_proto_code_t code = (ina_proto_code_t)-1;
  ina_status_t st = ina_validate_generate_request(g, &lim, msg, sizeof msg, &code);
  expect_verdict(st, code, msg, want_code, want, (int)c);
  protobuf_c_message_free_unpacked(&g->base, NULL);
}

static void test_generate_fixed(void) {
  const ina_generate_limits_t lim = {.vocab_size = 129280, .max_context_tokens = 4096};
  uint32_t prompt[6] = {1, 2, 3, 4, 5, 130000};
  Ina__V1__GenerateRequest g = INA__V1__GENERATE_REQUEST__INIT;
  g.request_id = "r1";
  g.prompt_token_ids = prompt;
  g.n_prompt_token_ids = 6;
  g.max_tokens = 16;
  char msg[256];
  ina_proto_code_t code;
  ina_status_t st = ina_validate_generate_request(&g, &lim, msg, sizeof msg, &code);
  expect_verdict(st, code, msg, INA_PROTO_CODE_INVALID_ARGUMENT, "prompt_token_ids[5]: 130000 >= vocab_size 129280", __LINE__);
  /* A short buffer truncates but stays terminated; code may be NULL. */
  char small[9];
  CHECK(ina_validate_generate_request(&g, &lim, small, sizeof small, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(strcmp(small, "prompt_t") == 0);
  CHECK(ina_validate_generate_request(&g, &lim, NULL, 0, NULL) == INA_ERR_INVALID_ARGUMENT);
  st = ina_validate_generate_request(NULL, &lim, msg, sizeof msg, &code);
  expect_verdict(st, code, msg, INA_PROTO_CODE_INVALID_ARGUMENT, "request: NULL", __LINE__);
  st = ina_validate_generate_request(&g, NULL, msg, sizeof msg, &code);
  expect_verdict(st, code, msg, INA_PROTO_CODE_INVALID_ARGUMENT, "limits: NULL or zero", __LINE__);
  /* A valid request clears a stale message. */
  prompt[5] = 7;
  strcpy(msg, "stale");
  st = ina_validate_generate_request(&g, &lim, msg, sizeof msg, &code);
  expect_verdict(st, code, msg, INA_PROTO_CODE_OK, "", __LINE__);
}

/* ---- ApplyPlacementRequest ---------------------------------------------------------- */

static void shuffle_u32(test_rng_t *r, uint32_t *a, size_t n) {
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)(test_rng_next(r) % i);
    uint32_t t = a[i - 1];
    a[i - 1] = a[j];
    a[j] = t;
  }
}

/* A valid placement for `lim` with the given degrees: every expert once, the remaining
 * slots random replicas, slots and layers listed in random order. */
static Ina__V1__ApplyPlacementRequest *make_placement_with(test_rng_t *r, const ina_placement_limits_t *lim,
                                                           uint32_t tp, uint32_t ep, uint32_t spr) {
  Ina__V1__ApplyPlacementRequest *req = malloc(sizeof *req);
  ina__v1__apply_placement_request__init(req);
  Ina__V1__ExpertPlacement *p = malloc(sizeof *p);
  ina__v1__expert_placement__init(p);
  req->placement = p;
  req->expected_generation = lim->current_generation;
  p->layout = malloc(sizeof *p->layout);
  ina__v1__layout__init(p->layout);
  p->layout->tp = tp;
  p->layout->dp = lim->world_size / tp;
  p->layout->ep = ep;
  p->slots_per_rank = spr;
  p->generation = test_rng_next(r); /* ignored in requests */
  const size_t total = (size_t)ep * spr;
  uint32_t *order = malloc(sizeof(uint32_t) * (lim->n_moe_layers > total ? lim->n_moe_layers : total));
  uint32_t *experts = malloc(sizeof(uint32_t) * total);
  p->n_layers = lim->n_moe_layers;
  p->layers = malloc(sizeof *p->layers * p->n_layers);
  for (uint32_t i = 0; i < lim->n_moe_layers; i++) order[i] = i;
  shuffle_u32(r, order, lim->n_moe_layers);
  for (size_t li = 0; li < p->n_layers; li++) {
    Ina__V1__LayerPlacement *layer = malloc(sizeof *layer);
    ina__v1__layer_placement__init(layer);
    layer->moe_layer = order[li];
    for (size_t s = 0; s < total; s++)
      experts[s] = s < lim->n_routed_experts ? (uint32_t)s : (uint32_t)test_rng_int(r, 0, lim->n_routed_experts - 1);
    shuffle_u32(r, experts, total);
    layer->n_slots = total;
    layer->slots = malloc(sizeof *layer->slots * total);
    p->layers[li] = layer;
    uint32_t *pairs = malloc(sizeof(uint32_t) * total);
    for (size_t s = 0; s < total; s++) pairs[s] = (uint32_t)s;
    shuffle_u32(r, pairs, total);
    for (size_t s = 0; s < total; s++) {
      Ina__V1__ExpertSlot *slot = malloc(sizeof *slot);
      ina__v1__expert_slot__init(slot);
      slot->ep_rank = pairs[s] / spr;
      slot->slot = pairs[s] % spr;
      slot->logical_expert = experts[pairs[s]];
      layer->slots[s] = slot;
    }
    free(pairs);
  }
  free(order);
  free(experts);
  return req;
}

static uint32_t random_divisor(test_rng_t *r, uint32_t n) {
  uint32_t d;
  do d = (uint32_t)test_rng_int(r, 1, n); while (n % d != 0);
  return d;
}

static Ina__V1__ApplyPlacementRequest *make_placement(test_rng_t *r, ina_placement_limits_t *lim) {
  static const uint32_t worlds[] = {1, 2, 4, 6, 8, 16};
  lim->world_size = worlds[test_rng_next(r) % 6];
  lim->n_moe_layers = (uint32_t)test_rng_int(r, 1, 4);
  lim->n_routed_experts = (uint32_t)test_rng_int(r, 2, 40);
  lim->current_generation = (uint64_t)test_rng_int(r, 1, 1000);
  uint32_t tp = random_divisor(r, lim->world_size), ep = random_divisor(r, lim->world_size);
  uint32_t spr = (lim->n_routed_experts + ep - 1) / ep + (uint32_t)test_rng_int(r, 0, 2);
  lim->max_slots_per_rank = spr + (uint32_t)test_rng_int(r, 0, 2);
  return make_placement_with(r, lim, tp, ep, spr);
}

typedef enum {
  P_VALID, P_NO_PLACEMENT, P_NO_LAYOUT, P_TP_ZERO, P_DP_ZERO, P_EP_ZERO, P_TP_DP, P_EP_DIVIDES,
  P_SPR_ZERO, P_SPR_TOO_FEW, P_LAYER_COUNT, P_LAYER_RANGE, P_LAYER_DUP, P_SLOT_COUNT, P_EP_RANK,
  P_SLOT_RANGE, P_EXPERT_RANGE, P_SLOT_DUP, P_EXPERT_MISSING, P_MEMORY, P_MEMORY_EXACT,
  P_GENERATION, P_GENERATION_ZERO, P_CASES
} placement_case_t;

static void test_placement_case(test_rng_t *r, placement_case_t c) {
  ina_placement_limits_t lim;
  Ina__V1__ApplyPlacementRequest *req = make_placement(r, &lim);
  Ina__V1__ExpertPlacement *p = req->placement;
  Ina__V1__Layout *l = p->layout;
  const uint32_t spr = p->slots_per_rank, ep = l->ep;
  const size_t li = (size_t)test_rng_int(r, 0, (int64_t)p->n_layers - 1);
  Ina__V1__LayerPlacement *layer = p->layers[li];
  const size_t si = (size_t)test_rng_int(r, 0, (int64_t)layer->n_slots - 1);
  Ina__V1__ExpertSlot *slot = layer->slots[si];
  char want[256] = "";
  ina_proto_code_t want_code = INA_PROTO_CODE_INVALID_ARGUMENT;
  switch (c) {
    case P_VALID: want_code = INA_PROTO_CODE_OK; break;
    case P_NO_PLACEMENT:
      protobuf_c_message_free_unpacked(&p->base, NULL);
      req->placement = NULL;
      snprintf(want, sizeof want, "placement: missing");
      break;
    case P_NO_LAYOUT:
      protobuf_c_message_free_unpacked(&l->base, NULL);
      p->layout = NULL;
      snprintf(want, sizeof want, "placement.layout: missing");
      break;
    case P_TP_ZERO: l->tp = 0; snprintf(want, sizeof want, "placement.layout.tp: 0 (must be >= 1)"); break;
    case P_DP_ZERO: l->dp = 0; snprintf(want, sizeof want, "placement.layout.dp: 0 (must be >= 1)"); break;
    case P_EP_ZERO: l->ep = 0; snprintf(want, sizeof want, "placement.layout.ep: 0 (must be >= 1)"); break;
    case P_TP_DP:
      l->tp *= 2;
      snprintf(want, sizeof want, "placement.layout: tp %u * dp %u != world_size %u", l->tp, l->dp, lim.world_size);
      break;
    case P_EP_DIVIDES:
      l->ep = lim.world_size + (uint32_t)test_rng_int(r, 1, 3);
      snprintf(want, sizeof want, "placement.layout.ep: %u does not divide world_size %u", l->ep, lim.world_size);
      break;
    case P_SPR_ZERO: p->slots_per_rank = 0; snprintf(want, sizeof want, "placement.slots_per_rank: 0 (must be >= 1)"); break;
    case P_SPR_TOO_FEW:
      lim.n_routed_experts = spr * ep + 1;
      snprintf(want, sizeof want, "placement.slots_per_rank: %u * ep %u < n_routed_experts %u", spr, ep, lim.n_routed_experts);
      break;
    case P_LAYER_COUNT:
      lim.n_moe_layers++;
      snprintf(want, sizeof want, "placement.layers: %zu entries != n_moe_layers %u", p->n_layers, lim.n_moe_layers);
      break;
    case P_LAYER_RANGE:
      layer->moe_layer = lim.n_moe_layers;
      snprintf(want, sizeof want, "placement.layers[%zu].moe_layer: %u >= n_moe_layers %u", li, lim.n_moe_layers, lim.n_moe_layers);
      break;
    case P_LAYER_DUP:
      if (p->n_layers < 2) { want_code = INA_PROTO_CODE_OK; break; } /* nothing to duplicate */
      {
        size_t j = li > 0 ? li : 1, i = (size_t)test_rng_int(r, 0, (int64_t)j - 1);
        p->layers[j]->moe_layer = p->layers[i]->moe_layer;
        snprintf(want, sizeof want, "placement.layers[%zu].moe_layer: %u is also given by placement.layers[%zu]", j,
                 p->layers[i]->moe_layer, i);
      }
      break;
    case P_SLOT_COUNT:
      protobuf_c_message_free_unpacked(&layer->slots[layer->n_slots - 1]->base, NULL);
      layer->n_slots--;
      snprintf(want, sizeof want, "placement.layers[%zu].slots: %zu entries != ep %u * slots_per_rank %u", li,
               layer->n_slots, ep, spr);
      break;
    case P_EP_RANK:
      slot->ep_rank = ep;
      snprintf(want, sizeof want, "placement.layers[%zu].slots[%zu].ep_rank: %u >= ep %u", li, si, ep, ep);
      break;
    case P_SLOT_RANGE:
      slot->slot = spr + (test_rng_int(r, 0, 1) ? 0 : 7);
      snprintf(want, sizeof want, "placement.layers[%zu].slots[%zu].slot: %u >= slots_per_rank %u", li, si, slot->slot, spr);
      break;
    case P_EXPERT_RANGE:
      slot->logical_expert = lim.n_routed_experts + (test_rng_int(r, 0, 1) ? 0 : 44); /* the boundary, or past it */
      snprintf(want, sizeof want, "placement.layers[%zu].slots[%zu].logical_expert: %u >= n_routed_experts %u", li, si,
               slot->logical_expert, lim.n_routed_experts);
      break;
    case P_SLOT_DUP: {
      size_t j = si > 0 ? si : 1, i = (size_t)test_rng_int(r, 0, (int64_t)j - 1);
      if (layer->n_slots < 2) { want_code = INA_PROTO_CODE_OK; break; }
      layer->slots[j]->ep_rank = layer->slots[i]->ep_rank;
      layer->slots[j]->slot = layer->slots[i]->slot;
      snprintf(want, sizeof want, "placement.layers[%zu].slots[%zu]: ep_rank %u slot %u is also given by placement.layers[%zu].slots[%zu]",
               li, j, layer->slots[i]->ep_rank, layer->slots[i]->slot, li, i);
      break;
    }
    case P_EXPERT_MISSING: {
      /* Find an expert with exactly one slot and give that slot to another expert. */
      uint32_t *count = calloc(lim.n_routed_experts, sizeof *count);
      for (size_t s = 0; s < layer->n_slots; s++) count[layer->slots[s]->logical_expert]++;
      uint32_t e = lim.n_routed_experts;
      for (uint32_t x = 0; x < lim.n_routed_experts && e == lim.n_routed_experts; x++)
        if (count[x] == 1) e = x;
      free(count);
      if (e == lim.n_routed_experts) { want_code = INA_PROTO_CODE_OK; break; } /* all replicated */
      for (size_t s = 0; s < layer->n_slots; s++)
        if (layer->slots[s]->logical_expert == e) layer->slots[s]->logical_expert = (e + 1) % lim.n_routed_experts;
      snprintf(want, sizeof want, "placement.layers[%zu].slots: logical expert %u has no slot", li, e);
      break;
    }
    case P_MEMORY:
      lim.max_slots_per_rank = spr - 1;
      want_code = INA_PROTO_CODE_RESOURCE_EXHAUSTED;
      snprintf(want, sizeof want, "placement.slots_per_rank: %u > %u slots that fit in GPU memory", spr, spr - 1);
      break;
    case P_MEMORY_EXACT: lim.max_slots_per_rank = spr; want_code = INA_PROTO_CODE_OK; break;
    case P_GENERATION:
    case P_GENERATION_ZERO:
      req->expected_generation = c == P_GENERATION ? lim.current_generation + 1 : 0;
      want_code = INA_PROTO_CODE_FAILED_PRECONDITION;
      snprintf(want, sizeof want, "expected_generation: %llu != generation in force %llu",
               (unsigned long long)req->expected_generation, (unsigned long long)lim.current_generation);
      break;
    case P_CASES: break;
  }
  char msg[256];
  ina_proto_code_t code = (ina_proto_code_t)-1;
  ina_status_t st = ina_validate_apply_placement_request(req, &lim, msg, sizeof msg, &code);
  /* Failures other than INVALID_ARGUMENT also return INA_ERR_INVALID_ARGUMENT. */
  expect_verdict(st, code, msg, want_code, want, 1000 + (int)c);
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

/* The example from the issue, with DeepSeek-V3 sizes: 8 ranks, 256 experts. */
static void test_placement_fixed(test_rng_t *r) {
  ina_placement_limits_t lim = {.world_size = 8, .n_moe_layers = 58, .n_routed_experts = 256,
                                .max_slots_per_rank = 40, .current_generation = 3};
  Ina__V1__ApplyPlacementRequest *req = make_placement_with(r, &lim, 8, 8, 36);
  char msg[256];
  ina_proto_code_t code;
  ina_status_t st = ina_validate_apply_placement_request(req, &lim, msg, sizeof msg, &code);
  expect_verdict(st, code, msg, INA_PROTO_CODE_OK, "", __LINE__);
  req->placement->layers[3]->slots[17]->logical_expert = 300;
  st = ina_validate_apply_placement_request(req, &lim, msg, sizeof msg, &code);
  expect_verdict(st, code, msg, INA_PROTO_CODE_INVALID_ARGUMENT,
                 "placement.layers[3].slots[17].logical_expert: 300 >= n_routed_experts 256", __LINE__);
  st = ina_validate_apply_placement_request(req, NULL, msg, sizeof msg, &code);
  expect_verdict(st, code, msg, INA_PROTO_CODE_INVALID_ARGUMENT, "limits: NULL or zero", __LINE__);
  st = ina_validate_apply_placement_request(NULL, &lim, msg, sizeof msg, &code);
  expect_verdict(st, code, msg, INA_PROTO_CODE_INVALID_ARGUMENT, "request: NULL", __LINE__);
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

int main(void) {
  test_rng_t rng = {test_seed("test_proto_validate")};
  test_generate_fixed();
  test_placement_fixed(&rng);
  for (int it = 0; it < ITERS; it++) {
    for (int c = 0; c < G_CASES; c++) test_generate_case(&rng, (generate_case_t)c);
    for (int c = 0; c < P_CASES; c++) test_placement_case(&rng, (placement_case_t)c);
  }
  return test_finish("test_proto_validate");
}
