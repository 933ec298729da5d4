/* Fuzz target: the request bodies of the OpenAI-compatible HTTP API (agent/http/
 * openai_api.h), POST /v1/completions and /v1/chat/completions. Each input is a body,
 * parsed for both endpoints (DeepSeek-V3's vocabulary of 129280, a 3000-byte limit);
 * every answer is rendered from what the parse gave and read back.
 *
 * For every input and endpoint it traps unless:
 *  - a refusal is INA_ERR_INVALID_ARGUMENT with the request all zero, status 413 exactly
 *    when the input is over the limit and 400 otherwise, type "invalid_request_error",
 *    param and message NUL-terminated in their buffers, a message that starts with the
 *    field path it names (a prefix of param) or with "the body", and an error body that
 *    reads back as JSON holding exactly that message, type and param;
 *  - an accepted request has its endpoint's texts and only them, every text
 *    NUL-terminated at its length and well-formed UTF-8, token ids in the vocabulary,
 *    every number in its documented range, and its defaults where the input said nothing;
 *  - the answers built from its strings (whole responses, first / later / finish / usage
 *    chunks, the model list; the prompts' token ids as raw bytes, and texts cut mid-
 *    character, for ill-formed UTF-8) are valid JSON whose texts read back equal to the
 *    well-formed ones they were made from;
 *  - releasing zeroes the request, and releasing twice is harmless.
 * Everything is freed (LeakSanitizer checks). */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/http/openai_api.h"
#include "core/log.h"
#include "tests/fuzz/fuzz_check.h"

#define VOCAB 129280
#define MAX_BODY 3000
#define MAX_CHOICES (INA_OPENAI_MAX_PROMPTS + 1)

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  ina_log_set_quiet_errors(1);
  return 0;
}

static int all_zero(const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i]) return 0;
  return 1;
}

/* Well-formed UTF-8, checked independently of the code under test. */
static int utf8_ok(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    const unsigned c = s[i];
    size_t k;
    uint32_t cp;
    if (c < 0x80) { i++; continue; }
    if ((c & 0xE0) == 0xC0) { k = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { k = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { k = 4; cp = c & 0x07; }
    else return 0;
    if (i + k > n) return 0;
    for (size_t j = 1; j < k; j++) {
      if ((s[i + j] & 0xC0) != 0x80) return 0;
      cp = cp << 6 | (s[i + j] & 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    i += k;
  }
  return 1;
}

static void check_text(const char *s, size_t len, const char *what) {
  FUZZ_REQUIRE(s != NULL, "%s is NULL", what);
  FUZZ_REQUIRE(strlen(s) == len, "%s: length %zu, but %zu up to its NUL", what, len, strlen(s));
  FUZZ_REQUIRE(utf8_ok((const unsigned char *)s, len), "%s is not UTF-8", what);
}

static json_t *read_back(char *text, const char *what) {
  FUZZ_REQUIRE(text != NULL, "%s rendered nothing", what);
  json_error_t e;
  json_t *doc = json_loads(text, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &e);
  FUZZ_REQUIRE(doc != NULL, "%s is not JSON (%s): %.200s", what, e.text, text);
  free(text);
  return doc;
}

static void check_refusal(const uint8_t *data, size_t size, const ina_openai_request_t *req,
                          const ina_openai_error_t *err, ina_status_t st) {
  FUZZ_REQUIRE(st == INA_ERR_INVALID_ARGUMENT, "refused with status %d", st);
  FUZZ_REQUIRE(all_zero(req, sizeof *req), "a refusal left the request filled");
  FUZZ_REQUIRE(err->http_status == (size > MAX_BODY ? 413 : 400), "http %d for %zu bytes", err->http_status, size);
  FUZZ_REQUIRE(err->type && strcmp(err->type, "invalid_request_error") == 0, "type %s", err->type);
  FUZZ_REQUIRE(memchr(err->param, '\0', sizeof err->param) && memchr(err->message, '\0', sizeof err->message),
               "param or message not NUL-terminated");
  FUZZ_REQUIRE(err->message[0], "an empty message");
  FUZZ_REQUIRE(utf8_ok((const unsigned char *)err->message, strlen(err->message)), "the message is not UTF-8: %s",
               err->message);
  if (err->param[0]) {
    const char *colon = strstr(err->message, ": ");
    FUZZ_REQUIRE(colon && (size_t)(colon - err->message) <= strlen(err->param) &&
                     strncmp(err->message, err->param, (size_t)(colon - err->message)) == 0,
                 "the message does not start with the field (%s): %s", err->param, err->message);
  } else {
    FUZZ_REQUIRE(strncmp(err->message, "the ", 4) == 0, "a message without a field: %s", err->message);
  }
  (void)data;
  json_t *doc = read_back(ina_openai_render_error(err), "the error");
  const json_t *e = json_object_get(doc, "error");
  FUZZ_REQUIRE(json_is_string(json_object_get(e, "message")) &&
                   strcmp(json_string_value(json_object_get(e, "message")), err->message) == 0,
               "the error body's message differs");
  FUZZ_REQUIRE(json_is_string(json_object_get(e, "type")) &&
                   strcmp(json_string_value(json_object_get(e, "type")), err->type) == 0,
               "the error body's type differs");
  const json_t *param = json_object_get(e, "param");
  FUZZ_REQUIRE(err->param[0] ? json_is_string(param) && strcmp(json_string_value(param), err->param) == 0
                             : json_is_null(param),
               "the error body's param differs");
  json_decref(doc);
}

static void check_request(ina_openai_endpoint_t ep, const ina_openai_request_t *r) {
  FUZZ_REQUIRE(r->endpoint == ep, "endpoint %d", r->endpoint);
  check_text(r->model, strlen(r->model ? r->model : ""), "model");
  if (ep == INA_OPENAI_COMPLETIONS) {
    FUZZ_REQUIRE(r->num_prompts >= 1 && r->num_prompts <= INA_OPENAI_MAX_PROMPTS && r->prompts, "%zu prompts",
                 r->num_prompts);
    FUZZ_REQUIRE(!r->messages && !r->num_messages, "messages in a completions request");
    for (size_t i = 0; i < r->num_prompts; i++) {
      const ina_openai_prompt_t *p = &r->prompts[i];
      FUZZ_REQUIRE(!p->text != !p->ids, "prompt %zu: text and ids both or neither", i);
      if (p->text) {
        check_text(p->text, p->text_len, "a prompt");
        FUZZ_REQUIRE(p->num_ids == 0, "a text prompt with ids");
      } else {
        FUZZ_REQUIRE(p->num_ids >= 1 && p->text_len == 0, "prompt %zu: %zu ids", i, p->num_ids);
        for (size_t k = 0; k < p->num_ids; k++)
          FUZZ_REQUIRE(p->ids[k] >= 0 && p->ids[k] < VOCAB, "token id %d", p->ids[k]);
      }
    }
    FUZZ_REQUIRE(r->thinking == -1 && r->add_generation_prompt == 0, "chat options in a completions request");
  } else {
    FUZZ_REQUIRE(r->num_messages >= 1 && r->messages, "%zu messages", r->num_messages);
    FUZZ_REQUIRE(!r->prompts && !r->num_prompts, "prompts in a chat request");
    for (size_t i = 0; i < r->num_messages; i++) {
      FUZZ_REQUIRE(r->messages[i].role <= INA_OPENAI_ROLE_ASSISTANT, "role %d", r->messages[i].role);
      check_text(r->messages[i].content, r->messages[i].content_len, "a message");
    }
    FUZZ_REQUIRE(r->thinking >= -1 && r->thinking <= 1 && (r->add_generation_prompt == 0 || r->add_generation_prompt == 1),
                 "thinking %d, add_generation_prompt %d", r->thinking, r->add_generation_prompt);
  }
  FUZZ_REQUIRE(r->max_tokens == -1 || r->max_tokens >= 1, "max_tokens %lld", (long long)r->max_tokens);
  FUZZ_REQUIRE(r->temperature >= 0 && r->temperature <= 2, "temperature %g", r->temperature);
  FUZZ_REQUIRE(r->top_p > 0 && r->top_p <= 1, "top_p %g", r->top_p);
  FUZZ_REQUIRE(r->top_k >= 0, "top_k %d", r->top_k);
  FUZZ_REQUIRE(r->has_seed == 0 || r->has_seed == 1, "has_seed %d", r->has_seed);
  FUZZ_REQUIRE(r->has_seed || r->seed == 0, "a seed without has_seed");
  FUZZ_REQUIRE(r->num_stop <= INA_OPENAI_MAX_STOP, "%zu stop strings", r->num_stop);
  for (size_t i = 0; i < INA_OPENAI_MAX_STOP; i++) {
    if (i < r->num_stop) {
      check_text(r->stop[i], r->stop_len[i], "a stop string");
      FUZZ_REQUIRE(r->stop_len[i] > 0, "an empty stop string");
    } else {
      FUZZ_REQUIRE(!r->stop[i] && !r->stop_len[i], "stop[%zu] past num_stop", i);
    }
  }
  FUZZ_REQUIRE(!r->stop_token_ids == !r->num_stop_token_ids, "stop_token_ids and their count disagree");
  for (size_t i = 0; i < r->num_stop_token_ids; i++)
    FUZZ_REQUIRE(r->stop_token_ids[i] >= 0 && r->stop_token_ids[i] < VOCAB, "stop id %d", r->stop_token_ids[i]);
  FUZZ_REQUIRE(r->stream == 0 || r->stream == 1, "stream %d", r->stream);
  FUZZ_REQUIRE(r->include_usage == 0 || (r->include_usage == 1 && r->stream), "include_usage %d", r->include_usage);
  FUZZ_REQUIRE(r->logprobs >= -1 && r->logprobs <= INA_OPENAI_MAX_LOGPROBS, "logprobs %d", r->logprobs);
  FUZZ_REQUIRE(r->ignore_eos == 0 || r->ignore_eos == 1, "ignore_eos %d", r->ignore_eos);
}

/* A choice's text: the prompt's or message's text, or a prompt's ids as raw bytes. */
typedef struct {
  const char *text;
  size_t len;
  int well_formed;
} source_t;

static size_t sources_of(const ina_openai_request_t *r, source_t *src, char **scratch) {
  size_t n = 0;
  *scratch = NULL;
  if (r->endpoint == INA_OPENAI_CHAT) {
    for (size_t i = 0; i < r->num_messages && n < MAX_CHOICES; i++)
      src[n++] = (source_t){r->messages[i].content, r->messages[i].content_len, 1};
    return n;
  }
  size_t total = 0;
  for (size_t i = 0; i < r->num_prompts; i++) total += r->prompts[i].num_ids;
  char *bytes = malloc(total + 1);
  FUZZ_REQUIRE(bytes != NULL, "no memory");
  *scratch = bytes;
  for (size_t i = 0; i < r->num_prompts; i++) {
    const ina_openai_prompt_t *p = &r->prompts[i];
    if (p->text) {
      src[n++] = (source_t){p->text, p->text_len, 1};
    } else {
      for (size_t k = 0; k < p->num_ids; k++) bytes[k] = (char)(p->ids[k] & 0xFF);
      src[n++] = (source_t){bytes, p->num_ids, 0};
      bytes += p->num_ids;
    }
  }
  return n;
}

static const char *text_of(const json_t *choice, int chat) {
  const json_t *v = chat ? json_object_get(json_object_get(choice, "message"), "content") : json_object_get(choice, "text");
  FUZZ_REQUIRE(json_is_string(v), "a choice without its text");
  return json_string_value(v);
}

static void check_answers(const ina_openai_request_t *r) {
  const ina_openai_endpoint_t ep = r->endpoint;
  const int chat = ep == INA_OPENAI_CHAT;
  source_t src[MAX_CHOICES];
  char *scratch;
  const size_t n = sources_of(r, src, &scratch);

  /* Logprobs: the first source cut in half (perhaps mid-character) and whole; the stop
   * strings as alternatives (no NUL: completions make them object keys). */
  const char *tops[INA_OPENAI_MAX_STOP + 1];
  size_t top_lens[INA_OPENAI_MAX_STOP + 1];
  float top_lps[INA_OPENAI_MAX_STOP + 1];
  size_t num_top = 0;
  for (size_t i = 0; i < r->num_stop; i++, num_top++) {
    tops[num_top] = r->stop[i];
    top_lens[num_top] = r->stop_len[i];
    top_lps[num_top] = -(float)i * 0.3f;
  }
  tops[num_top] = r->model;
  top_lens[num_top] = strlen(r->model);
  top_lps[num_top++] = -1e30f;
  const ina_openai_logprob_t lps[2] = {
      {src[0].text, src[0].len / 2, -0.25f, num_top, tops, top_lens, top_lps},
      {src[0].text, src[0].len, -7.5f, 0, NULL, NULL, NULL},
  };
  ina_openai_choice_t choices[MAX_CHOICES];
  for (size_t i = 0; i < n; i++)
    choices[i] = (ina_openai_choice_t){src[i].text, src[i].len, i == 0 ? src[0].text : NULL, i == 0 ? src[0].len / 2 : 0,
                                       i % 2 ? "length" : NULL, i == 0 ? lps : NULL, i == 0 ? 2 : 0};
  const ina_openai_usage_t usage = {(int64_t)n, r->max_tokens, r->has_seed ? (int64_t)(r->seed >> 1) : 0};

  json_t *doc = read_back(ina_openai_render_response(ep, r->model, 1733140800, r->model, choices, n, &usage), "a response");
  FUZZ_REQUIRE(strcmp(json_string_value(json_object_get(doc, "model")), r->model) == 0 &&
                   strcmp(json_string_value(json_object_get(doc, "id")), r->model) == 0,
               "the model does not read back");
  const json_t *arr = json_object_get(doc, "choices");
  FUZZ_REQUIRE(json_array_size(arr) == n, "%zu choices read back of %zu", json_array_size(arr), n);
  for (size_t i = 0; i < n; i++) {
    const char *t = text_of(json_array_get(arr, i), chat);
    if (src[i].well_formed)
      FUZZ_REQUIRE(strlen(t) == src[i].len && memcmp(t, src[i].text, src[i].len) == 0, "choice %zu's text changed", i);
  }
  FUZZ_REQUIRE(json_integer_value(json_object_get(json_object_get(doc, "usage"), "total_tokens")) ==
                   (json_int_t)(usage.prompt_tokens + usage.completion_tokens),
               "total_tokens");
  json_decref(doc);

  for (size_t i = 0; i < n; i++) {
    for (int first = 0; first < 2; first++) {
      doc = read_back(ina_openai_render_chunk_at(ep, "chunk", 1, r->model, i, first, &choices[i],
                                                 r->include_usage ? &usage : NULL, i),
                      "a chunk");
      const json_t *c = json_array_get(json_object_get(doc, "choices"), 0);
      FUZZ_REQUIRE(json_integer_value(json_object_get(c, "index")) == (json_int_t)i, "chunk index");
      if (chat) {
        const json_t *delta = json_object_get(c, "delta");
        FUZZ_REQUIRE(json_is_object(delta), "a chunk without delta");
        FUZZ_REQUIRE(!json_object_get(delta, "role") == !first, "role in a chunk: first %d", first);
        const json_t *content = json_object_get(delta, "content");
        FUZZ_REQUIRE(!content == !(first || src[i].len), "content in a chunk of %zu bytes", src[i].len);
        if (content && src[i].well_formed)
          FUZZ_REQUIRE(strcmp(json_string_value(content), src[i].text) == 0, "a chunk's content changed");
      } else if (src[i].well_formed) {
        FUZZ_REQUIRE(strcmp(text_of(c, 0), src[i].text) == 0, "a chunk's text changed");
      }
      json_decref(doc);
    }
  }
  doc = read_back(ina_openai_render_chunk(ep, r->model, 2, r->model, 0, 0, NULL, &usage), "the usage chunk");
  FUZZ_REQUIRE(json_is_array(json_object_get(doc, "choices")) && json_array_size(json_object_get(doc, "choices")) == 0,
               "the usage chunk has choices");
  json_decref(doc);
  doc = read_back(ina_openai_render_models(r->model, 0, r->max_tokens), "the model list");
  json_decref(doc);
  free(scratch);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  for (int e = 0; e < 2; e++) {
    const ina_openai_endpoint_t ep = e ? INA_OPENAI_CHAT : INA_OPENAI_COMPLETIONS;
    ina_openai_request_t req;
    ina_openai_error_t err;
    memset(&req, 0xa5, sizeof req);
    memset(&err, 0xa5, sizeof err);
    const ina_status_t st = ina_openai_parse_request(ep, (const char *)data, size, VOCAB, MAX_BODY, &req, &err);
    if (st != INA_OK) {
      check_refusal(data, size, &req, &err, st);
      continue;
    }
    FUZZ_REQUIRE(size <= MAX_BODY, "accepted %zu bytes over the limit", size);
    FUZZ_REQUIRE(err.http_status == 0 && !err.param[0] && !err.message[0], "accepted with an error");
    check_request(ep, &req);
    check_answers(&req);
    ina_openai_request_release(&req);
    FUZZ_REQUIRE(all_zero(&req, sizeof req), "release left the request filled");
    ina_openai_request_release(&req);
  }
  return 0;
}
