/* Load and placement commands talking to a running ina-agent over gRPC:
 *   ina load --server HOST:PORT [--experts] [--reset] [--json]
 *   ina place --server HOST:PORT --show [--out FILE]
 *   ina place --server HOST:PORT --file FILE [--admin-token T | --admin-token-file F]
 *             [--expected-generation G] [--dry-run]
 * The connection options are those of the other client commands (cmd_client.c).
 *
 * The placement file is JSON, one MoE layer's expert map per entry of "layers":
 *   {"layout": {"tp": 1, "dp": 1, "ep": 1}, "slots_per_rank": 64, "generation": 1,
 *    "layers": [{"moe_layer": 0, "slots": [{"ep_rank": 0, "slot": 0, "logical_expert": 0},
 *    ...]}, ...]}
 * `--show` writes it; `--file` reads it back ("generation" is ignored there: the
 * expected generation travels separately). The file is checked for shape and types only,
 * before any call; whether the placement is valid for the job is the agent's answer. */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "core/log.h"
#include "ina/v1/node.pb-c.h"
#include "ina/v1/placement.pb-c.h"
#include "agent/rpc/rpc_client.h"
#include "agent/rpc/rpc_pb.h"
#include "tools/cli.h"

/* ApplyPlacement moves expert weights and re-captures graphs: minutes, not seconds. */
#define APPLY_DEFAULT_TIMEOUT_MS 600000

#define CONNECTION_HELP                                                                       \
  "  --server HOST:PORT   the agent's gRPC address (required)\n"                              \
  "  --tls                use TLS (server certificate checked against --tls-ca or the\n"      \
  "                       system roots)\n"                                                    \
  "  --tls-ca FILE        PEM root certificate(s) for --tls\n"                                \
  "  --tls-name NAME      name the server certificate must carry (default: the host)\n"      \
  "  --token TOKEN        bearer token sent with every call\n"

#define HELP_HELP "  -h, --help           this help\n"

enum { O_SERVER = 512, O_TLS, O_TLS_CA, O_TLS_NAME, O_TOKEN, O_TIMEOUT };

#define CONNECTION_OPTIONS                                                                    \
  {"server", required_argument, 0, O_SERVER}, {"tls", no_argument, 0, O_TLS},                \
      {"tls-ca", required_argument, 0, O_TLS_CA}, {"tls-name", required_argument, 0, O_TLS_NAME}, \
      {"token", required_argument, 0, O_TOKEN}, {"timeout-ms", required_argument, 0, O_TIMEOUT}

typedef struct connection {
  ina_rpc_client_options_t options;
  int64_t timeout_ms; /* -1: the command's default */
} connection_t;

/* Handles a connection option; returns 1 when `c` was one, -1 on a bad value, 0 else. */
static int connection_option(connection_t *conn, int c, const char *arg) {
  switch (c) {
  case O_SERVER: conn->options.target = arg; return 1;
  case O_TLS: conn->options.tls = 1; return 1;
  case O_TLS_CA: conn->options.tls_root_cert_file = arg; return 1;
  case O_TLS_NAME: conn->options.tls_target_name = arg; return 1;
  case O_TOKEN: conn->options.bearer_token = arg; return 1;
  case O_TIMEOUT: return cli_parse_int("--timeout-ms", arg, 1, INT64_MAX, &conn->timeout_ms) ? -1 : 1;
  default: return 0;
  }
}

/* One unary call of /ina.v1.SERVICE/NAME: packs `request`, calls and unpacks the answer
 * as a message of `answer_type`. Returns the unpacked message (free it with
 * protobuf_c_message_free_unpacked), or NULL after printing why ("ina CMD: NAME: CODE:
 * message" for a call that ended with an error status). */
static ProtobufCMessage *call(ina_rpc_client_t *client, const char *cmd, const char *service,
                              const char *name, const ProtobufCMessage *request, int64_t deadline_ms,
                              const ProtobufCMessageDescriptor *answer_type) {
  char method[128];
  uint8_t *bytes = NULL, *resp = NULL;
  size_t size = 0, resp_size = 0;
  ina_rpc_status_t status;
  ProtobufCMessage *answer = NULL;
  snprintf(method, sizeof method, "/ina.v1.%s/%s", service, name);
  if (ina_rpc_pack(request, &bytes, &size) != INA_OK) {
    fprintf(stderr, "ina %s: %s\n", cmd, ina_last_error());
    return NULL;
  }
  if (ina_rpc_client_unary(client, method, bytes, size, deadline_ms, &resp, &resp_size, &status) != INA_OK) {
    fprintf(stderr, "ina %s: %s: %s: %s\n", cmd, name, ina_rpc_code_name(status.code), status.message);
  } else if (!(answer = protobuf_c_message_unpack(answer_type, NULL, resp_size, resp))) {
    fprintf(stderr, "ina %s: %s: the answer (%zu bytes) is not an %s\n", cmd, name, resp_size,
            answer_type->name);
  }
  free(bytes);
  free(resp);
  return answer;
}

static ina_rpc_client_t *connect_or_report(const char *cmd, connection_t *conn) {
  ina_rpc_client_t *client = NULL;
  if (ina_rpc_client_create(&conn->options, &client) != INA_OK)
    fprintf(stderr, "ina %s: %s\n", cmd, ina_last_error());
  return client;
}

/* ---- readable JSON output ----------------------------------------------------------- */

#define DUMP_FLAGS (JSON_ENCODE_ANY | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9))

/* Whether v prints on one line: a scalar, or an array or object of scalars only. */
static int is_flat(const json_t *v) {
  const char *key;
  json_t *child;
  size_t i;
  if (json_is_array(v)) {
    json_array_foreach((json_t *)v, i, child)
      if (json_is_array(child) || json_is_object(child)) return 0;
  } else if (json_is_object(v)) {
    json_object_foreach((json_t *)v, key, child)
      if (json_is_array(child) || json_is_object(child)) return 0;
  }
  return 1;
}

static int print_dump(FILE *f, const json_t *v) {
  char *s = json_dumps(v, DUMP_FLAGS);
  if (!s) return -1;
  fputs(s, f);
  free(s);
  return 0;
}

/* Prints v with one member or element per line down to the values that fit on one line
 * (an expert map prints one slot per line), which keeps large files easy to read, edit
 * and diff. Returns 0, or -1 when out of memory. */
static int print_json(FILE *f, const json_t *v, int indent) {
  if (is_flat(v)) return print_dump(f, v);
  const int is_object = json_is_object(v);
  const size_t n = is_object ? json_object_size(v) : json_array_size(v);
  size_t i = 0;
  fputs(is_object ? "{\n" : "[\n", f);
  void *it = is_object ? json_object_iter((json_t *)v) : NULL;
  for (i = 0; i < n; i++) {
    fprintf(f, "%*s", indent + 2, "");
    json_t *child;
    if (is_object) {
      json_t *key = json_string(json_object_iter_key(it));
      if (!key || print_dump(f, key)) {
        json_decref(key);
        return -1;
      }
      json_decref(key);
      fputs(": ", f);
      child = json_object_iter_value(it);
      it = json_object_iter_next((json_t *)v, it);
    } else {
      child = json_array_get(v, i);
    }
    if (print_json(f, child, indent + 2)) return -1;
    fputs(i + 1 < n ? ",\n" : "\n", f);
  }
  fprintf(f, "%*s%s", indent, "", is_object ? "}" : "]");
  return 0;
}

/* Writes doc to path (stdout when NULL) followed by a newline; 0 or 1 after a message. */
static int write_json(const char *cmd, const json_t *doc, const char *path) {
  FILE *f = path ? fopen(path, "w") : stdout;
  if (!f) {
    fprintf(stderr, "ina %s: --out '%s': cannot open: %s\n", cmd, path, strerror(errno));
    return 1;
  }
  int bad = print_json(f, doc, 0) != 0;
  fputc('\n', f);
  bad |= ferror(f) != 0;
  if (path) bad |= fclose(f) != 0;
  else bad |= fflush(f) != 0;
  if (bad) fprintf(stderr, "ina %s: cannot write %s\n", cmd, path ? path : "to stdout");
  return bad;
}

/* json_object_set_new that remembers a failure (out of memory) in *bad. */
static void put(json_t *obj, const char *key, json_t *value, int *bad) {
  if (!value || json_object_set_new(obj, key, value) != 0) *bad = 1;
}

/* ---- ina load ----------------------------------------------------------------------- */

static void load_usage(FILE *f) {
  fprintf(f,
          "usage: ina load --server HOST:PORT [--experts] [--reset] [--json] [options]\n"
          "\n"
          "Prints the agent's load (ina.v1.Node/GetLoad): queued and running requests, KV\n"
          "cache pages used and free, prefill and decode tokens/s over the window since the\n"
          "previous GetLoad. With --experts also the tokens routed to each logical expert of\n"
          "each MoE layer, and per layer the imbalance max/mean (1 = perfectly even).\n"
          "\n"
          "  --experts            include the per-expert token counts\n"
          "  --reset              reset the per-expert counters after reading them, so that\n"
          "                       the next call counts a fresh window (implies --experts)\n"
          "  --json               print JSON (the fields of ina.v1.NodeLoad) instead of text\n"
          CONNECTION_HELP
          "  --timeout-ms N       deadline of the call (default 10000)\n"
          HELP_HELP);
}

typedef struct layer_stats {
  uint64_t total, max;
  size_t argmax;
  double max_over_mean; /* 0 when no token was routed */
} layer_stats_t;

static layer_stats_t layer_stats(const Ina__V1__ExpertLoad *e) {
  layer_stats_t s = {0, 0, 0, 0};
  for (size_t i = 0; i < e->n_tokens; i++) {
    s.total += e->tokens[i];
    if (e->tokens[i] > s.max) {
      s.max = e->tokens[i];
      s.argmax = i;
    }
  }
  if (s.total > 0) s.max_over_mean = (double)s.max * (double)e->n_tokens / (double)s.total;
  return s;
}

static int decimal_width(uint64_t v) {
  int w = 1;
  while (v >= 10) {
    v /= 10;
    w++;
  }
  return w;
}

static void print_load_text(const Ina__V1__NodeLoad *load, int experts) {
  printf("requests: %u queued, %u running\n", load->queued_requests, load->running_requests);
  printf("kv pages: %llu used, %llu free (%u tokens per page)\n",
         (unsigned long long)load->kv_pages_used, (unsigned long long)load->kv_pages_free,
         load->kv_page_size);
  printf("throughput: prefill %.1f tokens/s, decode %.1f tokens/s (over the last %.1f s)\n",
         load->prefill_tokens_per_second, load->decode_tokens_per_second, load->window_seconds);
  if (!experts) return;
  printf("expert load: tokens per logical expert over the last %.1f s, %zu MoE layers\n",
         load->expert_load_seconds, load->n_expert_load);
  enum { PER_ROW = 16 };
  for (size_t l = 0; l < load->n_expert_load; l++) {
    const Ina__V1__ExpertLoad *e = load->expert_load[l];
    const layer_stats_t s = layer_stats(e);
    printf("moe layer %u: %llu tokens", e->moe_layer, (unsigned long long)s.total);
    if (s.total > 0)
      printf(", max %llu (expert %zu), max/mean %.2f", (unsigned long long)s.max, s.argmax,
             s.max_over_mean);
    printf("\n");
    /* Rows of PER_ROW counts, each led by its first expert's index. */
    const int index_width = decimal_width(e->n_tokens > 0 ? e->n_tokens - 1 : 0);
    const int count_width = decimal_width(s.max);
    for (size_t i = 0; i < e->n_tokens; i++) {
      if (i % PER_ROW == 0) printf("  %*zu:", index_width, i);
      printf(" %*llu", count_width, (unsigned long long)e->tokens[i]);
      if (i % PER_ROW == PER_ROW - 1 || i + 1 == e->n_tokens) printf("\n");
    }
  }
}

static json_t *load_to_json(const Ina__V1__NodeLoad *load, int experts) {
  json_t *doc = json_object();
  int bad = !doc;
  if (bad) return NULL;
  put(doc, "queued_requests", json_integer(load->queued_requests), &bad);
  put(doc, "running_requests", json_integer(load->running_requests), &bad);
  put(doc, "kv_pages_used", json_integer((json_int_t)load->kv_pages_used), &bad);
  put(doc, "kv_pages_free", json_integer((json_int_t)load->kv_pages_free), &bad);
  put(doc, "kv_page_size", json_integer(load->kv_page_size), &bad);
  put(doc, "prefill_tokens_per_second", json_real(load->prefill_tokens_per_second), &bad);
  put(doc, "decode_tokens_per_second", json_real(load->decode_tokens_per_second), &bad);
  put(doc, "window_seconds", json_real(load->window_seconds), &bad);
  if (experts) {
    put(doc, "expert_load_seconds", json_real(load->expert_load_seconds), &bad);
    json_t *layers = json_array();
    put(doc, "expert_load", layers, &bad);
    for (size_t l = 0; l < load->n_expert_load && !bad; l++) {
      const Ina__V1__ExpertLoad *e = load->expert_load[l];
      const layer_stats_t s = layer_stats(e);
      json_t *entry = json_object(), *tokens = json_array();
      if (!entry || json_array_append_new(layers, entry) != 0) {
        json_decref(tokens);
        bad = 1;
        break;
      }
      put(entry, "moe_layer", json_integer(e->moe_layer), &bad);
      put(entry, "tokens", tokens, &bad);
      for (size_t i = 0; i < e->n_tokens && !bad; i++)
        bad |= json_array_append_new(tokens, json_integer((json_int_t)e->tokens[i])) != 0;
      put(entry, "total_tokens", json_integer((json_int_t)s.total), &bad);
      /* null: no token was routed, so no imbalance to speak of */
      put(entry, "max_over_mean", s.total > 0 ? json_real(s.max_over_mean) : json_null(), &bad);
    }
  }
  if (bad) {
    json_decref(doc);
    return NULL;
  }
  return doc;
}

int cmd_load(int argc, char **argv) {
  enum { O_EXPERTS = 256, O_RESET, O_JSON };
  static const struct option opts[] = {
      CONNECTION_OPTIONS,
      {"experts", no_argument, 0, O_EXPERTS}, {"reset", no_argument, 0, O_RESET},
      {"json", no_argument, 0, O_JSON},       {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  connection_t conn = {INA_RPC_CLIENT_OPTIONS_INIT, -1};
  int experts = 0, reset = 0, as_json = 0, c, r;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if ((r = connection_option(&conn, c, optarg)) == 1) continue;
    if (r < 0) return 2;
    switch (c) {
    case O_EXPERTS: experts = 1; break;
    case O_RESET: reset = experts = 1; break;
    case O_JSON: as_json = 1; break;
    case 'h': load_usage(stdout); return 0;
    default: load_usage(stderr); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "ina load: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (!conn.options.target) {
    fprintf(stderr, "ina load: --server HOST:PORT is required\n");
    return 2;
  }
  ina_rpc_client_t *client = connect_or_report("load", &conn);
  if (!client) return 1;
  Ina__V1__GetLoadRequest req = INA__V1__GET_LOAD_REQUEST__INIT;
  req.include_expert_load = experts;
  req.reset_expert_load = reset;
  Ina__V1__NodeLoad *load = (Ina__V1__NodeLoad *)call(client, "load", "Node", "GetLoad", &req.base,
                                                      conn.timeout_ms > 0 ? conn.timeout_ms : 0,
                                                      &ina__v1__node_load__descriptor);
  ina_rpc_client_destroy(client);
  if (!load) return 1;
  int rc = 0;
  if (as_json) {
    json_t *doc = load_to_json(load, experts);
    if (!doc) fprintf(stderr, "ina load: out of memory\n");
    rc = !doc || write_json("load", doc, NULL);
    json_decref(doc);
  } else {
    print_load_text(load, experts);
  }
  protobuf_c_message_free_unpacked(&load->base, NULL);
  return rc;
}

/* ---- placement <-> JSON --------------------------------------------------------------- */

static json_t *placement_to_json(const Ina__V1__ExpertPlacement *p) {
  json_t *doc = json_object(), *layout = json_object(), *layers = json_array();
  int bad = !doc;
  if (bad) {
    json_decref(layout);
    json_decref(layers);
    return NULL;
  }
  put(doc, "layout", layout, &bad);
  /* An absent layout reads as its zero value, as proto3 has it. */
  put(layout, "tp", json_integer(p->layout ? p->layout->tp : 0), &bad);
  put(layout, "dp", json_integer(p->layout ? p->layout->dp : 0), &bad);
  put(layout, "ep", json_integer(p->layout ? p->layout->ep : 0), &bad);
  put(doc, "slots_per_rank", json_integer(p->slots_per_rank), &bad);
  put(doc, "generation", json_integer((json_int_t)p->generation), &bad);
  put(doc, "layers", layers, &bad);
  for (size_t l = 0; l < p->n_layers && !bad; l++) {
    const Ina__V1__LayerPlacement *lp = p->layers[l];
    json_t *layer = json_object(), *slots = json_array();
    if (!layer || json_array_append_new(layers, layer) != 0) {
      json_decref(slots);
      bad = 1;
      break;
    }
    put(layer, "moe_layer", json_integer(lp->moe_layer), &bad);
    put(layer, "slots", slots, &bad);
    for (size_t i = 0; i < lp->n_slots && !bad; i++) {
      json_t *slot = json_object();
      if (!slot || json_array_append_new(slots, slot) != 0) {
        bad = 1;
        break;
      }
      put(slot, "ep_rank", json_integer(lp->slots[i]->ep_rank), &bad);
      put(slot, "slot", json_integer(lp->slots[i]->slot), &bad);
      put(slot, "logical_expert", json_integer(lp->slots[i]->logical_expert), &bad);
    }
  }
  if (bad) {
    json_decref(doc);
    return NULL;
  }
  return doc;
}

/* A placement read from a file: the protobuf-c messages and the storage they point into
 * (every slot of every layer in one array). */
typedef struct placement_doc {
  Ina__V1__ExpertPlacement placement;
  Ina__V1__Layout layout;
  Ina__V1__LayerPlacement *layers, **layer_ptrs;
  Ina__V1__ExpertSlot *slots, **slot_ptrs;
} placement_doc_t;

static void placement_doc_free(placement_doc_t *d) {
  free(d->layers);
  free(d->layer_ptrs);
  free(d->slots);
  free(d->slot_ptrs);
}

/* Reading state: the file name for messages and the first problem found. */
typedef struct reader {
  const char *file;
  char error[512];
} reader_t;

/* Records "FILE: PATH: problem" (PATH omitted when empty); returns -1. */
__attribute__((format(printf, 3, 4))) static int reader_fail(reader_t *r, const char *path,
                                                             const char *fmt, ...) {
  va_list ap;
  int n = snprintf(r->error, sizeof r->error, "%s: %s%s", r->file, path, path[0] ? ": " : "");
  if (n < 0 || (size_t)n >= sizeof r->error) return -1;
  va_start(ap, fmt);
  vsnprintf(r->error + n, sizeof r->error - (size_t)n, fmt, ap);
  va_end(ap);
  return -1;
}

/* A value as it appears in JSON, shortened for messages: "x" with its quotes, 12, [1, 2]. */
static void describe(const json_t *v, char *out, size_t size) {
  char *s = json_dumps(v, DUMP_FLAGS);
  if (!s) {
    snprintf(out, size, "(a value)");
    return;
  }
  if (strlen(s) > 48) snprintf(out, size, "%.45s...", s);
  else snprintf(out, size, "%s", s);
  free(s);
}

/* "prefix.key", or "key" at the top. */
static void join_path(char *out, size_t size, const char *prefix, const char *key) {
  snprintf(out, size, "%s%s%s", prefix, prefix[0] ? "." : "", key);
}

/* obj must be an object whose keys are all in `allowed` (NULL-terminated). */
static int check_object(reader_t *r, const json_t *obj, const char *path, const char *const *allowed) {
  char got[64], key_path[160], expected[160] = "";
  const char *key;
  json_t *value;
  if (!json_is_object(obj)) {
    describe(obj, got, sizeof got);
    return reader_fail(r, path, "expected an object, got %s", got);
  }
  for (size_t i = 0; allowed[i]; i++)
    snprintf(expected + strlen(expected), sizeof expected - strlen(expected), "%s%s", i ? ", " : "",
             allowed[i]);
  json_object_foreach((json_t *)obj, key, value) {
    size_t i = 0;
    while (allowed[i] && strcmp(allowed[i], key) != 0) i++;
    if (!allowed[i]) {
      join_path(key_path, sizeof key_path, path, key);
      return reader_fail(r, key_path, "unknown key (expected one of %s)", expected);
    }
  }
  return 0;
}

/* obj[key] as an integer in [0, max]. */
static int read_uint(reader_t *r, const json_t *obj, const char *path, const char *key, uint64_t max,
                     uint64_t *out) {
  char key_path[160], got[64];
  join_path(key_path, sizeof key_path, path, key);
  const json_t *v = json_object_get(obj, key);
  if (!v) return reader_fail(r, key_path, "missing");
  if (!json_is_integer(v) || json_integer_value(v) < 0) {
    describe(v, got, sizeof got);
    return reader_fail(r, key_path, "expected a non-negative integer, got %s", got);
  }
  if ((uint64_t)json_integer_value(v) > max) {
    describe(v, got, sizeof got);
    return reader_fail(r, key_path, "expected an integer in [0, %llu], got %s",
                       (unsigned long long)max, got);
  }
  *out = (uint64_t)json_integer_value(v);
  return 0;
}

static int read_u32(reader_t *r, const json_t *obj, const char *path, const char *key, uint32_t *out) {
  uint64_t v = 0;
  if (read_uint(r, obj, path, key, UINT32_MAX, &v)) return -1;
  *out = (uint32_t)v;
  return 0;
}

/* obj[key] as an array. */
static const json_t *read_array(reader_t *r, const json_t *obj, const char *path, const char *key) {
  char key_path[160], got[64];
  join_path(key_path, sizeof key_path, path, key);
  const json_t *v = json_object_get(obj, key);
  if (!v) {
    reader_fail(r, key_path, "missing");
    return NULL;
  }
  if (!json_is_array(v)) {
    describe(v, got, sizeof got);
    reader_fail(r, key_path, "expected an array, got %s", got);
    return NULL;
  }
  return v;
}

static int read_slot(reader_t *r, const json_t *v, const char *path, Ina__V1__ExpertSlot *slot) {
  static const char *const keys[] = {"ep_rank", "slot", "logical_expert", NULL};
  ina__v1__expert_slot__init(slot);
  if (check_object(r, v, path, keys)) return -1;
  if (read_u32(r, v, path, "ep_rank", &slot->ep_rank)) return -1;
  if (read_u32(r, v, path, "slot", &slot->slot)) return -1;
  return read_u32(r, v, path, "logical_expert", &slot->logical_expert);
}

/* Slots of every layer, for sizing the one slot array; malformed entries count 0 and are
 * reported by the full read. */
static size_t count_slots(const json_t *layers) {
  size_t total = 0, l;
  json_t *layer;
  json_array_foreach((json_t *)layers, l, layer) {
    const json_t *slots = json_is_object(layer) ? json_object_get(layer, "slots") : NULL;
    if (json_is_array(slots)) total += json_array_size(slots);
  }
  return total;
}

static int read_placement(reader_t *r, const json_t *root, placement_doc_t *d) {
  static const char *const top_keys[] = {"layout", "slots_per_rank", "generation", "layers", NULL};
  static const char *const layout_keys[] = {"tp", "dp", "ep", NULL};
  static const char *const layer_keys[] = {"moe_layer", "slots", NULL};
  memset(d, 0, sizeof *d);
  ina__v1__expert_placement__init(&d->placement);
  ina__v1__layout__init(&d->layout);
  if (check_object(r, root, "", top_keys)) return -1;
  const json_t *layout = json_object_get(root, "layout");
  if (!layout) return reader_fail(r, "layout", "missing");
  if (check_object(r, layout, "layout", layout_keys)) return -1;
  if (read_u32(r, layout, "layout", "tp", &d->layout.tp) ||
      read_u32(r, layout, "layout", "dp", &d->layout.dp) ||
      read_u32(r, layout, "layout", "ep", &d->layout.ep))
    return -1;
  if (read_u32(r, root, "", "slots_per_rank", &d->placement.slots_per_rank)) return -1;
  const json_t *layers = read_array(r, root, "", "layers");
  if (!layers) return -1;

  const size_t n_layers = json_array_size(layers), n_slots = count_slots(layers);
  d->layers = calloc(n_layers + 1, sizeof *d->layers);
  d->layer_ptrs = calloc(n_layers + 1, sizeof *d->layer_ptrs);
  d->slots = calloc(n_slots + 1, sizeof *d->slots);
  d->slot_ptrs = calloc(n_slots + 1, sizeof *d->slot_ptrs);
  if (!d->layers || !d->layer_ptrs || !d->slots || !d->slot_ptrs)
    return reader_fail(r, "", "out of memory");
  size_t next_slot = 0;
  for (size_t l = 0; l < n_layers; l++) {
    char path[64];
    const json_t *layer = json_array_get(layers, l);
    Ina__V1__LayerPlacement *lp = &d->layers[l];
    ina__v1__layer_placement__init(lp);
    snprintf(path, sizeof path, "layers[%zu]", l);
    if (check_object(r, layer, path, layer_keys)) return -1;
    if (read_u32(r, layer, path, "moe_layer", &lp->moe_layer)) return -1;
    const json_t *slots = read_array(r, layer, path, "slots");
    if (!slots) return -1;
    lp->n_slots = json_array_size(slots);
    lp->slots = d->slot_ptrs + next_slot;
    for (size_t i = 0; i < lp->n_slots; i++) {
      char slot_path[96];
      snprintf(slot_path, sizeof slot_path, "%s.slots[%zu]", path, i);
      if (read_slot(r, json_array_get(slots, i), slot_path, &d->slots[next_slot])) return -1;
      d->slot_ptrs[next_slot] = &d->slots[next_slot];
      next_slot++;
    }
    d->layer_ptrs[l] = lp;
  }
  d->placement.layout = &d->layout;
  d->placement.n_layers = n_layers;
  d->placement.layers = d->layer_ptrs;
  return 0;
}

/* ---- ina place ---------------------------------------------------------------------- */

static void place_usage(FILE *f) {
  fprintf(f,
          "usage: ina place --server HOST:PORT --show [--out FILE] [options]\n"
          "       ina place --server HOST:PORT --file FILE [--admin-token T | --admin-token-file F]\n"
          "                 [--expected-generation G] [--dry-run] [options]\n"
          "\n"
          "--show writes the placement in force (ina.v1.Placement/GetPlacement) as JSON:\n"
          "  {\"layout\": {\"tp\": T, \"dp\": D, \"ep\": E}, \"slots_per_rank\": S, \"generation\": G,\n"
          "   \"layers\": [{\"moe_layer\": M, \"slots\": [{\"ep_rank\": R, \"slot\": I,\n"
          "                                            \"logical_expert\": X}, ...]}, ...]}\n"
          "--file applies such a file (ApplyPlacement, an admin call; its \"generation\" is\n"
          "ignored). The file's shape and types are checked first: a malformed file exits 2\n"
          "naming the key. A refused placement prints the agent's status code and message and\n"
          "exits 1.\n"
          "\n"
          "  --show               print the placement in force\n"
          "  --out FILE           with --show: write it to FILE instead of stdout\n"
          "  --file FILE          apply the placement in FILE\n"
          "  --admin-token T      the agent's admin token (sent as the bearer token)\n"
          "  --admin-token-file F the same, read from the first line of file F, so that the\n"
          "                       token does not show in the process list\n"
          "  --expected-generation G\n"
          "                       apply only if generation G is still in force (an\n"
          "                       orchestrator passes the generation it planned from); default:\n"
          "                       the generation in force, read just before applying\n"
          "  --dry-run            have the agent validate the placement and apply nothing\n"
          CONNECTION_HELP
          "  --timeout-ms N       deadline of each call (default 10000 for --show, 600000 for\n"
          "                       ApplyPlacement)\n"
          HELP_HELP);
}

/* The first line of `path` (without its line end) into buf; 1 with a message when the
 * file cannot be read, or the line is empty or does not fit. */
static int read_token_file(const char *path, char *buf, size_t size) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "ina place: --admin-token-file '%s': %s\n", path, strerror(errno));
    return 1;
  }
  const int got = fgets(buf, (int)size, f) != NULL;
  fclose(f);
  const size_t n = got ? strcspn(buf, "\r\n") : 0;
  if (n == 0 || n == size - 1) {
    fprintf(stderr, "ina place: --admin-token-file '%s': %s\n", path,
            n == 0 ? "the first line is empty" : "the token is too long");
    return 1;
  }
  buf[n] = '\0';
  return 0;
}

/* The placement in force; NULL after printing why not. */
static Ina__V1__GetPlacementResponse *get_placement(ina_rpc_client_t *client, const connection_t *conn) {
  Ina__V1__GetPlacementRequest req = INA__V1__GET_PLACEMENT_REQUEST__INIT;
  return (Ina__V1__GetPlacementResponse *)call(client, "place", "Placement", "GetPlacement", &req.base,
                                               conn->timeout_ms > 0 ? conn->timeout_ms : 0,
                                               &ina__v1__get_placement_response__descriptor);
}

static int show_placement(ina_rpc_client_t *client, const connection_t *conn, const char *out) {
  Ina__V1__GetPlacementResponse *resp = get_placement(client, conn);
  if (!resp) return 1;
  int rc = 1;
  if (!resp->placement) {
    fprintf(stderr, "ina place: GetPlacement: the answer holds no placement\n");
  } else {
    json_t *doc = placement_to_json(resp->placement);
    if (!doc) fprintf(stderr, "ina place: out of memory\n");
    else rc = write_json("place", doc, out);
    json_decref(doc);
    const Ina__V1__ExpertPlacement *p = resp->placement;
    if (rc == 0 && out)
      printf("placement generation %llu (tp %u, dp %u, ep %u, %u slots per rank, %zu MoE layers) "
             "written to %s\n",
             (unsigned long long)p->generation, p->layout ? p->layout->tp : 0,
             p->layout ? p->layout->dp : 0, p->layout ? p->layout->ep : 0, p->slots_per_rank,
             p->n_layers, out);
  }
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return rc;
}

/* The generation in force, from GetPlacement; 0 after printing why not. */
static uint64_t generation_in_force(ina_rpc_client_t *client, const connection_t *conn) {
  Ina__V1__GetPlacementResponse *resp = get_placement(client, conn);
  if (!resp) return 0;
  uint64_t g = resp->placement ? resp->placement->generation : 0;
  if (g == 0) fprintf(stderr, "ina place: GetPlacement: the answer holds no generation\n");
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return g;
}

static int apply_placement(ina_rpc_client_t *client, const connection_t *conn, placement_doc_t *doc,
                           uint64_t expected_generation, int dry_run) {
  if (expected_generation == 0) {
    expected_generation = generation_in_force(client, conn);
    if (expected_generation == 0) return 1;
  }
  Ina__V1__ApplyPlacementRequest req = INA__V1__APPLY_PLACEMENT_REQUEST__INIT;
  req.placement = &doc->placement;
  req.expected_generation = expected_generation;
  req.dry_run = dry_run;
  Ina__V1__ApplyPlacementResponse *resp = (Ina__V1__ApplyPlacementResponse *)call(
      client, "place", "Placement", "ApplyPlacement", &req.base,
      conn->timeout_ms > 0 ? conn->timeout_ms : APPLY_DEFAULT_TIMEOUT_MS,
      &ina__v1__apply_placement_response__descriptor);
  if (!resp) return 1;
  if (dry_run)
    printf("dry run: the agent accepts the placement; generation %llu stays in force\n",
           (unsigned long long)resp->generation);
  else
    printf("applied: generation %llu -> %llu in %llu ms, %llu bytes of expert weights moved\n",
           (unsigned long long)expected_generation, (unsigned long long)resp->generation,
           (unsigned long long)resp->apply_ms, (unsigned long long)resp->bytes_moved);
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return 0;
}

int cmd_place(int argc, char **argv) {
  enum { O_SHOW = 256, O_OUT, O_FILE, O_ADMIN, O_ADMIN_FILE, O_EXPECTED, O_DRY };
  static const struct option opts[] = {
      CONNECTION_OPTIONS,
      {"show", no_argument, 0, O_SHOW},
      {"out", required_argument, 0, O_OUT},
      {"file", required_argument, 0, O_FILE},
      {"admin-token", required_argument, 0, O_ADMIN},
      {"admin-token-file", required_argument, 0, O_ADMIN_FILE},
      {"expected-generation", required_argument, 0, O_EXPECTED},
      {"dry-run", no_argument, 0, O_DRY},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  connection_t conn = {INA_RPC_CLIENT_OPTIONS_INIT, -1};
  const char *out = NULL, *file = NULL, *token_file = NULL;
  int show = 0, dry_run = 0, tokens_given = 0, c, r;
  int64_t expected = 0;
  static char token[512];
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if ((r = connection_option(&conn, c, optarg)) == 1) {
      tokens_given += c == O_TOKEN;
      continue;
    }
    if (r < 0) return 2;
    switch (c) {
    case O_SHOW: show = 1; break;
    case O_OUT: out = optarg; break;
    case O_FILE: file = optarg; break;
    case O_ADMIN: conn.options.bearer_token = optarg; tokens_given++; break;
    case O_ADMIN_FILE: token_file = optarg; tokens_given++; break;
    case O_EXPECTED:
      if (cli_parse_int("--expected-generation", optarg, 1, INT64_MAX, &expected)) return 2;
      break;
    case O_DRY: dry_run = 1; break;
    case 'h': place_usage(stdout); return 0;
    default: place_usage(stderr); return 2;
    }
  }
  const char *problem = NULL;
  if (optind < argc) {
    fprintf(stderr, "ina place: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (!conn.options.target) problem = "--server HOST:PORT is required";
  else if (show == !!file) problem = "give one of --show and --file";
  else if (out && !show) problem = "--out goes with --show";
  else if (show && (expected || dry_run)) problem = "--expected-generation and --dry-run go with --file";
  else if (tokens_given > 1) problem = "give only one of --admin-token, --admin-token-file and --token";
  if (problem) {
    fprintf(stderr, "ina place: %s (see ina place --help)\n", problem);
    return 2;
  }
  if (token_file) {
    if (read_token_file(token_file, token, sizeof token)) return 2;
    conn.options.bearer_token = token;
  }

  /* Read and check the whole file before any call. */
  placement_doc_t doc;
  memset(&doc, 0, sizeof doc);
  if (file) {
    json_t *root = NULL;
    if (ina_json_load_file(file, &root) != INA_OK) {
      fprintf(stderr, "ina place: %s\n", ina_last_error());
      return 2;
    }
    reader_t reader = {file, ""};
    const int bad = read_placement(&reader, root, &doc);
    json_decref(root);
    if (bad) {
      fprintf(stderr, "ina place: %s\n", reader.error);
      placement_doc_free(&doc);
      return 2;
    }
  }

  int rc = 1;
  ina_rpc_client_t *client = connect_or_report("place", &conn);
  if (client)
    rc = show ? show_placement(client, &conn, out)
              : apply_placement(client, &conn, &doc, (uint64_t)expected, dry_run);
  ina_rpc_client_destroy(client);
  placement_doc_free(&doc);
  return rc;
}
