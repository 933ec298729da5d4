/* ina-agent: serve a model over gRPC until SIGTERM or SIGINT, then drain and exit 0. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "core/cuda.h"
#include "core/log.h"
#include "model/parallel_job.h"
#include "agent/agent.h"
#include "comm/heartbeat.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: ina-agent --model DIR|NAME|random:NAME [options]\n"
          "\n"
          "Serves ina.v1.Node, ina.v1.Inference, ina.v1.Placement and grpc.health.v1 over\n"
          "gRPC. Prints the bound address, then \"serving\" once a warm-up generation ran.\n"
          "SIGTERM or SIGINT: stop accepting, let running generations finish (up to\n"
          "--drain-grace-ms), cancel the rest, exit 0.\n"
          "\n"
          "  --model M            checkpoint directory, or a built-in model with seeded random\n"
          "                       weights: tiny, v3.2-tiny (DeepSeek-V3.2), or\n"
          "                       random:NAME (NAME: tiny, v2-lite, v3-layers, v3.2-tiny,\n"
          "                       v3.2-layers)\n"
          "  --model-seed S       seed of random weights (default 0)\n"
          "  --dtype D            random weights' dtype: bf16 (default), f32, fp8\n"
          "  --listen HOST:PORT   gRPC listen address (default 127.0.0.1:0, a free port)\n"
          "  --metrics-listen HOST:PORT  serve Prometheus /metrics there (default: off;\n"
          "                       port 0: a free port)\n"
          "  --http-listen HOST:PORT  serve the OpenAI-compatible HTTP API there (POST\n"
          "                       /v1/completions, /v1/chat/completions, GET /v1/models,\n"
          "                       /health; default: off; port 0: a free port; TLS with\n"
          "                       --tls-cert/--tls-key as gRPC)\n"
          "  --api-key-file F     the HTTP API requires 'Authorization: Bearer KEY', KEY the\n"
          "                       first line of F (default: no key)\n"
          "  --served-model-name N  the model's name in HTTP requests and /v1/models\n"
          "                       (default: --model)\n"
          "  --chat-format NAME   the chat format of /v1/chat/completions (default: recognized\n"
          "                       from the checkpoint's chat template)\n"
          "  --tokenizer DIR      the HTTP API's tokenizer: DIR/tokenizer.json (and\n"
          "                       tokenizer_config.json) instead of the model's own; it must\n"
          "                       cover the model's vocabulary (default: the checkpoint's, or\n"
          "                       a built-in model's)\n"
          "  --role R             both (default): serves Generate by itself; prefill: runs\n"
          "                       prompts for decode agents (ina.v1.KvTransfer/Prefill) and\n"
          "                       refuses Generate; decode: serves Generate, its prompts run\n"
          "                       on --prefill-agent and their KV pages arrive over UCX\n"
          "  --prefill-agent HOST:PORT  a decode agent's prefill agent (a request may name\n"
          "                       another in GenerateRequest.prefill_agent)\n"
          "  --kv-transfer-timeout-ms N  how long one prompt's prefill and transfer may take\n"
          "                       (default 30000)\n"
          "  --device D           cpu, cuda (device 0) or cuda:N; default cuda when a CUDA\n"
          "                       device is present, else cpu\n"
          "  --page-size N        KV cache page size in tokens (default 16)\n"
          "  --index-keys K       DeepSeek-V3.2's index keys in the KV cache: bf16 (default)\n"
          "                       or fp8 (DeepSeek's release indexer: e4m3 keys with a scale per\n"
          "                       token, the index query in FP8 too; on a GPU it needs sm_90)\n"
          "  --max-tokens N       KV cache capacity in tokens (default 65536)\n"
          "  --threads N          CPU engine threads (default: INA_NUM_THREADS or all CPUs)\n"
          "  --tls-cert F         PEM certificate chain (with --tls-key: TLS instead of plaintext)\n"
          "  --tls-key F          PEM private key\n"
          "  --admin-token T      bearer token required by admin calls (ApplyPlacement)\n"
          "  --admin-token-file F the same, read from file F (its first line), so that the token\n"
          "                       does not show in the process list. Without a token, admin\n"
          "                       calls are refused (PERMISSION_DENIED)\n"
          "  --allow-unauthenticated-admin  without a token: admin calls are open to any\n"
          "                       client instead (a warning is logged at start); trusted\n"
          "                       networks and tests only\n"
          "  --drain-grace-ms N   how long running generations may finish at shutdown\n"
          "                       (default 30000)\n"
          "  --max-running N      requests admitted (prefilling or decoding) at once (default 64)\n"
          "  --prefix-cache-pages N  KV pages the prefix cache may keep for reuse (0: no prefix\n"
          "                       cache; default: half the pool)\n"
          "  --max-queued-requests N  Generate answers RESOURCE_EXHAUSTED while N requests\n"
          "                       wait for admission (default 1024; 0: no limit)\n"
          "  --heartbeat-timeout S  under mpirun: a rank that has not answered the heartbeat\n"
          "                       for S seconds (default 3; below INA_COMM_TIMEOUT_S) turns\n"
          "                       the node NOT_SERVING until it answers again\n"
          "  --tp T               under mpirun: tensor parallelism over T ranks\n"
          "  --ep [E]             under mpirun: the ranks, or with --tp the groups of T\n"
          "                       ranks, split the routed experts (E, when given, must be\n"
          "                       their number: the ranks / T). Each rank runs on the GPU\n"
          "                       of its local rank (NCCL between them) or, with --device cpu\n"
          "                       or without GPUs, on the CPU. Rank 0 serves; the\n"
          "                       others follow its steps and exit when it stops: signal rank 0\n"
          "                       (its pid is printed) to drain; mpirun's own SIGTERM kills the\n"
          "                       ranks after a few seconds. A rank that stops answering fails\n"
          "                       the others within INA_COMM_TIMEOUT_S (default here 20 s):\n"
          "                       they exit non-zero\n"
          "  --attention-dp       with --ep: the groups compute attention for different\n"
          "                       sequences (each on the group its first KV page picks), the\n"
          "                       MoE layers over all of them\n"
          "  --ep-exchange X      with --ep: how the MoE layers exchange tokens: dispatch (each\n"
          "                       token only to its experts' ranks; the default with\n"
          "                       --attention-dp, CPU ranks only) or allgather (every rank\n"
          "                       every token; the default otherwise)\n"
          "  --two-batch-overlap  with the dispatch exchange: each step in two micro-batches,\n"
          "                       one's exchange travelling while the other computes\n"
          "  --dp [D]             --attention-dp, naming its degree: D, when given, must be the\n"
          "                       number of groups (the ranks / T), e.g. mpirun -np 4 ina-agent\n"
          "                       --tp 2 --ep 2 --dp 2\n"
          "  -h, --help           this help\n"
          "Logging: INA_LOG=info (or warn, debug; per part: INA_LOG=warn,agent=info).\n");
}

static int parse_int(const char *option, const char *text, long long min, long long max,
                     long long *out) {
  char *end = NULL;
  long long v = strtoll(text, &end, 10);
  if (!text[0] || *end || v < min || v > max) {
    fprintf(stderr, "ina-agent: %s '%s': expected an integer in [%lld, %lld]\n", option, text, min, max);
    return 1;
  }
  *out = v;
  return 0;
}

/* A number of seconds in [0.01, 3600]. */
static int parse_seconds(const char *option, const char *text, double *out) {
  char *end = NULL;
  const double v = strtod(text, &end);
  if (!text[0] || *end || !(v >= 0.01 && v <= 3600)) {
    fprintf(stderr, "ina-agent: %s '%s': expected seconds in [0.01, 3600]\n", option, text);
    return 1;
  }
  *out = v;
  return 0;
}

/* "cpu" -> -1, "cuda" -> 0, "cuda:N" -> N. */
static int parse_device(const char *text, int32_t *out) {
  long long n = 0;
  if (strcmp(text, "cpu") == 0) *out = -1;
  else if (strcmp(text, "cuda") == 0) *out = 0;
  else if (strncmp(text, "cuda:", 5) == 0 && parse_int("--device", text + 5, 0, 1023, &n) == 0) *out = (int32_t)n;
  else {
    fprintf(stderr, "ina-agent: --device '%s': expected cpu, cuda or cuda:N\n", text);
    return 1;
  }
  return 0;
}

static int parse_dtype(const char *text, ina_dtype_t *out) {
  if (strcmp(text, "bf16") == 0) *out = INA_DTYPE_BF16;
  else if (strcmp(text, "f32") == 0) *out = INA_DTYPE_F32;
  else if (strcmp(text, "fp8") == 0) *out = INA_DTYPE_FP8_E4M3;
  else {
    fprintf(stderr, "ina-agent: --dtype '%s': expected bf16, f32 or fp8\n", text);
    return 1;
  }
  return 0;
}

/* The agent the signal handlers stop; set before they are installed. */
static ina_agent_t *volatile g_agent;
static volatile sig_atomic_t g_signalled;

static void on_signal(int sig) {
  (void)sig;
  g_signalled = 1;
  ina_agent_request_stop(g_agent); /* async-signal-safe */
}

static int install_signal_handlers(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  return sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0;
}

/* The first line of `path` (without its line end) into buf; 1 with a message when the
 * file cannot be read, or the line is empty or longer than buf. */
static int read_token_file(const char *option, const char *path, char *buf, size_t size) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "ina-agent: %s '%s': %s\n", option, path, strerror(errno));
    return 1;
  }
  const int got = fgets(buf, (int)size, f) != NULL;
  fclose(f);
  const size_t n = got ? strcspn(buf, "\r\n") : 0;
  if (n == 0 || n == size - 1) {
    fprintf(stderr, "ina-agent: %s '%s': %s\n", option, path,
            n == 0 ? "the first line is empty" : "the token is too long");
    return 1;
  }
  buf[n] = '\0';
  return 0;
}

/* "ina-agent: WHAT HOST:PORT" with the port the server got (the address may say port 0). */
static void print_address(const char *what, const char *listen, int port) {
  const char *host = listen ? listen : "127.0.0.1:0";
  const char *colon = strrchr(host, ':');
  int host_len = colon ? (int)(colon - host) : (int)strlen(host);
  printf("ina-agent: %s %.*s:%d\n", what, host_len, host, port);
  fflush(stdout);
}

/* ---- several ranks ---------------------------------------------------------------- */

/* The MPI job behind --tp / --ep (model/parallel_job.h); every rank replicates rank 0's
 * scheduler over the job's world communicator. */
#define AGENT_COMM_TIMEOUT_S 20.0

static int job_start(int tp_size, int32_t ep, int on_gpu, ina_parallel_job_t *job) {
  if (ina_parallel_job_start(tp_size, ep, on_gpu ? INA_COMM_BACKEND_NCCL : INA_COMM_BACKEND_MPI, job) !=
      INA_OK) {
    if (job->rank == 0) fprintf(stderr, "ina-agent: %s\n", ina_last_error());
    return 2;
  }
  if (!getenv("INA_COMM_TIMEOUT_S")) {
    ina_comm_t *comms[3] = {job->tp, job->ep, job->world};
    for (int i = 0; i < 3; i++)
      if (comms[i]) ina_comm_set_timeout(comms[i], AGENT_COMM_TIMEOUT_S);
  }
  return 0;
}

/* The job's heartbeat (comm/heartbeat.h), collective: a period of a sixth of the
 * timeout, and a timeout below the collectives' so that a silent rank shows in health
 * before they give up. Without MPI_THREAD_MULTIPLE the job runs without one (health then
 * sees a silent rank only when a collective times out). */
static int job_heartbeat(const ina_parallel_job_t *job, double *timeout_s, ina_heartbeat_t **out) {
  const double comm_timeout = ina_comm_timeout(job->world);
  if (*timeout_s <= 0) *timeout_s = 3.0;
  if (comm_timeout > 0 && *timeout_s >= comm_timeout) {
    if (job->rank == 0)
      fprintf(stderr, "ina-agent: --heartbeat-timeout %.2f s is not below the collective timeout "
                      "(INA_COMM_TIMEOUT_S %.2f s): using %.2f s\n",
              *timeout_s, comm_timeout, comm_timeout / 2);
    *timeout_s = comm_timeout / 2;
  }
  const ina_status_t st = ina_heartbeat_start(job->world, *timeout_s / 6, out);
  if (st == INA_ERR_UNSUPPORTED) {
    if (job->rank == 0) fprintf(stderr, "ina-agent: no heartbeat: %s\n", ina_last_error());
    return 0;
  }
  if (st != INA_OK) {
    fprintf(stderr, "ina-agent: rank %d: %s\n", job->rank, ina_last_error());
    return 1;
  }
  return 0;
}

static int job_broken(const ina_parallel_job_t *job) {
  return (job->tp && ina_comm_is_broken(job->tp)) || (job->ep && ina_comm_is_broken(job->ep)) ||
         (job->world && ina_comm_is_broken(job->world));
}

/* This rank's slice of the model. The groups split the experts evenly, so that the
 * placement the agent reports has the same number of slots on every rank. */
static int job_shard(const ina_parallel_job_t *job, const char *spec, ina_shard_t *shard) {
  ina_model_config_t cfg;
  if (ina_model_spec_config(spec, &cfg) != INA_OK ||
      ina_parallel_job_shard(job, &cfg, 1, shard) != INA_OK) {
    if (job->rank == 0) fprintf(stderr, "ina-agent: %s\n", ina_last_error());
    return 2;
  }
  return 0;
}

/* Every rank's place in the job, gathered on every rank (collective). */
static int job_describe(const ina_parallel_job_t *job, const ina_shard_t *shard, int32_t device,
                        ina_agent_rank_t *all) {
  const ina_agent_rank_t mine = {job->rank,
                                 ina_bootstrap_local_rank(job->boot),
                                 device,
                                 (int32_t)getpid(),
                                 shard->tp_rank,
                                 job->rank / job->tp_size,
                                 ina_parallel_job_ep_rank(job),
                                 shard->expert_begin,
                                 shard->expert_end,
                                 ina_bootstrap_node_id(job->boot)};
  const size_t words = sizeof mine / sizeof(int32_t);
  if (ina_comm_all_gather(job->world, &mine, all, words, INA_DTYPE_I32, NULL) != INA_OK) {
    fprintf(stderr, "ina-agent: cannot gather the ranks' places: %s\n", ina_last_error());
    return 1;
  }
  return 0;
}

/* Ranks > 0: the same model slice, engine and scheduler as rank 0's, following its steps
 * until it stops (exit 0) or goes silent (exit 1). Signals are left to rank 0, whose
 * stop reaches this rank as the end of the replication. */
static int follow(const ina_agent_options_t *o, const ina_parallel_job_t *job) {
  signal(SIGTERM, SIG_IGN);
  signal(SIGINT, SIG_IGN);
  ina_model_options_t mo = INA_MODEL_OPTIONS_INIT;
  mo.seed = o->model_seed;
  mo.dtype = o->model_dtype;
  mo.shard = o->shard;
  mo.random_on_device = o->device >= 0; /* as rank 0's (agent.c): random weights made on the GPU */
  ina_engine_options_t eo = INA_ENGINE_OPTIONS_INIT;
  eo.page_size = o->page_size > 0 ? o->page_size : 16;
  eo.max_tokens = o->max_tokens > 0 ? o->max_tokens : 65536;
  eo.num_threads = o->num_threads;
  eo.device = o->device;
  eo.tp_comm = o->tp_comm;
  eo.ep_comm = o->ep_comm;
  eo.attention_dp = o->attention_dp ? 2 : 0;
  eo.ep_exchange = o->ep_exchange; /* as rank 0's (agent.c) */
  eo.micro_batches = o->attention_dp ? o->micro_batches : 1;
  ina_model_t *model = NULL;
  ina_engine_t *engine = NULL;
  ina_scheduler_t *scheduler = NULL;
  ina_status_t st = ina_model_open(o->model, &mo, &model);
  if (st == INA_OK) st = ina_engine_create(model, &eo, &engine);
  ina_scheduler_config_t sc = o->scheduler;
  sc.control = ina_agent_placement_control; /* ApplyPlacement reaches this rank this way */
  sc.control_user_data = NULL;
  if (st == INA_OK) st = ina_scheduler_create(engine, &sc, &scheduler);
  if (st == INA_OK) {
    printf("ina-agent: rank %d of %d following rank 0 (pid %d)\n", job->rank, job->size,
           (int)getpid());
    fflush(stdout);
    st = ina_scheduler_follow(scheduler);
  }
  if (st != INA_OK) fprintf(stderr, "ina-agent: rank %d: %s\n", job->rank, ina_last_error());
  ina_scheduler_destroy(scheduler);
  ina_engine_destroy(engine);
  ina_model_destroy(model);
  return st == INA_OK ? 0 : 1;
}

/* Ranks > 0 that are their node's local rank 0: the same following, and the node's own
 * Node and health services (ina_agent_options_t.node_server). */
static int serve_node(ina_agent_options_t *o, const ina_parallel_job_t *job) {
  signal(SIGTERM, SIG_IGN);
  signal(SIGINT, SIG_IGN);
  o->node_server = 1;
  ina_agent_t *agent = NULL;
  ina_status_t st = ina_agent_create(o, &agent);
  if (st == INA_OK) {
    printf("ina-agent: rank %d of %d following rank 0 (pid %d)\n", job->rank, job->size, (int)getpid());
    char what[96];
    snprintf(what, sizeof what, "node %d (rank %d) serves its Node service on", ina_bootstrap_node_id(job->boot),
             job->rank);
    print_address(what, o->listen_address, ina_agent_port(agent));
    st = ina_agent_follow(agent);
  }
  if (st != INA_OK) fprintf(stderr, "ina-agent: rank %d: %s\n", job->rank, ina_last_error());
  ina_agent_destroy(agent);
  return st == INA_OK ? 0 : 1;
}

/* Rank 0: a rank that stops answering breaks a communicator; the agent then stops and
 * the process exits non-zero. */
typedef struct watch {
  const ina_parallel_job_t *job;
  atomic_int done, lost;
} watch_t;

static void *watch_ranks(void *arg) {
  watch_t *w = arg;
  while (!w->done) {
    if (job_broken(w->job)) {
      w->lost = 1;
      fprintf(stderr, "ina-agent: another rank stopped answering; stopping\n");
      ina_agent_request_stop(g_agent);
      break;
    }
    usleep(100000);
  }
  return NULL;
}

int main(int argc, char **argv) {
  enum { O_MODEL = 256, O_MSEED, O_DTYPE, O_LISTEN, O_DEVICE, O_PAGE, O_MAXTOK, O_THREADS,
         O_CERT, O_KEY, O_TOKEN, O_TOKEN_FILE, O_OPEN_ADMIN, O_GRACE, O_METRICS, O_TP, O_EP, O_ADP,
         O_DP, O_RUNNING, O_QUEUED, O_HB_TIMEOUT, O_EXCHANGE, O_TBO, O_HTTP, O_API_KEY_FILE, O_SERVED,
         O_CHAT_FORMAT, O_ROLE, O_PREFILL_AGENT, O_KV_TIMEOUT, O_PREFIX_PAGES, O_TOKENIZER, O_INDEX_KEYS };
  static const struct option opts[] = {
      {"model", required_argument, 0, O_MODEL},       {"model-seed", required_argument, 0, O_MSEED},
      {"dtype", required_argument, 0, O_DTYPE},       {"listen", required_argument, 0, O_LISTEN},
      {"device", required_argument, 0, O_DEVICE},     {"page-size", required_argument, 0, O_PAGE},
      {"max-tokens", required_argument, 0, O_MAXTOK}, {"threads", required_argument, 0, O_THREADS},
      {"tls-cert", required_argument, 0, O_CERT},     {"tls-key", required_argument, 0, O_KEY},
      {"admin-token", required_argument, 0, O_TOKEN}, {"drain-grace-ms", required_argument, 0, O_GRACE},
      {"metrics-listen", required_argument, 0, O_METRICS}, {"admin-token-file", required_argument, 0, O_TOKEN_FILE},
      {"tp", required_argument, 0, O_TP},             {"ep", optional_argument, 0, O_EP},
      {"attention-dp", no_argument, 0, O_ADP},        {"dp", optional_argument, 0, O_DP},
      {"allow-unauthenticated-admin", no_argument, 0, O_OPEN_ADMIN},
      {"max-running", required_argument, 0, O_RUNNING}, {"max-queued-requests", required_argument, 0, O_QUEUED},
      {"heartbeat-timeout", required_argument, 0, O_HB_TIMEOUT},
      {"ep-exchange", required_argument, 0, O_EXCHANGE},
      {"two-batch-overlap", no_argument, 0, O_TBO},
      {"http-listen", required_argument, 0, O_HTTP},  {"api-key-file", required_argument, 0, O_API_KEY_FILE},
      {"served-model-name", required_argument, 0, O_SERVED}, {"chat-format", required_argument, 0, O_CHAT_FORMAT},
      {"role", required_argument, 0, O_ROLE},         {"prefill-agent", required_argument, 0, O_PREFILL_AGENT},
      {"kv-transfer-timeout-ms", required_argument, 0, O_KV_TIMEOUT},
      {"prefix-cache-pages", required_argument, 0, O_PREFIX_PAGES},
      {"tokenizer", required_argument, 0, O_TOKENIZER}, {"index-keys", required_argument, 0, O_INDEX_KEYS},
      {"help", no_argument, 0, 'h'},                  {0, 0, 0, 0}};
  ina_agent_options_t o = INA_AGENT_OPTIONS_INIT;
  static char token[512], api_key[512];
  long long v = 0, tp_size = 1, dp_size = 0;
  int c;
  int32_t ep = INA_PARALLEL_EP_NONE;
  ina_log_set_quiet_errors(1); /* the last error is printed once, below, with context */
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case O_MODEL: o.model = optarg; break;
    case O_MSEED: if (parse_int("--model-seed", optarg, 0, INT64_MAX, &v)) return 2; o.model_seed = (uint64_t)v; break;
    case O_DTYPE: if (parse_dtype(optarg, &o.model_dtype)) return 2; break;
    case O_LISTEN: o.listen_address = optarg; break;
    case O_METRICS: o.metrics_listen = optarg; break;
    case O_DEVICE: if (parse_device(optarg, &o.device)) return 2; break;
    case O_TP: if (parse_int("--tp", optarg, 1, 1024, &tp_size)) return 2; break;
    case O_EP: if (ina_parallel_job_parse_ep("ina-agent", optarg, argc, argv, &optind, &ep)) return 2; break;
    case O_ADP: o.attention_dp = 1; break;
    case O_DP: {
      int32_t d = 0;
      if (ina_parallel_job_parse_dp("ina-agent", optarg, argc, argv, &optind, &d)) return 2;
      dp_size = d;
      o.attention_dp = 1;
      break;
    }
    case O_PAGE: if (parse_int("--page-size", optarg, 1, 1 << 20, &v)) return 2; o.page_size = (int32_t)v; break;
    case O_MAXTOK: if (parse_int("--max-tokens", optarg, 1, INT64_MAX, &v)) return 2; o.max_tokens = v; break;
    case O_THREADS: if (parse_int("--threads", optarg, 0, 4096, &v)) return 2; o.num_threads = (int32_t)v; break;
    case O_CERT: o.tls_cert_file = optarg; break;
    case O_KEY: o.tls_key_file = optarg; break;
    case O_TOKEN: o.admin_token = optarg; break;
    case O_TOKEN_FILE:
      if (read_token_file("--admin-token-file", optarg, token, sizeof token)) return 2;
      o.admin_token = token;
      break;
    case O_OPEN_ADMIN: o.allow_unauthenticated_admin = 1; break;
    case O_GRACE: if (parse_int("--drain-grace-ms", optarg, 0, INT64_MAX, &v)) return 2; o.drain_grace_ms = v; break;
    case O_RUNNING: if (parse_int("--max-running", optarg, 1, 65536, &v)) return 2; o.scheduler.max_running = (int32_t)v; break;
    case O_QUEUED: if (parse_int("--max-queued-requests", optarg, 0, INT32_MAX, &v)) return 2; o.max_queued_requests = (int32_t)v; break;
    case O_EXCHANGE:
      o.ep_exchange = ina_engine_ep_exchange_parse(optarg);
      if (o.ep_exchange < 0) {
        fprintf(stderr, "ina-agent: --ep-exchange '%s': expected allgather or dispatch\n", optarg);
        return 2;
      }
      break;
    case O_TBO: o.micro_batches = 2; break;
    case O_HTTP: o.http_listen = optarg; break;
    case O_API_KEY_FILE:
      if (read_token_file("--api-key-file", optarg, api_key, sizeof api_key)) return 2;
      o.api_key = api_key;
      break;
    case O_SERVED: o.served_model_name = optarg; break;
    case O_CHAT_FORMAT: o.chat_format = optarg; break;
    case O_TOKENIZER: o.tokenizer = optarg; break;
    case O_INDEX_KEYS:
      o.index_keys = ina_engine_index_keys_parse(optarg);
      if (o.index_keys < 0) {
        fprintf(stderr, "ina-agent: --index-keys '%s': expected bf16 or fp8\n", optarg);
        return 2;
      }
      break;
    case O_ROLE:
      if (strcmp(optarg, "both") && strcmp(optarg, "prefill") && strcmp(optarg, "decode")) {
        fprintf(stderr, "ina-agent: --role '%s': expected both, prefill or decode\n", optarg);
        return 2;
      }
      o.role = optarg;
      break;
    case O_PREFILL_AGENT: o.prefill_agent = optarg; break;
    case O_PREFIX_PAGES:
      if (parse_int("--prefix-cache-pages", optarg, 0, INT32_MAX, &v)) return 2;
      o.scheduler.prefix_cache_pages = (int32_t)v;
      break;
    case O_KV_TIMEOUT:
      if (parse_int("--kv-transfer-timeout-ms", optarg, 1, 3600000, &v)) return 2;
      o.kv_transfer_timeout_ms = v;
      break;
    case O_HB_TIMEOUT: if (parse_seconds("--heartbeat-timeout", optarg, &o.heartbeat_timeout_s)) return 2; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "ina-agent: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (o.allow_unauthenticated_admin && o.admin_token && o.admin_token[0]) {
    fprintf(stderr, "ina-agent: --allow-unauthenticated-admin contradicts "
                    "--admin-token/--admin-token-file (with a token, admin calls require it): "
                    "give one or the other\n");
    return 2;
  }
  if (!o.model) {
    fprintf(stderr, "ina-agent: --model is required\n\n");
    usage(stderr);
    return 2;
  }

  if (o.attention_dp && !ep) {
    fprintf(stderr, "ina-agent: %s needs --ep (the groups share the MoE layers)\n",
            dp_size ? "--dp" : "--attention-dp");
    return 2;
  }
  ina_parallel_job_t job;
  memset(&job, 0, sizeof job);
  ina_heartbeat_t *heartbeat = NULL;
  if (ep || tp_size > 1) {
    /* Each rank takes the GPU of its local rank (NCCL between them), or the CPU. */
    const int on_gpu = o.device >= 0 || (o.device == INA_AGENT_DEVICE_AUTO && ina_cuda_device_count() > 0);
    int rc = job_start((int)tp_size, ep, on_gpu, &job);
    if (rc == 0 && dp_size && dp_size != job.groups) {
      if (job.rank == 0)
        fprintf(stderr,
                "ina-agent: --dp %lld with --tp %d on %d ranks: the ranks form %d group(s), and "
                "attention data parallelism runs over all of them (--dp %d)\n",
                dp_size, job.tp_size, job.size, job.groups, job.groups);
      rc = 2;
    }
    o.device = on_gpu ? ina_parallel_job_device(&job) : -1;
    if (rc == 0) rc = job_shard(&job, o.model, &o.shard);
    ina_agent_rank_t *ranks = rc == 0 ? calloc((size_t)job.size, sizeof *ranks) : NULL;
    if (rc == 0) rc = ranks ? job_describe(&job, &o.shard, o.device, ranks) : 1;
    if (rc == 0) rc = job_heartbeat(&job, &o.heartbeat_timeout_s, &heartbeat);
    o.heartbeat = heartbeat;
    if (rc) {
      free(ranks);
      ina_parallel_job_end(&job);
      return rc;
    }
    o.ranks = ranks;
    o.num_ranks = job.size;
    o.tp = job.tp_size;
    o.dp = job.groups;
    o.ep = ep ? o.dp : 1;
    o.tp_comm = job.tp;
    o.ep_comm = job.ep;
    o.scheduler.replica_comm = job.world;
    if (job.rank > 0) {
      if (ina_bootstrap_local_rank(job.boot) == 0) {
        rc = serve_node(&o, &job);
        free(ranks);
      } else {
        free(ranks);
        o.ranks = NULL;
        rc = follow(&o, &job);
      }
      /* A lost leader would keep MPI_Finalize waiting: end the whole job instead. */
      if (rc != 0) ina_parallel_job_abort(&job, rc);
      ina_heartbeat_stop(heartbeat);
      ina_parallel_job_end(&job);
      return rc;
    }
  }

  ina_agent_t *agent = NULL;
  const ina_status_t created = ina_agent_create(&o, &agent);
  free((void *)o.ranks); /* copied by the agent */
  if (created != INA_OK) {
    fprintf(stderr, "ina-agent: %s\n", ina_last_error());
    if (job.world) ina_parallel_job_abort(&job, 1); /* the followers wait for rank 0 */
    ina_parallel_job_end(&job);
    return 1;
  }
  g_agent = agent;
  if (install_signal_handlers()) {
    fprintf(stderr, "ina-agent: cannot install signal handlers\n");
    g_agent = NULL;
    ina_agent_destroy(agent);
    return 1;
  }
  watch_t watch = {&job, 0, 0};
  pthread_t watcher;
  const int watching = job.world && pthread_create(&watcher, NULL, watch_ranks, &watch) == 0;
  if (job.world) {
    printf("ina-agent: rank 0 of %d serving, tensor parallel %d, expert parallel %d (pid %d)\n",
           job.size, job.tp_size, job.ep ? job.groups : 1, (int)getpid());
    fflush(stdout);
  }
  print_address("listening on", o.listen_address, ina_agent_port(agent));
  if (o.metrics_listen && o.metrics_listen[0])
    print_address("metrics on", o.metrics_listen, ina_agent_metrics_port(agent));
  if (o.http_listen && o.http_listen[0]) print_address("HTTP API on", o.http_listen, ina_agent_http_port(agent));
  ina_status_t st = ina_agent_wait_serving(agent, -1);
  if (st == INA_OK) {
    printf("ina-agent: serving\n");
    fflush(stdout);
  } else if (g_signalled) {
    st = INA_OK; /* stopped before the warm-up ended: not a failure */
  } else {
    fprintf(stderr, "ina-agent: %s\n", ina_last_error());
    ina_agent_request_stop(agent);
  }
  ina_agent_wait(agent);
  if (watching) {
    watch.done = 1;
    pthread_join(watcher, NULL);
  }
  if (watch.lost) st = INA_ERR_MPI;
  /* The agent is stopping anyway: later signals must not reach it once it is freed. */
  signal(SIGTERM, SIG_IGN);
  signal(SIGINT, SIG_IGN);
  g_agent = NULL;
  ina_agent_destroy(agent);
  /* A rank that stopped answering would keep MPI_Finalize waiting: end the whole job. */
  if (watch.lost) ina_parallel_job_abort(&job, 1);
  ina_heartbeat_stop(heartbeat); /* after the followers' stop: they wait for its word */
  ina_parallel_job_end(&job);
  if (st == INA_OK) {
    printf("ina-agent: stopped\n");
    fflush(stdout);
  }
  return st == INA_OK ? 0 : 1;
}
