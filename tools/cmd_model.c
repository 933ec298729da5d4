/* ina model init | info */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "attention/dsa.h"
#include "core/log.h"
#include "model/model.h"
#include "tools/cli.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: ina model init --config NAME --out DIR [--seed S] [--dtype bf16|f32|fp8]\n"
          "       ina model info --model DIR|tiny|random:NAME\n"
          "\n"
          "init writes a built-in configuration (tiny, v2-lite, v3-layers, v3.2-tiny,\n"
          "v3.2-layers) with seeded random weights as a Hugging Face checkpoint (config.json +\n"
          "model.safetensors); fp8 stores\n"
          "the linear weights as e4m3 with 128x128 block scales (weight_scale_inv), as the\n"
          "DeepSeek-V3 release does. `--model random:NAME --model-seed S` builds the same\n"
          "weights in memory.\n"
          "info prints the configuration (V3.2: the indexer), the cache per token and the\n"
          "bytes of weights.\n");
}

static int model_init(int argc, char **argv) {
  static const struct option opts[] = {{"config", required_argument, 0, 'c'},
                                       {"out", required_argument, 0, 'o'},
                                       {"seed", required_argument, 0, 's'},
                                       {"dtype", required_argument, 0, 'd'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *name = NULL, *out = NULL;
  int64_t seed = 0;
  ina_dtype_t dtype = INA_DTYPE_BF16;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'c': name = optarg; break;
    case 'o': out = optarg; break;
    case 's': if (cli_parse_int("--seed", optarg, 0, INT64_MAX, &seed)) return 2; break;
    case 'd': if (cli_parse_weight_dtype("--dtype", optarg, &dtype)) return 2; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (!name || !out) {
    fprintf(stderr, "ina model init: --config and --out are required\n\n");
    usage(stderr);
    return 2;
  }
  ina_model_config_t cfg;
  if (ina_model_config_builtin(name, &cfg) != INA_OK) {
    fprintf(stderr, "ina model init: %s\n", ina_last_error());
    return 1;
  }
  if (mkdir(out, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "ina model init: cannot create %s: %s\n", out, strerror(errno));
    return 1;
  }
  ina_weights_t w;
  if (ina_weights_random(&cfg, (uint64_t)seed, dtype, NULL, &w) != INA_OK ||
      ina_weights_save(&w, out) != INA_OK) {
    fprintf(stderr, "ina model init: %s\n", ina_last_error());
    ina_weights_release(&w);
    return 1;
  }
  ina_weights_release(&w);
  printf("wrote %s (%s, seed %lld, %s)\n", out, name, (long long)seed, ina_dtype_name(dtype));
  return 0;
}

static int model_info(int argc, char **argv) {
  static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *spec = NULL;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'm': spec = optarg; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (!spec) {
    fprintf(stderr, "ina model info: --model is required\n");
    return 2;
  }
  ina_model_t *m;
  ina_model_options_t mo = INA_MODEL_OPTIONS_INIT;
  mo.random_on_device = 1; /* random weights: their shapes only, none generated */
  if (ina_model_open(spec, &mo, &m) != INA_OK) {
    fprintf(stderr, "ina model info: %s\n", ina_last_error());
    return 1;
  }
  const ina_model_config_t *k = ina_model_config(m);
  printf("model %s: DeepSeek-V%s, %d layers (%d dense), hidden %d, %d heads, vocab %d\n", spec,
         ina_cfg_has_indexer(k) ? "3.2" : k->arch == INA_ARCH_DEEPSEEK_V3 ? "3" : "2", k->num_layers, k->first_k_dense_replace < k->num_layers ? k->first_k_dense_replace : k->num_layers,
         k->hidden_size, k->num_heads, k->vocab_size);
  printf("MLA: q_lora_rank %d, kv_lora_rank %d, qk %d+%d, v %d; rope %s%s\n", k->q_lora_rank,
         k->kv_lora_rank, k->qk_nope_head_dim, k->qk_rope_head_dim, k->v_head_dim,
         k->rope_yarn ? "yarn" : "default", k->rope_layout == INA_ROPE_PAIRS ? " (interleaved)" : "");
  printf("MoE: %d routed experts (top %d, groups %d/%d), %d shared, inter %d\n", k->n_routed_experts,
         k->num_experts_per_tok, k->topk_group, k->n_group, k->n_shared_experts, k->moe_intermediate_size);
  {
    /* The paged cache per token and layer: MLA's latent and rope key, in bf16 (the GPU
     * engine's; the CPU engine stores fp32) or in FP8 (512 e4m3 + one fp32 scale per 128
     * + bf16 rope: FlashMLA's 656-byte entry at DeepSeek's shapes); V3.2 adds the
     * indexer's key (bf16, or e4m3 with one fp32 scale per token). */
    const int64_t latent = k->kv_lora_rank, rope = k->qk_rope_head_dim;
    const int64_t bf16 = 2 * (latent + rope), fp8 = latent + 4 * ((latent + 127) / 128) + 2 * rope;
    const int64_t key_bf16 = ina_cfg_has_indexer(k) ? ina_dsa_index_key_bytes(INA_DSA_KEY_BF16, k->index_head_dim) : 0;
    const int64_t key_fp8 = ina_cfg_has_indexer(k) ? ina_dsa_index_key_bytes(INA_DSA_KEY_FP8, k->index_head_dim) : 0;
    if (ina_cfg_has_indexer(k))
      printf("DSA indexer: %d heads x %d, top %d tokens per query\n", k->index_n_heads, k->index_head_dim,
             k->index_topk);
    char key_part[48] = "";
    if (ina_cfg_has_indexer(k)) snprintf(key_part, sizeof key_part, " + index key %lld", (long long)key_bf16);
    printf("cache per token: %lld bytes per layer in bf16 (latent %lld + rope %lld%s), %lld with an FP8 latent%s; "
           "%.1f KiB over the %d layers (bf16)\n",
           (long long)(bf16 + key_bf16), (long long)(2 * latent), (long long)(2 * rope), key_part,
           (long long)(fp8 + key_fp8),
           ina_cfg_has_indexer(k) ? " and key" : "", (double)((bf16 + key_bf16) * k->num_layers) / 1024.0,
           k->num_layers);
  }
  printf("weights: %.2f MiB%s\n", (double)ina_model_weight_bytes(m) / (1024.0 * 1024.0),
         k->fp8_block_scaled ? " (fp8 block-scaled)" : "");
  ina_model_destroy(m);
  return 0;
}

int cmd_model(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "init") == 0) return model_init(argc - 1, argv + 1);
  if (argc >= 2 && strcmp(argv[1], "info") == 0) return model_info(argc - 1, argv + 1);
  if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    usage(stdout);
    return 0;
  }
  usage(stderr);
  return 2;
}
