/* The expert-parallel traffic model (moe_ep/ep_traffic.h):
 *   - greedy softmax routing on i.i.d. logits picks a uniform K-subset of the E experts,
 *     so the ranks a token reaches average ep (1 - C(E - E/ep, K) / C(E, K)) with
 *     contiguous placement; the sampled mean must be within 5 standard errors of it (the
 *     count lies in [0, ep], so its variance is at most ep^2 / 4);
 *   - DeepSeek-V3's group-limited routing with one group per rank (8 groups, top 4, at
 *     EP8) never reaches more than 4 ranks;
 *   - the bytes follow the header's formulas exactly, one rank exchanges nothing, and
 *     the times are messages x cost + bytes / bandwidth;
 *   - bad inputs are refused by name. */
#include <math.h>
#include <string.h>

#include "core/log.h"
#include "moe_ep/ep_traffic.h"
#include "tests/test_util.h"

static double choose_ratio(int32_t E, int32_t drop, int32_t K) { /* C(E - drop, K) / C(E, K) */
  double r = 1.0;
  for (int32_t i = 0; i < K; i++) r *= (double)(E - drop - i) / (double)(E - i);
  return r;
}

static ina_ep_traffic_input_t greedy_input(int32_t E, int32_t K, int32_t ep) {
  ina_ep_traffic_input_t in;
  memset(&in, 0, sizeof in);
  ina_router_config_t rc = INA_ROUTER_CONFIG_INIT;
  rc.method = INA_ROUTER_SOFTMAX_GREEDY;
  rc.num_experts = E;
  rc.top_k = K;
  in.router = rc;
  in.hidden = 2048;
  in.moe_intermediate = 1408;
  in.moe_layers = 26;
  in.ep = ep;
  in.tokens_per_rank = 16;
  in.dispatch_bytes_per_value = 2;
  in.combine_bytes_per_value = 2;
  in.samples = 20000;
  in.seed = 7;
  return in;
}

int main(void) {
  const ina_ep_costs_t costs = INA_EP_COSTS_INIT;
  /* 1. The mean ranks per token against the closed form. */
  const int32_t eps[] = {2, 4, 8, 16};
  for (size_t i = 0; i < sizeof eps / sizeof eps[0]; i++) {
    const int32_t E = 64, K = 6, ep = eps[i];
    ina_ep_traffic_input_t in = greedy_input(E, K, ep);
    ina_ep_traffic_t t;
    CHECK_OK(ina_ep_traffic_estimate(&in, &costs, &t));
    const double want = ep * (1.0 - choose_ratio(E, E / ep, K));
    const double tol = 5.0 * (ep / 2.0) / sqrt((double)in.samples);
    CHECKF(fabs(t.ranks_per_token - want) <= tol, "ep %d: %.4f ranks per token, expected %.4f +- %.4f", (int)ep,
           t.ranks_per_token, want, tol);
    /* The home is one of ep ranks, uniformly: remote = reached - P(home reached). */
    CHECKF(fabs(t.remote_ranks_per_token - want * (ep - 1) / ep) <= tol, "ep %d: %.4f remote ranks, expected %.4f",
           (int)ep, t.remote_ranks_per_token, want * (ep - 1) / ep);
    CHECKF(fabs(t.remote_entries_per_token - K * (ep - 1.0) / ep) <= 5.0 * K / sqrt((double)in.samples),
           "ep %d: %.4f remote entries, expected %.4f", (int)ep, t.remote_entries_per_token, K * (ep - 1.0) / ep);
    /* 3. The formulas. */
    const double row_d = in.hidden * 2.0 + 4.0 * K, row_c = in.hidden * 2.0, T = (double)in.tokens_per_rank;
    CHECK(fabs(t.dispatch_bytes - T * t.remote_ranks_per_token * row_d) <= 1e-6 * t.dispatch_bytes);
    CHECK(fabs(t.combine_bytes - T * t.remote_entries_per_token * row_c) <= 1e-6 * t.combine_bytes);
    CHECK(fabs(t.allgather_bytes - (ep - 1) * T * in.hidden * 2.0 * 3.0) <= 1e-6 * t.allgather_bytes);
    CHECK(t.peers_per_rank <= ep - 1 && t.peers_per_rank > 0);
    CHECK(fabs(t.dispatch_us - (t.peers_per_rank * costs.message_us + t.dispatch_bytes / costs.bytes_per_us)) < 1e-9);
    CHECK(fabs(t.step_allgather_us - in.moe_layers * t.allgather_us) < 1e-6);
  }
  /* 2. V3's groups at EP8: one group per rank, at most topk_group ranks per token. */
  {
    ina_ep_traffic_input_t in = greedy_input(256, 8, 8);
    in.router.method = INA_ROUTER_SIGMOID_NOAUX_TC;
    in.router.n_group = 8;
    in.router.topk_group = 4;
    in.router.norm_topk_prob = 1;
    in.router.routed_scaling_factor = 2.5f;
    in.hidden = 7168;
    in.tokens_per_rank = 32;
    ina_ep_traffic_t t;
    CHECK_OK(ina_ep_traffic_estimate(&in, &costs, &t));
    CHECKF(t.max_ranks_per_token <= 4, "V3 routing at EP8: a token reached %d ranks (at most 4 groups)",
           (int)t.max_ranks_per_token);
    CHECKF(t.dispatch_bytes <= 0.4 * t.allgather_bytes, "V3 routing at EP8: dispatch %.0f bytes, all-gather %.0f",
           t.dispatch_bytes, t.allgather_bytes);
    printf("V3 routing, EP8, 32 tokens per rank: %.2f ranks per token (max %d); dispatch %.3f MB, combine %.3f MB, "
           "all-gather exchange %.3f MB per rank and layer\n",
           t.ranks_per_token, (int)t.max_ranks_per_token, t.dispatch_bytes / 1e6, t.combine_bytes / 1e6,
           t.allgather_bytes / 1e6);
  }
  /* One rank: nothing crosses a wire. */
  {
    ina_ep_traffic_input_t in = greedy_input(64, 6, 1);
    ina_ep_traffic_t t;
    CHECK_OK(ina_ep_traffic_estimate(&in, &costs, &t));
    CHECK(t.remote_ranks_per_token == 0 && t.dispatch_bytes == 0 && t.combine_bytes == 0 && t.allgather_bytes == 0 &&
          t.peers_per_rank == 0);
  }
  /* 4. Refusals. */
  {
    ina_log_set_quiet_errors(1);
    ina_ep_traffic_input_t in = greedy_input(64, 6, 128);
    ina_ep_traffic_t t;
    CHECK(ina_ep_traffic_estimate(&in, &costs, &t) == INA_ERR_INVALID_ARGUMENT && strstr(ina_last_error(), "ep 128"));
    in = greedy_input(64, 6, 4);
    in.samples = 0;
    CHECK(ina_ep_traffic_estimate(&in, &costs, &t) == INA_ERR_INVALID_ARGUMENT && strstr(ina_last_error(), "samples"));
    ina_ep_costs_t bad = costs;
    bad.bytes_per_us = 0;
    in = greedy_input(64, 6, 4);
    CHECK(ina_ep_traffic_estimate(&in, &bad, &t) == INA_ERR_INVALID_ARGUMENT && strstr(ina_last_error(), "bytes_per_us"));
    ina_log_set_quiet_errors(0);
  }
  return test_finish("test_ep_traffic");
}
