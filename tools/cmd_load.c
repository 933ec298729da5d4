/* ina load --server HOST:PORT [--experts] [--reset] [--json]: the load of a running
 * ina-agent (ina.v1.Node/GetLoad) as text or JSON. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "ina/v1/node.pb-c.h"
#include "tools/cli.h"
#include "tools/client_connection.h"
#include "tools/json_output.h"

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
          "  --json               print JSON (the fields of ina.v1.NodeLoad) instead of text\n");
  client_connection_help(f, "deadline of the call (default 10000)\n");
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
  printf("kv pages: %llu used (%llu cached, %llu in transfers), %llu free (%u tokens per page)\n",
         (unsigned long long)load->kv_pages_used, (unsigned long long)load->kv_pages_cached,
         (unsigned long long)load->kv_pages_transfer, (unsigned long long)load->kv_pages_free, load->kv_page_size);
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
  json_output_set(doc, "queued_requests", json_integer(load->queued_requests), &bad);
  json_output_set(doc, "running_requests", json_integer(load->running_requests), &bad);
  json_output_set(doc, "kv_pages_used", json_integer((json_int_t)load->kv_pages_used), &bad);
  json_output_set(doc, "kv_pages_free", json_integer((json_int_t)load->kv_pages_free), &bad);
  json_output_set(doc, "kv_page_size", json_integer(load->kv_page_size), &bad);
  json_output_set(doc, "kv_pages_cached", json_integer((json_int_t)load->kv_pages_cached), &bad);
  json_output_set(doc, "kv_pages_transfer", json_integer((json_int_t)load->kv_pages_transfer), &bad);
  json_output_set(doc, "prefill_tokens_per_second", json_real(load->prefill_tokens_per_second), &bad);
  json_output_set(doc, "decode_tokens_per_second", json_real(load->decode_tokens_per_second), &bad);
  json_output_set(doc, "window_seconds", json_real(load->window_seconds), &bad);
  if (experts) {
    json_output_set(doc, "expert_load_seconds", json_real(load->expert_load_seconds), &bad);
    json_t *layers = json_array();
    json_output_set(doc, "expert_load", layers, &bad);
    for (size_t l = 0; l < load->n_expert_load && !bad; l++) {
      const Ina__V1__ExpertLoad *e = load->expert_load[l];
      const layer_stats_t s = layer_stats(e);
      json_t *entry = json_output_append_object(layers, &bad);
      if (!entry) break;
      json_t *tokens = json_array();
      json_output_set(entry, "moe_layer", json_integer(e->moe_layer), &bad);
      json_output_set(entry, "tokens", tokens, &bad);
      for (size_t i = 0; i < e->n_tokens && !bad; i++)
        bad |= json_array_append_new(tokens, json_integer((json_int_t)e->tokens[i])) != 0;
      json_output_set(entry, "total_tokens", json_integer((json_int_t)s.total), &bad);
      /* null: no token was routed, so no imbalance to speak of */
      json_output_set(entry, "max_over_mean", s.total > 0 ? json_real(s.max_over_mean) : json_null(),
                      &bad);
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
      CLIENT_CONNECTION_OPTIONS,
      {"experts", no_argument, 0, O_EXPERTS}, {"reset", no_argument, 0, O_RESET},
      {"json", no_argument, 0, O_JSON},       {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  client_connection_t conn = CLIENT_CONNECTION_INIT;
  int experts = 0, reset = 0, as_json = 0, c, r;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if ((r = client_connection_option(&conn, c, optarg)) == 1) continue;
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
  ina_rpc_client_t *client = client_connect("load", &conn);
  if (!client) return 1;
  Ina__V1__GetLoadRequest req = INA__V1__GET_LOAD_REQUEST__INIT;
  req.include_expert_load = experts;
  req.reset_expert_load = reset;
  Ina__V1__NodeLoad *load =
      (Ina__V1__NodeLoad *)client_call(client, "load", "Node", "GetLoad", &req.base,
                                       client_connection_deadline(&conn, 0), &ina__v1__node_load__descriptor);
  ina_rpc_client_destroy(client);
  if (!load) return 1;
  int rc = 0;
  if (as_json) {
    json_t *doc = load_to_json(load, experts);
    if (!doc) fprintf(stderr, "ina load: out of memory\n");
    rc = !doc || json_output_write("load", doc, NULL);
    json_decref(doc);
  } else {
    print_load_text(load, experts);
  }
  protobuf_c_message_free_unpacked(&load->base, NULL);
  return rc;
}
