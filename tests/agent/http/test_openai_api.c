/* The OpenAI API's messages (agent/http/openai_api.h): every field's accepted forms and
 * defaults, every refusal's status, param and message (a table of bodies one rule away
 * from valid), the output zeroed after a refusal, and the renderers' answers parsed back
 * with jansson and checked field by field, ill-formed UTF-8 and odd floats included. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/http/openai_api.h"
#include "core/log.h"
#include "tests/test_util.h"

#define VOCAB 129280
#define MAX_BODY (1u << 20)

static const ina_openai_endpoint_t CMPL = INA_OPENAI_COMPLETIONS, CHAT = INA_OPENAI_CHAT;

static int all_zero(const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i]) return 0;
  return 1;
}

/* Parses body, which must be accepted; the caller releases *req. */
static int accept(ina_openai_endpoint_t ep, const char *body, ina_openai_request_t *req) {
  ina_openai_error_t err;
  memset(req, 0x5a, sizeof *req);
  memset(&err, 0x5a, sizeof err);
  const ina_status_t st = ina_openai_parse_request(ep, body, strlen(body), VOCAB, MAX_BODY, req, &err);
  CHECKF(st == INA_OK, "refused %s: %d %s: %s", body, err.http_status, err.param, err.message);
  if (st != INA_OK) {
    memset(req, 0, sizeof *req);
    return 0;
  }
  CHECK(err.http_status == 0 && err.param[0] == '\0' && err.message[0] == '\0');
  CHECK(req->endpoint == ep);
  return 1;
}

/* Parses body, which must be refused with status and param, the message naming `names`
 * (NULL: the param). */
static void refuse(ina_openai_endpoint_t ep, const char *body, int status, const char *param, const char *names) {
  ina_openai_request_t req;
  ina_openai_error_t err;
  memset(&req, 0x5a, sizeof req);
  memset(&err, 0x5a, sizeof err);
  const ina_status_t st = ina_openai_parse_request(ep, body, strlen(body), VOCAB, MAX_BODY, &req, &err);
  CHECKF(st == INA_ERR_INVALID_ARGUMENT, "%s: status %d", body, st);
  CHECKF(all_zero(&req, sizeof req), "%s: the request is not zeroed", body);
  CHECKF(err.http_status == status, "%s: http %d, not %d", body, err.http_status, status);
  CHECKF(strcmp(err.param, param) == 0, "%s: param \"%s\", not \"%s\" (%s)", body, err.param, param, err.message);
  CHECKF(err.type && strcmp(err.type, "invalid_request_error") == 0, "%s: type %s", body, err.type);
  CHECKF(memchr(err.message, '\0', sizeof err.message) && err.message[0], "%s: no message", body);
  const char *want = names ? names : param;
  CHECKF(strstr(err.message, want) != NULL, "%s: the message does not name %s: %s", body, want, err.message);
  if (st == INA_OK) ina_openai_request_release(&req);
}

/* ---- requests -------------------------------------------------------------------------- */

static void test_defaults(void) {
  ina_openai_request_t r;
  if (accept(CMPL, "{\"model\":\"m\",\"prompt\":\"hi\"}", &r)) {
    CHECK(strcmp(r.model, "m") == 0);
    CHECK(r.num_prompts == 1 && r.prompts[0].text && strcmp(r.prompts[0].text, "hi") == 0 &&
          r.prompts[0].text_len == 2 && !r.prompts[0].ids && r.prompts[0].num_ids == 0);
    CHECK(!r.messages && r.num_messages == 0);
    CHECK(r.max_tokens == -1 && r.temperature == 1 && r.top_p == 1 && r.top_k == 0);
    CHECK(!r.has_seed && r.seed == 0 && r.num_stop == 0 && !r.stop[0] && !r.stop_token_ids);
    CHECK(!r.stream && !r.include_usage && r.logprobs == -1 && !r.ignore_eos);
    CHECK(r.thinking == -1 && r.add_generation_prompt == 0);
    ina_openai_request_release(&r);
    CHECK(all_zero(&r, sizeof r));
    ina_openai_request_release(&r); /* twice is harmless */
  }
  if (accept(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r)) {
    CHECK(r.num_messages == 1 && r.messages[0].role == INA_OPENAI_ROLE_USER &&
          strcmp(r.messages[0].content, "hi") == 0 && r.messages[0].content_len == 2);
    CHECK(!r.prompts && r.num_prompts == 0);
    CHECK(r.max_tokens == -1 && r.temperature == 1 && r.top_p == 1 && r.logprobs == -1);
    CHECK(r.thinking == -1 && r.add_generation_prompt == 1);
    ina_openai_request_release(&r);
  }
  /* Unknown fields and nulls are ignored; white space around the body is fine. */
  if (accept(CMPL, " \n{\"model\":\"m\",\"prompt\":\"x\",\"frobnicate\":[1,{\"a\":\"\\u0000\"}],\"user\":5,"
                   "\"temperature\":null,\"max_tokens\":null,\"stop\":null,\"logprobs\":null,\"seed\":null,"
                   "\"n\":null,\"stream_options\":null,\"min_p\":0.1,\"repetition_penalty\":1.1}\t\r\n",
             &r)) {
    CHECK(r.temperature == 1 && r.max_tokens == -1 && r.num_stop == 0 && r.logprobs == -1 && !r.has_seed);
    ina_openai_request_release(&r);
  }
  ina_openai_request_t *null_req = NULL;
  ina_openai_request_release(null_req);
}

static void test_every_field(void) {
  ina_openai_request_t r;
  if (accept(CMPL,
             "{\"model\":\"deepseek-ai/DeepSeek-V3\",\"prompt\":[\"a\",\"\",\"\\u00e9\\ud83d\\ude00\"],"
             "\"max_tokens\":300,\"temperature\":0,\"top_p\":0.5,\"top_k\":40,\"seed\":-1,"
             "\"stop\":[\"\\n\",\"END\"],\"stop_token_ids\":[1,129279],\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true,\"continuous_usage_stats\":false},"
             "\"logprobs\":20,\"n\":1,\"echo\":false,\"ignore_eos\":true,\"user\":\"u\","
             "\"presence_penalty\":0,\"frequency_penalty\":0.0,\"best_of\":1,\"tools\":[],"
             "\"response_format\":{\"type\":\"text\"},\"logit_bias\":{},\"suffix\":\"\"}",
             &r)) {
    CHECK(strcmp(r.model, "deepseek-ai/DeepSeek-V3") == 0);
    CHECK(r.num_prompts == 3 && strcmp(r.prompts[0].text, "a") == 0 && r.prompts[1].text_len == 0 &&
          strcmp(r.prompts[1].text, "") == 0 && strcmp(r.prompts[2].text, "\xc3\xa9\xf0\x9f\x98\x80") == 0 &&
          r.prompts[2].text_len == 6);
    CHECK(r.max_tokens == 300 && r.temperature == 0 && r.top_p == 0.5 && r.top_k == 40);
    CHECK(r.has_seed && r.seed == UINT64_MAX);
    CHECK(r.num_stop == 2 && strcmp(r.stop[0], "\n") == 0 && r.stop_len[0] == 1 && strcmp(r.stop[1], "END") == 0 &&
          r.stop_len[1] == 3 && !r.stop[2]);
    CHECK(r.num_stop_token_ids == 2 && r.stop_token_ids[0] == 1 && r.stop_token_ids[1] == 129279);
    CHECK(r.stream && r.include_usage && r.logprobs == 20 && r.ignore_eos);
    ina_openai_request_release(&r);
  }
  if (accept(CHAT,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
             "{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"d1\"},{\"type\":\"text\",\"text\":\"d2\"}]},"
             "{\"role\":\"user\",\"content\":[],\"name\":\"bob\"},{\"role\":\"assistant\",\"content\":null},"
             "{\"role\":\"assistant\",\"reasoning_content\":\"r\"},{\"role\":\"assistant\",\"content\":\"a\",\"tool_calls\":[]}],"
             "\"max_tokens\":10,\"max_completion_tokens\":20,\"logprobs\":true,\"top_logprobs\":3,"
             "\"temperature\":2,\"top_p\":1,\"top_k\":-1,\"seed\":9223372036854775807,\"stop\":\"x\","
             "\"chat_template_kwargs\":{\"thinking\":true,\"other\":1},\"add_generation_prompt\":false,"
             "\"stream\":false,\"echo\":true}",
             &r)) {
    CHECK(r.num_messages == 6);
    CHECK(r.messages[0].role == INA_OPENAI_ROLE_SYSTEM && strcmp(r.messages[0].content, "s") == 0);
    CHECK(r.messages[1].role == INA_OPENAI_ROLE_SYSTEM && strcmp(r.messages[1].content, "d1\nd2") == 0 &&
          r.messages[1].content_len == 5);
    CHECK(r.messages[2].role == INA_OPENAI_ROLE_USER && r.messages[2].content && r.messages[2].content_len == 0);
    CHECK(r.messages[3].role == INA_OPENAI_ROLE_ASSISTANT && strcmp(r.messages[3].content, "") == 0);
    CHECK(r.messages[4].role == INA_OPENAI_ROLE_ASSISTANT && strcmp(r.messages[4].content, "") == 0);
    CHECK(strcmp(r.messages[5].content, "a") == 0);
    CHECK(r.max_tokens == 20); /* max_completion_tokens wins */
    CHECK(r.logprobs == 3 && r.temperature == 2 && r.top_p == 1 && r.top_k == 0);
    CHECK(r.has_seed && r.seed == (uint64_t)INT64_MAX);
    CHECK(r.num_stop == 1 && strcmp(r.stop[0], "x") == 0);
    CHECK(r.thinking == 1 && r.add_generation_prompt == 0 && !r.stream);
    ina_openai_request_release(&r);
  }
  /* Chat: logprobs true alone is 0 alternatives; false is none; enable_thinking. */
  if (accept(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"logprobs\":true,"
                   "\"chat_template_kwargs\":{\"enable_thinking\":false},\"max_tokens\":7}", &r)) {
    CHECK(r.logprobs == 0 && r.thinking == 0 && r.max_tokens == 7);
    ina_openai_request_release(&r);
  }
  if (accept(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"logprobs\":false,"
                   "\"chat_template_kwargs\":{\"enable_thinking\":true,\"thinking\":true},"
                   "\"top_logprobs\":null,\"max_completion_tokens\":5}", &r)) {
    CHECK(r.logprobs == -1 && r.thinking == 1 && r.max_tokens == 5);
    ina_openai_request_release(&r);
  }
  /* Completions: logprobs 0, integral reals for integers, an empty stop list, top_k 0. */
  if (accept(CMPL, "{\"model\":\"\",\"prompt\":\"\",\"logprobs\":0,\"max_tokens\":16.0,\"top_k\":0,\"stop\":[],"
                   "\"seed\":0,\"stream\":true,\"stream_options\":{},\"max_completion_tokens\":0,"
                   "\"top_logprobs\":99,\"chat_template_kwargs\":5,\"add_generation_prompt\":3}", &r)) {
    CHECK(r.logprobs == 0 && r.max_tokens == 16 && r.top_k == 0 && r.num_stop == 0 && r.has_seed &&
          r.seed == 0 && r.stream && !r.include_usage && strcmp(r.model, "") == 0);
    CHECK(r.num_prompts == 1 && r.prompts[0].text && r.prompts[0].text_len == 0);
    CHECK(r.thinking == -1); /* chat-only fields are unknown to completions */
    ina_openai_request_release(&r);
  }
  if (accept(CMPL, "{\"model\":\"m\",\"prompt\":\"p\",\"stop\":[\"a\",\"b\",\"c\",\"d\"],\"top_p\":1e-9,"
                   "\"temperature\":1.5,\"stop_token_ids\":[]}", &r)) {
    CHECK(r.num_stop == 4 && strcmp(r.stop[3], "d") == 0 && r.top_p == 1e-9 && r.temperature == 1.5 &&
          !r.stop_token_ids && r.num_stop_token_ids == 0);
    ina_openai_request_release(&r);
  }
}

static void test_prompt_forms(void) {
  ina_openai_request_t r;
  if (accept(CMPL, "{\"model\":\"m\",\"prompt\":[0,5,129279]}", &r)) {
    CHECK(r.num_prompts == 1 && !r.prompts[0].text && r.prompts[0].num_ids == 3 && r.prompts[0].ids[0] == 0 &&
          r.prompts[0].ids[1] == 5 && r.prompts[0].ids[2] == 129279);
    ina_openai_request_release(&r);
  }
  if (accept(CMPL, "{\"model\":\"m\",\"prompt\":[[1],[2,3.0,4]]}", &r)) {
    CHECK(r.num_prompts == 2 && r.prompts[0].num_ids == 1 && r.prompts[0].ids[0] == 1 && !r.prompts[0].text &&
          r.prompts[1].num_ids == 3 && r.prompts[1].ids[1] == 3 && r.prompts[1].ids[2] == 4);
    ina_openai_request_release(&r);
  }
  /* INA_OPENAI_MAX_PROMPTS prompts pass; a long list of ids is one prompt. */
  char body[8192];
  int n = snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":[");
  for (int i = 0; i < INA_OPENAI_MAX_PROMPTS; i++) n += snprintf(body + n, sizeof body - n, "%s\"p%d\"", i ? "," : "", i);
  snprintf(body + n, sizeof body - n, "]}");
  if (accept(CMPL, body, &r)) {
    CHECK(r.num_prompts == INA_OPENAI_MAX_PROMPTS && strcmp(r.prompts[63].text, "p63") == 0);
    ina_openai_request_release(&r);
  }
  n = snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":[");
  for (int i = 0; i < 500; i++) n += snprintf(body + n, sizeof body - n, "%s%d", i ? "," : "", i);
  snprintf(body + n, sizeof body - n, "]}");
  if (accept(CMPL, body, &r)) {
    CHECK(r.num_prompts == 1 && r.prompts[0].num_ids == 500 && r.prompts[0].ids[499] == 499);
    ina_openai_request_release(&r);
  }
  /* One more prompt is refused, as strings and as lists of ids. */
  n = snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":[");
  for (int i = 0; i <= INA_OPENAI_MAX_PROMPTS; i++) n += snprintf(body + n, sizeof body - n, "%s\"p\"", i ? "," : "");
  snprintf(body + n, sizeof body - n, "]}");
  refuse(CMPL, body, 400, "prompt", "65 prompts");
  n = snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":[");
  for (int i = 0; i <= INA_OPENAI_MAX_PROMPTS; i++) n += snprintf(body + n, sizeof body - n, "%s[1]", i ? "," : "");
  snprintf(body + n, sizeof body - n, "]}");
  refuse(CMPL, body, 400, "prompt", "64");

  /* vocab_size 0 leaves ids unchecked above (but int32 and >= 0). */
  ina_openai_error_t err;
  const char *big = "{\"model\":\"m\",\"prompt\":[2147483647]}";
  CHECK(ina_openai_parse_request(CMPL, big, strlen(big), 0, 0, &r, &err) == INA_OK && r.prompts[0].ids[0] == INT32_MAX);
  ina_openai_request_release(&r);
  const char *bigger = "{\"model\":\"m\",\"prompt\":[2147483648]}";
  CHECK(ina_openai_parse_request(CMPL, bigger, strlen(bigger), 0, 0, &r, &err) == INA_ERR_INVALID_ARGUMENT &&
        strcmp(err.param, "prompt[0]") == 0);
  const char *small = "{\"model\":\"m\",\"prompt\":[15,16]}";
  CHECK(ina_openai_parse_request(CMPL, small, strlen(small), 16, 0, &r, &err) == INA_ERR_INVALID_ARGUMENT &&
        strcmp(err.param, "prompt[1]") == 0 && strstr(err.message, "[0, 16)"));
}

/* Bodies one rule away from valid: status, param, and a text the message must hold. */
typedef struct {
  ina_openai_endpoint_t ep;
  const char *body, *param, *names;
} refusal_t;

#define C "{\"model\":\"m\",\"prompt\":\"p\","
#define M "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"

static const refusal_t kRefusals[] = {
    /* the body */
    {INA_OPENAI_COMPLETIONS, "", "", "not valid JSON"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"p\"} x", "", "not valid JSON"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"p\"}{}", "", "not valid JSON"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"p\",}", "", "not valid JSON"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"model\":\"n\",\"prompt\":\"p\"}", "", "duplicate"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"\xff\"}", "", "not valid JSON"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"\\ud800\"}", "", "not valid JSON"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":NaN}", "", "not valid JSON"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"p\",\"seed\":9223372036854775808}", "", "not valid JSON"},
    {INA_OPENAI_COMPLETIONS, "[1,2]", "", "JSON object, not a list"},
    {INA_OPENAI_COMPLETIONS, "\"text\"", "", "JSON object, not \"text\""},
    {INA_OPENAI_CHAT, "null", "", "JSON object, not null"},
    /* model */
    {INA_OPENAI_COMPLETIONS, "{\"prompt\":\"p\"}", "model", "model: required"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":null,\"prompt\":\"p\"}", "model", "model: required"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":7,\"prompt\":\"p\"}", "model", "model: must be a string, not 7"},
    {INA_OPENAI_CHAT, "{\"model\":\"a\\u0000b\",\"messages\":[]}", "model", "NUL"},
    /* prompt */
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\"}", "prompt", "prompt: required"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[]}", "prompt", "prompt: must not be an empty list"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":5}", "prompt", "prompt: must be a string or a list"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":{}}", "prompt", "not an object"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[true]}", "prompt[0]", "not true"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[\"a\",\"b\",\"c\",4]}", "prompt[3]", "not 4"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[1,2,\"x\"]}", "prompt[2]", "token id"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[1,-1]}", "prompt[1]", "-1"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[1,1.5]}", "prompt[1]", "integer, not 1.5"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[1,129280]}", "prompt[1]", "129280 is out of range [0, 129280)"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[[1],[]]}", "prompt[1]", "empty list"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[[1],[2,-3]]}", "prompt[1][1]", "-3"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[[1],\"x\"]}", "prompt[1]", "list of token ids"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[[\"x\"]]}", "prompt[0][0]", "token id"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[\"ok\",\"a\\u0000\"]}", "prompt[1]", "NUL"},
    {INA_OPENAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"\\u0000\"}", "prompt", "U+0000"},
    /* messages */
    {INA_OPENAI_CHAT, "{\"model\":\"m\"}", "messages", "messages: required"},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[]}", "messages", "empty list"},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":\"hi\"}", "messages", "not \"hi\""},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[\"hi\"]}", "messages[0]", "must be an object"},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}", "messages[0].role", "required"},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":1,\"content\":\"x\"}]}", "messages[0].role", "not 1"},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"robot\",\"content\":\"x\"}]}",
     "messages[1].role", "\"robot\" is not one of"},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages[0].role", "\"tool\""},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"User\",\"content\":\"x\"}]}", "messages[0].role", "\"User\""},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\\u0000\",\"content\":\"x\"}]}", "messages[0].role", "not one of"},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}", "messages[0].content", "required"},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":null}]}", "messages[0].content", "required"},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":3}]}", "messages[0].content", "not 3"},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000\"}]}", "messages[0].content", "NUL"},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[\"x\"]}]}", "messages[0].content[0]", "object"},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]}",
     "messages[0].content[0].type", "required"},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"user\",\"content\":"
                      "[{\"type\":\"text\",\"text\":\"x\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"u\"}}]}]}",
     "messages[1].content[1].type", "messages[1].content[1]: \"image_url\" parts are not supported"},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
     "messages[0].content[0].text", "required"},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":1}]}]}",
     "messages[0].content[0].text", "not 1"},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"user\",\"content\":"
                      "[{\"type\":\"text\",\"text\":\"x\"},{\"type\":\"text\",\"text\":\"\\u0000\"}]}]}",
     "messages[1].content[1].text", "NUL"},
    {INA_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":\"a\",\"tool_calls\":[{\"id\":\"c\"}]}]}",
     "messages[0].tool_calls", "tool calls"},
    /* max_tokens, max_completion_tokens */
    {INA_OPENAI_COMPLETIONS, C "\"max_tokens\":0}", "max_tokens", "max_tokens: 0 is less than 1"},
    {INA_OPENAI_COMPLETIONS, C "\"max_tokens\":-5}", "max_tokens", "-5"},
    {INA_OPENAI_COMPLETIONS, C "\"max_tokens\":\"16\"}", "max_tokens", "integer, not \"16\""},
    {INA_OPENAI_COMPLETIONS, C "\"max_tokens\":2.5}", "max_tokens", "2.5"},
    {INA_OPENAI_COMPLETIONS, C "\"max_tokens\":1e300}", "max_tokens", "1e+300"},
    {INA_OPENAI_COMPLETIONS, C "\"max_tokens\":true}", "max_tokens", "not true"},
    {INA_OPENAI_CHAT, M "\"max_completion_tokens\":0}", "max_completion_tokens", "0 is less than 1"},
    {INA_OPENAI_CHAT, M "\"max_tokens\":0,\"max_completion_tokens\":5}", "max_tokens", NULL},
    {INA_OPENAI_CHAT, M "\"max_tokens\":5,\"max_completion_tokens\":[]}", "max_completion_tokens", "not a list"},
    /* temperature, top_p, top_k */
    {INA_OPENAI_COMPLETIONS, C "\"temperature\":3.5}", "temperature", "temperature: 3.5 is out of range [0, 2]"},
    {INA_OPENAI_COMPLETIONS, C "\"temperature\":-0.1}", "temperature", "-0.1"},
    {INA_OPENAI_COMPLETIONS, C "\"temperature\":2.0000001}", "temperature", "2.0000001"},
    {INA_OPENAI_CHAT, M "\"temperature\":\"hot\"}", "temperature", "must be a number, not \"hot\""},
    {INA_OPENAI_COMPLETIONS, C "\"top_p\":0}", "top_p", "top_p: 0 is out of range (0, 1]"},
    {INA_OPENAI_COMPLETIONS, C "\"top_p\":1.01}", "top_p", "1.01"},
    {INA_OPENAI_CHAT, M "\"top_p\":null,\"top_k\":-2}", "top_k", "top_k: -2"},
    {INA_OPENAI_COMPLETIONS, C "\"top_k\":2147483648}", "top_k", "2147483648"},
    {INA_OPENAI_COMPLETIONS, C "\"top_k\":1.5}", "top_k", "1.5"},
    /* seed */
    {INA_OPENAI_COMPLETIONS, C "\"seed\":\"42\"}", "seed", "seed: must be an integer, not \"42\""},
    {INA_OPENAI_COMPLETIONS, C "\"seed\":0.5}", "seed", "0.5"},
    {INA_OPENAI_COMPLETIONS, C "\"seed\":1e19}", "seed", "1e+19"},
    /* stop, stop_token_ids */
    {INA_OPENAI_COMPLETIONS, C "\"stop\":\"\"}", "stop", "stop: must not be an empty string"},
    {INA_OPENAI_COMPLETIONS, C "\"stop\":5}", "stop", "not 5"},
    {INA_OPENAI_COMPLETIONS, C "\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop", "5 strings"},
    {INA_OPENAI_COMPLETIONS, C "\"stop\":[\"a\",\"b\",3]}", "stop[2]", "stop[2]: must be a string, not 3"},
    {INA_OPENAI_CHAT, M "\"stop\":[\"a\",\"\"]}", "stop[1]", "empty"},
    {INA_OPENAI_CHAT, M "\"stop\":[\"\\u0000\"]}", "stop[0]", "NUL"},
    {INA_OPENAI_COMPLETIONS, C "\"stop_token_ids\":7}", "stop_token_ids", "not 7"},
    {INA_OPENAI_COMPLETIONS, C "\"stop_token_ids\":[1,200000]}", "stop_token_ids[1]", "200000"},
    {INA_OPENAI_COMPLETIONS, C "\"stop_token_ids\":[null]}", "stop_token_ids[0]", "null"},
    /* stream, stream_options */
    {INA_OPENAI_COMPLETIONS, C "\"stream\":1}", "stream", "stream: must be true or false, not 1"},
    {INA_OPENAI_COMPLETIONS, C "\"stream\":\"true\"}", "stream", "\"true\""},
    {INA_OPENAI_COMPLETIONS, C "\"stream_options\":{\"include_usage\":true}}", "stream_options", "only allowed when stream is true"},
    {INA_OPENAI_CHAT, M "\"stream\":false,\"stream_options\":{}}", "stream_options", "stream is true"},
    {INA_OPENAI_CHAT, M "\"stream\":true,\"stream_options\":true}", "stream_options", "object"},
    {INA_OPENAI_CHAT, M "\"stream\":true,\"stream_options\":{\"include_usage\":\"yes\"}}", "stream_options.include_usage", "\"yes\""},
    /* logprobs, top_logprobs */
    {INA_OPENAI_COMPLETIONS, C "\"logprobs\":21}", "logprobs", "logprobs: 21 is out of range [0, 20]"},
    {INA_OPENAI_COMPLETIONS, C "\"logprobs\":-1}", "logprobs", "-1"},
    {INA_OPENAI_COMPLETIONS, C "\"logprobs\":true}", "logprobs", "logprobs: must be an integer (0 to 20) or null, not true"},
    {INA_OPENAI_CHAT, M "\"logprobs\":5}", "logprobs", "must be true or false, not 5"},
    {INA_OPENAI_CHAT, M "\"top_logprobs\":2}", "top_logprobs", "needs logprobs to be true"},
    {INA_OPENAI_CHAT, M "\"logprobs\":false,\"top_logprobs\":0}", "top_logprobs", "logprobs"},
    {INA_OPENAI_CHAT, M "\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs", "21"},
    {INA_OPENAI_CHAT, M "\"logprobs\":true,\"top_logprobs\":-1}", "top_logprobs", "-1"},
    {INA_OPENAI_CHAT, M "\"logprobs\":true,\"top_logprobs\":\"3\"}", "top_logprobs", "\"3\""},
    /* n, echo, ignore_eos */
    {INA_OPENAI_COMPLETIONS, C "\"n\":2}", "n", "n: 2 is not supported by this server (only 1)"},
    {INA_OPENAI_CHAT, M "\"n\":0}", "n", "n: 0"},
    {INA_OPENAI_CHAT, M "\"n\":\"1\"}", "n", "\"1\""},
    {INA_OPENAI_COMPLETIONS, C "\"echo\":true}", "echo", "echo: true is not supported"},
    {INA_OPENAI_COMPLETIONS, C "\"echo\":0}", "echo", "not 0"},
    {INA_OPENAI_COMPLETIONS, C "\"ignore_eos\":\"no\"}", "ignore_eos", "\"no\""},
    /* the unsupported */
    {INA_OPENAI_COMPLETIONS, C "\"presence_penalty\":0.5}", "presence_penalty", "presence_penalty: 0.5 is not supported"},
    {INA_OPENAI_CHAT, M "\"frequency_penalty\":-1}", "frequency_penalty", "-1 is not supported"},
    {INA_OPENAI_CHAT, M "\"frequency_penalty\":\"0\"}", "frequency_penalty", "number"},
    {INA_OPENAI_COMPLETIONS, C "\"best_of\":2}", "best_of", "best_of: 2 is not supported"},
    {INA_OPENAI_COMPLETIONS, C "\"suffix\":\"s\"}", "suffix", "not supported"},
    {INA_OPENAI_COMPLETIONS, C "\"suffix\":1}", "suffix", "not 1"},
    {INA_OPENAI_CHAT, M "\"tools\":[{\"type\":\"function\"}]}", "tools", "tool calling"},
    {INA_OPENAI_CHAT, M "\"tools\":{}}", "tools", "list"},
    {INA_OPENAI_CHAT, M "\"functions\":[{\"name\":\"f\"}]}", "functions", "not supported"},
    {INA_OPENAI_CHAT, M "\"response_format\":{\"type\":\"json_object\"}}", "response_format.type", "\"json_object\" is not supported"},
    {INA_OPENAI_CHAT, M "\"response_format\":{}}", "response_format.type", "required"},
    {INA_OPENAI_CHAT, M "\"response_format\":\"text\"}", "response_format", "object"},
    {INA_OPENAI_CHAT, M "\"logit_bias\":{\"50256\":-100}}", "logit_bias", "not supported"},
    {INA_OPENAI_CHAT, M "\"logit_bias\":[]}", "logit_bias", "object"},
    /* chat options */
    {INA_OPENAI_CHAT, M "\"chat_template_kwargs\":[]}", "chat_template_kwargs", "object"},
    {INA_OPENAI_CHAT, M "\"chat_template_kwargs\":{\"thinking\":1}}", "chat_template_kwargs.thinking", "not 1"},
    {INA_OPENAI_CHAT, M "\"chat_template_kwargs\":{\"enable_thinking\":\"on\"}}", "chat_template_kwargs.enable_thinking", "\"on\""},
    {INA_OPENAI_CHAT, M "\"chat_template_kwargs\":{\"thinking\":true,\"enable_thinking\":false}}",
     "chat_template_kwargs.enable_thinking", "contradicts"},
    {INA_OPENAI_CHAT, M "\"add_generation_prompt\":1}", "add_generation_prompt", "not 1"},
};

static void test_refusals(void) {
  for (size_t i = 0; i < sizeof kRefusals / sizeof kRefusals[0]; i++)
    refuse(kRefusals[i].ep, kRefusals[i].body, 400, kRefusals[i].param, kRefusals[i].names);

  /* A long string is quoted cut, on a character boundary. */
  char body[512];
  snprintf(body, sizeof body, M "\"temperature\":\"%s\"}",
           "\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9"
           "\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9");
  refuse(CHAT, body, 400, "temperature", "...\"");
  ina_openai_request_t r;
  ina_openai_error_t err;
  CHECK(ina_openai_parse_request(CHAT, body, strlen(body), VOCAB, 0, &r, &err) == INA_ERR_INVALID_ARGUMENT);
  const char *q = strchr(err.message, '"');
  CHECKF(q && strlen(q) == 1 + 40 + 3 + 1 && ina_openai_text_chars(q, strlen(q)) == 1 + 20 + 3 + 1,
         "cut quote: %s", err.message);

  /* The size limit: 413, before any parsing. */
  const char *ok = "{\"model\":\"m\",\"prompt\":\"p\"}";
  memset(&r, 0x5a, sizeof r);
  CHECK(ina_openai_parse_request(CMPL, ok, strlen(ok), VOCAB, strlen(ok) - 1, &r, &err) == INA_ERR_INVALID_ARGUMENT);
  CHECK(err.http_status == 413 && strcmp(err.type, "invalid_request_error") == 0 && err.param[0] == '\0' &&
        strstr(err.message, "limit") && all_zero(&r, sizeof r));
  CHECK(ina_openai_parse_request(CMPL, ok, strlen(ok), VOCAB, strlen(ok), &r, &err) == INA_OK);
  ina_openai_request_release(&r);
  /* The body need not be NUL-terminated: only len bytes are read. */
  char unterminated[64];
  memcpy(unterminated, ok, strlen(ok));
  memset(unterminated + strlen(ok), '}', sizeof unterminated - strlen(ok));
  CHECK(ina_openai_parse_request(CMPL, unterminated, strlen(ok), VOCAB, 0, &r, &err) == INA_OK);
  ina_openai_request_release(&r);
  /* The endpoint decides the fields: a chat body to completions and back. */
  refuse(CMPL, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", 400, "prompt", NULL);
  refuse(CHAT, "{\"model\":\"m\",\"prompt\":\"p\"}", 400, "messages", NULL);
  /* Invalid calls. */
  CHECK(ina_openai_parse_request(CMPL, ok, strlen(ok), VOCAB, 0, NULL, &err) == INA_ERR_INVALID_ARGUMENT &&
        err.http_status == 500);
  CHECK(ina_openai_parse_request(CMPL, NULL, 3, VOCAB, 0, &r, &err) == INA_ERR_INVALID_ARGUMENT && all_zero(&r, sizeof r));
  CHECK(ina_openai_parse_request((ina_openai_endpoint_t)7, ok, strlen(ok), VOCAB, 0, &r, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_openai_parse_request(CMPL, NULL, 0, VOCAB, 0, &r, &err) == INA_ERR_INVALID_ARGUMENT &&
        err.http_status == 400);
}

/* ---- errors ---------------------------------------------------------------------------- */

static json_t *parse_back(char *text) {
  CHECKF(text != NULL, "rendered nothing");
  if (!text) return json_null();
  json_error_t e;
  json_t *doc = json_loads(text, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &e);
  CHECKF(doc != NULL, "not JSON (%s): %s", e.text, text);
  if (doc) {
    /* Compact, keys in the order written: jansson writes the document back the same. */
    char *again = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    CHECKF(again && strcmp(again, text) == 0, "not compact: %s", text);
    free(again);
  }
  free(text);
  return doc ? doc : json_null();
}

static const char *str_at(const json_t *o, const char *key) { return json_string_value(json_object_get(o, key)); }
static json_int_t int_at(const json_t *o, const char *key) { return json_integer_value(json_object_get(o, key)); }

/* The keys of o, in order, joined with ','. */
static void keys_of(const json_t *o, char *buf, size_t size) {
  buf[0] = '\0';
  const char *key;
  json_t *v;
  size_t n = 0;
  json_object_foreach((json_t *)o, key, v) {
    (void)v;
    n += snprintf(buf + n, n < size ? size - n : 0, "%s%s", n ? "," : "", key);
  }
}

#define CHECK_KEYS(o, want)                                                              \
  do {                                                                                   \
    char keys_[256];                                                                     \
    keys_of((o), keys_, sizeof keys_);                                                   \
    CHECKF(strcmp(keys_, (want)) == 0, "keys %s, not %s", keys_, (want));                \
  } while (0)

static void test_errors(void) {
  ina_openai_error_t err;
  memset(&err, 0x5a, sizeof err);
  CHECK(ina_openai_error_set(&err, 404, "model", "model: \"%s\" does not exist", "x") == 404);
  CHECK(err.http_status == 404 && strcmp(err.type, "not_found_error") == 0 && strcmp(err.param, "model") == 0 &&
        strcmp(err.message, "model: \"x\" does not exist") == 0);
  json_t *doc = parse_back(ina_openai_render_error(&err));
  const json_t *e = json_object_get(doc, "error");
  CHECK_KEYS(doc, "error");
  CHECK_KEYS(e, "message,type,param,code");
  CHECK(str_at(e, "message") && strcmp(str_at(e, "message"), "model: \"x\" does not exist") == 0);
  CHECK(str_at(e, "type") && strcmp(str_at(e, "type"), "not_found_error") == 0);
  CHECK(str_at(e, "param") && strcmp(str_at(e, "param"), "model") == 0);
  CHECK(str_at(e, "code") && strcmp(str_at(e, "code"), "404") == 0);
  json_decref(doc);

  static const struct {
    int status;
    const char *type;
  } types[] = {{400, "invalid_request_error"}, {401, "authentication_error"}, {404, "not_found_error"},
               {405, "invalid_request_error"}, {413, "invalid_request_error"}, {429, "rate_limit_error"},
               {500, "server_error"},          {503, "server_error"}};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    ina_openai_error_set(&err, types[i].status, NULL, "busy");
    CHECK(strcmp(err.type, types[i].type) == 0 && err.param[0] == '\0');
    doc = parse_back(ina_openai_render_error(&err));
    e = json_object_get(doc, "error");
    CHECK(json_is_null(json_object_get(e, "param")) && strcmp(str_at(e, "type"), types[i].type) == 0);
    char code[8];
    snprintf(code, sizeof code, "%d", types[i].status);
    CHECK(strcmp(str_at(e, "code"), code) == 0);
    json_decref(doc);
  }
  /* Messages and params too long are cut on a character boundary; controls and quotes
   * are escaped; the result is valid JSON. */
  char longer[1200];
  for (size_t i = 0; i + 2 < sizeof longer; i += 2) memcpy(longer + i, "\xc3\xa9", 2);
  longer[sizeof longer - 2] = '\0';
  ina_openai_error_set(&err, 400, "a.very.long.parameter.path.that.goes.on.and.on.and.on.beyond.sixty.four.bytes",
                       "\"quoted\"\n\t%s", longer);
  CHECK(strlen(err.param) == 63 && strlen(err.message) < 512);
  CHECK(ina_openai_text_chars(err.message, strlen(err.message)) == 10 + (strlen(err.message) - 10) / 2);
  doc = parse_back(ina_openai_render_error(&err));
  e = json_object_get(doc, "error");
  CHECK(str_at(e, "message") && strcmp(str_at(e, "message"), err.message) == 0);
  json_decref(doc);
  /* A message with ill-formed bytes (set by a caller) still renders valid JSON. */
  ina_openai_error_set(&err, 500, "x\xff", "bad \xc3 byte");
  doc = parse_back(ina_openai_render_error(&err));
  e = json_object_get(doc, "error");
  CHECK(str_at(e, "message") && strcmp(str_at(e, "message"), "bad \xef\xbf\xbd byte") == 0);
  CHECK(str_at(e, "param") && strcmp(str_at(e, "param"), "x\xef\xbf\xbd") == 0);
  json_decref(doc);
  CHECK(ina_openai_render_error(NULL) == NULL);
  CHECK(ina_openai_error_set(NULL, 503, NULL, "x") == 503);

  /* A parser refusal renders as OpenAI's error body. */
  ina_openai_request_t r;
  const char *body = "{\"model\":\"m\",\"prompt\":\"p\",\"temperature\":3.5}";
  CHECK(ina_openai_parse_request(CMPL, body, strlen(body), VOCAB, 0, &r, &err) == INA_ERR_INVALID_ARGUMENT);
  doc = parse_back(ina_openai_render_error(&err));
  e = json_object_get(doc, "error");
  CHECK(strcmp(str_at(e, "message"), "temperature: 3.5 is out of range [0, 2]") == 0);
  CHECK(strcmp(str_at(e, "param"), "temperature") == 0 && strcmp(str_at(e, "code"), "400") == 0 &&
        strcmp(str_at(e, "type"), "invalid_request_error") == 0);
  json_decref(doc);
}

/* ---- answers --------------------------------------------------------------------------- */

static void check_usage(const json_t *u, json_int_t prompt, json_int_t completion, json_int_t cached) {
  CHECK_KEYS(u, "prompt_tokens,completion_tokens,total_tokens,prompt_tokens_details");
  CHECK(int_at(u, "prompt_tokens") == prompt && int_at(u, "completion_tokens") == completion &&
        int_at(u, "total_tokens") == prompt + completion);
  const json_t *d = json_object_get(u, "prompt_tokens_details");
  CHECK_KEYS(d, "cached_tokens");
  CHECK(int_at(d, "cached_tokens") == cached);
}

static int is_real(const json_t *v, double want) { return json_is_real(v) && json_real_value(v) == want; }

static void test_models(void) {
  json_t *doc = parse_back(ina_openai_render_models("deepseek-ai/DeepSeek-V3", 1700000000, 163840));
  CHECK_KEYS(doc, "object,data");
  CHECK(strcmp(str_at(doc, "object"), "list") == 0 && json_array_size(json_object_get(doc, "data")) == 1);
  const json_t *m = json_array_get(json_object_get(doc, "data"), 0);
  CHECK_KEYS(m, "id,object,created,owned_by,max_model_len");
  CHECK(strcmp(str_at(m, "id"), "deepseek-ai/DeepSeek-V3") == 0 && strcmp(str_at(m, "object"), "model") == 0 &&
        int_at(m, "created") == 1700000000 && strcmp(str_at(m, "owned_by"), "ina") == 0 &&
        int_at(m, "max_model_len") == 163840);
  json_decref(doc);
  CHECK(ina_openai_render_models(NULL, 0, 0) == NULL);
}

/* Two generated tokens: "Hi" and an ill-formed "\xe4\xbd" (the first two bytes of 你),
 * with alternatives; the second token's alternatives hold a NUL and two texts that both
 * render as U+FFFD. */
static const char *const kTop0[] = {"Hi", "Hello"};
static const size_t kTop0Lens[] = {2, 5};
static const float kTop0Lp[] = {-0.1f, -2.5f};
static const char *const kTop1[] = {"\xe4\xbd", "a\0b", "\xff"};
static const size_t kTop1Lens[] = {2, 3, 1};
static const float kTop1Lp[] = {-0.5f, -1.0f, -3.0f};
static const ina_openai_logprob_t kLogprobs[] = {
    {"Hi", 2, -0.1f, 2, kTop0, kTop0Lens, kTop0Lp},
    {"\xe4\xbd", 2, -0.5f, 3, kTop1, kTop1Lens, kTop1Lp},
};
/* The same without the NUL alternative, for the completions' {token: logprob} objects
 * (jansson, which reads the answers back here, refuses NUL in keys; the key is valid
 * JSON and checked as text). */
static const char *const kTop1NoNul[] = {"\xe4\xbd", "b", "\xff"};
static const size_t kTop1NoNulLens[] = {2, 1, 1};
static const ina_openai_logprob_t kLogprobsNoNul[] = {
    {"Hi", 2, -0.1f, 2, kTop0, kTop0Lens, kTop0Lp},
    {"\xe4\xbd", 2, -0.5f, 3, kTop1NoNul, kTop1NoNulLens, kTop1Lp},
};

static void check_bytes(const json_t *b, const char *s, size_t n) {
  CHECK(json_is_array(b) && json_array_size(b) == n);
  for (size_t i = 0; i < n && i < json_array_size(b); i++)
    CHECK(json_integer_value(json_array_get(b, i)) == (unsigned char)s[i]);
}

static void test_completion_response(void) {
  const ina_openai_choice_t choices[] = {
      {"Hi\xe4\xbd", 4, NULL, 0, "length", kLogprobsNoNul, 2},
      {"plain \"quoted\"\n", 15, NULL, 0, NULL, NULL, 0},
      {NULL, 0, NULL, 0, "stop", NULL, 0},
  };
  const ina_openai_usage_t usage = {.prompt_tokens = 12, .completion_tokens = 2, .cached_tokens = 8};
  json_t *doc = parse_back(ina_openai_render_response(CMPL, "cmpl-1", 1733140800, "m", choices, 3, &usage));
  CHECK_KEYS(doc, "id,object,created,model,choices,usage");
  CHECK(strcmp(str_at(doc, "id"), "cmpl-1") == 0 && strcmp(str_at(doc, "object"), "text_completion") == 0 &&
        json_is_integer(json_object_get(doc, "created")) && int_at(doc, "created") == 1733140800 &&
        strcmp(str_at(doc, "model"), "m") == 0);
  const json_t *arr = json_object_get(doc, "choices");
  CHECK(json_array_size(arr) == 3);
  const json_t *c0 = json_array_get(arr, 0), *c1 = json_array_get(arr, 1), *c2 = json_array_get(arr, 2);
  CHECK_KEYS(c0, "index,text,logprobs,finish_reason");
  CHECK(int_at(c0, "index") == 0 && int_at(c1, "index") == 1 && int_at(c2, "index") == 2);
  CHECK(strcmp(str_at(c0, "text"), "Hi\xef\xbf\xbd") == 0 && strcmp(str_at(c0, "finish_reason"), "length") == 0);
  CHECK(strcmp(str_at(c1, "text"), "plain \"quoted\"\n") == 0 && json_is_null(json_object_get(c1, "finish_reason")) &&
        json_is_null(json_object_get(c1, "logprobs")));
  CHECK(strcmp(str_at(c2, "text"), "") == 0 && strcmp(str_at(c2, "finish_reason"), "stop") == 0);
  const json_t *lp = json_object_get(c0, "logprobs");
  CHECK_KEYS(lp, "tokens,token_logprobs,top_logprobs,text_offset");
  const json_t *tokens = json_object_get(lp, "tokens"), *tlp = json_object_get(lp, "token_logprobs"),
               *top = json_object_get(lp, "top_logprobs"), *off = json_object_get(lp, "text_offset");
  CHECK(json_array_size(tokens) == 2 && strcmp(json_string_value(json_array_get(tokens, 0)), "Hi") == 0 &&
        strcmp(json_string_value(json_array_get(tokens, 1)), "\xef\xbf\xbd") == 0);
  CHECK(is_real(json_array_get(tlp, 0), -0.1) && is_real(json_array_get(tlp, 1), -0.5));
  CHECK(json_array_size(off) == 2 && json_integer_value(json_array_get(off, 0)) == 0 &&
        json_integer_value(json_array_get(off, 1)) == 2);
  const json_t *t0 = json_array_get(top, 0), *t1 = json_array_get(top, 1);
  CHECK_KEYS(t0, "Hi,Hello");
  CHECK(is_real(json_object_get(t0, "Hi"), -0.1) && is_real(json_object_get(t0, "Hello"), -2.5));
  /* "\xe4\xbd" and "\xff" both render as U+FFFD: the first (likelier) is kept; "a\0b" keeps its NUL. */
  CHECK_KEYS(t1, "\xef\xbf\xbd,b");
  CHECK(is_real(json_object_get(t1, "\xef\xbf\xbd"), -0.5) && is_real(json_object_get(t1, "b"), -1.0));
  check_usage(json_object_get(doc, "usage"), 12, 2, 8);
  json_decref(doc);
  const ina_openai_choice_t nul = {"x", 1, NULL, 0, NULL, kLogprobs, 2};
  char *text = ina_openai_render_response(CMPL, "c", 0, "m", &nul, 1, NULL);
  CHECKF(text && strstr(text, "{\"\xef\xbf\xbd\":-0.5,\"a\\u0000b\":-1.0}"), "NUL key: %s", text);
  free(text);

  /* No choices, no usage. */
  doc = parse_back(ina_openai_render_response(CMPL, "c", 0, "m", NULL, 0, NULL));
  CHECK_KEYS(doc, "id,object,created,model,choices");
  CHECK(json_is_array(json_object_get(doc, "choices")) && json_array_size(json_object_get(doc, "choices")) == 0);
  json_decref(doc);
  /* Invalid arguments. */
  const ina_openai_choice_t bad_text = {NULL, 3, NULL, 0, NULL, NULL, 0};
  const ina_openai_logprob_t too_many = {"x", 1, -1.0f, INA_OPENAI_MAX_LOGPROBS + 1, kTop0, kTop0Lens, kTop0Lp};
  const ina_openai_logprob_t no_tops = {"x", 1, -1.0f, 1, NULL, NULL, NULL};
  const ina_openai_choice_t bad_lp = {"x", 1, NULL, 0, NULL, &too_many, 1};
  const ina_openai_choice_t bad_lp2 = {"x", 1, NULL, 0, NULL, &no_tops, 1};
  CHECK(ina_openai_render_response(CMPL, NULL, 0, "m", choices, 1, NULL) == NULL);
  CHECK(ina_openai_render_response(CMPL, "c", 0, NULL, choices, 1, NULL) == NULL);
  CHECK(ina_openai_render_response(CMPL, "c", 0, "m", NULL, 1, NULL) == NULL);
  CHECK(ina_openai_render_response(CMPL, "c", 0, "m", &bad_text, 1, NULL) == NULL);
  CHECK(ina_openai_render_response(CHAT, "c", 0, "m", &bad_lp, 1, NULL) == NULL);
  CHECK(ina_openai_render_response(CHAT, "c", 0, "m", &bad_lp2, 1, NULL) == NULL);
  CHECK(ina_openai_render_response((ina_openai_endpoint_t)5, "c", 0, "m", choices, 1, NULL) == NULL);
}

static void test_chat_response(void) {
  const ina_openai_choice_t choices[] = {
      {"Hi\xe4\xbd", 4, "think \xff", 7, "stop", kLogprobs, 2},
      {NULL, 0, NULL, 0, "length", NULL, 0},
  };
  const ina_openai_usage_t usage = {.prompt_tokens = 5, .completion_tokens = 0, .cached_tokens = 0};
  json_t *doc = parse_back(ina_openai_render_response(CHAT, "chatcmpl-7", -1, "m\xc3", choices, 2, &usage));
  CHECK_KEYS(doc, "id,object,created,model,choices,usage");
  CHECK(strcmp(str_at(doc, "object"), "chat.completion") == 0 && int_at(doc, "created") == -1 &&
        strcmp(str_at(doc, "model"), "m\xef\xbf\xbd") == 0 && strcmp(str_at(doc, "id"), "chatcmpl-7") == 0);
  const json_t *c0 = json_array_get(json_object_get(doc, "choices"), 0);
  const json_t *c1 = json_array_get(json_object_get(doc, "choices"), 1);
  CHECK_KEYS(c0, "index,message,logprobs,finish_reason");
  const json_t *msg = json_object_get(c0, "message");
  CHECK_KEYS(msg, "role,content,reasoning_content");
  CHECK(strcmp(str_at(msg, "role"), "assistant") == 0 && strcmp(str_at(msg, "content"), "Hi\xef\xbf\xbd") == 0 &&
        strcmp(str_at(msg, "reasoning_content"), "think \xef\xbf\xbd") == 0);
  CHECK(strcmp(str_at(c0, "finish_reason"), "stop") == 0);
  const json_t *lp = json_object_get(c0, "logprobs");
  CHECK_KEYS(lp, "content");
  const json_t *content = json_object_get(lp, "content");
  CHECK(json_array_size(content) == 2);
  const json_t *e0 = json_array_get(content, 0), *e1 = json_array_get(content, 1);
  CHECK_KEYS(e0, "token,logprob,bytes,top_logprobs");
  CHECK(strcmp(str_at(e0, "token"), "Hi") == 0 && is_real(json_object_get(e0, "logprob"), -0.1));
  check_bytes(json_object_get(e0, "bytes"), "Hi", 2);
  CHECK(strcmp(str_at(e1, "token"), "\xef\xbf\xbd") == 0);
  check_bytes(json_object_get(e1, "bytes"), "\xe4\xbd", 2);
  const json_t *top1 = json_object_get(e1, "top_logprobs");
  CHECK(json_array_size(top1) == 3);
  const json_t *a1 = json_array_get(top1, 1), *a2 = json_array_get(top1, 2);
  CHECK_KEYS(a1, "token,logprob,bytes");
  CHECK(json_string_length(json_object_get(a1, "token")) == 3 && memcmp(str_at(a1, "token"), "a\0b", 3) == 0 &&
        is_real(json_object_get(a1, "logprob"), -1.0));
  check_bytes(json_object_get(a1, "bytes"), "a\0b", 3);
  check_bytes(json_object_get(a2, "bytes"), "\xff", 1);
  CHECK(strcmp(str_at(a2, "token"), "\xef\xbf\xbd") == 0 && is_real(json_object_get(a2, "logprob"), -3.0));
  /* A NULL text is content null; no reasoning, no key. */
  msg = json_object_get(c1, "message");
  CHECK_KEYS(msg, "role,content");
  CHECK(json_is_null(json_object_get(msg, "content")) && json_is_null(json_object_get(c1, "logprobs")));
  check_usage(json_object_get(doc, "usage"), 5, 0, 0);
  json_decref(doc);
}

static void test_chunks(void) {
  /* Chat: the first chunk with role (and content ""), a content chunk, a finish chunk, the
   * usage chunk. */
  const ina_openai_choice_t first = {NULL, 0, NULL, 0, NULL, NULL, 0};
  json_t *doc = parse_back(ina_openai_render_chunk(CHAT, "chatcmpl-1", 17, "m", 0, 1, &first, NULL));
  CHECK_KEYS(doc, "id,object,created,model,choices");
  CHECK(strcmp(str_at(doc, "object"), "chat.completion.chunk") == 0 && int_at(doc, "created") == 17);
  const json_t *c = json_array_get(json_object_get(doc, "choices"), 0);
  CHECK_KEYS(c, "index,delta,logprobs,finish_reason");
  CHECK_KEYS(json_object_get(c, "delta"), "role,content");
  CHECK(strcmp(str_at(json_object_get(c, "delta"), "role"), "assistant") == 0 &&
        strcmp(str_at(json_object_get(c, "delta"), "content"), "") == 0 &&
        json_is_null(json_object_get(c, "finish_reason")) && json_is_null(json_object_get(c, "logprobs")));
  json_decref(doc);

  const ina_openai_choice_t text = {"\xe4\xbd\xa0\xe5", 4, NULL, 0, NULL, kLogprobs + 1, 1};
  doc = parse_back(ina_openai_render_chunk(CHAT, "chatcmpl-1", 17, "m", 3, 0, &text, NULL));
  c = json_array_get(json_object_get(doc, "choices"), 0);
  CHECK(int_at(c, "index") == 3);
  CHECK_KEYS(json_object_get(c, "delta"), "content");
  CHECK(strcmp(str_at(json_object_get(c, "delta"), "content"), "\xe4\xbd\xa0\xef\xbf\xbd") == 0);
  const json_t *content = json_object_get(json_object_get(c, "logprobs"), "content");
  CHECK(json_array_size(content) == 1);
  check_bytes(json_object_get(json_array_get(content, 0), "bytes"), "\xe4\xbd", 2);
  json_decref(doc);

  const ina_openai_choice_t reasoning = {NULL, 0, "hmm", 3, NULL, NULL, 0};
  doc = parse_back(ina_openai_render_chunk(CHAT, "chatcmpl-1", 17, "m", 0, 0, &reasoning, NULL));
  c = json_array_get(json_object_get(doc, "choices"), 0);
  CHECK_KEYS(json_object_get(c, "delta"), "reasoning_content");
  json_decref(doc);

  const ina_openai_choice_t fin = {"", 0, NULL, 0, "stop", NULL, 0};
  doc = parse_back(ina_openai_render_chunk(CHAT, "chatcmpl-1", 17, "m", 0, 0, &fin, NULL));
  c = json_array_get(json_object_get(doc, "choices"), 0);
  CHECK(json_is_object(json_object_get(c, "delta")) && json_object_size(json_object_get(c, "delta")) == 0);
  CHECK(strcmp(str_at(c, "finish_reason"), "stop") == 0);
  json_decref(doc);

  const ina_openai_usage_t usage = {.prompt_tokens = 3, .completion_tokens = 4, .cached_tokens = 1};
  doc = parse_back(ina_openai_render_chunk(CHAT, "chatcmpl-1", 17, "m", 0, 0, NULL, &usage));
  CHECK_KEYS(doc, "id,object,created,model,choices,usage");
  CHECK(json_is_array(json_object_get(doc, "choices")) && json_array_size(json_object_get(doc, "choices")) == 0);
  check_usage(json_object_get(doc, "usage"), 3, 4, 1);
  json_decref(doc);
  /* A choice with usage: both. */
  doc = parse_back(ina_openai_render_chunk(CHAT, "chatcmpl-1", 17, "m", 0, 0, &text, &usage));
  CHECK(json_array_size(json_object_get(doc, "choices")) == 1);
  check_usage(json_object_get(doc, "usage"), 3, 4, 1);
  json_decref(doc);
  CHECK(ina_openai_render_chunk(CHAT, "c", 0, "m", 0, 0, NULL, NULL) == NULL);
  CHECK(ina_openai_render_chunk(CHAT, NULL, 0, "m", 0, 0, &text, NULL) == NULL);

  /* Completions: text always there, logprobs' offsets from text_offset. */
  const ina_openai_choice_t ctext = {"Hi\xe4\xbd", 4, NULL, 0, NULL, kLogprobsNoNul, 2};
  doc = parse_back(ina_openai_render_chunk_at(CMPL, "cmpl-2", 18, "m", 0, 1, &ctext, NULL, 10));
  CHECK_KEYS(doc, "id,object,created,model,choices");
  CHECK(strcmp(str_at(doc, "object"), "text_completion") == 0);
  c = json_array_get(json_object_get(doc, "choices"), 0);
  CHECK_KEYS(c, "index,text,logprobs,finish_reason");
  CHECK(strcmp(str_at(c, "text"), "Hi\xef\xbf\xbd") == 0);
  const json_t *off = json_object_get(json_object_get(c, "logprobs"), "text_offset");
  CHECK(json_integer_value(json_array_get(off, 0)) == 10 && json_integer_value(json_array_get(off, 1)) == 12);
  json_decref(doc);
  doc = parse_back(ina_openai_render_chunk(CMPL, "cmpl-2", 18, "m", 0, 0, &fin, NULL));
  c = json_array_get(json_object_get(doc, "choices"), 0);
  CHECK(strcmp(str_at(c, "text"), "") == 0 && strcmp(str_at(c, "finish_reason"), "stop") == 0);
  json_decref(doc);
  doc = parse_back(ina_openai_render_chunk(CMPL, "cmpl-2", 18, "m", 0, 0, NULL, &usage));
  CHECK(json_array_size(json_object_get(doc, "choices")) == 0 && strcmp(str_at(doc, "object"), "text_completion") == 0);
  check_usage(json_object_get(doc, "usage"), 3, 4, 1);
  json_decref(doc);
}

/* Log probabilities: shortest decimals, clamped non-finite values. */
static void test_logprob_values(void) {
  const float values[] = {-0.1f, 0.0f, -1e-8f, -123.456f, -INFINITY, NAN, -1e30f, INFINITY, -9999.0f, 1e-3f};
  const double want[] = {-0.1, 0.0, -1e-8, -123.456, -9999.0, -9999.0, -9999.0, 0.0, -9999.0, 0.0};
  for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
    const ina_openai_logprob_t lp = {"t", 1, values[i], 0, NULL, NULL, NULL};
    const ina_openai_choice_t ch = {"t", 1, NULL, 0, NULL, &lp, 1};
    char *text = ina_openai_render_response(CHAT, "c", 0, "m", &ch, 1, NULL);
    CHECK(text != NULL);
    if (text && i == 0) CHECKF(strstr(text, "\"logprob\":-0.1,") != NULL, "not shortest: %s", text);
    if (text && i == 3) CHECKF(strstr(text, "\"logprob\":-123.456,") != NULL, "not shortest: %s", text);
    json_t *doc = parse_back(text);
    const json_t *e =
        json_array_get(json_object_get(json_object_get(json_array_get(json_object_get(doc, "choices"), 0), "logprobs"), "content"), 0);
    const json_t *v = json_object_get(e, "logprob");
    CHECKF(json_is_real(v) && (float)json_real_value(v) == (float)want[i], "value %zu: %g", i, json_real_value(v));
    json_decref(doc);
  }
}

/* Random bytes as texts: every answer stays valid JSON, and a well-formed text comes back
 * as it went in; text_chars counts what the renderer writes. */
static void test_random_bytes(void) {
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (int trial = 0; trial < 2000; trial++) {
    char buf[24];
    const size_t n = (size_t)(trial % 24);
    for (size_t i = 0; i < n; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      const unsigned r = (unsigned)(s >> 33);
      /* mostly UTF-8 lead and continuation bytes, sometimes ASCII */
      buf[i] = (char)(r % 3 == 0 ? 0x20 + r % 0x60 : 0x80 + r % 0x78);
    }
    const ina_openai_logprob_t lp = {buf, n, -1.0f, 0, NULL, NULL, NULL};
    const ina_openai_choice_t ch = {buf, n, NULL, 0, NULL, &lp, 1};
    json_t *doc = parse_back(ina_openai_render_response(CMPL, "c", 0, "m", &ch, 1, NULL));
    const json_t *text = json_object_get(json_array_get(json_object_get(doc, "choices"), 0), "text");
    CHECK(json_is_string(text));
    /* What came back is UTF-8 (jansson checked) of the counted characters. */
    size_t chars = 0;
    const char *t = json_string_value(text);
    for (size_t i = 0; t && i < json_string_length(text); i++) chars += ((unsigned char)t[i] & 0xC0) != 0x80;
    CHECK(chars == ina_openai_text_chars(buf, n));
    json_decref(doc);
  }
  /* Well-formed texts are unchanged, ill-formed ones per maximal subpart. */
  static const struct {
    const char *in, *out;
    size_t chars;
  } cases[] = {
      {"abc", "abc", 3},
      {"\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80", 1},
      {"\xf0\x9f\x98", "\xef\xbf\xbd", 1},                          /* truncated 4-byte: one */
      {"\xe0\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 3}, /* overlong: each byte */
      {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 3}, /* surrogate */
      {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 4},
      {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd", 2},
      {"a\xe4\xbdz", "a\xef\xbf\xbdz", 3},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const ina_openai_choice_t ch = {cases[i].in, strlen(cases[i].in), NULL, 0, NULL, NULL, 0};
    json_t *doc = parse_back(ina_openai_render_response(CMPL, "c", 0, "m", &ch, 1, NULL));
    const char *t = str_at(json_array_get(json_object_get(doc, "choices"), 0), "text");
    CHECKF(t && strcmp(t, cases[i].out) == 0, "case %zu", i);
    CHECK(ina_openai_text_chars(cases[i].in, strlen(cases[i].in)) == cases[i].chars);
    json_decref(doc);
  }
}

int main(void) {
  ina_log_set_quiet_errors(1);
  test_defaults();
  test_every_field();
  test_prompt_forms();
  test_refusals();
  test_errors();
  test_models();
  test_completion_response();
  test_chat_response();
  test_chunks();
  test_logprob_values();
  test_random_bytes();
  printf("test_openai_api: %zu refusal bodies\n", sizeof kRefusals / sizeof kRefusals[0]);
  return test_finish("test_openai_api");
}
