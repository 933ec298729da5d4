/* ina place: the expert placement of a running ina-agent.
 *   ina place --server HOST:PORT --show [--out FILE]
 *   ina place --server HOST:PORT --file FILE [--admin-token T | --admin-token-file F]
 *             [--expected-generation G] [--dry-run]
 *   ina place --server HOST:PORT --balance [--slots-per-rank S]
 *             [--admin-token T | --admin-token-file F] [--dry-run] [--out FILE]
 * `--show` writes the placement in force as JSON (placement_json.h); `--file` reads such
 * a file back, checks it whole before any call, and applies it. `--balance` reads the
 * per-expert token counts (Node/GetLoad) and the placement in force, plans a balanced one
 * relative to it (placement_rebalance in moe_ep/placement_balance.h: layers it does not
 * improve stay, the others move the fewest weights), prints how even the ranks' loads are
 * and will be, and applies it against the generation it planned from. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "core/log.h"
#include "ina/v1/node.pb-c.h"
#include "ina/v1/placement.pb-c.h"
#include "moe_ep/placement_balance.h"
#include "tools/cli.h"
#include "tools/client_connection.h"
#include "tools/json_output.h"
#include "tools/placement_json.h"

/* ApplyPlacement moves expert weights and re-captures graphs: minutes, not seconds. */
#define APPLY_DEFAULT_TIMEOUT_MS 600000

static void place_usage(FILE *f) {
  fprintf(f,
          "usage: ina place --server HOST:PORT --show [--out FILE] [options]\n"
          "       ina place --server HOST:PORT --file FILE [--admin-token T | --admin-token-file F]\n"
          "                 [--expected-generation G] [--dry-run] [options]\n"
          "       ina place --server HOST:PORT --balance [--slots-per-rank S] [--out FILE]\n"
          "                 [--admin-token T | --admin-token-file F] [--dry-run] [options]\n"
          "\n"
          "--show writes the placement in force (ina.v1.Placement/GetPlacement) as JSON:\n"
          "  {\"layout\": {\"tp\": T, \"dp\": D, \"ep\": E}, \"slots_per_rank\": S, \"generation\": G,\n"
          "   \"layers\": [{\"moe_layer\": M, \"slots\": [{\"ep_rank\": R, \"slot\": I,\n"
          "                                            \"logical_expert\": X}, ...]}, ...]}\n"
          "--file applies such a file (ApplyPlacement, an admin call; its \"generation\" is\n"
          "ignored). The file's shape and types are checked first: a malformed file exits 2\n"
          "naming the key. A refused placement prints the agent's status code and message and\n"
          "exits 1.\n"
          "--balance plans a placement from the tokens routed to each expert since start-up or\n"
          "the last `ina load --reset` (ina.v1.Node/GetLoad) and applies it against the\n"
          "generation it read. Per MoE layer, hot experts get redundant replicas in spare slots\n"
          "(a replicated expert's tokens are split evenly among its replicas, so outputs do not\n"
          "change) and replicas are packed so that the busiest EP rank's load is low. A layer\n"
          "the plan does not improve keeps its map; in the others the ranks are numbered so\n"
          "that the fewest expert weights move. A layer without counted tokens is planned as if\n"
          "every expert were equally loaded. It prints per layer the busiest rank's load over\n"
          "the mean (1 = even) now and planned. A --slots-per-rank the model cannot use exits 2.\n"
          "\n"
          "  --show               print the placement in force\n"
          "  --out FILE           with --show: write it to FILE instead of stdout; with\n"
          "                       --balance: also write the planned placement there (its\n"
          "                       \"generation\" is the one it was planned from)\n"
          "  --file FILE          apply the placement in FILE\n"
          "  --balance            plan a balanced placement from the expert load and apply it\n"
          "  --slots-per-rank S   with --balance: expert slots per EP rank and MoE layer, from\n"
          "                       ceil(experts / ep) to experts; slots beyond the least that\n"
          "                       fits may hold replicas. Default: the count in force\n"
          "  --admin-token T      the agent's admin token (sent as the bearer token)\n"
          "  --admin-token-file F the same, read from the first line of file F, so that the\n"
          "                       token does not show in the process list\n"
          "  --expected-generation G\n"
          "                       apply only if generation G is still in force (an\n"
          "                       orchestrator passes the generation it planned from); default:\n"
          "                       the generation in force, read just before applying\n"
          "  --dry-run            have the agent validate the placement and apply nothing\n");
  client_connection_help(f, "deadline of each call (default 10000 for GetPlacement and\n"
                            "GetLoad, 600000 for ApplyPlacement)\n");
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
static Ina__V1__GetPlacementResponse *get_placement(ina_rpc_client_t *client,
                                                    const client_connection_t *conn) {
  Ina__V1__GetPlacementRequest req = INA__V1__GET_PLACEMENT_REQUEST__INIT;
  return (Ina__V1__GetPlacementResponse *)client_call(client, "place", "Placement", "GetPlacement",
                                                      &req.base, client_connection_deadline(conn, 0),
                                                      &ina__v1__get_placement_response__descriptor);
}

static int show_placement(ina_rpc_client_t *client, const client_connection_t *conn, const char *out) {
  Ina__V1__GetPlacementResponse *resp = get_placement(client, conn);
  if (!resp) return 1;
  int rc = 1;
  if (!resp->placement) {
    fprintf(stderr, "ina place: GetPlacement: the answer holds no placement\n");
  } else {
    json_t *doc = placement_to_json(resp->placement);
    if (!doc) fprintf(stderr, "ina place: out of memory\n");
    else rc = json_output_write("place", doc, out);
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
static uint64_t generation_in_force(ina_rpc_client_t *client, const client_connection_t *conn) {
  Ina__V1__GetPlacementResponse *resp = get_placement(client, conn);
  if (!resp) return 0;
  uint64_t g = resp->placement ? resp->placement->generation : 0;
  if (g == 0) fprintf(stderr, "ina place: GetPlacement: the answer holds no generation\n");
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return g;
}

static int apply_placement(ina_rpc_client_t *client, const client_connection_t *conn,
                           Ina__V1__ExpertPlacement *placement, uint64_t expected_generation,
                           int dry_run) {
  if (expected_generation == 0) {
    expected_generation = generation_in_force(client, conn);
    if (expected_generation == 0) return 1;
  }
  Ina__V1__ApplyPlacementRequest req = INA__V1__APPLY_PLACEMENT_REQUEST__INIT;
  req.placement = placement;
  req.expected_generation = expected_generation;
  req.dry_run = dry_run;
  Ina__V1__ApplyPlacementResponse *resp = (Ina__V1__ApplyPlacementResponse *)client_call(
      client, "place", "Placement", "ApplyPlacement", &req.base,
      client_connection_deadline(conn, APPLY_DEFAULT_TIMEOUT_MS),
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

/* ---- --balance ---------------------------------------------------------------------- */

/* What --balance plans from, as dense arrays: the counters of GetLoad and the placement
 * of GetPlacement, both checked to describe the same layers and experts. */
typedef struct balance_input {
  int32_t layers, experts, ep, slots_per_rank; /* slots_per_rank: the count in force */
  uint64_t generation;
  double seconds;    /* covered by the counters */
  uint64_t *load;    /* [layers][experts] tokens routed to each expert */
  int32_t *in_force; /* [layers][ep][slots_per_rank] the map in force, -1 empty */
} balance_input_t;

static void balance_input_free(balance_input_t *in) {
  free(in->load);
  free(in->in_force);
}

/* Entries of the dense map that --balance will hold at most: far above any real model
 * (61 layers x 256 ranks x 256 slots is 4M), low enough to refuse a nonsensical answer. */
#define BALANCE_MAX_MAP_ENTRIES ((uint64_t)1 << 28)

/* Fills `in` from the two answers; 1 after printing what does not fit. */
static int read_balance_input(const Ina__V1__NodeLoad *load, const Ina__V1__ExpertPlacement *p,
                              balance_input_t *in) {
  memset(in, 0, sizeof *in);
  if (!p || !p->layout || p->layout->ep < 1 || p->slots_per_rank < 1 || p->generation < 1 ||
      p->n_layers < 1) {
    fprintf(stderr, "ina place: GetPlacement: the answer holds no placement with a layout, slots, "
                    "a generation and MoE layers\n");
    return 1;
  }
  if (load->n_expert_load != p->n_layers || load->expert_load[0]->n_tokens < 1) {
    fprintf(stderr, "ina place: GetLoad counts experts of %zu MoE layers, GetPlacement places %zu\n",
            load->n_expert_load, p->n_layers);
    return 1;
  }
  const uint64_t per_layer_max = BALANCE_MAX_MAP_ENTRIES / p->n_layers;
  if (p->n_layers > BALANCE_MAX_MAP_ENTRIES || p->layout->ep > per_layer_max ||
      p->slots_per_rank > per_layer_max / p->layout->ep ||
      load->expert_load[0]->n_tokens > BALANCE_MAX_MAP_ENTRIES) {
    fprintf(stderr, "ina place: GetPlacement: %zu layers x ep %u x %u slots per rank: too large\n",
            p->n_layers, p->layout->ep, p->slots_per_rank);
    return 1;
  }
  const size_t entries = p->n_layers * p->layout->ep * p->slots_per_rank;
  in->layers = (int32_t)p->n_layers;
  in->experts = (int32_t)load->expert_load[0]->n_tokens;
  in->ep = (int32_t)p->layout->ep;
  in->slots_per_rank = (int32_t)p->slots_per_rank;
  in->generation = p->generation;
  in->seconds = load->expert_load_seconds;
  in->load = calloc((size_t)in->layers * (size_t)in->experts, sizeof *in->load);
  in->in_force = malloc(entries * sizeof *in->in_force);
  /* One flag per layer, so that each must come exactly once in both answers. */
  unsigned char *seen = calloc((size_t)in->layers, 2);
  int bad = !in->load || !in->in_force || !seen;
  if (bad) fprintf(stderr, "ina place: out of memory\n");
  for (size_t i = 0; i < entries && !bad; i++) in->in_force[i] = -1;
  for (size_t i = 0; i < load->n_expert_load && !bad; i++) {
    const Ina__V1__ExpertLoad *e = load->expert_load[i];
    if (e->moe_layer >= (uint32_t)in->layers || seen[e->moe_layer] ||
        e->n_tokens != (size_t)in->experts) {
      fprintf(stderr, "ina place: GetLoad: expert_load[%zu] (moe layer %u, %zu experts) does not fit "
                      "%d MoE layers of %d experts, each once\n",
              i, e->moe_layer, e->n_tokens, in->layers, in->experts);
      bad = 1;
      break;
    }
    seen[e->moe_layer] = 1;
    memcpy(in->load + (size_t)e->moe_layer * in->experts, e->tokens, e->n_tokens * sizeof *e->tokens);
  }
  const size_t per_layer = (size_t)in->ep * (size_t)in->slots_per_rank;
  for (size_t i = 0; i < p->n_layers && !bad; i++) {
    const Ina__V1__LayerPlacement *lp = p->layers[i];
    if (lp->moe_layer >= (uint32_t)in->layers || seen[in->layers + lp->moe_layer]) {
      fprintf(stderr, "ina place: GetPlacement: layers[%zu].moe_layer %u is outside [0, %d) or "
                      "given twice\n", i, lp->moe_layer, in->layers);
      bad = 1;
      break;
    }
    seen[in->layers + lp->moe_layer] = 1;
    for (size_t j = 0; j < lp->n_slots && !bad; j++) {
      const Ina__V1__ExpertSlot *sl = lp->slots[j];
      if (sl->ep_rank >= (uint32_t)in->ep || sl->slot >= (uint32_t)in->slots_per_rank ||
          sl->logical_expert >= (uint32_t)in->experts) {
        fprintf(stderr, "ina place: GetPlacement: layers[%zu].slots[%zu] (rank %u, slot %u, expert "
                        "%u) is outside ep %d x %d slots of %d experts\n",
                i, j, sl->ep_rank, sl->slot, sl->logical_expert, in->ep, in->slots_per_rank,
                in->experts);
        bad = 1;
        break;
      }
      in->in_force[lp->moe_layer * per_layer + sl->ep_rank * (size_t)in->slots_per_rank + sl->slot] =
          (int32_t)sl->logical_expert;
    }
  }
  free(seen);
  if (bad) balance_input_free(in);
  return bad;
}

/* A slots-per-rank count that the model cannot use; 2 (bad argument) after saying why. */
static int check_slots_per_rank(const balance_input_t *in, int64_t slots) {
  const int64_t least = (in->experts + in->ep - 1) / in->ep;
  if (slots >= least && slots <= in->experts) return 0;
  fprintf(stderr, "ina place: --slots-per-rank %lld: outside [%lld, %d] for the agent's %d experts over "
                  "ep %d (every expert needs a slot, and a rank holds each expert at most once)\n",
          (long long)slots, (long long)least, in->experts, in->experts, in->ep);
  return 2;
}

/* How even one layer's expert map spreads its load: the busiest rank's load over the
 * mean (tokens split evenly among replicas), and the replicas it holds. */
typedef struct map_stats {
  double max_over_mean; /* 0 when the layer counted no token */
  int32_t replicas;     /* non-empty slots */
  int32_t hot_replicas; /* replicas of the layer's hottest expert */
} map_stats_t;

static int map_stats(const uint64_t *load, int32_t experts, int32_t ep, int32_t slots,
                     const int32_t *map, int32_t hot, double *rank_load, map_stats_t *out) {
  if (placement_rank_loads(load, experts, ep, slots, map, rank_load) != 0) return -1;
  double total = 0, top = 0;
  for (int32_t r = 0; r < ep; r++) {
    total += rank_load[r];
    top = rank_load[r] > top ? rank_load[r] : top;
  }
  *out = (map_stats_t){total > 0 ? top * ep / total : 0, 0, 0};
  for (size_t i = 0; i < (size_t)ep * (size_t)slots; i++) {
    out->replicas += map[i] >= 0;
    out->hot_replicas += map[i] == hot;
  }
  return 0;
}

/* Per layer: tokens, max/mean rank load and replicas, in force -> planned (or kept). */
static int print_balance_summary(const balance_input_t *in, int32_t slots, const int32_t *planned,
                                 const unsigned char *kept) {
  double *rank_load = malloc((size_t)in->ep * sizeof *rank_load);
  if (!rank_load) {
    fprintf(stderr, "ina place: out of memory\n");
    return 1;
  }
  printf("balance: %d MoE layers of %d experts over ep %d, %d -> %d slots per rank, from the expert "
         "load of the last %.1f s (generation %llu)\n",
         in->layers, in->experts, in->ep, in->slots_per_rank, slots, in->seconds,
         (unsigned long long)in->generation);
  int rc = 0, changed = 0;
  for (int32_t l = 0; l < in->layers && rc == 0; l++) {
    const uint64_t *load = in->load + (size_t)l * in->experts;
    uint64_t total = 0;
    int32_t hot = 0;
    for (int32_t e = 0; e < in->experts; e++) {
      total += load[e];
      hot = load[e] > load[hot] ? e : hot;
    }
    map_stats_t now, after;
    changed += !kept[l];
    if (map_stats(load, in->experts, in->ep, in->slots_per_rank,
                  in->in_force + (size_t)l * in->ep * in->slots_per_rank, hot, rank_load, &now) != 0) {
      fprintf(stderr, "ina place: GetPlacement: moe layer %d leaves an expert with tokens without a "
                      "slot\n", l);
      rc = 1;
    } else if (map_stats(load, in->experts, in->ep, slots, planned + (size_t)l * in->ep * slots, hot,
                         rank_load, &after) != 0) {
      fprintf(stderr, "ina place: moe layer %d: the plan leaves an expert without a slot\n", l);
      rc = 1;
    } else if (total == 0) {
      printf("moe layer %d: no tokens counted: %s\n", l,
             kept[l] ? "kept" : "experts spread as if equally loaded");
    } else if (kept[l]) {
      printf("moe layer %d: %llu tokens, max/mean rank load %.3f, %d replicas: kept (the plan is no "
             "better)\n",
             l, (unsigned long long)total, now.max_over_mean, now.replicas);
    } else {
      printf("moe layer %d: %llu tokens, max/mean rank load %.3f -> %.3f, %d -> %d replicas (hottest "
             "expert %d: %d -> %d)\n",
             l, (unsigned long long)total, now.max_over_mean, after.max_over_mean, now.replicas,
             after.replicas, hot, now.hot_replicas, after.hot_replicas);
    }
  }
  if (rc == 0) printf("plan: %d of %d MoE layers change\n", changed, in->layers);
  free(rank_load);
  return rc;
}

/* A placement message over a dense expert map; the messages point into this struct's
 * arrays. `placement` comes first, so the whole is found from the message. */
typedef struct planned_placement {
  Ina__V1__ExpertPlacement placement;
  Ina__V1__Layout layout;
  Ina__V1__LayerPlacement *layers, **layer_ptrs;
  Ina__V1__ExpertSlot *slots, **slot_ptrs;
} planned_placement_t;

static void planned_placement_free(planned_placement_t *p) {
  if (!p) return;
  free(p->layers);
  free(p->layer_ptrs);
  free(p->slots);
  free(p->slot_ptrs);
  free(p);
}

/* The message for map [layers][ep][slots] (-1: empty, left out) with `layout`; NULL when
 * out of memory. */
static planned_placement_t *planned_placement(const Ina__V1__Layout *layout, int32_t layers,
                                              int32_t slots, uint64_t generation, const int32_t *map) {
  const size_t per_layer = (size_t)layout->ep * (size_t)slots, total = (size_t)layers * per_layer;
  planned_placement_t *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->layers = calloc((size_t)layers, sizeof *p->layers);
  p->layer_ptrs = calloc((size_t)layers, sizeof *p->layer_ptrs);
  p->slots = calloc(total, sizeof *p->slots);
  p->slot_ptrs = calloc(total, sizeof *p->slot_ptrs);
  if (!p->layers || !p->layer_ptrs || !p->slots || !p->slot_ptrs) {
    planned_placement_free(p);
    return NULL;
  }
  ina__v1__layout__init(&p->layout);
  p->layout.tp = layout->tp;
  p->layout.dp = layout->dp;
  p->layout.ep = layout->ep;
  ina__v1__expert_placement__init(&p->placement);
  p->placement.layout = &p->layout;
  p->placement.slots_per_rank = (uint32_t)slots;
  p->placement.generation = generation;
  p->placement.n_layers = (size_t)layers;
  p->placement.layers = p->layer_ptrs;
  size_t n = 0;
  for (int32_t l = 0; l < layers; l++) {
    Ina__V1__LayerPlacement *lp = &p->layers[l];
    ina__v1__layer_placement__init(lp);
    lp->moe_layer = (uint32_t)l;
    lp->slots = p->slot_ptrs + n;
    for (size_t i = 0; i < per_layer; i++) {
      const int32_t x = map[(size_t)l * per_layer + i];
      if (x < 0) continue;
      Ina__V1__ExpertSlot *sl = &p->slots[n];
      ina__v1__expert_slot__init(sl);
      sl->ep_rank = (uint32_t)(i / (size_t)slots);
      sl->slot = (uint32_t)(i % (size_t)slots);
      sl->logical_expert = (uint32_t)x;
      p->slot_ptrs[n++] = sl;
      lp->n_slots++;
    }
    p->layer_ptrs[l] = lp;
  }
  return p;
}

/* GetLoad (with the expert counters) and GetPlacement, a plan with `slots` slots per rank
 * (0: the count in force), the summary, --out, then ApplyPlacement against the generation
 * read. Returns the exit code: 2 for a slots count the model cannot use, 1 for a failed
 * call or a refusal. */
static int balance_placement(ina_rpc_client_t *client, const client_connection_t *conn, int64_t slots,
                             const char *out, int dry_run) {
  Ina__V1__GetLoadRequest load_req = INA__V1__GET_LOAD_REQUEST__INIT;
  load_req.include_expert_load = 1;
  Ina__V1__NodeLoad *load = (Ina__V1__NodeLoad *)client_call(
      client, "place", "Node", "GetLoad", &load_req.base, client_connection_deadline(conn, 0),
      &ina__v1__node_load__descriptor);
  if (!load) return 1;
  Ina__V1__GetPlacementResponse *resp = get_placement(client, conn);
  balance_input_t in;
  int32_t *map = NULL;
  unsigned char *kept = NULL;
  planned_placement_t *plan = NULL;
  char error[256];
  int rc = 1;
  if (!resp || read_balance_input(load, resp->placement, &in) != 0) goto done_calls;
  if (slots == 0) slots = in.slots_per_rank;
  if ((rc = check_slots_per_rank(&in, slots)) != 0) goto done;
  rc = 1;
  map = malloc((size_t)in.layers * (size_t)in.ep * (size_t)slots * sizeof *map);
  kept = malloc((size_t)in.layers);
  if (!map || !kept) {
    fprintf(stderr, "ina place: out of memory\n");
    goto done;
  }
  if (placement_rebalance(in.load, in.in_force, in.slots_per_rank, in.layers, in.experts, in.ep,
                          (int32_t)slots, map, kept, error, sizeof error) != 0) {
    fprintf(stderr, "ina place: --balance: %s\n", error);
    goto done;
  }
  if (print_balance_summary(&in, (int32_t)slots, map, kept) != 0) goto done;
  plan = planned_placement(resp->placement->layout, in.layers, (int32_t)slots, in.generation, map);
  if (!plan) {
    fprintf(stderr, "ina place: out of memory\n");
    goto done;
  }
  if (out) {
    json_t *doc = placement_to_json(&plan->placement);
    const int bad = !doc || json_output_write("place", doc, out);
    if (!doc) fprintf(stderr, "ina place: out of memory\n");
    json_decref(doc);
    if (bad) goto done;
    printf("planned placement written to %s\n", out);
  }
  rc = apply_placement(client, conn, &plan->placement, in.generation, dry_run);
done:
  balance_input_free(&in);
done_calls:
  planned_placement_free(plan);
  free(map);
  free(kept);
  if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
  protobuf_c_message_free_unpacked(&load->base, NULL);
  return rc;
}

int cmd_place(int argc, char **argv) {
  enum { O_SHOW = 256, O_OUT, O_FILE, O_ADMIN, O_ADMIN_FILE, O_EXPECTED, O_DRY, O_BALANCE, O_SLOTS };
  static const struct option opts[] = {
      CLIENT_CONNECTION_OPTIONS,
      {"show", no_argument, 0, O_SHOW},
      {"out", required_argument, 0, O_OUT},
      {"file", required_argument, 0, O_FILE},
      {"admin-token", required_argument, 0, O_ADMIN},
      {"admin-token-file", required_argument, 0, O_ADMIN_FILE},
      {"expected-generation", required_argument, 0, O_EXPECTED},
      {"dry-run", no_argument, 0, O_DRY},
      {"balance", no_argument, 0, O_BALANCE},
      {"slots-per-rank", required_argument, 0, O_SLOTS},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  client_connection_t conn = CLIENT_CONNECTION_INIT;
  const char *out = NULL, *file = NULL, *token_file = NULL;
  int show = 0, balance = 0, dry_run = 0, tokens_given = 0, c, r;
  int64_t expected = 0, slots = 0;
  static char token[512];
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if ((r = client_connection_option(&conn, c, optarg)) == 1) {
      tokens_given += c == CLIENT_OPT_TOKEN;
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
    case O_BALANCE: balance = 1; break;
    case O_SLOTS:
      if (cli_parse_int("--slots-per-rank", optarg, 1, INT32_MAX, &slots)) return 2;
      break;
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
  else if (show + !!file + balance != 1) problem = "give one of --show and --file (or --balance)";
  else if (out && file) problem = "--out goes with --show or --balance";
  else if (dry_run && show) problem = "--dry-run goes with --file or --balance";
  else if (expected && !file)
    problem = "--expected-generation goes with --file (--balance applies against the generation it "
              "planned from)";
  else if (slots && !balance) problem = "--slots-per-rank goes with --balance";
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
  Ina__V1__ExpertPlacement *placement = NULL;
  if (file) {
    json_t *root = NULL;
    char error[512];
    if (ina_json_load_file(file, &root) != INA_OK) {
      fprintf(stderr, "ina place: %s\n", ina_last_error());
      return 2;
    }
    const int bad = placement_from_json(root, file, &placement, error, sizeof error);
    json_decref(root);
    if (bad) {
      fprintf(stderr, "ina place: %s\n", error);
      return 2;
    }
  }

  int rc = 1;
  ina_rpc_client_t *client = client_connect("place", &conn);
  if (client)
    rc = show      ? show_placement(client, &conn, out)
         : balance ? balance_placement(client, &conn, slots, out, dry_run)
                   : apply_placement(client, &conn, placement, (uint64_t)expected, dry_run);
  ina_rpc_client_destroy(client);
  placement_free(placement);
  return rc;
}
