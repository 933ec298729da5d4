/* ina generate: run prompts through a model and print the generated ids. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda.h"
#include "core/log.h"
#include "core/npy.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/parallel_job.h"
#include "tools/cli.h"
#include "tools/cli_tokenizer.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: ina generate --model DIR|tiny|random:NAME --prompt-ids 1,2,3|--prompt TEXT [options]\n"
          "\n"
          "Runs the prompts as one batch (prefill, then batched decode) and prints the device\n"
          "that ran, each prompt's generated token ids (and, with --prompt, their text), then\n"
          "prefill and decode tokens/s.\n"
          "\n"
          "  --model M            checkpoint directory (config.json + *.safetensors), a built-in\n"
          "                       model with seeded random weights (tiny, random:tiny,\n"
          "                       random:v2-lite, random:v3-layers, random:v3.2-*); on a GPU, random weights\n"
          "                       are generated in device memory\n"
          "  --prompt-ids IDS     comma-separated token ids; repeat for a batch of prompts\n"
          "  --prompt TEXT        a prompt as text, tokenized by the model's tokenizer (BOS as\n"
          "                       the checkpoint asks); repeatable, mixes with --prompt-ids\n"
          "  --max-new-tokens N   tokens to generate per prompt (default 16)\n"
          "  --temperature T      0 = greedy (default 0)\n"
          "  --top-k K            keep the K most likely tokens (0 = off, default)\n"
          "  --top-p P            nucleus sampling mass in (0, 1] (default 1)\n"
          "  --seed S             sampling seed (default 0)\n"
          "  --ignore-eos         keep generating past the end-of-sequence id\n"
          "  --dump-logits FILE   write float32 .npy logits [prompt_len + N - 1, vocab] of every\n"
          "                       processed position; with several prompts FILE_0.npy, FILE_1.npy...\n"
          "  --model-seed S       seed of random weights (default 0)\n"
          "  --dtype D            random weights' dtype: bf16 (default), f32, fp8\n"
          "  --page-size N        KV cache page size in tokens (default 16)\n"
          "  --index-keys K       DeepSeek-V3.2's index keys in the KV cache: bf16 (default)\n"
          "                       or fp8 (DeepSeek's release indexer: e4m3 keys with a scale per\n"
          "                       token, the index query in FP8 too; on a GPU it needs sm_90)\n"
          "  --device D           cpu, cuda (device 0) or cuda:N; default cuda when a CUDA device\n"
          "                       is present, else cpu. The GPU computes with bf16 activations\n"
          "                       (the CPU in fp32), so logits differ slightly between them\n"
          "  --no-cuda-graphs     run every GPU step eagerly (default: decode steps replay CUDA\n"
          "                       graphs captured per batch bucket)\n"
          "  --threads N          CPU threads (default: INA_NUM_THREADS or all CPUs)\n"
          "  --tp T               tensor parallelism over T ranks of an mpirun job: each rank\n"
          "                       holds 1/T of the attention heads and MLP intermediates\n"
          "  --ep [E]             expert parallelism: the ranks (or, with --tp, the groups of T\n"
          "                       ranks) split the routed experts (E, when given, must be their\n"
          "                       number). All ranks run the same batch and rank 0 prints;\n"
          "                       e.g. mpirun -np 4 ina generate --tp 2 --ep 2 ... With GPUs\n"
          "                       each rank uses the GPU of its local rank (NCCL between them;\n"
          "                       --device cpu keeps the job on the CPU)\n"
          "  --dp [D]             with --ep: attention data parallelism, the groups computing\n"
          "                       attention for different prompts (each on the group its first\n"
          "                       KV page picks) and the MoE layers over all of them (D, when\n"
          "                       given, must be the number of groups: the ranks / T);\n"
          "                       --attention-dp is the same without a degree\n"
          "  --ep-exchange X      how the MoE layers exchange tokens: dispatch (each token only\n"
          "                       to its experts' ranks; the default with --dp, CPU only) or\n"
          "                       allgather (every rank every token)\n"
          "  --two-batch-overlap  with the dispatch exchange: each step in two micro-batches,\n"
          "                       one's exchange travelling while the other computes\n"
          "  -h, --help           this help\n"
          "\n"
          "With --server HOST:PORT the prompts run on a running ina-agent instead (see\n"
          "`ina generate --server x --help`).\n");
}

/* "cpu" -> -1, "cuda" -> 0, "cuda:N" -> N. */
static int parse_device(const char *text, int32_t *out) {
  int64_t n = 0;
  if (strcmp(text, "cpu") == 0) {
    *out = -1;
    return 0;
  }
  if (strcmp(text, "cuda") == 0) {
    *out = 0;
    return 0;
  }
  if (strncmp(text, "cuda:", 5) == 0 && cli_parse_int("--device", text + 5, 0, 1023, &n) == 0) {
    *out = (int32_t)n;
    return 0;
  }
  fprintf(stderr, "ina generate: --device '%s': expected cpu, cuda or cuda:N\n", text);
  return 1;
}

typedef struct prompts {
  int32_t **ids;
  int32_t *lens;
  int32_t count;
} prompts_t;

static int add_prompt(prompts_t *p, const char *text) {
  int32_t *ids, n;
  if (cli_parse_ids("--prompt-ids", text, &ids, &n)) return 1;
  int32_t **ni = realloc(p->ids, (size_t)(p->count + 1) * sizeof *ni);
  if (ni) p->ids = ni;
  int32_t *nl = realloc(p->lens, (size_t)(p->count + 1) * sizeof *nl);
  if (nl) p->lens = nl;
  if (!ni || !nl) {
    free(ids);
    return 1;
  }
  p->ids[p->count] = ids;
  p->lens[p->count++] = n;
  return 0;
}

/* FILE for one prompt; FILE_i.npy (before a .npy suffix) for several. */
static void dump_path(const char *base, int32_t i, int32_t count, char *out, size_t size) {
  if (count == 1) {
    snprintf(out, size, "%s", base);
    return;
  }
  size_t n = strlen(base);
  if (n > 4 && strcmp(base + n - 4, ".npy") == 0) n -= 4;
  snprintf(out, size, "%.*s_%d.npy", (int)n, base, i);
}

/* tools/cmd_client.c: `ina generate --server HOST:PORT` runs on a remote ina-agent. */

static int wants_server(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--server") == 0 || strncmp(argv[i], "--server=", 9) == 0) return 1;
  return 0;
}

/* With --tp or --ep: this rank's slice of the model (model/parallel_job.h). */
static int job_shard(const ina_parallel_job_t *job, const char *spec, ina_shard_t *shard) {
  ina_model_config_t cfg;
  if (ina_model_spec_config(spec, &cfg) != INA_OK ||
      ina_parallel_job_shard(job, &cfg, 0, shard) != INA_OK) {
    fprintf(stderr, "ina generate: %s\n", ina_last_error());
    return 1;
  }
  return 0;
}

int cmd_generate(int argc, char **argv) {
  if (wants_server(argc, argv)) return cmd_generate_remote(argc, argv);
  enum { O_MODEL = 256, O_PROMPT, O_MAXNEW, O_TEMP, O_TOPK, O_TOPP, O_SEED, O_EOS, O_DUMP,
         O_MSEED, O_DTYPE, O_PAGE, O_THREADS, O_DEVICE, O_NOGRAPHS, O_EP, O_TP, O_DP, O_ADP, O_EXCHANGE, O_TBO,
         O_TEXT, O_INDEX_KEYS };
  static const struct option opts[] = {
      {"model", required_argument, 0, O_MODEL},       {"prompt-ids", required_argument, 0, O_PROMPT},
      {"max-new-tokens", required_argument, 0, O_MAXNEW}, {"temperature", required_argument, 0, O_TEMP},
      {"top-k", required_argument, 0, O_TOPK},        {"top-p", required_argument, 0, O_TOPP},
      {"seed", required_argument, 0, O_SEED},         {"ignore-eos", no_argument, 0, O_EOS},
      {"dump-logits", required_argument, 0, O_DUMP},  {"model-seed", required_argument, 0, O_MSEED},
      {"dtype", required_argument, 0, O_DTYPE},       {"page-size", required_argument, 0, O_PAGE},
      {"threads", required_argument, 0, O_THREADS},   {"device", required_argument, 0, O_DEVICE},
      {"no-cuda-graphs", no_argument, 0, O_NOGRAPHS}, {"ep", optional_argument, 0, O_EP},
      {"tp", required_argument, 0, O_TP},             {"dp", optional_argument, 0, O_DP},
      {"attention-dp", no_argument, 0, O_ADP},
      {"ep-exchange", required_argument, 0, O_EXCHANGE},
      {"two-batch-overlap", no_argument, 0, O_TBO},
      {"prompt", required_argument, 0, O_TEXT},        {"index-keys", required_argument, 0, O_INDEX_KEYS},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  const char *model_spec = NULL, *dump = NULL;
  prompts_t prompts = {NULL, NULL, 0};
  /* --prompt texts, tokenized once the model is known; NULL for --prompt-ids slots. */
  const char **texts = calloc((size_t)argc + 1, sizeof *texts);
  int32_t num_texts = 0;
  ina_tokenizer_t *tok = NULL;
  if (!texts) return 1;
  int64_t max_new = 16, top_k = 0, seed = 0, page_size = 16, threads = 0;
  double temperature = 0, top_p = 1;
  int ignore_eos = 0, rc = 1;
  int32_t use_ep = INA_PARALLEL_EP_NONE, dp_size = 0;
  int64_t tp_size = 1;
  int32_t device = ina_cuda_device_count() > 0 ? 0 : -1;
  ina_parallel_job_t job;
  memset(&job, 0, sizeof job);
  ina_model_options_t mopts = INA_MODEL_OPTIONS_INIT;
  ina_engine_options_t eopts = INA_ENGINE_OPTIONS_INIT;
  ina_model_t *model = NULL;
  ina_engine_t *engine = NULL;
  ina_generate_request_t *reqs = NULL;
  int64_t v;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case O_MODEL: model_spec = optarg; break;
    case O_PROMPT: if (add_prompt(&prompts, optarg)) goto done; break;
    case O_TEXT: {
      /* A placeholder id, replaced below by the text's ids. */
      if (add_prompt(&prompts, "0")) goto done;
      texts[prompts.count - 1] = optarg;
      num_texts++;
      break;
    }
    case O_MAXNEW: if (cli_parse_int("--max-new-tokens", optarg, 0, 1 << 20, &max_new)) goto done; break;
    case O_TEMP: if (cli_parse_float("--temperature", optarg, 0, 1e6, &temperature)) goto done; break;
    case O_TOPK: if (cli_parse_int("--top-k", optarg, 0, INT32_MAX, &top_k)) goto done; break;
    case O_TOPP: if (cli_parse_float("--top-p", optarg, 1e-9, 1, &top_p)) goto done; break;
    case O_SEED: if (cli_parse_int("--seed", optarg, 0, INT64_MAX, &seed)) goto done; break;
    case O_EOS: ignore_eos = 1; break;
    case O_DUMP: dump = optarg; break;
    case O_MSEED:
      if (cli_parse_int("--model-seed", optarg, 0, INT64_MAX, &v)) goto done;
      mopts.seed = (uint64_t)v;
      break;
    case O_DTYPE: if (cli_parse_weight_dtype("--dtype", optarg, &mopts.dtype)) goto done; break;
    case O_PAGE: if (cli_parse_int("--page-size", optarg, 1, 1 << 20, &page_size)) goto done; break;
    case O_THREADS: if (cli_parse_int("--threads", optarg, 0, 4096, &threads)) goto done; break;
    case O_DEVICE:
      if (parse_device(optarg, &device)) goto done;
      break;
    case O_NOGRAPHS: eopts.cuda_graphs = 0; break;
    case O_INDEX_KEYS:
      eopts.index_keys = ina_engine_index_keys_parse(optarg);
      if (eopts.index_keys < 0) {
        fprintf(stderr, "ina generate: --index-keys '%s': expected bf16 or fp8\n", optarg);
        goto done;
      }
      break;
    case O_EP:
      if (ina_parallel_job_parse_ep("ina generate", optarg, argc, argv, &optind, &use_ep)) {
        rc = 2;
        goto done;
      }
      break;
    case O_TP: if (cli_parse_int("--tp", optarg, 1, 1024, &tp_size)) goto done; break;
    case O_DP:
      if (ina_parallel_job_parse_dp("ina generate", optarg, argc, argv, &optind, &dp_size)) {
        rc = 2;
        goto done;
      }
      eopts.attention_dp = 2; /* every rank runs the same batch */
      break;
    case O_ADP: eopts.attention_dp = 2; break;
    case O_EXCHANGE:
      eopts.ep_exchange = ina_engine_ep_exchange_parse(optarg);
      if (eopts.ep_exchange < 0) {
        fprintf(stderr, "ina generate: --ep-exchange '%s': expected allgather or dispatch\n", optarg);
        rc = 2;
        goto done;
      }
      break;
    case O_TBO: eopts.micro_batches = 2; break;
    case 'h': usage(stdout); rc = 0; goto done;
    default: usage(stderr); rc = 2; goto done;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "ina generate: unexpected argument '%s'\n", argv[optind]);
    rc = 2;
    goto done;
  }
  if (!model_spec || prompts.count == 0) {
    fprintf(stderr, "ina generate: --model and at least one --prompt-ids or --prompt are required\n\n");
    usage(stderr);
    rc = 2;
    goto done;
  }
  if (eopts.attention_dp && !use_ep) {
    fprintf(stderr, "ina generate: --dp needs --ep (the groups share the MoE layers)\n");
    rc = 2;
    goto done;
  }
  if (num_texts > 0) {
    if (cli_tokenizer_open("ina generate", model_spec, &tok)) goto done;
    for (int32_t i = 0; i < prompts.count; i++) {
      if (!texts[i]) continue;
      free(prompts.ids[i]);
      prompts.ids[i] = NULL;
      if (cli_tokenize_prompt("ina generate", tok, texts[i], &prompts.ids[i], &prompts.lens[i])) goto done;
    }
  }
  const int multi_rank = use_ep || tp_size > 1;
  if (multi_rank) {
    /* Each rank takes the GPU of its local rank (NCCL between them), or the CPU (MPI). */
    const int on_gpu = device >= 0;
    if (ina_parallel_job_start((int32_t)tp_size, use_ep, on_gpu ? INA_COMM_BACKEND_NCCL : INA_COMM_BACKEND_MPI,
                               &job) != INA_OK) {
      if (job.rank == 0) fprintf(stderr, "ina generate: %s\n", ina_last_error());
      rc = 2;
      goto done;
    }
    if (dp_size && dp_size != job.groups) {
      if (job.rank == 0)
        fprintf(stderr,
                "ina generate: --dp %d with --tp %d on %d ranks: the ranks form %d group(s), and attention data "
                "parallelism runs over all of them (--dp %d)\n",
                (int)dp_size, (int)job.tp_size, (int)job.size, (int)job.groups, (int)job.groups);
      rc = 2;
      goto done;
    }
    if (on_gpu) device = ina_parallel_job_device(&job);
    if (job_shard(&job, model_spec, &mopts.shard)) goto done;
    eopts.tp_comm = job.tp;
    eopts.ep_comm = job.ep;
  }
  mopts.random_on_device = device >= 0; /* random weights are generated on the GPU */
  if (ina_model_open(model_spec, &mopts, &model) != INA_OK) {
    fprintf(stderr, "ina generate: cannot open model: %s\n", ina_last_error());
    goto done;
  }
  const ina_model_config_t *cfg = ina_model_config(model);
  int64_t total = 0;
  for (int32_t i = 0; i < prompts.count; i++) total += prompts.lens[i] + max_new;
  eopts.page_size = (int32_t)page_size;
  eopts.max_tokens = total + (int64_t)prompts.count * page_size;
  /* Under --dp the pool has a stripe per group and a prompt's pages all come from one:
   * each stripe gets room for all of them (a GPU stores only its own stripe). */
  if (eopts.attention_dp && multi_rank) eopts.max_tokens *= job.groups;
  eopts.num_threads = (int32_t)threads;
  eopts.device = device;
  if (ina_engine_create(model, &eopts, &engine) != INA_OK) {
    fprintf(stderr, "ina generate: %s\n", ina_last_error());
    goto done;
  }
  if (multi_rank) {
    if (job.rank == 0)
      printf("device: %s, %d ranks: tensor parallel %d, expert parallel %d%s\n", device >= 0 ? "cuda" : "cpu",
             job.size, job.tp_size, use_ep ? job.groups : 1, eopts.attention_dp ? ", attention data parallel" : "");
  } else if (device < 0) {
    printf("device: cpu\n");
  } else {
    char name[128];
    printf("device: cuda:%d, %s\n", device, ina_cuda_device_name(device, name, sizeof name));
  }
  reqs = calloc((size_t)prompts.count, sizeof *reqs);
  if (!reqs) goto done;
  for (int32_t i = 0; i < prompts.count; i++) {
    ina_sampling_params_t sp = INA_SAMPLING_PARAMS_INIT;
    sp.temperature = (float)temperature;
    sp.top_k = (int32_t)top_k;
    sp.top_p = (float)top_p;
    sp.seed = (uint64_t)seed + (uint64_t)i;
    reqs[i].prompt = prompts.ids[i];
    reqs[i].prompt_len = prompts.lens[i];
    reqs[i].max_new_tokens = (int32_t)max_new;
    reqs[i].sampling = sp;
    reqs[i].ignore_eos = ignore_eos;
    reqs[i].output = malloc((size_t)(max_new > 0 ? max_new : 1) * sizeof(int32_t));
    if (!reqs[i].output) goto done;
    if (dump) {
      reqs[i].logits = malloc((size_t)(prompts.lens[i] + max_new) * (size_t)cfg->vocab_size * sizeof(float));
      if (!reqs[i].logits) goto done;
    }
  }
  ina_generate_stats_t stats;
  if (ina_generate(engine, reqs, prompts.count, &stats) != INA_OK) {
    fprintf(stderr, "ina generate: %s\n", ina_last_error());
    goto done;
  }
  for (int32_t i = 0; i < prompts.count && job.rank == 0; i++) {
    printf("prompt %d:", i);
    for (int32_t k = 0; k < reqs[i].num_generated; k++) printf("%s%d", k ? "," : " ", reqs[i].output[k]);
    printf("\n");
    if (tok) {
      char label[32];
      snprintf(label, sizeof label, "text %d: ", (int)i);
      if (cli_print_text("ina generate", tok, label, reqs[i].output, reqs[i].num_generated)) goto done;
    }
    if (dump) {
      char path[4096];
      int64_t shape[2] = {reqs[i].prompt_len + reqs[i].num_generated - 1, cfg->vocab_size};
      if (reqs[i].num_generated == 0) shape[0] = reqs[i].prompt_len;
      dump_path(dump, i, prompts.count, path, sizeof path);
      if (ina_npy_write(path, INA_DTYPE_F32, 2, shape, reqs[i].logits) != INA_OK) {
        fprintf(stderr, "ina generate: %s\n", ina_last_error());
        goto done;
      }
      fprintf(stderr, "logits [%lld, %lld] written to %s\n", (long long)shape[0], (long long)shape[1], path);
    }
  }
  if (job.rank != 0) {
    rc = 0;
    goto done;
  }
  printf("prefill: %lld tokens in %.3f s (%.1f tokens/s)\n", (long long)stats.prefill_tokens,
         stats.prefill_seconds, stats.prefill_seconds > 0 ? stats.prefill_tokens / stats.prefill_seconds : 0);
  printf("decode: %lld tokens in %d steps, %.3f s (%.1f tokens/s, batch %d)\n",
         (long long)stats.decode_tokens, stats.decode_steps, stats.decode_seconds,
         stats.decode_seconds > 0 ? stats.decode_tokens / stats.decode_seconds : 0, prompts.count);
  if (use_ep) {
    ina_engine_ep_traffic_t t;
    if (ina_engine_ep_traffic(engine, &t) == INA_OK && t.layers > 0)
      printf("ep exchange: %s, rank 0 sent %.0f bytes per MoE layer (%.0f dispatch, %.0f combine) over %lld layer "
             "exchanges\n",
             ina_engine_ep_exchange_name(t.exchange), (double)(t.dispatch_bytes + t.combine_bytes) / (double)t.layers,
             (double)t.dispatch_bytes / (double)t.layers, (double)t.combine_bytes / (double)t.layers,
             (long long)t.layers);
    if (ina_engine_ep_traffic(engine, &t) == INA_OK && t.layers > 0 && t.exchange == INA_ENGINE_EP_EXCHANGE_DISPATCH)
      printf("ep exchange: %d micro-batch%s per step, rank 0 waited %.3f s on the exchanges (%.1f us per MoE layer)\n",
             (int)t.micro_batches, t.micro_batches == 1 ? "" : "es", 1e-9 * (double)t.wait_ns,
             1e-3 * (double)t.wait_ns / (double)t.layers);
  }
  rc = 0;
done:
  if (reqs)
    for (int32_t i = 0; i < prompts.count; i++) {
      free(reqs[i].output);
      free(reqs[i].logits);
    }
  free(reqs);
  for (int32_t i = 0; i < prompts.count; i++) free(prompts.ids[i]);
  free(prompts.ids);
  free(prompts.lens);
  free(texts);
  ina_tokenizer_destroy(tok);
  ina_engine_destroy(engine);
  ina_model_destroy(model);
  ina_parallel_job_end(&job);
  return rc;
}
