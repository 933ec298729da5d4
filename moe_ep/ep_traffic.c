/* The expert-parallel traffic and time model (ep_traffic.h). */
#define INA_LOG_SUBSYS "moe_ep"
#include "moe_ep/ep_traffic.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

/* splitmix64: the model's own generator, so its figures do not depend on a platform. */
static uint64_t next_u64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double next_uniform(uint64_t *s) { return (double)(next_u64(s) >> 11) * 0x1.0p-53; }

static float next_normal(uint64_t *s) { /* Box-Muller */
  const double u = next_uniform(s), v = next_uniform(s);
  return (float)(sqrt(-2.0 * log(u > 0 ? u : 0x1.0p-53)) * cos(6.283185307179586 * v));
}

static int32_t rank_of_expert(int32_t x, int32_t E, int32_t ep) {
  /* the inverse of [E r / ep, E (r + 1) / ep) */
  int32_t r = (int32_t)(((int64_t)x * ep) / E);
  while (r + 1 < ep && ((int64_t)E * (r + 1)) / ep <= x) r++;
  while (r > 0 && ((int64_t)E * r) / ep > x) r--;
  return r;
}

ina_status_t ina_ep_traffic_estimate(const ina_ep_traffic_input_t *in, const ina_ep_costs_t *c, ina_ep_traffic_t *out) {
  ina_status_t st = INA_OK;
  float *logits = NULL, *weights = NULL, *bias = NULL;
  int32_t *ids = NULL;
  uint8_t *reach = NULL;
  INA_REQUIRE(in && c && out, INA_ERR_INVALID_ARGUMENT, "ep traffic: NULL argument");
  memset(out, 0, sizeof *out);
  INA_CHECK(ina_router_config_validate(&in->router));
  const int32_t E = in->router.num_experts, K = in->router.top_k, ep = in->ep;
  INA_REQUIRE(ep >= 1 && ep <= 4096, INA_ERR_INVALID_ARGUMENT, "ep traffic: ep %d is outside [1, 4096]", (int)ep);
  INA_REQUIRE(ep <= E, INA_ERR_INVALID_ARGUMENT, "ep traffic: ep %d is more than the %d experts (ranks without "
              "experts: replicas are not modelled)", (int)ep, (int)E);
  INA_REQUIRE(in->hidden >= 1 && in->moe_intermediate >= 0 && in->moe_layers >= 1 && in->tokens_per_rank >= 0,
              INA_ERR_INVALID_ARGUMENT, "ep traffic: hidden %lld, moe_intermediate %lld, moe_layers %d, tokens_per_rank %lld",
              (long long)in->hidden, (long long)in->moe_intermediate, (int)in->moe_layers, (long long)in->tokens_per_rank);
  INA_REQUIRE(in->dispatch_bytes_per_value > 0 && in->combine_bytes_per_value > 0, INA_ERR_INVALID_ARGUMENT,
              "ep traffic: payload bytes per value must be positive");
  INA_REQUIRE(in->samples >= 1 && in->samples <= (1 << 22), INA_ERR_INVALID_ARGUMENT,
              "ep traffic: samples %d is outside [1, 2^22]", (int)in->samples);
  INA_REQUIRE(c->bytes_per_us > 0 && c->message_us >= 0, INA_ERR_INVALID_ARGUMENT,
              "ep traffic: bytes_per_us %g must be positive and message_us %g not negative", c->bytes_per_us, c->message_us);
  const int64_t S = in->samples;
  logits = malloc((size_t)S * (size_t)E * sizeof *logits);
  weights = malloc((size_t)S * (size_t)K * sizeof *weights);
  ids = malloc((size_t)S * (size_t)K * sizeof *ids);
  reach = malloc((size_t)ep);
  INA_CHECK_ALLOC(logits);
  INA_CHECK_ALLOC(weights);
  INA_CHECK_ALLOC(ids);
  INA_CHECK_ALLOC(reach);
  uint64_t rng = in->seed ^ 0x5EED5EED5EED5EEDull;
  for (int64_t i = 0; i < S * E; i++) logits[i] = next_normal(&rng);
  /* No correction bias (zeros where the method takes one): a balanced router. */
  if (in->router.method == INA_ROUTER_SIGMOID_NOAUX_TC) {
    bias = calloc((size_t)E, sizeof *bias);
    INA_CHECK_ALLOC(bias);
  }
  INA_CHECK(ina_router_ref(&in->router, logits, bias, S, ids, weights));

  /* Per token: ranks reached and remote entries, from a uniformly drawn home. */
  double ranks = 0, remote = 0, remote_entries = 0;
  int32_t most = 0;
  int32_t *home = malloc((size_t)S * sizeof *home);
  INA_CHECK_ALLOC(home);
  for (int64_t t = 0; t < S; t++) {
    home[t] = (int32_t)(next_u64(&rng) % (uint64_t)ep);
    memset(reach, 0, (size_t)ep);
    int32_t n = 0;
    for (int32_t k = 0; k < K; k++) {
      const int32_t r = rank_of_expert(ids[t * K + k], E, ep);
      if (r != home[t]) remote_entries++;
      if (!reach[r]) {
        reach[r] = 1;
        n++;
      }
    }
    ranks += n;
    remote += n - reach[home[t]];
    if (n > most) most = n;
  }
  /* Peers a rank's batch reaches: the samples cut into batches of T tokens. */
  double peers = 0;
  const int64_t T = in->tokens_per_rank;
  if (T > 0 && ep > 1) {
    const int64_t batches = S / T > 0 ? S / T : 1; /* a batch longer than the samples wraps */
    for (int64_t b = 0; b < batches; b++) {
      const int32_t me = (int32_t)(b % ep); /* the batch's home */
      memset(reach, 0, (size_t)ep);
      int32_t n = 0;
      for (int64_t j = 0; j < T; j++) {
        const int64_t t = (b * T + j) % S;
        for (int32_t k = 0; k < K; k++) {
          const int32_t r = rank_of_expert(ids[t * K + k], E, ep);
          if (r != me && !reach[r]) {
            reach[r] = 1;
            n++;
          }
        }
      }
      peers += n;
    }
    peers /= (double)batches;
  }
  free(home);
  out->ranks_per_token = ranks / (double)S;
  out->remote_ranks_per_token = remote / (double)S;
  out->max_ranks_per_token = most;
  out->remote_entries_per_token = remote_entries / (double)S;
  out->peers_per_rank = peers;

  const double H = (double)in->hidden, Td = (double)T;
  const double scales = in->dispatch_bytes_per_value < 2 ? 4.0 * ceil(H / 128.0) : 0.0; /* fp8 rows */
  const double row_d = H * in->dispatch_bytes_per_value + scales + 4.0 * K, row_c = H * in->combine_bytes_per_value;
  out->dispatch_bytes = Td * out->remote_ranks_per_token * row_d;
  out->combine_bytes = Td * (in->combine_summed ? out->remote_ranks_per_token : out->remote_entries_per_token) * row_c;
  out->dispatch_messages = peers;
  /* All-gather of the rows, then a ring all-reduce (reduce-scatter + all-gather) of the
   * outputs over the whole batch: (ep - 1) T rows out, then 2 (ep - 1) T. */
  out->allgather_bytes = (double)(ep - 1) * Td * (H * in->dispatch_bytes_per_value + scales) +
                         2.0 * (double)(ep - 1) * Td * row_c;
  out->allgather_messages = 3.0 * (ep - 1);
  out->dispatch_us = peers * c->message_us + out->dispatch_bytes / c->bytes_per_us;
  out->combine_us = peers * c->message_us + out->combine_bytes / c->bytes_per_us;
  out->allgather_us = out->allgather_messages * c->message_us + out->allgather_bytes / c->bytes_per_us;
  /* Entries computed per rank: every token's K entries, spread evenly over the ranks. */
  if (c->expert_flops_per_us > 0)
    out->compute_us = Td * K * 3.0 * 2.0 * H * (double)in->moe_intermediate / c->expert_flops_per_us;
  out->step_dispatch_us = in->moe_layers * (out->dispatch_us + out->combine_us + out->compute_us);
  out->step_allgather_us = in->moe_layers * (out->allgather_us + out->compute_us);
fail:
  free(logits);
  free(weights);
  free(bias);
  free(ids);
  free(reach);
  return st;
}
