/* ina place: the expert placement of a running ina-agent.
 *   ina place --server HOST:PORT --show [--out FILE]
 *   ina place --server HOST:PORT --file FILE [--admin-token T | --admin-token-file F]
 *             [--expected-generation G] [--dry-run]
 * `--show` writes the placement in force as JSON (placement_json.h); `--file` reads such
 * a file back, checks it whole before any call, and applies it. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"
#include "core/log.h"
#include "ina/v1/placement.pb-c.h"
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
          "  --dry-run            have the agent validate the placement and apply nothing\n");
  client_connection_help(f, "deadline of each call (default 10000 for --show, 600000 for\n"
                            "ApplyPlacement)\n");
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

int cmd_place(int argc, char **argv) {
  enum { O_SHOW = 256, O_OUT, O_FILE, O_ADMIN, O_ADMIN_FILE, O_EXPECTED, O_DRY };
  static const struct option opts[] = {
      CLIENT_CONNECTION_OPTIONS,
      {"show", no_argument, 0, O_SHOW},
      {"out", required_argument, 0, O_OUT},
      {"file", required_argument, 0, O_FILE},
      {"admin-token", required_argument, 0, O_ADMIN},
      {"admin-token-file", required_argument, 0, O_ADMIN_FILE},
      {"expected-generation", required_argument, 0, O_EXPECTED},
      {"dry-run", no_argument, 0, O_DRY},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  client_connection_t conn = CLIENT_CONNECTION_INIT;
  const char *out = NULL, *file = NULL, *token_file = NULL;
  int show = 0, dry_run = 0, tokens_given = 0, c, r;
  int64_t expected = 0;
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
    rc = show ? show_placement(client, &conn, out)
              : apply_placement(client, &conn, placement, (uint64_t)expected, dry_run);
  ina_rpc_client_destroy(client);
  placement_free(placement);
  return rc;
}
