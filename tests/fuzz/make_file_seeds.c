/* Writes the seed corpus of the file and request parsers' fuzz targets, from the
 * repository's real inputs where it has them:
 *   fuzz_model_config    every tests/golden/fixtures/<name>/config.json, the built-in
 *                        configurations as `ina model init` saves them, and regressions:
 *                        a fixture with one value the parser once took wrongly;
 *   fuzz_safetensors     each fixture's model.safetensors cut down to its smallest
 *                        tensors (real names, dtypes, shapes, bytes and metadata; whole
 *                        files would make every input hundreds of kB), rewritten by ina's
 *                        writer; files with every dtype, scalars, empty tensors and
 *                        metadata; and a few laid out as other writers do (unpadded
 *                        header, metadata last, bytes no tensor covers);
 *   fuzz_checkpoint_index
 *                        each fixture's tensors as a model.safetensors.index.json over
 *                        two shards, as transformers writes it; an empty map, a tensor
 *                        mapped to the index itself, and shard names the reader must
 *                        refuse (a parent directory, a path, escaped '/' and "..");
 *   fuzz_npy             a fixture's logits, arrays as ina_npy_write writes them, and
 *                        the forms NumPy also writes (version 2.0, no trailing comma);
 *   fuzz_placement_json  placements as `ina place --show --out` writes them;
 *   fuzz_metrics_http    request lines, one for each answer;
 *   fuzz_openai_request  bodies of /v1/completions and /v1/chat/completions as clients
 *                        send them: each prompt and content form, every field read in
 *                        its accepted forms, and bodies one rule away from valid.
 *
 * Usage: make_file_seeds FIXTURES_DIR OUT_DIR. Writes OUT_DIR/TARGET/NAME; exits 1 on any
 * failure. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/log.h"
#include "core/npy.h"
#include "core/safetensors.h"
#include "model/config.h"
#include "tools/json_output.h"
#include "tools/placement_json.h"

/* Each cut-down checkpoint keeps its smallest tensors up to this many data bytes. */
#define CUT_DATA_BYTES 4096
#define CUT_MAX_TENSORS 12

static const char *out_dir;

static void die(const char *what) {
  fprintf(stderr, "make_file_seeds: %s%s%s\n", what, ina_last_error()[0] ? ": " : "",
          ina_last_error());
  exit(1);
}

static void make_dir(const char *path) {
  if (mkdir(path, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "make_file_seeds: mkdir %s: %s\n", path, strerror(errno));
    exit(1);
  }
}

/* OUT_DIR/target/name, making the target's directory. */
static const char *seed_path(const char *target, const char *name) {
  static char path[4096];
  snprintf(path, sizeof path, "%s/%s", out_dir, target);
  make_dir(path);
  snprintf(path, sizeof path, "%s/%s/%s", out_dir, target, name);
  return path;
}

static void write_bytes(const char *target, const char *name, const void *bytes, size_t size) {
  const char *path = seed_path(target, name);
  FILE *f = fopen(path, "wb");
  if (!f || (size && fwrite(bytes, 1, size, f) != size) || fclose(f) != 0) die(path);
}

static void copy_file(const char *from, const char *target, const char *name) {
  FILE *f = fopen(from, "rb");
  if (!f) die(from);
  char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf, f);
  if (ferror(f) || !feof(f)) die(from); /* every input seed is small */
  fclose(f);
  write_bytes(target, name, buf, n);
}

/* ---- config.json ---------------------------------------------------------------------- */

/* A fixture's config.json with one or two changes: fuzz_model_config's regressions, each
 * a value the parser once took wrongly (cut to int32, with undefined behaviour for a
 * double; lost on saving; turned into NaN frequencies or a negative attention scale). A
 * key is a top-level key or "rope.KEY" for the rope object. */
typedef struct {
  const char *name, *key, *value, *key2, *value2;
} config_change_t;

static const config_change_t kConfigRegressions[] = {
    {"regression-truncate_false", "rope.truncate", "false", NULL, NULL},
    {"regression-original_max_huge", "rope.original_max_position_embeddings", "1e20", NULL, NULL},
    {"regression-original_max_fraction", "rope.original_max_position_embeddings", "4096.5", NULL, NULL},
    {"regression-eos_negative", "eos_token_id", "-7", NULL, NULL},
    {"regression-bos_wide", "bos_token_id", "4294967296", NULL, NULL},
    {"regression-mscale_negative", "rope.mscale_all_dim", "-10.0", NULL, NULL},
    {"regression-attention_factor_negative", "rope.attention_factor", "-3.0", NULL, NULL},
    /* beta_fast 1 puts the correction range's ends at +inf: ln(1) divides them. */
    {"regression-yarn_theta_one", "rope.rope_theta", "1", "rope.beta_fast", "1.0"},
    {"regression-theta_tiny", "rope_theta", "1.1e-299", NULL, NULL},
    {"regression-beta_negative", "rope.beta_slow", "-1.0", NULL, NULL},
    {"regression-factor_below_one", "rope.factor", "0.5", NULL, NULL},
    {"regression-block_wide", "quantization_config",
     "{\"quant_method\": \"fp8\", \"weight_block_size\": [4294967424, 128]}", NULL, NULL},
    {"regression-head_dim_sum", "qk_nope_head_dim", "2147483647", NULL, NULL},
};

static json_t *load_json(const char *path) {
  json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, NULL);
  if (!json_is_object(root)) die(path);
  return root;
}

/* The rope object of a config (rope_parameters or rope_scaling) when it is YaRN's. */
static json_t *yarn_rope(json_t *root) {
  json_t *rope = json_object_get(root, "rope_parameters");
  if (!json_is_object(rope)) rope = json_object_get(root, "rope_scaling");
  if (!json_is_object(rope)) return NULL;
  const char *type = json_string_value(json_object_get(rope, "rope_type"));
  if (!type) type = json_string_value(json_object_get(rope, "type"));
  return type && strcmp(type, "yarn") == 0 ? rope : NULL;
}

static void config_regressions(const char *fixtures, const char *const *names, size_t n) {
  char from[4096], name[256];
  size_t base = 0;
  for (; base < n; base++) {
    snprintf(from, sizeof from, "%s/%s/config.json", fixtures, names[base]);
    json_t *root = load_json(from);
    const int yarn = yarn_rope(root) != NULL && json_object_get(root, "rope_theta") != NULL;
    json_decref(root);
    if (yarn) break;
  }
  if (base == n) die("no fixture config.json with YaRN rope and rope_theta");
  for (size_t i = 0; i < sizeof kConfigRegressions / sizeof kConfigRegressions[0]; i++) {
    const config_change_t *c = &kConfigRegressions[i];
    json_t *root = load_json(from);
    json_t *rope = yarn_rope(root);
    for (int k = 0; k < 2; k++) {
      const char *full = k ? c->key2 : c->key, *text = k ? c->value2 : c->value;
      if (!full) continue;
      json_t *obj = strncmp(full, "rope.", 5) == 0 ? rope : root;
      const char *key = obj == rope ? full + 5 : full;
      /* Only the rope object's rope_theta counts, when both are given. */
      if (obj == root && strcmp(key, "rope_theta") == 0) json_object_del(rope, "rope_theta");
      json_t *value = json_loads(text, JSON_DECODE_ANY, NULL);
      if (!value || json_object_set_new(obj, key, value) != 0) die(c->name);
    }
    snprintf(name, sizeof name, "%s.json", c->name);
    if (json_dump_file(root, seed_path("fuzz_model_config", name), JSON_INDENT(2)) != 0)
      die(c->name);
    json_decref(root);
  }
}

static void config_seeds(const char *fixtures, const char *const *names, size_t n) {
  char from[4096], name[256];
  for (size_t i = 0; i < n; i++) {
    snprintf(from, sizeof from, "%s/%s/config.json", fixtures, names[i]);
    snprintf(name, sizeof name, "%s.json", names[i]);
    copy_file(from, "fuzz_model_config", name);
  }
  config_regressions(fixtures, names, n);
  for (const char *const *b = ina_model_config_builtin_names(); *b; b++) {
    ina_model_config_t c;
    if (ina_model_config_builtin(*b, &c) != INA_OK) die(*b);
    snprintf(name, sizeof name, "builtin-%s.json", *b);
    if (ina_model_config_save(&c, seed_path("fuzz_model_config", name)) != INA_OK) die(name);
  }
}

/* ---- safetensors ---------------------------------------------------------------------- */

static int by_size(const void *a, const void *b) {
  const ina_st_entry_t *x = *(const ina_st_entry_t *const *)a, *y = *(const ina_st_entry_t *const *)b;
  if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* The fixture's smallest tensors, with its metadata, through ina_safetensors_write. */
static void cut_checkpoint(const char *fixtures, const char *fixture) {
  char from[4096], name[256];
  snprintf(from, sizeof from, "%s/%s/model.safetensors", fixtures, fixture);
  ina_safetensors_t *sf = NULL;
  if (ina_safetensors_open(from, &sf) != INA_OK) die(from);
  const size_t n = ina_safetensors_count(sf);
  const ina_st_entry_t **sorted = calloc(n + 1, sizeof *sorted);
  ina_st_write_entry_t *keep = calloc(n + 1, sizeof *keep);
  if (!sorted || !keep) die("out of memory");
  for (size_t i = 0; i < n; i++) sorted[i] = ina_safetensors_at(sf, i);
  qsort(sorted, n, sizeof *sorted, by_size);
  size_t kept = 0, bytes = 0;
  for (size_t i = 0; i < n && kept < CUT_MAX_TENSORS && bytes + sorted[i]->nbytes <= CUT_DATA_BYTES;
       i++) {
    const ina_st_entry_t *e = sorted[i];
    keep[kept] = (ina_st_write_entry_t){e->name, e->dtype, e->ndim, {0}, e->data};
    memcpy(keep[kept].shape, e->shape, sizeof e->shape);
    kept++;
    bytes += e->nbytes;
  }
  const char *format = ina_safetensors_metadata(sf, "format");
  const char *meta[] = {"format", format, NULL};
  snprintf(name, sizeof name, "%s.safetensors", fixture);
  if (ina_safetensors_write(seed_path("fuzz_safetensors", name), keep, kept,
                            format ? meta : NULL) != INA_OK)
    die(name);
  free(keep);
  free(sorted);
  ina_safetensors_close(sf);
}

/* 8-byte length + header + data, as another writer may lay a file out. */
static void raw_safetensors(const char *name, const char *header, const void *data, size_t n) {
  unsigned char buf[4096];
  const size_t hlen = strlen(header);
  if (8 + hlen + n > sizeof buf) die(name);
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
  memcpy(buf + 8, header, hlen);
  memcpy(buf + 8 + hlen, data, n);
  write_bytes("fuzz_safetensors", name, buf, 8 + hlen + n);
}

static void safetensors_seeds(const char *fixtures, const char *const *names, size_t n) {
  for (size_t i = 0; i < n; i++) cut_checkpoint(fixtures, names[i]);

  /* One tensor of every dtype, a scalar and empty tensors, and metadata. */
  unsigned char bytes[256];
  for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (unsigned char)(i * 37 + 11);
  const ina_st_write_entry_t every[] = {
      {"model.embed_tokens.weight", INA_DTYPE_BF16, 2, {4, 3}, bytes},
      {"f32.vector", INA_DTYPE_F32, 1, {5}, bytes},
      {"f16.matrix", INA_DTYPE_F16, 2, {2, 2}, bytes},
      {"layers.0.mlp.experts.0.down_proj.weight", INA_DTYPE_FP8_E4M3, 2, {3, 5}, bytes},
      {"e5m2", INA_DTYPE_FP8_E5M2, 3, {1, 2, 3}, bytes},
      {"weight_scale_inv", INA_DTYPE_F32, 2, {1, 1}, bytes},
      {"ids", INA_DTYPE_I32, 1, {3}, bytes},
      {"positions", INA_DTYPE_I64, 5, {1, 1, 1, 1, 2}, bytes},
      {"scalar", INA_DTYPE_F32, 0, {0}, bytes},
      {"empty", INA_DTYPE_BF16, 2, {0, 7}, bytes},
  };
  const char *meta[] = {"format", "pt", "note", "caf\xc3\xa9 \xe2\x9c\x93", "", "empty key", NULL};
  if (ina_safetensors_write(seed_path("fuzz_safetensors", "every_dtype.safetensors"), every,
                            sizeof every / sizeof every[0], meta) != INA_OK)
    die("every_dtype");
  if (ina_safetensors_write(seed_path("fuzz_safetensors", "no_tensors.safetensors"), NULL, 0,
                            NULL) != INA_OK)
    die("no_tensors");

  raw_safetensors("unpadded_metadata_last.safetensors",
                  "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                  "\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
                  "\"__metadata__\":{\"format\":\"np\"}}",
                  bytes, 16);
  raw_safetensors("spaces_gap_tail.safetensors",
                  "{ \"x\" : { \"dtype\" : \"I64\", \"shape\" : [ 1 ], \"data_offsets\" : [ 8, 16 ] },"
                  " \"z\" : { \"dtype\" : \"F16\", \"shape\" : [ 0 ], \"data_offsets\" : [ 8, 8 ] } }   ",
                  bytes, 24);
}

/* ---- checkpoint index ----------------------------------------------------------------- */

/* The fixture's tensors over two shards (the first half of the file in the first), with
 * the total size, as transformers' save_pretrained writes the index (sorted, indented). */
static void checkpoint_index(const char *fixtures, const char *fixture) {
  char from[4096], name[256];
  snprintf(from, sizeof from, "%s/%s/model.safetensors", fixtures, fixture);
  ina_safetensors_t *sf = NULL;
  if (ina_safetensors_open(from, &sf) != INA_OK) die(from);
  const size_t n = ina_safetensors_count(sf);
  json_t *map = json_object(), *index = json_object();
  size_t total = 0;
  if (!map || !index) die("out of memory");
  for (size_t i = 0; i < n; i++) {
    const ina_st_entry_t *e = ina_safetensors_at(sf, i);
    total += e->nbytes;
    const char *shard = i < n / 2 ? "model-00001-of-00002.safetensors"
                                  : "model-00002-of-00002.safetensors";
    if (json_object_set_new(map, e->name, json_string(shard)) != 0) die(e->name);
  }
  json_object_set_new(index, "metadata", json_pack("{s:I}", "total_size", (json_int_t)total));
  json_object_set_new(index, "weight_map", map);
  snprintf(name, sizeof name, "%s.index.json", fixture);
  if (json_dump_file(index, seed_path("fuzz_checkpoint_index", name),
                     JSON_INDENT(2) | JSON_SORT_KEYS) != 0)
    die(name);
  json_decref(index);
  ina_safetensors_close(sf);
}

static void checkpoint_index_seeds(const char *fixtures, const char *const *names, size_t n) {
  for (size_t i = 0; i < n; i++) checkpoint_index(fixtures, names[i]);
  static const char *const raw[][2] = {
      {"empty_map.json", "{\"metadata\": {}, \"weight_map\": {}}"},
      {"index_as_shard.json",
       "{\"weight_map\": {\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
       " \"lm_head.weight\": \"model.safetensors.index.json\","
       " \"model.norm.weight\": \"model-00002-of-00002.safetensors\"}}"},
      {"parent_directory.json", "{\"weight_map\": {\"w\": \"../model.safetensors\"}}"},
      {"absolute_path.json", "{\"weight_map\": {\"w\": \"/etc/passwd\"}}"},
      {"escaped_slash.json", "{\"weight_map\": {\"w\": \"sub\\/x.safetensors\"}}"},
      {"escaped_dots.json", "{\"weight_map\": {\"w\": \"\\u002e\\u002e\"}}"},
      {"not_a_string.json", "{\"weight_map\": {\"w\": 1}, \"metadata\": null}"},
  };
  for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++)
    write_bytes("fuzz_checkpoint_index", raw[i][0], raw[i][1], strlen(raw[i][1]));
}

/* ---- npy ------------------------------------------------------------------------------ */

/* magic, version, length (2 or 4 bytes), the dict padded to 64 with a newline, data. */
static void raw_npy(const char *name, int major, const char *dict, const void *data, size_t n) {
  unsigned char buf[1024];
  const size_t prefix = major == 1 ? 10 : 12, dlen = strlen(dict);
  const size_t hlen = (prefix + dlen + 1 + 63) / 64 * 64 - prefix;
  if (prefix + hlen + n > sizeof buf) die(name);
  memcpy(buf, "\x93NUMPY", 6);
  buf[6] = (unsigned char)major;
  buf[7] = 0;
  for (size_t i = 0; i < prefix - 8; i++) buf[8 + i] = (unsigned char)(hlen >> (8 * i));
  memcpy(buf + prefix, dict, dlen);
  memset(buf + prefix + dlen, ' ', hlen - dlen - 1);
  buf[prefix + hlen - 1] = '\n';
  memcpy(buf + prefix + hlen, data, n);
  write_bytes("fuzz_npy", name, buf, prefix + hlen + n);
}

static void npy_seeds(const char *fixtures, const char *const *names, size_t n) {
  char from[4096], name[256];
  for (size_t i = 0; i < n && i < 2; i++) {
    snprintf(from, sizeof from, "%s/%s/logits_0.npy", fixtures, names[i]);
    snprintf(name, sizeof name, "%s-logits_0.npy", names[i]);
    copy_file(from, "fuzz_npy", name);
  }
  unsigned char bytes[512];
  for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (unsigned char)(i * 53 + 5);
  const struct {
    const char *name;
    ina_dtype_t dtype;
    int ndim;
    int64_t shape[INA_MAX_DIMS];
  } arrays[] = {
      {"f32_scalar.npy", INA_DTYPE_F32, 0, {0}},
      {"i32_vector.npy", INA_DTYPE_I32, 1, {3}},
      {"i64_matrix.npy", INA_DTYPE_I64, 2, {2, 3}},
      {"f32_empty.npy", INA_DTYPE_F32, 2, {0, 4}},
      {"f32_rank5.npy", INA_DTYPE_F32, 5, {1, 2, 1, 3, 2}},
  };
  for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
    if (ina_npy_write(seed_path("fuzz_npy", arrays[i].name), arrays[i].dtype, arrays[i].ndim,
                      arrays[i].shape, bytes) != INA_OK)
      die(arrays[i].name);
  raw_npy("version2.npy", 2, "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", bytes, 16);
  raw_npy("double_quotes_no_trailing_comma.npy", 1,
          "{\"shape\": (3, 2), \"fortran_order\": False, \"descr\": \"<f4\"}", bytes, 24);
}

/* ---- placement JSON ------------------------------------------------------------------- */

/* n_layers MoE layers of `experts` experts over ep ranks of slots_per_rank slots: expert
 * e in slot e, then the spare slots replicate experts from 0 up. */
static void write_placement(const char *name, uint32_t ep, uint32_t slots_per_rank,
                            uint32_t experts, uint32_t n_layers, uint64_t generation,
                            int readable) {
  enum { MAX_SLOTS = 64, MAX_LAYERS = 4 };
  Ina__V1__ExpertSlot slots[MAX_LAYERS][MAX_SLOTS], *slot_ptrs[MAX_LAYERS][MAX_SLOTS];
  Ina__V1__LayerPlacement layers[MAX_LAYERS], *layer_ptrs[MAX_LAYERS];
  Ina__V1__Layout layout = INA__V1__LAYOUT__INIT;
  Ina__V1__ExpertPlacement p = INA__V1__EXPERT_PLACEMENT__INIT;
  const uint32_t total = ep * slots_per_rank;
  if (total > MAX_SLOTS || n_layers > MAX_LAYERS) die(name);
  layout.tp = 1;
  layout.dp = ep;
  layout.ep = ep;
  for (uint32_t l = 0; l < n_layers; l++) {
    ina__v1__layer_placement__init(&layers[l]);
    layers[l].moe_layer = l;
    layers[l].n_slots = total;
    layers[l].slots = slot_ptrs[l];
    for (uint32_t s = 0; s < total; s++) {
      ina__v1__expert_slot__init(&slots[l][s]);
      slots[l][s].ep_rank = s / slots_per_rank;
      slots[l][s].slot = s % slots_per_rank;
      slots[l][s].logical_expert = (s + l) % experts;
      slot_ptrs[l][s] = &slots[l][s];
    }
    layer_ptrs[l] = &layers[l];
  }
  p.layout = &layout;
  p.slots_per_rank = slots_per_rank;
  p.generation = generation;
  p.n_layers = n_layers;
  p.layers = layer_ptrs;
  json_t *doc = placement_to_json(&p);
  if (!doc) die(name);
  const char *path = seed_path("fuzz_placement_json", name);
  if (readable) {
    if (json_output_write("make_file_seeds", doc, path) != 0) die(name);
  } else if (json_dump_file(doc, path, JSON_COMPACT | JSON_PRESERVE_ORDER) != 0) {
    die(name);
  }
  json_decref(doc);
}

static void placement_seeds(void) {
  write_placement("tiny_ep2_replicas.json", 2, 5, 8, 3, 1, 1);
  write_placement("one_rank.json", 1, 4, 4, 1, 7, 1);
  write_placement("ep4_compact.json", 4, 3, 10, 2, 0, 0);
  write_placement("no_layers.json", 2, 1, 2, 0, 2, 1);
}

/* ---- metrics HTTP --------------------------------------------------------------------- */

static void metrics_seeds(void) {
  static const char *const lines[][2] = {
      {"get", "GET /metrics"},        {"head", "HEAD /metrics"},      {"post", "POST /metrics"},
      {"options", "OPTIONS *"},       {"root", "GET /"},              {"slash", "GET /metrics/"},
      {"longer", "DELETE /metricsx"}, {"no_path", "GET"},
  };
  for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
    write_bytes("fuzz_metrics_http", lines[i][0], lines[i][1], strlen(lines[i][1]));
}

/* ---- OpenAI API request bodies -------------------------------------------------------- */

static void openai_seeds(void) {
  static const char *const bodies[][2] = {
      {"completion_minimal", "{\"model\":\"m\",\"prompt\":\"Hello\"}"},
      {"completion_every_field",
       "{\"model\":\"deepseek-ai/DeepSeek-V3\",\"prompt\":[\"a\",\"\",\"\\u00e9\\ud83d\\ude00\"],"
       "\"max_tokens\":300,\"temperature\":0.7,\"top_p\":0.95,\"top_k\":40,\"seed\":-1,"
       "\"stop\":[\"\\n\",\"END\"],\"stop_token_ids\":[1,129279],\"stream\":true,"
       "\"stream_options\":{\"include_usage\":true},\"logprobs\":5,\"n\":1,\"echo\":false,"
       "\"ignore_eos\":true,\"user\":\"u\",\"presence_penalty\":0,\"frequency_penalty\":0.0,"
       "\"best_of\":1,\"response_format\":{\"type\":\"text\"},\"logit_bias\":{},\"suffix\":\"\"}"},
      {"completion_token_ids", "{\"model\":\"m\",\"prompt\":[0,15,129279],\"max_tokens\":16.0}"},
      {"completion_id_lists", "{\"model\":\"m\",\"prompt\":[[1],[2,3,4]],\"stop\":\"x\",\"logprobs\":0}"},
      {"completion_nulls", "{\"model\":\"m\",\"prompt\":\"\",\"max_tokens\":null,\"stop\":null,\"seed\":null,"
                           "\"logprobs\":null,\"unknown\":[1,{\"a\":\"\\u0000\"}]}"},
      {"completion_id_out_of_range", "{\"model\":\"m\",\"prompt\":[1,129280]}"},
      {"completion_mixed_prompt", "{\"model\":\"m\",\"prompt\":[\"a\",[1]]}"},
      {"completion_stream_options_alone", "{\"model\":\"m\",\"prompt\":\"p\",\"stream_options\":{}}"},
      {"completion_echo", "{\"model\":\"m\",\"prompt\":\"p\",\"echo\":true,\"n\":2}"},
      {"chat_minimal", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}"},
      {"chat_every_field",
       "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
       "{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"d1\"},{\"type\":\"text\",\"text\":\"d2\"}]},"
       "{\"role\":\"user\",\"content\":\"q\",\"name\":\"bob\"},{\"role\":\"assistant\",\"content\":null},"
       "{\"role\":\"assistant\",\"content\":\"a\",\"tool_calls\":[]}],\"max_tokens\":10,"
       "\"max_completion_tokens\":20,\"logprobs\":true,\"top_logprobs\":3,\"temperature\":2,\"top_p\":1,"
       "\"top_k\":-1,\"seed\":9223372036854775807,\"stop\":[\"a\",\"b\",\"c\",\"d\"],"
       "\"chat_template_kwargs\":{\"thinking\":true},\"add_generation_prompt\":false,\"stream\":true,"
       "\"stream_options\":{\"include_usage\":false},\"tools\":[],\"ignore_eos\":false}"},
      {"chat_enable_thinking", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[]}],"
                               "\"chat_template_kwargs\":{\"enable_thinking\":false}}"},
      {"chat_image_part", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
                          "\"image_url\":{\"url\":\"https://x/y.png\"}}]}]}"},
      {"chat_top_logprobs_alone", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                                  "\"top_logprobs\":2}"},
      {"chat_tool_role", "{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"r\"}],"
                         "\"tools\":[{\"type\":\"function\"}]}"},
      {"chat_nul_content", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}"},
      {"duplicate_key", "{\"model\":\"m\",\"model\":\"n\",\"prompt\":\"p\"}"},
      {"trailing_garbage", "{\"model\":\"m\",\"prompt\":\"p\"} x"},
      {"not_an_object", "[{\"model\":\"m\"}]"},
  };
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++)
    write_bytes("fuzz_openai_request", bodies[i][0], bodies[i][1], strlen(bodies[i][1]));
}

/* ---- main ----------------------------------------------------------------------------- */

static int by_name(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: make_file_seeds FIXTURES_DIR OUT_DIR\n");
    return 1;
  }
  const char *fixtures = argv[1];
  out_dir = argv[2];
  make_dir(out_dir);

  /* The fixtures, in name order so the seeds do not depend on the directory's order. */
  char *names[64];
  size_t n = 0;
  DIR *d = opendir(fixtures);
  if (!d) die(fixtures);
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    char probe[4096];
    struct stat sb;
    snprintf(probe, sizeof probe, "%s/%s/config.json", fixtures, e->d_name);
    if (e->d_name[0] == '.' || stat(probe, &sb) != 0) continue;
    if (n == sizeof names / sizeof names[0]) die("too many fixtures");
    names[n] = strdup(e->d_name);
    if (!names[n++]) die("out of memory");
  }
  closedir(d);
  if (n == 0) die("no fixture with a config.json");
  qsort(names, n, sizeof names[0], by_name);

  config_seeds(fixtures, (const char *const *)names, n);
  safetensors_seeds(fixtures, (const char *const *)names, n);
  checkpoint_index_seeds(fixtures, (const char *const *)names, n);
  npy_seeds(fixtures, (const char *const *)names, n);
  placement_seeds();
  metrics_seeds();
  openai_seeds();
  for (size_t i = 0; i < n; i++) free(names[i]);
  return 0;
}
