/* `ina plan`: the expert-parallel traffic and time model (moe_ep/ep_traffic.h) for a
 * model's shapes at one or more EP degrees. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "model/config.h"
#include "model/model.h"
#include "moe_ep/ep_traffic.h"
#include "tools/cli.h"

static void plan_usage(FILE *f) {
  fprintf(f,
          "usage: ina plan --model SPEC --ep E[,E...] --batch B [options]\n"
          "\n"
          "Predicts one MoE layer's expert-parallel exchange per rank: the bytes and messages\n"
          "of dispatch/combine (each token sent only to its experts' ranks) against the\n"
          "all-gather exchange (every rank gathers every token, outputs reduce-scattered),\n"
          "and the step time of each from per-byte and per-message costs. Routing is the\n"
          "model's router on random logits, experts placed contiguously (balanced load).\n"
          "\n"
          "  --model SPEC         checkpoint dir, tiny or random:NAME (only its config is read)\n"
          "  --ep E[,E...]        expert-parallel degrees, e.g. 8,16,32,72\n"
          "  --batch B            tokens per step over the whole group (attention DP:\n"
          "                       B / E per rank)\n"
          "  --moe-layers N       MoE layers per step (default: the model's; DeepSeek-V3 has\n"
          "                       58, random:v3-layers 3)\n"
          "  --dtype D            dispatch payload: bf16 (default) or fp8 (1x128 scales);\n"
          "                       outputs return in bf16\n"
          "  --bytes-per-us X     link bandwidth per rank and direction (default 300000:\n"
          "                       300 GB/s, NVLink busbw of bench/RESULTS.md)\n"
          "  --message-us X       fixed cost per message (default 6.3)\n"
          "  --expert-tflops X    expert GEMM rate per rank for the compute term (default 0:\n"
          "                       exchange only)\n"
          "  --combine-summed     each rank sums its experts' outputs before they return (one\n"
          "                       row per token and rank, not per expert: fewer bytes, but\n"
          "                       not the one-rank order of the sum)\n"
          "  --samples N          routed tokens drawn (default 8192)\n"
          "  --seed N             (default 1)\n"
          "  -h, --help           this help\n");
}

int cmd_plan(int argc, char **argv) {
  enum { O_MODEL = 256, O_EP, O_BATCH, O_DTYPE, O_BW, O_MSG, O_TFLOPS, O_SAMPLES, O_SEED, O_LAYERS, O_SUMMED };
  static const struct option opts[] = {{"model", required_argument, 0, O_MODEL},
                                       {"ep", required_argument, 0, O_EP},
                                       {"batch", required_argument, 0, O_BATCH},
                                       {"dtype", required_argument, 0, O_DTYPE},
                                       {"bytes-per-us", required_argument, 0, O_BW},
                                       {"message-us", required_argument, 0, O_MSG},
                                       {"expert-tflops", required_argument, 0, O_TFLOPS},
                                       {"samples", required_argument, 0, O_SAMPLES},
                                       {"seed", required_argument, 0, O_SEED},
                                       {"moe-layers", required_argument, 0, O_LAYERS},
                                       {"combine-summed", no_argument, 0, O_SUMMED},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *spec = NULL, *dtype = "bf16";
  int32_t *eps = NULL, n_eps = 0;
  int64_t batch = -1, v = 0, layers = 0;
  ina_ep_costs_t costs = INA_EP_COSTS_INIT;
  double tflops = 0;
  int32_t samples = 8192;
  uint64_t seed = 1;
  int c, rc = 2, summed = 0;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
      case O_MODEL: spec = optarg; break;
      case O_EP:
        free(eps);
        if (cli_parse_ids("--ep", optarg, &eps, &n_eps)) goto done;
        break;
      case O_BATCH: if (cli_parse_int("--batch", optarg, 1, (int64_t)1 << 30, &batch)) goto done; break;
      case O_DTYPE:
        if (strcmp(optarg, "bf16") && strcmp(optarg, "fp8")) {
          fprintf(stderr, "ina plan: --dtype '%s': expected bf16 or fp8\n", optarg);
          goto done;
        }
        dtype = optarg;
        break;
      case O_BW: if (cli_parse_float("--bytes-per-us", optarg, 1e-3, 1e12, &costs.bytes_per_us)) goto done; break;
      case O_MSG: if (cli_parse_float("--message-us", optarg, 0, 1e9, &costs.message_us)) goto done; break;
      case O_TFLOPS: if (cli_parse_float("--expert-tflops", optarg, 0, 1e6, &tflops)) goto done; break;
      case O_SAMPLES: if (cli_parse_int("--samples", optarg, 1, 1 << 22, &v)) goto done; samples = (int32_t)v; break;
      case O_SUMMED: summed = 1; break;
      case O_LAYERS: if (cli_parse_int("--moe-layers", optarg, 1, 4096, &layers)) goto done; break;
      case O_SEED: if (cli_parse_int("--seed", optarg, 0, INT64_MAX, &v)) goto done; seed = (uint64_t)v; break;
      case 'h': plan_usage(stdout); rc = 0; goto done;
      default: plan_usage(stderr); goto done;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "ina plan: unexpected argument '%s'\n", argv[optind]);
    goto done;
  }
  if (!spec || !n_eps || batch < 0) {
    fprintf(stderr, "ina plan: --model, --ep and --batch are required\n\n");
    plan_usage(stderr);
    goto done;
  }
  costs.expert_flops_per_us = tflops * 1e6;
  ina_model_config_t cfg;
  if (ina_model_spec_config(spec, &cfg) != INA_OK) {
    fprintf(stderr, "ina plan: %s\n", ina_last_error());
    rc = 1;
    goto done;
  }
  if (cfg.n_routed_experts <= 0) {
    fprintf(stderr, "ina plan: model %s has no routed experts: nothing to exchange\n", spec);
    rc = 1;
    goto done;
  }
  int32_t moe_layers = 0;
  for (int32_t l = 0; l < cfg.num_layers; l++) moe_layers += ina_cfg_layer_is_moe(&cfg, l);
  if (layers > 0) moe_layers = (int32_t)layers;
  ina_ep_traffic_input_t in;
  memset(&in, 0, sizeof in);
  in.router = ina_cfg_router_config(&cfg);
  in.hidden = cfg.hidden_size;
  in.moe_intermediate = cfg.moe_intermediate_size;
  in.moe_layers = moe_layers;
  in.dispatch_bytes_per_value = strcmp(dtype, "fp8") == 0 ? 1.0 : 2.0;
  in.combine_bytes_per_value = 2.0;
  in.combine_summed = summed;
  in.samples = samples;
  in.seed = seed;
  printf("model %s: hidden %d, %d routed experts, top-%d, %d groups (top %d), %d MoE layers; batch %lld, %s "
         "dispatch, bf16 combine%s; costs %.0f bytes/us, %.2f us/message%s\n",
         spec, (int)cfg.hidden_size, (int)cfg.n_routed_experts, (int)cfg.num_experts_per_tok, (int)cfg.n_group,
         (int)cfg.topk_group, (int)moe_layers, (long long)batch, dtype, summed ? " (summed per rank)" : " (a row per expert)", costs.bytes_per_us, costs.message_us,
         tflops > 0 ? "" : ", no compute term");
  printf("per rank and MoE layer:\n");
  printf("%5s %8s %7s %7s %6s %10s %10s %10s %7s %9s %9s %10s %10s\n", "ep", "tok/rank", "ranks/t", "max", "peers",
         "disp MB", "comb MB", "allg MB", "ratio", "disp us", "comb us", "allg us", "step ms");
  rc = 0;
  for (int32_t i = 0; i < n_eps; i++) {
    in.ep = eps[i];
    in.tokens_per_rank = (batch + eps[i] - 1) / (eps[i] > 0 ? eps[i] : 1);
    ina_ep_traffic_t t;
    if (eps[i] < 1 || ina_ep_traffic_estimate(&in, &costs, &t) != INA_OK) {
      fprintf(stderr, "ina plan: --ep %d: %s\n", (int)eps[i], eps[i] < 1 ? "must be >= 1" : ina_last_error());
      rc = 1;
      continue;
    }
    const double sent = t.dispatch_bytes + t.combine_bytes;
    printf("%5d %8lld %7.2f %7d %6.1f %10.3f %10.3f %10.3f %7.3f %9.1f %9.1f %10.1f %5.2f/%.2f\n", (int)eps[i],
           (long long)in.tokens_per_rank, t.ranks_per_token, (int)t.max_ranks_per_token, t.peers_per_rank,
           t.dispatch_bytes / 1e6, t.combine_bytes / 1e6, t.allgather_bytes / 1e6,
           t.allgather_bytes > 0 ? sent / t.allgather_bytes : 0.0, t.dispatch_us, t.combine_us, t.allgather_us,
           t.step_dispatch_us / 1e3, t.step_allgather_us / 1e3);
  }
  printf("ranks/t: ranks a token reaches (home included); peers: other ranks one rank's batch reaches;\n"
         "ratio: (dispatch + combine) / all-gather bytes; step ms: every MoE layer's exchange%s,\n"
         "dispatch/combine / all-gather.\n",
         tflops > 0 ? " and expert compute" : "");
done:
  free(eps);
  return rc;
}
