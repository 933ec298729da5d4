/* Client commands talking to a running ina-agent over gRPC:
 *   ina info --server HOST:PORT              the node's NodeInfo
 *   ina health --server HOST:PORT            grpc.health.v1 Check and ina.v1.Node/GetHealth
 *   ina generate --server HOST:PORT ...      streams generated token ids as they arrive
 * Their connection options (--tls, --tls-ca FILE, --tls-name NAME, --token TOKEN,
 * --timeout-ms N) are those of every client command (client_connection.h). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "grpc/health/v1/health.pb-c.h"
#include "ina/v1/inference.pb-c.h"
#include "ina/v1/node.pb-c.h"
#include "agent/rpc/rpc_client.h"
#include "agent/rpc/rpc_pb.h"
#include "tools/cli.h"
#include "tools/cli_tokenizer.h"
#include "tools/client_connection.h"

/* The deadlines of the three commands, for their --timeout-ms help. */
static const char timeout_help[] = "deadline of each call (default 10000 for info and health, none\n"
                                   "for generate)\n";

/* Parses a command with only connection options. Returns -1 to go on, else an exit code. */
static int parse_connection_only(const char *cmd, const char *help, int argc, char **argv,
                                 client_connection_t *conn) {
  static const struct option opts[] = {
      CLIENT_CONNECTION_OPTIONS, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
  int c, r;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if ((r = client_connection_option(conn, c, optarg)) == 1) continue;
    if (r < 0) return 2;
    FILE *f = c == 'h' ? stdout : stderr;
    fputs(help, f);
    client_connection_help(f, timeout_help);
    return c == 'h' ? 0 : 2;
  }
  if (optind < argc) {
    fprintf(stderr, "ina %s: unexpected argument '%s'\n", cmd, argv[optind]);
    return 2;
  }
  return -1;
}

/* ---- ina info ----------------------------------------------------------------------- */

static void print_node_info(const Ina__V1__NodeInfo *info) {
  printf("hostname: %s\n", info->hostname);
  if (info->n_gpus == 0) printf("device: cpu\n");
  for (size_t i = 0; i < info->n_gpus; i++)
    printf("device: cuda:%u, %s\n", info->gpus[i]->gpu_index, info->gpus[i]->name);
  printf("ranks: %zu of world size %u%s\n", info->n_ranks, info->world_size,
         info->attention_data_parallel ? ", attention data parallel over the dp groups" : "");
  if (info->ep_exchange && info->ep_exchange[0])
    printf("expert-parallel exchange: %s%s\n", info->ep_exchange,
           info->ep_micro_batches == 2 ? ", two-batch overlap (2 micro-batches per step)" : "");
  for (size_t i = 0; i < info->n_ranks; i++)
    printf("  rank %u: local %u, gpu %u, pid %u, tp %u dp %u ep %u\n", info->ranks[i]->global_rank,
           info->ranks[i]->local_rank, info->ranks[i]->gpu_index, info->ranks[i]->pid,
           info->ranks[i]->tp_rank, info->ranks[i]->dp_rank, info->ranks[i]->ep_rank);
  const Ina__V1__ModelInfo *m = info->model;
  if (m)
    printf("model: %s (%s): vocab %u, %u layers (%u MoE), %u experts (top %u), max context %u "
           "tokens, weights %s, eos %u\n",
           m->name, m->architecture, m->vocab_size, m->n_layers, m->n_moe_layers,
           m->n_routed_experts, m->n_experts_per_token, m->max_context_tokens, m->weight_dtype,
           m->eos_token_id);
  if (m && m->index_topk > 0)
    printf("sparse attention: each query attends to its top %u cached tokens (DeepSeek-V3.2's indexer)\n",
           m->index_topk);
  const Ina__V1__BuildInfo *b = info->build;
  if (b)
    printf("build: ina %s (%s)%s%.12s%s%s\n", b->version, b->build_type,
           b->git_commit[0] ? ", commit " : "", b->git_commit, b->cuda_version[0] ? ", CUDA " : "",
           b->cuda_version);
  printf("host memory: %.1f GiB\n", (double)info->host_memory_bytes / (1024.0 * 1024.0 * 1024.0));
}

int cmd_info(int argc, char **argv) {
  client_connection_t conn = CLIENT_CONNECTION_INIT;
  int rc = parse_connection_only("info", "usage: ina info --server HOST:PORT [options]\n\n"
                                         "Prints what the agent serves: device, ranks, model, build.\n\n",
                                 argc, argv, &conn);
  if (rc >= 0) return rc;
  ina_rpc_client_t *client = client_connect("info", &conn);
  if (!client) return 1;
  Ina__V1__GetNodeInfoRequest req = INA__V1__GET_NODE_INFO_REQUEST__INIT;
  uint8_t *bytes = NULL, *resp = NULL;
  size_t size = 0, resp_size = 0;
  ina_rpc_status_t status;
  rc = 1;
  if (ina_rpc_pack(&req.base, &bytes, &size) != INA_OK) goto done;
  if (ina_rpc_client_unary(client, "/ina.v1.Node/GetNodeInfo", bytes, size,
                           client_connection_deadline(&conn, 0), &resp, &resp_size, &status) != INA_OK) {
    client_call_failed("info", "GetNodeInfo", &status);
    goto done;
  }
  Ina__V1__NodeInfo *info = ina__v1__node_info__unpack(NULL, resp_size, resp);
  if (!info) {
    fprintf(stderr, "ina info: the answer is not an ina.v1.NodeInfo\n");
    goto done;
  }
  print_node_info(info);
  ina__v1__node_info__free_unpacked(info, NULL);
  rc = 0;
done:
  free(bytes);
  free(resp);
  ina_rpc_client_destroy(client);
  return rc;
}

/* ---- ina health --------------------------------------------------------------------- */

static const char *serving_status_name(int s) {
  switch (s) {
  case 1: return "SERVING";
  case 2: return "NOT_SERVING";
  case 3: return "SERVICE_UNKNOWN";
  default: return "UNKNOWN";
  }
}

static const char *node_state_name(Ina__V1__NodeState s) {
  switch (s) {
  case INA__V1__NODE_STATE__NODE_STATE_STARTING: return "starting";
  case INA__V1__NODE_STATE__NODE_STATE_SERVING: return "serving";
  case INA__V1__NODE_STATE__NODE_STATE_REPLACING: return "replacing";
  case INA__V1__NODE_STATE__NODE_STATE_DRAINING: return "draining";
  case INA__V1__NODE_STATE__NODE_STATE_FAILED: return "failed";
  default: return "unspecified";
  }
}

int cmd_health(int argc, char **argv) {
  client_connection_t conn = CLIENT_CONNECTION_INIT;
  int rc = parse_connection_only("health", "usage: ina health --server HOST:PORT [options]\n\n"
                                           "Prints the grpc.health.v1 status and the node state; exits 0\n"
                                           "when SERVING, 1 otherwise.\n\n",
                                 argc, argv, &conn);
  if (rc >= 0) return rc;
  ina_rpc_client_t *client = client_connect("health", &conn);
  if (!client) return 1;
  int64_t deadline = client_connection_deadline(&conn, 0);
  Grpc__Health__V1__HealthCheckRequest check = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  Ina__V1__GetHealthRequest hreq = INA__V1__GET_HEALTH_REQUEST__INIT;
  uint8_t *bytes = NULL, *resp = NULL;
  size_t size = 0, resp_size = 0;
  ina_rpc_status_t status;
  int serving = 0;
  rc = 1;
  check.service = "";
  if (ina_rpc_pack(&check.base, &bytes, &size) != INA_OK) goto done;
  if (ina_rpc_client_unary(client, "/grpc.health.v1.Health/Check", bytes, size, deadline, &resp,
                           &resp_size, &status) != INA_OK) {
    client_call_failed("health", "Check", &status);
    goto done;
  }
  Grpc__Health__V1__HealthCheckResponse *h = grpc__health__v1__health_check_response__unpack(NULL, resp_size, resp);
  if (!h) goto done;
  serving = h->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
  printf("health: %s\n", serving_status_name(h->status));
  grpc__health__v1__health_check_response__free_unpacked(h, NULL);
  free(bytes);
  free(resp);
  bytes = resp = NULL;
  if (ina_rpc_pack(&hreq.base, &bytes, &size) != INA_OK) goto done;
  if (ina_rpc_client_unary(client, "/ina.v1.Node/GetHealth", bytes, size, deadline, &resp, &resp_size,
                           &status) != INA_OK) {
    client_call_failed("health", "GetHealth", &status);
    goto done;
  }
  Ina__V1__NodeHealth *nh = ina__v1__node_health__unpack(NULL, resp_size, resp);
  if (!nh) goto done;
  printf("state: %s, up %llu s%s%s\n", node_state_name(nh->state), (unsigned long long)nh->uptime_seconds,
         nh->message[0] ? ": " : "", nh->message);
  /* Per rank only for a job of several: one rank's age is always 0. */
  for (size_t i = 0; i < nh->n_ranks && nh->n_ranks > 1; i++)
    printf("  rank %u: %s, heartbeat answered %llu ms ago\n", nh->ranks[i]->global_rank,
           node_state_name(nh->ranks[i]->state), (unsigned long long)nh->ranks[i]->last_heartbeat_age_ms);
  ina__v1__node_health__free_unpacked(nh, NULL);
  rc = serving ? 0 : 1;
done:
  free(bytes);
  free(resp);
  ina_rpc_client_destroy(client);
  return rc;
}

/* ---- ina generate --server ---------------------------------------------------------- */

static void generate_usage(FILE *f) {
  fprintf(f,
          "usage: ina generate --server HOST:PORT --prompt-ids 1,2,3|--prompt TEXT [options]\n"
          "\n"
          "Sends each prompt to the agent's ina.v1.Inference/Generate in turn and prints its\n"
          "token ids as they arrive (\"prompt I: a,b,c\"), with --prompt their text (\"text I:\n"
          "...\"), then how it finished.\n"
          "\n"
          "  --prompt-ids IDS     comma-separated token ids; repeat for several prompts\n"
          "  --prompt TEXT        a prompt as text (repeatable; mixes with --prompt-ids)\n"
          "  --tokenizer M        the tokenizer of --prompt: a checkpoint directory or a built-in\n"
          "                       model (default: the model the agent names in GetNodeInfo)\n"
          "  --max-new-tokens N   tokens to generate per prompt (default 16)\n"
          "  --temperature T      0 = greedy (default 0)\n"
          "  --top-k K            keep the K most likely tokens (0 = off, default)\n"
          "  --top-p P            nucleus sampling mass in (0, 1] (default 1)\n"
          "  --seed S             sampling seed (default 0: the agent picks)\n"
          "  --ignore-eos         keep generating past the end-of-sequence id\n"
          "  --stop-ids IDS       comma-separated ids that end generation\n"
          "  --stream-interval N  tokens per streamed message (default 1)\n"
          "  --request-id ID      request id (default ina-cli-PID-I); Cancel uses it\n");
  client_connection_help(f, timeout_help);
}

static const char *finish_name(Ina__V1__FinishReason f) {
  switch (f) {
  case INA__V1__FINISH_REASON__FINISH_REASON_STOP: return "stop";
  case INA__V1__FINISH_REASON__FINISH_REASON_LENGTH: return "length";
  case INA__V1__FINISH_REASON__FINISH_REASON_CANCELLED: return "cancelled";
  case INA__V1__FINISH_REASON__FINISH_REASON_ERROR: return "error";
  default: return "none";
  }
}

typedef struct stream_printer {
  uint32_t printed;   /* tokens printed so far */
  int32_t *ids;       /* every token id, for the text line; NULL when not kept */
  uint32_t num_ids, cap_ids;
  int finished;       /* the final response arrived */
  int bad;            /* a message did not decode */
  Ina__V1__FinishReason finish;
  uint32_t prompt_tokens, completion_tokens, cached;
  double first_ms, total_ms;
  char error[256];
} stream_printer_t;

static int print_tokens(void *ctx, const uint8_t *bytes, size_t size) {
  stream_printer_t *p = ctx;
  Ina__V1__GenerateResponse *r = ina__v1__generate_response__unpack(NULL, size, bytes);
  if (!r) {
    p->bad = 1;
    return 1; /* cancel the call */
  }
  for (size_t i = 0; i < r->n_token_ids; i++) {
    printf("%s%u", p->printed++ ? "," : " ", r->token_ids[i]);
    if (p->num_ids == p->cap_ids) {
      const uint32_t cap = p->cap_ids ? 2 * p->cap_ids : 64;
      int32_t *grown = realloc(p->ids, cap * sizeof *grown);
      if (!grown) continue;
      p->ids = grown;
      p->cap_ids = cap;
    }
    p->ids[p->num_ids++] = (int32_t)r->token_ids[i];
  }
  fflush(stdout);
  if (r->finish_reason != INA__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED) {
    p->finished = 1;
    p->finish = r->finish_reason;
    p->prompt_tokens = r->prompt_tokens;
    p->completion_tokens = r->completion_tokens;
    if (r->timings) {
      p->first_ms = (double)r->timings->first_token_us / 1000.0;
      p->total_ms = (double)r->timings->total_us / 1000.0;
      p->cached = r->timings->cached_prompt_tokens;
    }
    snprintf(p->error, sizeof p->error, "%s", r->error_message);
  }
  ina__v1__generate_response__free_unpacked(r, NULL);
  return 0;
}

/* Streams one prompt; returns 0 when it finished normally (or was cancelled by the
 * agent), 1 otherwise. */
static int generate_one(ina_rpc_client_t *client, Ina__V1__GenerateRequest *req, int index,
                        int64_t deadline, const ina_tokenizer_t *tok) {
  uint8_t *bytes = NULL;
  size_t size = 0;
  stream_printer_t p;
  ina_rpc_status_t status;
  memset(&p, 0, sizeof p);
  if (ina_rpc_pack(&req->base, &bytes, &size) != INA_OK) {
    fprintf(stderr, "ina generate: %s\n", ina_last_error());
    return 1;
  }
  printf("prompt %d:", index);
  fflush(stdout);
  ina_status_t st = ina_rpc_client_stream(client, "/ina.v1.Inference/Generate", bytes, size, deadline,
                                          print_tokens, &p, &status);
  free(bytes);
  printf("\n");
  if (st == INA_OK && tok) {
    char label[32];
    snprintf(label, sizeof label, "text %d: ", index);
    cli_print_text("ina generate", tok, label, p.ids, (int32_t)p.num_ids);
  }
  free(p.ids);
  if (st != INA_OK) {
    if (p.bad) fprintf(stderr, "ina generate: a response is not an ina.v1.GenerateResponse\n");
    return client_call_failed("generate", "Generate", &status);
  }
  if (!p.finished) {
    fprintf(stderr, "ina generate: the stream ended without a final response\n");
    return 1;
  }
  printf("finish: %s, %u prompt tokens (%u cached), %u generated, first token %.1f ms, total %.1f ms%s%s\n",
         finish_name(p.finish), p.prompt_tokens, p.cached, p.completion_tokens, p.first_ms, p.total_ms,
         p.error[0] ? ": " : "", p.error);
  return p.finish == INA__V1__FINISH_REASON__FINISH_REASON_ERROR;
}

/* The name of the model the agent serves (GetNodeInfo), malloc'ed; NULL with a message. */
static char *served_model(ina_rpc_client_t *client, const client_connection_t *conn) {
  Ina__V1__GetNodeInfoRequest req = INA__V1__GET_NODE_INFO_REQUEST__INIT;
  uint8_t *bytes = NULL, *resp = NULL;
  size_t size = 0, resp_size = 0;
  ina_rpc_status_t status;
  char *name = NULL;
  if (ina_rpc_pack(&req.base, &bytes, &size) == INA_OK &&
      ina_rpc_client_unary(client, "/ina.v1.Node/GetNodeInfo", bytes, size, client_connection_deadline(conn, 0), &resp,
                           &resp_size, &status) == INA_OK) {
    Ina__V1__NodeInfo *info = ina__v1__node_info__unpack(NULL, resp_size, resp);
    if (info && info->model && info->model->name) name = strdup(info->model->name);
    if (info) ina__v1__node_info__free_unpacked(info, NULL);
  } else {
    client_call_failed("generate", "GetNodeInfo", &status);
  }
  free(bytes);
  free(resp);
  if (!name) fprintf(stderr, "ina generate: the agent does not name its model; give --tokenizer\n");
  return name;
}

int cmd_generate_remote(int argc, char **argv) {
  enum { O_PROMPT = 256, O_MAXNEW, O_TEMP, O_TOPK, O_TOPP, O_SEED, O_EOS, O_STOP, O_INTERVAL, O_ID, O_TEXT,
         O_TOKENIZER };
  static const struct option opts[] = {
      CLIENT_CONNECTION_OPTIONS,
      {"prompt-ids", required_argument, 0, O_PROMPT}, {"max-new-tokens", required_argument, 0, O_MAXNEW},
      {"temperature", required_argument, 0, O_TEMP},  {"top-k", required_argument, 0, O_TOPK},
      {"top-p", required_argument, 0, O_TOPP},        {"seed", required_argument, 0, O_SEED},
      {"ignore-eos", no_argument, 0, O_EOS},          {"stop-ids", required_argument, 0, O_STOP},
      {"stream-interval", required_argument, 0, O_INTERVAL}, {"request-id", required_argument, 0, O_ID},
      {"prompt", required_argument, 0, O_TEXT},       {"tokenizer", required_argument, 0, O_TOKENIZER},
      {"help", no_argument, 0, 'h'},                  {0, 0, 0, 0}};
  client_connection_t conn = CLIENT_CONNECTION_INIT;
  char **prompts = NULL;
  int *is_text = NULL;
  int num_prompts = 0, num_texts = 0, rc = 2, c, r;
  const char *tokenizer_spec = NULL;
  char *served = NULL;
  ina_tokenizer_t *tok = NULL;
  int64_t max_new = 16, top_k = 0, seed = 0, interval = 0;
  double temperature = 0, top_p = 1;
  int ignore_eos = 0;
  const char *request_id = NULL;
  int32_t *stop = NULL, num_stop = 0;
  ina_rpc_client_t *client = NULL;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if ((r = client_connection_option(&conn, c, optarg)) == 1) continue;
    if (r < 0) goto done;
    switch (c) {
    case O_PROMPT:
    case O_TEXT: {
      char **np = realloc(prompts, (size_t)(num_prompts + 1) * sizeof *np);
      if (np) prompts = np;
      int *nt = realloc(is_text, (size_t)(num_prompts + 1) * sizeof *nt);
      if (nt) is_text = nt;
      if (!np || !nt) goto done;
      is_text[num_prompts] = c == O_TEXT;
      num_texts += c == O_TEXT;
      prompts[num_prompts++] = optarg;
      break;
    }
    case O_TOKENIZER: tokenizer_spec = optarg; break;
    case O_MAXNEW: if (cli_parse_int("--max-new-tokens", optarg, 1, UINT32_MAX, &max_new)) goto done; break;
    case O_TEMP: if (cli_parse_float("--temperature", optarg, 0, 100, &temperature)) goto done; break;
    case O_TOPK: if (cli_parse_int("--top-k", optarg, 0, UINT32_MAX, &top_k)) goto done; break;
    case O_TOPP: if (cli_parse_float("--top-p", optarg, 1e-9, 1, &top_p)) goto done; break;
    case O_SEED: if (cli_parse_int("--seed", optarg, 0, INT64_MAX, &seed)) goto done; break;
    case O_EOS: ignore_eos = 1; break;
    case O_STOP:
      free(stop);
      stop = NULL;
      if (cli_parse_ids("--stop-ids", optarg, &stop, &num_stop)) goto done;
      break;
    case O_INTERVAL: if (cli_parse_int("--stream-interval", optarg, 0, 1024, &interval)) goto done; break;
    case O_ID: request_id = optarg; break;
    case 'h': generate_usage(stdout); rc = 0; goto done;
    default: generate_usage(stderr); goto done;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "ina generate: unexpected argument '%s'\n", argv[optind]);
    goto done;
  }
  if (num_prompts == 0) {
    fprintf(stderr, "ina generate: at least one --prompt-ids or --prompt is required\n\n");
    generate_usage(stderr);
    goto done;
  }
  rc = 1;
  client = client_connect("generate", &conn);
  if (!client) goto done;
  if (num_texts > 0) {
    if (!tokenizer_spec && !(tokenizer_spec = served = served_model(client, &conn))) goto done;
    if (cli_tokenizer_open("ina generate", tokenizer_spec, &tok)) goto done;
  }
  for (int i = 0; i < num_prompts && rc == 1; i++) {
    int32_t *ids = NULL, n = 0;
    if (is_text[i] ? cli_tokenize_prompt("ina generate", tok, prompts[i], &ids, &n)
                   : cli_parse_ids("--prompt-ids", prompts[i], &ids, &n))
      break;
    uint32_t *uids = malloc((size_t)n * sizeof *uids);
    uint32_t *ustop = malloc((size_t)(num_stop + 1) * sizeof *ustop);
    int failed = 1;
    if (uids && ustop) {
      char id[160];
      for (int32_t k = 0; k < n; k++) uids[k] = (uint32_t)ids[k];
      for (int32_t k = 0; k < num_stop; k++) ustop[k] = (uint32_t)stop[k];
      if (request_id && num_prompts == 1) snprintf(id, sizeof id, "%s", request_id);
      else if (request_id) snprintf(id, sizeof id, "%s-%d", request_id, i);
      else snprintf(id, sizeof id, "ina-cli-%ld-%d", (long)getpid(), i);
      Ina__V1__SamplingParams sp = INA__V1__SAMPLING_PARAMS__INIT;
      sp.temperature = (float)temperature;
      sp.top_k = (uint32_t)top_k;
      sp.top_p = (float)top_p;
      sp.seed = (uint64_t)seed;
      Ina__V1__GenerateRequest req = INA__V1__GENERATE_REQUEST__INIT;
      req.request_id = id;
      req.prompt_token_ids = uids;
      req.n_prompt_token_ids = (size_t)n;
      req.sampling = &sp;
      req.max_tokens = (uint32_t)max_new;
      req.stop_token_ids = ustop;
      req.n_stop_token_ids = (size_t)num_stop;
      req.ignore_eos = ignore_eos;
      req.stream_interval = (uint32_t)interval;
      failed = generate_one(client, &req, i, client_connection_deadline(&conn, -1), tok);
    }
    free(ids);
    free(uids);
    free(ustop);
    if (failed) break;
    if (i == num_prompts - 1) rc = 0;
  }
done:
  ina_rpc_client_destroy(client);
  ina_tokenizer_destroy(tok);
  free(served);
  free(prompts);
  free(is_text);
  free(stop);
  return rc;
}
