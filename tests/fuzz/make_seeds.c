/* Writes the seed corpus of the fuzz targets: a few small messages per target, valid or
 * one rule away from valid, so that fuzzing starts from inputs that reach the
 * validators' deeper checks. Built from the .proto files' generated code at build time,
 * so the seeds follow the messages when they change.
 *
 * Usage: make_seeds OUT_DIR. Writes OUT_DIR/TARGET/NAME (one binary message each, all
 * under 4 KiB); exits 1 on any failure. A few seeds are written as raw wire bytes, to
 * start from encodings protobuf-c never produces itself (unpacked repeated fields,
 * unknown fields, a field given twice). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "grpc/health/v1/health.pb-c.h"
#include "ina/v1/inference.pb-c.h"
#include "ina/v1/kv_transfer.pb-c.h"
#include "ina/v1/node.pb-c.h"
#include "ina/v1/placement.pb-c.h"

enum { SEED_MAX_BYTES = 4096 };

static const char *out_dir;

static void make_dir(const char *path) {
  if (mkdir(path, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "make_seeds: mkdir %s: %s\n", path, strerror(errno));
    exit(1);
  }
}

static void write_raw(const char *target, const char *name, const uint8_t *bytes, size_t size) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", out_dir, target);
  make_dir(path);
  snprintf(path, sizeof path, "%s/%s/%s", out_dir, target, name);
  if (size > SEED_MAX_BYTES) {
    fprintf(stderr, "make_seeds: %s: %zu bytes, more than %d\n", path, size, SEED_MAX_BYTES);
    exit(1);
  }
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(bytes, 1, size, f) != size || fclose(f) != 0) {
    fprintf(stderr, "make_seeds: cannot write %s\n", path);
    exit(1);
  }
}

static void write_message(const char *target, const char *name, const ProtobufCMessage *m) {
  uint8_t buf[SEED_MAX_BYTES];
  size_t size = protobuf_c_message_get_packed_size(m);
  if (size > sizeof buf) {
    fprintf(stderr, "make_seeds: %s/%s: %zu bytes, more than %d\n", target, name, size, SEED_MAX_BYTES);
    exit(1);
  }
  protobuf_c_message_pack(m, buf);
  write_raw(target, name, buf, size);
}

/* ---- raw wire encoding -------------------------------------------------------------- */

typedef struct wire {
  uint8_t bytes[SEED_MAX_BYTES];
  size_t size;
} wire_t;

static void wire_varint(wire_t *w, uint64_t v) {
  do {
    w->bytes[w->size++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
}

/* Wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32. */
static void wire_tag(wire_t *w, uint32_t field, uint32_t wire_type) {
  wire_varint(w, (uint64_t)field << 3 | wire_type);
}

static void wire_string(wire_t *w, uint32_t field, const char *s) {
  wire_tag(w, field, 2);
  wire_varint(w, strlen(s));
  memcpy(w->bytes + w->size, s, strlen(s));
  w->size += strlen(s);
}

/* ---- ina.v1.GenerateRequest --------------------------------------------------------- */

static void generate_seeds(void) {
  const char *t = "fuzz_generate_request";
  uint32_t one_id[] = {0};
  Ina__V1__GenerateRequest g = INA__V1__GENERATE_REQUEST__INIT;
  g.request_id = "a";
  g.n_prompt_token_ids = 1;
  g.prompt_token_ids = one_id;
  g.max_tokens = 1;
  write_message(t, "minimal", &g.base);

  /* Every field set, valid for DeepSeek-V3 (vocab 129280, 163840 tokens of context). */
  uint32_t prompt[48], stops[] = {1, 129279, 100000};
  for (int i = 0; i < 48; i++) prompt[i] = (uint32_t)(i * 2693u) % 129280u;
  Ina__V1__SamplingParams s = INA__V1__SAMPLING_PARAMS__INIT;
  s.temperature = 0.7f;
  s.top_p = 0.95f;
  s.top_k = 50;
  s.min_p = 0.05f;
  s.repetition_penalty = 1.1f;
  s.seed = 42;
  g.request_id = "req-0001";
  g.n_prompt_token_ids = 48;
  g.prompt_token_ids = prompt;
  g.sampling = &s;
  g.max_tokens = 4096;
  g.n_stop_token_ids = 3;
  g.stop_token_ids = stops;
  g.ignore_eos = 1;
  g.stream_interval = 16;
  write_message(t, "full", &g.base);

  /* At the edges of a tiny model (vocab 16, 8 tokens of context). */
  uint32_t tiny_prompt[] = {15, 3, 7}, tiny_stop[] = {15, 0};
  Ina__V1__SamplingParams tiny_s = INA__V1__SAMPLING_PARAMS__INIT;
  tiny_s.temperature = 100.0f;
  tiny_s.top_p = 1.0f;
  tiny_s.top_k = 16;
  g.request_id = "~!edge-of-printable~";
  g.n_prompt_token_ids = 3;
  g.prompt_token_ids = tiny_prompt;
  g.sampling = &tiny_s;
  g.max_tokens = 5;
  g.n_stop_token_ids = 2;
  g.stop_token_ids = tiny_stop;
  g.stream_interval = 1024;
  write_message(t, "tiny_model_edges", &g.base);

  /* One rule broken: a duplicate stop id. */
  uint32_t dup_stop[] = {5, 9, 5};
  g.n_stop_token_ids = 3;
  g.stop_token_ids = dup_stop;
  write_message(t, "duplicate_stop_id", &g.base);

  /* Wire forms protobuf-c does not write: prompt ids one tag each (unpacked), a field
   * given twice (the last wins), unknown fields of each wire type. */
  wire_t w = {.size = 0};
  wire_string(&w, 1, "first");
  wire_string(&w, 1, "raw-1");
  for (uint32_t id = 0; id < 5; id++) {
    wire_tag(&w, 2, 0);
    wire_varint(&w, id * 1000u);
  }
  wire_tag(&w, 4, 0);
  wire_varint(&w, 8);
  wire_tag(&w, 99, 0);
  wire_varint(&w, UINT64_MAX);
  wire_tag(&w, 100, 1);
  for (int i = 0; i < 8; i++) w.bytes[w.size++] = (uint8_t)i;
  wire_tag(&w, 101, 5);
  for (int i = 0; i < 4; i++) w.bytes[w.size++] = 0xff;
  wire_string(&w, 102, "unknown");
  write_raw(t, "raw_unpacked_unknown", w.bytes, w.size);
}

/* ---- ina.v1.ApplyPlacementRequest --------------------------------------------------- */

/* A request with the given layout whose layers map slot k of rank r to expert
 * (r * spr + k + shift) % n_experts; the arrays are caller-provided storage. */
typedef struct placement_seed {
  Ina__V1__ApplyPlacementRequest req;
  Ina__V1__ExpertPlacement placement;
  Ina__V1__Layout layout;
  Ina__V1__LayerPlacement layers[4];
  Ina__V1__LayerPlacement *layer_ptrs[4];
  Ina__V1__ExpertSlot slots[4][16];
  Ina__V1__ExpertSlot *slot_ptrs[4][16];
} placement_seed_t;

static void placement_build(placement_seed_t *p, uint32_t tp, uint32_t dp, uint32_t ep,
                            uint32_t spr, uint32_t n_layers, uint32_t n_experts, uint64_t generation) {
  ina__v1__apply_placement_request__init(&p->req);
  ina__v1__expert_placement__init(&p->placement);
  ina__v1__layout__init(&p->layout);
  p->layout.tp = tp;
  p->layout.dp = dp;
  p->layout.ep = ep;
  for (uint32_t l = 0; l < n_layers; l++) {
    ina__v1__layer_placement__init(&p->layers[l]);
    /* Layers listed in reverse order, slots rank-major in reverse: any order is valid. */
    p->layers[l].moe_layer = n_layers - 1 - l;
    p->layers[l].n_slots = (size_t)ep * spr;
    p->layers[l].slots = p->slot_ptrs[l];
    for (uint32_t i = 0; i < ep * spr; i++) {
      uint32_t k = ep * spr - 1 - i;
      Ina__V1__ExpertSlot *s = &p->slots[l][i];
      ina__v1__expert_slot__init(s);
      s->ep_rank = k / spr;
      s->slot = k % spr;
      s->logical_expert = (k + l) % n_experts;
      p->slot_ptrs[l][i] = s;
    }
    p->layer_ptrs[l] = &p->layers[l];
  }
  p->placement.layout = &p->layout;
  p->placement.slots_per_rank = spr;
  p->placement.n_layers = n_layers;
  p->placement.layers = p->layer_ptrs;
  p->req.placement = &p->placement;
  p->req.expected_generation = generation;
}

static void placement_seeds(void) {
  const char *t = "fuzz_apply_placement_request";
  static placement_seed_t p;
  /* Valid for the small job (4 ranks, 2 MoE layers, 4 experts, <= 2 slots, generation 3). */
  placement_build(&p, 4, 1, 4, 1, 2, 4, 3);
  write_message(t, "small_one_slot_per_rank", &p.req.base);
  placement_build(&p, 2, 2, 2, 2, 2, 4, 3);
  p.req.dry_run = 1;
  write_message(t, "small_dry_run", &p.req.base);
  /* Redundant replicas: 6 slots for 4 experts, over the small job's 2 slots a rank. */
  placement_build(&p, 1, 4, 2, 3, 2, 4, 3);
  write_message(t, "small_replicas_too_many_slots", &p.req.base);
  placement_build(&p, 4, 1, 4, 1, 2, 4, 2);
  write_message(t, "small_stale_generation", &p.req.base);
  /* A DeepSeek-V3 layout (16 ranks, 256 experts): right header, layers left out (58 MoE
   * layers of 16 x 17 slots would not fit a small seed). */
  placement_build(&p, 8, 2, 16, 17, 0, 256, 1);
  write_message(t, "v3_header_only", &p.req.base);
}

/* ---- ina.v1.PrefillRequest ---------------------------------------------------------- */

/* A request valid for both DeepSeek-V3 and the tiny model (vocab 16, 8 tokens of context):
 * a 5-token prompt into a decode cache of 3-token pages, the first 2 tokens already
 * there; the arrays are the seed's own storage. */
typedef struct prefill_seed {
  Ina__V1__PrefillRequest req;
  Ina__V1__SamplingParams sampling;
  Ina__V1__KvEndpoint decode;
  Ina__V1__KvLayout layout;
  uint32_t prompt[64];
  uint32_t pages[8];
  uint8_t blob[64];
} prefill_seed_t;

static void prefill_build(prefill_seed_t *p) {
  ina__v1__prefill_request__init(&p->req);
  ina__v1__sampling_params__init(&p->sampling);
  ina__v1__kv_endpoint__init(&p->decode);
  ina__v1__kv_layout__init(&p->layout);
  for (uint32_t i = 0; i < 64; i++) p->prompt[i] = (i * 7u + 3u) % 16u;
  for (uint32_t i = 0; i < 8; i++) p->pages[i] = 9u - i;
  for (uint32_t i = 0; i < 64; i++) p->blob[i] = (uint8_t)(i * 37u + 1u);
  p->sampling.temperature = 0.7f;
  p->sampling.top_p = 0.9f;
  p->sampling.top_k = 8;
  p->sampling.seed = 1234;
  p->layout.page_size = 3;
  p->layout.num_pages = 10;
  p->layout.num_layers = 2;
  p->layout.entry_bytes = 64;
  p->layout.model_fingerprint = "tiny-test fp32 kv:fp32";
  p->decode.layout = &p->layout;
  p->decode.ucx_blob.data = p->blob;
  p->decode.ucx_blob.len = 16;
  p->decode.role = "decode";
  p->decode.tp_size = 1;
  p->req.transfer_id = "kv-0001";
  p->req.n_prompt_token_ids = 5;
  p->req.prompt_token_ids = p->prompt;
  p->req.sampling = &p->sampling;
  p->req.logprobs_plus_one = 3;
  p->req.decode = &p->decode;
  p->req.n_decode_pages = 2;
  p->req.decode_pages = p->pages;
  p->req.first_token = 2;
  p->req.timeout_ms = 5000;
}

static void prefill_seeds(void) {
  const char *t = "fuzz_prefill_request";
  static prefill_seed_t p;
  char long_id[130];
  memset(long_id, '~', 129);
  long_id[129] = '\0';

  /* Accepted. */
  prefill_build(&p);
  write_message(t, "valid", &p.req.base);
  prefill_build(&p);
  p.req.n_prompt_token_ids = 1;
  p.req.n_decode_pages = 1;
  p.req.first_token = 0;
  p.req.sampling = NULL;
  p.req.logprobs_plus_one = 0;
  p.req.timeout_ms = 0;
  p.layout.page_size = p.layout.num_pages = p.layout.num_layers = 1;
  p.layout.entry_bytes = 1;
  p.pages[0] = 0;
  p.decode.ucx_blob.len = 1;
  write_message(t, "minimal", &p.req.base);
  /* At the tiny model's edges: 7 tokens (+ 1 = the context), top_k = vocab, 20
   * alternatives, an id of 128 bytes, the last page of the cache, first_token last. */
  prefill_build(&p);
  long_id[128] = '\0';
  p.req.transfer_id = long_id;
  p.req.n_prompt_token_ids = 7;
  p.prompt[6] = 15;
  p.sampling.top_k = 16;
  p.sampling.temperature = 100.0f;
  p.sampling.top_p = 1.0f;
  p.req.logprobs_plus_one = 21;
  p.req.n_decode_pages = 3;
  p.pages[2] = 9;
  p.req.first_token = 6;
  write_message(t, "tiny_model_edges", &p.req.base);
  long_id[128] = '~';
  /* DeepSeek-V3-like: 48 tokens, 16-token pages of 61 layers of 656-byte entries. */
  prefill_build(&p);
  for (uint32_t i = 0; i < 48; i++) p.prompt[i] = (i * 2693u) % 129280u;
  p.req.n_prompt_token_ids = 48;
  p.sampling.top_k = 50;
  p.layout.page_size = 16;
  p.layout.num_pages = 4096;
  p.layout.num_layers = 61;
  p.layout.entry_bytes = 656;
  p.layout.model_fingerprint = "deepseek-ai/DeepSeek-V3 fp8 kv:bf16";
  p.decode.ucx_blob.len = 64;
  p.req.n_decode_pages = 3;
  p.pages[0] = 4095;
  p.pages[1] = 17;
  p.pages[2] = 18;
  p.req.first_token = 32;
  write_message(t, "v3_prompt", &p.req.base);
  /* Every count at its bound but entry_bytes: 2^12 layers x 2^30 pages x 2^20 tokens x 1
   * byte = 2^62 bytes of storage, which an int64_t addresses. */
  prefill_build(&p);
  p.layout.num_layers = 4096;
  p.layout.num_pages = 1u << 30;
  p.layout.page_size = 1u << 20;
  p.layout.entry_bytes = 1;
  p.req.n_decode_pages = 1;
  p.pages[0] = (1u << 30) - 1;
  write_message(t, "layout_largest", &p.req.base);

  /* Each rule broken once. */
  prefill_build(&p);
  p.req.transfer_id = "";
  write_message(t, "bad_transfer_id_empty", &p.req.base);
  p.req.transfer_id = long_id; /* 129 bytes */
  write_message(t, "bad_transfer_id_129_bytes", &p.req.base);
  p.req.transfer_id = "kv 0001";
  write_message(t, "bad_transfer_id_space", &p.req.base);
  prefill_build(&p);
  p.req.n_prompt_token_ids = 0;
  p.req.n_decode_pages = 0;
  p.req.first_token = 0;
  write_message(t, "bad_prompt_empty", &p.req.base);
  prefill_build(&p);
  p.req.n_prompt_token_ids = 8; /* + 1 > the tiny model's 8 */
  p.req.n_decode_pages = 3;
  write_message(t, "bad_prompt_too_long_tiny", &p.req.base);
  prefill_build(&p);
  p.prompt[4] = 129280;
  write_message(t, "bad_prompt_id_vocab", &p.req.base);
  prefill_build(&p);
  p.sampling.top_k = 129281;
  write_message(t, "bad_sampling_top_k", &p.req.base);
  prefill_build(&p);
  p.sampling.min_p = 1.0f;
  write_message(t, "bad_sampling_min_p", &p.req.base);
  prefill_build(&p);
  p.req.logprobs_plus_one = 22;
  write_message(t, "bad_logprobs_plus_one", &p.req.base);
  prefill_build(&p);
  p.req.decode = NULL;
  write_message(t, "bad_decode_missing", &p.req.base);
  prefill_build(&p);
  p.decode.layout = NULL;
  write_message(t, "bad_decode_layout_missing", &p.req.base);
  prefill_build(&p);
  p.layout.entry_bytes = 0;
  write_message(t, "bad_decode_layout_zero", &p.req.base);
  prefill_build(&p);
  p.layout.num_layers = 4097;
  write_message(t, "bad_decode_layout_layers", &p.req.base);
  /* Each count in bounds, their product past int64_t: 61 x 2^30 x 2^20 x 656. */
  prefill_build(&p);
  p.req.n_prompt_token_ids = 1;
  p.req.first_token = 0;
  p.req.n_decode_pages = 1;
  p.layout.num_layers = 61;
  p.layout.entry_bytes = 656;
  p.layout.num_pages = 1u << 30;
  p.layout.page_size = 1u << 20;
  p.pages[0] = (1u << 30) - 1;
  write_message(t, "bad_decode_layout_storage_overflow", &p.req.base);
  prefill_build(&p);
  p.decode.ucx_blob.len = 0;
  write_message(t, "bad_decode_ucx_blob_empty", &p.req.base);
  prefill_build(&p);
  p.req.n_decode_pages = 1;
  write_message(t, "bad_decode_pages_count", &p.req.base);
  prefill_build(&p);
  p.pages[1] = 10;
  write_message(t, "bad_decode_pages_id", &p.req.base);
  prefill_build(&p);
  p.req.first_token = 5;
  write_message(t, "bad_first_token", &p.req.base);

  /* Wire forms protobuf-c does not write: prompt ids and pages one tag each, the layout
   * given twice (protobuf-c keeps the last, a valid one), unknown fields. */
  wire_t w = {.size = 0};
  wire_string(&w, 1, "raw-kv");
  for (uint32_t id = 0; id < 4; id++) {
    wire_tag(&w, 2, 0);
    wire_varint(&w, id * 3u);
  }
  wire_t layout = {.size = 0};
  wire_tag(&layout, 2, 0);
  wire_varint(&layout, 8);
  wire_tag(&layout, 4, 0);
  wire_varint(&layout, 128);
  wire_t layout2 = {.size = 0};
  wire_tag(&layout2, 1, 0);
  wire_varint(&layout2, 2);
  wire_tag(&layout2, 2, 0);
  wire_varint(&layout2, 8);
  wire_tag(&layout2, 3, 0);
  wire_varint(&layout2, 1);
  wire_tag(&layout2, 4, 0);
  wire_varint(&layout2, 128);
  wire_t ep = {.size = 0};
  wire_tag(&ep, 1, 2);
  wire_varint(&ep, layout.size);
  memcpy(ep.bytes + ep.size, layout.bytes, layout.size);
  ep.size += layout.size;
  wire_tag(&ep, 1, 2);
  wire_varint(&ep, layout2.size);
  memcpy(ep.bytes + ep.size, layout2.bytes, layout2.size);
  ep.size += layout2.size;
  wire_string(&ep, 2, "blob");
  wire_tag(&w, 5, 2);
  wire_varint(&w, ep.size);
  memcpy(w.bytes + w.size, ep.bytes, ep.size);
  w.size += ep.size;
  for (uint32_t pg = 0; pg < 2; pg++) {
    wire_tag(&w, 6, 0);
    wire_varint(&w, 7 - pg);
  }
  wire_tag(&w, 7, 0);
  wire_varint(&w, 1);
  wire_tag(&w, 99, 0);
  wire_varint(&w, UINT64_MAX);
  wire_string(&w, 100, "unknown");
  write_raw(t, "raw_unpacked_layout_twice", w.bytes, w.size);
}

/* ---- the other requests ------------------------------------------------------------- */

static void other_request_seeds(void) {
  Ina__V1__CancelRequest c = INA__V1__CANCEL_REQUEST__INIT;
  write_message("fuzz_cancel_request", "empty", &c.base);
  c.request_id = "req-0001";
  write_message("fuzz_cancel_request", "id", &c.base);
  char long_id[129];
  memset(long_id, 'x', 128);
  long_id[128] = '\0';
  c.request_id = long_id;
  write_message("fuzz_cancel_request", "longest_id", &c.base);

  Ina__V1__AbortTransferRequest a = INA__V1__ABORT_TRANSFER_REQUEST__INIT;
  write_message("fuzz_abort_transfer_request", "empty", &a.base);
  a.transfer_id = "kv-0001";
  write_message("fuzz_abort_transfer_request", "id", &a.base);
  a.transfer_id = long_id; /* 128 bytes: the longest the handler takes */
  write_message("fuzz_abort_transfer_request", "longest_id", &a.base);
  char too_long_id[130];
  memset(too_long_id, 'y', 129);
  too_long_id[129] = '\0';
  a.transfer_id = too_long_id;
  write_message("fuzz_abort_transfer_request", "too_long_id", &a.base);

  Ina__V1__GetLoadRequest l = INA__V1__GET_LOAD_REQUEST__INIT;
  write_message("fuzz_get_load_request", "empty", &l.base);
  l.include_expert_load = 1;
  write_message("fuzz_get_load_request", "include", &l.base);
  l.reset_expert_load = 1;
  write_message("fuzz_get_load_request", "include_reset", &l.base);

  /* The empty requests: nothing, and fields the agent does not know (a newer client). */
  write_raw("fuzz_empty_requests", "empty", (const uint8_t *)"", 0);
  wire_t w = {.size = 0};
  wire_tag(&w, 1, 0);
  wire_varint(&w, 1);
  wire_string(&w, 2, "filter");
  wire_tag(&w, 3, 5);
  for (int i = 0; i < 4; i++) w.bytes[w.size++] = (uint8_t)(0x10 + i);
  write_raw("fuzz_empty_requests", "unknown_fields", w.bytes, w.size);

  Grpc__Health__V1__HealthCheckRequest h = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  write_message("fuzz_health_check_request", "server", &h.base);
  h.service = "ina.v1.Inference";
  write_message("fuzz_health_check_request", "inference", &h.base);
  h.service = "grpc.health.v1.Health";
  write_message("fuzz_health_check_request", "unknown_service", &h.base);
}

/* ---- responses the ina command line decodes ----------------------------------------- */

static void client_response_seeds(void) {
  const char *t = "fuzz_client_responses";
  Ina__V1__GpuInfo gpu[2] = {INA__V1__GPU_INFO__INIT, INA__V1__GPU_INFO__INIT};
  Ina__V1__GpuInfo *gpus[2] = {&gpu[0], &gpu[1]};
  Ina__V1__RankInfo rank[2] = {INA__V1__RANK_INFO__INIT, INA__V1__RANK_INFO__INIT};
  Ina__V1__RankInfo *ranks[2] = {&rank[0], &rank[1]};
  for (uint32_t i = 0; i < 2; i++) {
    gpu[i].gpu_index = i;
    gpu[i].name = "NVIDIA H200";
    gpu[i].uuid = i ? "GPU-5f2c0000-0000-0000-0000-000000000001" : "GPU-5f2c0000-0000-0000-0000-000000000000";
    gpu[i].compute_capability_major = 9;
    gpu[i].memory_total_bytes = 150754820096ull;
    gpu[i].memory_used_bytes = 120000000000ull;
    gpu[i].pci_bus_id = i ? "0000:2a:00.0" : "0000:19:00.0";
    rank[i].global_rank = i;
    rank[i].local_rank = i;
    rank[i].gpu_index = i;
    rank[i].pid = 4242 + i;
    rank[i].tp_rank = i;
    rank[i].ep_rank = i;
  }
  Ina__V1__GpuLink link = INA__V1__GPU_LINK__INIT, *links[1] = {&link};
  link.dst_gpu_index = 1;
  link.kind = INA__V1__LINK_KIND__LINK_KIND_NVLINK;
  link.nvlink_count = 18;
  link.bandwidth_gbps = 450.0;
  Ina__V1__ModelInfo model = INA__V1__MODEL_INFO__INIT;
  model.name = "deepseek-ai/DeepSeek-V3";
  model.architecture = "DeepseekV3ForCausalLM";
  model.vocab_size = 129280;
  model.n_layers = 61;
  model.n_moe_layers = 58;
  model.n_routed_experts = 256;
  model.n_experts_per_token = 8;
  model.max_context_tokens = 163840;
  model.weight_dtype = "fp8_e4m3";
  model.eos_token_id = 1;
  char *archs[1] = {"sm_90a"};
  Ina__V1__BuildInfo build = INA__V1__BUILD_INFO__INIT;
  build.version = "0.1.0";
  build.cuda_version = "12.6";
  build.n_cuda_archs = 1;
  build.cuda_archs = archs;
  build.build_type = "RelWithDebInfo";
  Ina__V1__NodeInfo info = INA__V1__NODE_INFO__INIT;
  info.hostname = "gpu-node-17";
  info.n_gpus = 2;
  info.gpus = gpus;
  info.n_links = 1;
  info.links = links;
  info.n_ranks = 2;
  info.ranks = ranks;
  info.world_size = 16;
  info.model = &model;
  info.build = &build;
  info.host_memory_bytes = 2199023255552ull;
  write_message(t, "node_info", &info.base);

  Ina__V1__RankHealth rh = INA__V1__RANK_HEALTH__INIT, *rhs[1] = {&rh};
  rh.global_rank = 3;
  rh.state = INA__V1__NODE_STATE__NODE_STATE_FAILED;
  rh.last_heartbeat_age_ms = 12000;
  Ina__V1__NodeHealth health = INA__V1__NODE_HEALTH__INIT;
  health.state = INA__V1__NODE_STATE__NODE_STATE_FAILED;
  health.message = "rank 3: CUDA error 700";
  health.uptime_seconds = 86400;
  health.n_ranks = 1;
  health.ranks = rhs;
  write_message(t, "node_health", &health.base);

  Grpc__Health__V1__HealthCheckResponse hc = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  hc.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
  write_message(t, "health_serving", &hc.base);

  uint32_t tokens[] = {128000, 17, 9, 4242};
  Ina__V1__Timings timings = INA__V1__TIMINGS__INIT;
  timings.queue_us = 120;
  timings.first_token_us = 35000;
  timings.total_us = 410000;
  timings.cached_prompt_tokens = 32;
  Ina__V1__GenerateResponse g = INA__V1__GENERATE_RESPONSE__INIT;
  g.request_id = "req-0001";
  g.n_token_ids = 4;
  g.token_ids = tokens;
  g.prompt_tokens = 48;
  g.completion_tokens = 4;
  write_message(t, "generate_tokens", &g.base);
  g.finish_reason = INA__V1__FINISH_REASON__FINISH_REASON_STOP;
  g.stop_token_id = 4242;
  g.timings = &timings;
  write_message(t, "generate_final", &g.base);
  g.n_token_ids = 0;
  g.finish_reason = INA__V1__FINISH_REASON__FINISH_REASON_ERROR;
  g.error_message = "scheduler: out of KV pages";
  write_message(t, "generate_error", &g.base);
}

/* ---- responses a decode agent decodes from its prefill agent ------------------------- */

static void decode_agent_response_seeds(void) {
  const char *t = "fuzz_client_responses";
  static uint8_t blob[48];
  for (int i = 0; i < 48; i++) blob[i] = (uint8_t)(i * 11 + 5);
  Ina__V1__KvLayout layout = INA__V1__KV_LAYOUT__INIT;
  layout.page_size = 16;
  layout.num_pages = 8192;
  layout.num_layers = 61;
  layout.entry_bytes = 656;
  layout.model_fingerprint = "deepseek-ai/DeepSeek-V3 fp8 kv:bf16";
  Ina__V1__KvEndpoint ep = INA__V1__KV_ENDPOINT__INIT;
  ep.layout = &layout;
  ep.ucx_blob.data = blob;
  ep.ucx_blob.len = sizeof blob;
  ep.role = "prefill";
  ep.tp_size = 2;
  write_message(t, "kv_endpoint_prefill", &ep.base);
  ep.role = "decode";
  write_message(t, "kv_endpoint_decode_role", &ep.base);
  ep.role = "both";
  layout.num_layers = 3;
  layout.entry_bytes = 64;
  layout.model_fingerprint = "tiny-test fp32 kv:fp32";
  ep.ucx_blob.len = 0;
  write_message(t, "kv_endpoint_other_model", &ep.base);
  ep.layout = NULL;
  write_message(t, "kv_endpoint_no_layout", &ep.base);

  uint32_t top_ids[21];
  float top_logprobs[21];
  for (int i = 0; i < 21; i++) {
    top_ids[i] = (uint32_t)(i * 6151 % 129280);
    top_logprobs[i] = -0.25f * (float)i;
  }
  Ina__V1__PrefillResponse pr = INA__V1__PREFILL_RESPONSE__INIT;
  pr.token = 4242;
  pr.cached_tokens = 16;
  pr.bytes_written = 32ull * 61 * 656;
  pr.puts = 61;
  write_message(t, "prefill_response", &pr.base);
  pr.logprob = -0.125f;
  pr.n_top_ids = pr.n_top_logprobs = 20;
  pr.top_ids = top_ids;
  pr.top_logprobs = top_logprobs;
  write_message(t, "prefill_response_20_top", &pr.base);
  pr.n_top_ids = pr.n_top_logprobs = 21;
  write_message(t, "prefill_response_21_top", &pr.base);
  pr.n_top_ids = 3;
  pr.n_top_logprobs = 2;
  write_message(t, "prefill_response_uneven_top", &pr.base);
}

/* UCX endpoint blobs (comm/ucx_blob.h's layout, written out byte by byte here): no
 * region, one region, two regions, and one cut short. */
static size_t put_le(uint8_t *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
  return (size_t)bytes;
}

static size_t ucx_blob(uint8_t *b, uint32_t address_len, uint32_t regions, uint32_t rkey_len) {
  size_t n = 0;
  n += put_le(b + n, 0x55414E49u, 4);
  n += put_le(b + n, 1, 2);
  n += put_le(b + n, 0, 2);
  n += put_le(b + n, address_len, 4);
  n += put_le(b + n, regions, 4);
  for (uint32_t i = 0; i < address_len; i++) b[n++] = (uint8_t)(i * 7 + 1);
  for (uint32_t r = 0; r < regions; r++) {
    n += put_le(b + n, 0x7f0000001000ull + 0x100000ull * r, 8);
    n += put_le(b + n, 0x40000, 8);
    n += put_le(b + n, r % 2, 4);
    n += put_le(b + n, rkey_len, 4);
    for (uint32_t i = 0; i < rkey_len; i++) b[n++] = (uint8_t)(i * 13 + r);
  }
  return n;
}

static void ucx_blob_seeds(void) {
  const char *t = "fuzz_ucx_blob";
  uint8_t b[1024];
  write_raw(t, "no_region", b, ucx_blob(b, 40, 0, 0));
  write_raw(t, "one_region", b, ucx_blob(b, 64, 1, 32));
  write_raw(t, "two_regions", b, ucx_blob(b, 17, 2, 9));
  const size_t n = ucx_blob(b, 64, 1, 32);
  write_raw(t, "cut_short", b, n - 5);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: make_seeds OUT_DIR\n");
    return 1;
  }
  out_dir = argv[1];
  make_dir(out_dir);
  generate_seeds();
  placement_seeds();
  prefill_seeds();
  other_request_seeds();
  client_response_seeds();
  decode_agent_response_seeds();
  ucx_blob_seeds();
  return 0;
}
