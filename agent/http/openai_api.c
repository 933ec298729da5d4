/* The OpenAI-compatible API's messages (openai_api.h): the request parser, which checks
 * every field it reads and names the first one at fault, and the renderers, which build
 * the answers with jansson and write them compact, keys in insertion order. Every text
 * that goes into an answer passes through utf8_repair first, so an answer is valid JSON
 * whatever bytes a token holds. */
#define INA_LOG_SUBSYS "http"
#include "agent/http/openai_api.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Strings quoted in refusals are cut after this many bytes (at a character boundary). */
#define QUOTE_BYTES 40

/* ---- UTF-8 ----------------------------------------------------------------------------- */

/* The length of the well-formed UTF-8 sequence at s [n >= 1] (1 to 4), or 0 when none
 * starts there; then *bad is the length of its maximal ill-formed subpart (>= 1), which
 * becomes one U+FFFD (Unicode's "substitution of maximal subparts", as Python's
 * errors="replace" and WHATWG's decoder do). */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad) {
  const unsigned c = s[0];
  if (c < 0x80) return 1;
  size_t need;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;      /* overlong */
    else if (c == 0xED) hi = 0x9F; /* surrogates */
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;      /* overlong */
    else if (c == 0xF4) hi = 0x8F; /* above U+10FFFF */
  } else {
    *bad = 1;
    return 0;
  }
  size_t i = 1;
  for (; i < need && i < n; i++) {
    const unsigned b = s[i];
    if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF)) break;
  }
  if (i == need) return need;
  *bad = i;
  return 0;
}

/* A malloc'ed, NUL-terminated copy of s [len] with every ill-formed subpart replaced by
 * U+FFFD; *out_len its length. NULL when out of memory. s may be NULL when len is 0. */
static char *utf8_repair(const char *s, size_t len, size_t *out_len) {
  char *out = malloc(len * 3 + 1);
  if (!out) return NULL;
  const unsigned char *u = (const unsigned char *)s;
  size_t o = 0;
  for (size_t i = 0; i < len;) {
    size_t bad = 0;
    const size_t k = utf8_seq(u + i, len - i, &bad);
    if (k) {
      memcpy(out + o, u + i, k);
      o += k;
      i += k;
    } else {
      memcpy(out + o, "\xEF\xBF\xBD", 3);
      o += 3;
      i += bad;
    }
  }
  out[o] = '\0';
  *out_len = o;
  return out;
}

size_t ina_openai_text_chars(const char *text, size_t len) {
  const unsigned char *u = (const unsigned char *)text;
  size_t chars = 0;
  for (size_t i = 0; i < len; chars++) {
    size_t bad = 0;
    const size_t k = utf8_seq(u + i, len - i, &bad);
    i += k ? k : bad;
  }
  return chars;
}

/* Cuts a text that snprintf stopped short so that it ends on a whole character. */
static void cut_to_character(char *s) {
  size_t n = strlen(s), j = n;
  while (j > 0 && ((unsigned char)s[j - 1] & 0xC0) == 0x80) j--;
  if (j == 0) return;
  size_t bad = 0;
  if (utf8_seq((const unsigned char *)s + j - 1, n - (j - 1), &bad) != n - (j - 1)) s[j - 1] = '\0';
}

/* ---- errors ---------------------------------------------------------------------------- */

static const char *error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

int ina_openai_error_set(ina_openai_error_t *err, int http_status, const char *param, const char *fmt, ...) {
  if (!err) return http_status;
  err->http_status = http_status;
  err->type = error_type(http_status);
  if (snprintf(err->param, sizeof err->param, "%s", param ? param : "") >= (int)sizeof err->param)
    cut_to_character(err->param);
  err->message[0] = '\0';
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof err->message) cut_to_character(err->message);
  }
  return http_status;
}

/* ---- parsing: helpers ------------------------------------------------------------------ */

typedef struct parser {
  ina_openai_error_t *err;
  int32_t vocab_size; /* <= 0: unchecked */
  int out_of_memory;
} parser_t;

/* A short description of a JSON value for messages: numbers as written, strings quoted
 * and cut after QUOTE_BYTES, containers by kind. */
static const char *describe(const json_t *v, char *buf, size_t size) {
  switch (json_typeof(v)) {
    case JSON_STRING: {
      const char *s = json_string_value(v);
      const size_t len = json_string_length(v);
      size_t cut = len;
      if (cut > QUOTE_BYTES) {
        cut = QUOTE_BYTES;
        while (cut > 0 && ((unsigned char)s[cut] & 0xC0) == 0x80) cut--;
      }
      /* An embedded NUL ends the quote early: the message stays one C string. */
      snprintf(buf, size, "\"%.*s%s\"", (int)cut, s, cut < len ? "..." : "");
      break;
    }
    case JSON_INTEGER: snprintf(buf, size, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
    case JSON_REAL: {
      const double d = json_real_value(v);
      snprintf(buf, size, "%.15g", d);
      if (strtod(buf, NULL) != d) snprintf(buf, size, "%.17g", d);
      break;
    }
    case JSON_TRUE: snprintf(buf, size, "true"); break;
    case JSON_FALSE: snprintf(buf, size, "false"); break;
    case JSON_NULL: snprintf(buf, size, "null"); break;
    case JSON_ARRAY: snprintf(buf, size, "a list"); break;
    case JSON_OBJECT: snprintf(buf, size, "an object"); break;
  }
  return buf;
}

#define DESCRIBE(v) describe((v), (char[QUOTE_BYTES + 16]){0}, QUOTE_BYTES + 16)

__attribute__((format(printf, 3, 4))) static int refuse(parser_t *p, const char *param, const char *fmt, ...) {
  char message[sizeof p->err->message];
  va_list ap;
  va_start(ap, fmt);
  if (vsnprintf(message, sizeof message, fmt, ap) >= (int)sizeof message) cut_to_character(message);
  va_end(ap);
  ina_openai_error_set(p->err, 400, param, "%s", message);
  return -1;
}

static int out_of_memory(parser_t *p) {
  p->out_of_memory = 1;
  ina_openai_error_set(p->err, 500, "", "out of memory while reading the request");
  return -1;
}

static int wrong_type(parser_t *p, const char *path, const char *what, const json_t *v) {
  return refuse(p, path, "%s: must be %s, not %s", path, what, DESCRIBE(v));
}

/* The member `key` of obj, NULL when absent or null (OpenAI's optional fields take null
 * for "not given"). */
static json_t *field(const json_t *obj, const char *key) {
  json_t *v = json_object_get(obj, key);
  return json_is_null(v) ? NULL : v;
}

/* An integer in [lo, hi]. A real with an integral value counts as that integer (as
 * pydantic's int fields in vLLM take 16.0). */
static int want_int(parser_t *p, const json_t *v, const char *path, int64_t lo, int64_t hi, int64_t *out) {
  int64_t x;
  if (json_is_integer(v)) {
    x = json_integer_value(v);
  } else if (json_is_real(v)) {
    const double d = json_real_value(v);
    if (d != floor(d)) return wrong_type(p, path, "an integer", v);
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0))
      return refuse(p, path, "%s: %s is out of range [%" PRId64 ", %" PRId64 "]", path, DESCRIBE(v), lo, hi);
    x = (int64_t)d;
  } else {
    return wrong_type(p, path, "an integer", v);
  }
  if (x < lo || x > hi) {
    if (hi == INT64_MAX) return refuse(p, path, "%s: %s is less than %" PRId64, path, DESCRIBE(v), lo);
    return refuse(p, path, "%s: %s is out of range [%" PRId64 ", %" PRId64 "]", path, DESCRIBE(v), lo, hi);
  }
  *out = x;
  return 0;
}

/* A number in [lo, hi], or (lo, hi] with lo_open. */
static int want_number(parser_t *p, const json_t *v, const char *path, double lo, double hi, int lo_open,
                       double *out) {
  if (!json_is_number(v)) return wrong_type(p, path, "a number", v);
  const double d = json_number_value(v);
  if (!(lo_open ? d > lo : d >= lo) || !(d <= hi))
    return refuse(p, path, "%s: %s is out of range %c%g, %g]", path, DESCRIBE(v), lo_open ? '(' : '[', lo, hi);
  *out = d;
  return 0;
}

static int want_bool(parser_t *p, const json_t *v, const char *path, int *out) {
  if (!json_is_boolean(v)) return wrong_type(p, path, "true or false", v);
  *out = json_is_true(v);
  return 0;
}

/* A string without NUL characters (the request's texts are C strings downstream). */
static int want_string(parser_t *p, const json_t *v, const char *path, const char **s, size_t *len) {
  if (!json_is_string(v)) return wrong_type(p, path, "a string", v);
  *s = json_string_value(v);
  *len = json_string_length(v);
  if (memchr(*s, '\0', *len))
    return refuse(p, path, "%s: %s contains a NUL character (U+0000)", path, DESCRIBE(v));
  return 0;
}

static char *copy_text(const char *s, size_t len) {
  char *c = malloc(len + 1);
  if (c) {
    memcpy(c, s, len);
    c[len] = '\0';
  }
  return c;
}

/* A copy of the string at v, into *out / *out_len. */
static int take_string(parser_t *p, const json_t *v, const char *path, char **out, size_t *out_len) {
  const char *s = NULL; /* set by want_string when it returns 0 (GCC -O3 cannot tell) */
  size_t len = 0;
  if (want_string(p, v, path, &s, &len)) return -1;
  if (!(*out = copy_text(s, len))) return out_of_memory(p);
  if (out_len) *out_len = len;
  return 0;
}

static int want_token_id(parser_t *p, const json_t *v, const char *path, int32_t *out) {
  int64_t id;
  if (!json_is_number(v)) return wrong_type(p, path, "a token id (an integer)", v);
  if (want_int(p, v, path, 0, INT32_MAX, &id)) return -1;
  if (p->vocab_size > 0 && id >= p->vocab_size)
    return refuse(p, path, "%s: token id %" PRId64 " is out of range [0, %" PRId32 ")", path, id, p->vocab_size);
  *out = (int32_t)id;
  return 0;
}

/* A non-empty list of token ids at v, copied into *ids [*n]. */
static int take_id_list(parser_t *p, const json_t *v, const char *path, int32_t **ids, size_t *n) {
  const size_t count = json_array_size(v);
  if (count == 0) return refuse(p, path, "%s: must not be an empty list of token ids", path);
  if (!(*ids = malloc(count * sizeof **ids))) return out_of_memory(p);
  *n = count;
  char sub[64];
  for (size_t i = 0; i < count; i++) {
    snprintf(sub, sizeof sub, "%s[%zu]", path, i);
    if (want_token_id(p, json_array_get(v, i), sub, &(*ids)[i])) return -1;
  }
  return 0;
}

/* ---- parsing: the fields --------------------------------------------------------------- */

static int parse_prompt(parser_t *p, const json_t *root, ina_openai_request_t *r) {
  const json_t *v = field(root, "prompt");
  if (!v) return refuse(p, "prompt", "prompt: required (a string, a list of strings, a list of token ids or a list of lists of token ids)");
  char path[64];
  if (json_is_string(v)) {
    if (!(r->prompts = calloc(1, sizeof *r->prompts))) return out_of_memory(p);
    r->num_prompts = 1;
    return take_string(p, v, "prompt", &r->prompts[0].text, &r->prompts[0].text_len);
  }
  if (!json_is_array(v))
    return wrong_type(p, "prompt", "a string or a list (of strings, token ids or lists of token ids)", v);
  const size_t n = json_array_size(v);
  if (n == 0) return refuse(p, "prompt", "prompt: must not be an empty list");
  const json_t *first = json_array_get(v, 0);
  if (json_is_number(first)) { /* one prompt of token ids */
    if (!(r->prompts = calloc(1, sizeof *r->prompts))) return out_of_memory(p);
    r->num_prompts = 1;
    return take_id_list(p, v, "prompt", &r->prompts[0].ids, &r->prompts[0].num_ids);
  }
  if (!json_is_string(first) && !json_is_array(first))
    return wrong_type(p, "prompt[0]", "a string, a token id or a list of token ids", first);
  if (n > INA_OPENAI_MAX_PROMPTS)
    return refuse(p, "prompt", "prompt: %zu prompts are more than this server's limit of %d", n,
                  INA_OPENAI_MAX_PROMPTS);
  if (!(r->prompts = calloc(n, sizeof *r->prompts))) return out_of_memory(p);
  r->num_prompts = n;
  const int strings = json_is_string(first);
  for (size_t i = 0; i < n; i++) {
    const json_t *e = json_array_get(v, i);
    snprintf(path, sizeof path, "prompt[%zu]", i);
    if (strings) {
      if (!json_is_string(e)) return wrong_type(p, path, "a string (as prompt[0] is)", e);
      if (take_string(p, e, path, &r->prompts[i].text, &r->prompts[i].text_len)) return -1;
    } else {
      if (!json_is_array(e)) return wrong_type(p, path, "a list of token ids (as prompt[0] is)", e);
      if (take_id_list(p, e, path, &r->prompts[i].ids, &r->prompts[i].num_ids)) return -1;
    }
  }
  return 0;
}

/* One message's content: a string, null (assistant only) or a list of text parts, joined
 * with "\n" as vLLM joins them. */
static int parse_content(parser_t *p, const json_t *msg, size_t m, ina_openai_message_t *out) {
  char path[64];
  snprintf(path, sizeof path, "messages[%zu].content", m);
  const json_t *v = field(msg, "content");
  if (!v) {
    if (out->role != INA_OPENAI_ROLE_ASSISTANT)
      return refuse(p, path, "%s: required (a string or a list of text parts)", path);
    if (!(out->content = copy_text("", 0))) return out_of_memory(p);
    return 0;
  }
  if (json_is_string(v)) return take_string(p, v, path, &out->content, &out->content_len);
  if (!json_is_array(v)) return wrong_type(p, path, "a string or a list of text parts", v);
  const size_t n = json_array_size(v);
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    const json_t *part = json_array_get(v, i);
    char part_path[96];
    snprintf(part_path, sizeof part_path, "%s[%zu]", path, i);
    if (!json_is_object(part)) return wrong_type(p, part_path, "an object ({\"type\": \"text\", \"text\": ...})", part);
    char sub[128];
    snprintf(sub, sizeof sub, "%s.type", part_path);
    const json_t *type = field(part, "type");
    if (!type) return refuse(p, sub, "%s: required (\"text\")", sub);
    if (!json_is_string(type)) return wrong_type(p, sub, "a string (\"text\")", type);
    if (strcmp(json_string_value(type), "text") != 0 || json_string_length(type) != 4)
      return refuse(p, sub, "%s: %s parts are not supported by this server (only \"text\")", part_path,
                    DESCRIBE(type));
    snprintf(sub, sizeof sub, "%s.text", part_path);
    const json_t *text = field(part, "text");
    if (!text) return refuse(p, sub, "%s: required (a string)", sub);
    const char *s;
    size_t len;
    if (want_string(p, text, sub, &s, &len)) return -1;
    total += len + (i > 0);
  }
  if (!(out->content = malloc(total + 1))) return out_of_memory(p);
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    const json_t *text = json_object_get(json_array_get(v, i), "text");
    if (i > 0) out->content[o++] = '\n';
    memcpy(out->content + o, json_string_value(text), json_string_length(text));
    o += json_string_length(text);
  }
  out->content[o] = '\0';
  out->content_len = o;
  return 0;
}

static int parse_messages(parser_t *p, const json_t *root, ina_openai_request_t *r) {
  const json_t *v = field(root, "messages");
  if (!v) return refuse(p, "messages", "messages: required (a non-empty list of messages)");
  if (!json_is_array(v)) return wrong_type(p, "messages", "a non-empty list of messages", v);
  const size_t n = json_array_size(v);
  if (n == 0) return refuse(p, "messages", "messages: must not be an empty list");
  if (!(r->messages = calloc(n, sizeof *r->messages))) return out_of_memory(p);
  r->num_messages = n;
  char path[64];
  for (size_t m = 0; m < n; m++) {
    const json_t *msg = json_array_get(v, m);
    snprintf(path, sizeof path, "messages[%zu]", m);
    if (!json_is_object(msg)) return wrong_type(p, path, "an object ({\"role\", \"content\"})", msg);
    snprintf(path, sizeof path, "messages[%zu].role", m);
    const json_t *role = field(msg, "role");
    if (!role) return refuse(p, path, "%s: required (system, developer, user or assistant)", path);
    if (!json_is_string(role)) return wrong_type(p, path, "a string (system, developer, user or assistant)", role);
    const char *name = json_string_value(role);
    const size_t name_len = json_string_length(role);
    if (name_len == strlen(name) && (strcmp(name, "system") == 0 || strcmp(name, "developer") == 0)) {
      r->messages[m].role = INA_OPENAI_ROLE_SYSTEM;
    } else if (name_len == strlen(name) && strcmp(name, "user") == 0) {
      r->messages[m].role = INA_OPENAI_ROLE_USER;
    } else if (name_len == strlen(name) && strcmp(name, "assistant") == 0) {
      r->messages[m].role = INA_OPENAI_ROLE_ASSISTANT;
    } else if (name_len == strlen(name) && (strcmp(name, "tool") == 0 || strcmp(name, "function") == 0)) {
      return refuse(p, path, "%s: %s messages are not supported by this server (it has no tool calling)", path,
                    DESCRIBE(role));
    } else {
      return refuse(p, path, "%s: %s is not one of system, developer, user, assistant", path, DESCRIBE(role));
    }
    if (parse_content(p, msg, m, &r->messages[m])) return -1;
    const json_t *calls = field(msg, "tool_calls");
    if (calls && !(json_is_array(calls) && json_array_size(calls) == 0)) {
      snprintf(path, sizeof path, "messages[%zu].tool_calls", m);
      return refuse(p, path, "%s: tool calls are not supported by this server", path);
    }
  }
  return 0;
}

static int parse_stop(parser_t *p, const json_t *root, ina_openai_request_t *r) {
  const json_t *v = field(root, "stop");
  if (!v) return 0;
  if (json_is_string(v)) {
    if (json_string_length(v) == 0) return refuse(p, "stop", "stop: must not be an empty string");
    r->num_stop = 1;
    return take_string(p, v, "stop", &r->stop[0], &r->stop_len[0]);
  }
  if (!json_is_array(v)) return wrong_type(p, "stop", "a string or a list of strings", v);
  const size_t n = json_array_size(v);
  if (n > INA_OPENAI_MAX_STOP)
    return refuse(p, "stop", "stop: %zu strings are more than the limit of %d", n, INA_OPENAI_MAX_STOP);
  char path[64];
  for (size_t i = 0; i < n; i++) {
    const json_t *e = json_array_get(v, i);
    snprintf(path, sizeof path, "stop[%zu]", i);
    if (!json_is_string(e)) return wrong_type(p, path, "a string", e);
    if (json_string_length(e) == 0) return refuse(p, path, "%s: must not be an empty string", path);
    if (take_string(p, e, path, &r->stop[i], &r->stop_len[i])) return -1;
    r->num_stop = i + 1;
  }
  return 0;
}

/* A field this server refuses unless it has its neutral value. */
static int refuse_number_unless(parser_t *p, const json_t *root, const char *key, double neutral) {
  const json_t *v = field(root, key);
  if (!v) return 0;
  if (!json_is_number(v)) return wrong_type(p, key, "a number", v);
  if (json_number_value(v) != neutral)
    return refuse(p, key, "%s: %s is not supported by this server (only %g)", key, DESCRIBE(v), neutral);
  return 0;
}

static int refuse_unsupported(parser_t *p, const json_t *root, ina_openai_endpoint_t ep) {
  if (refuse_number_unless(p, root, "presence_penalty", 0) || refuse_number_unless(p, root, "frequency_penalty", 0))
    return -1;
  const json_t *v;
  if (ep == INA_OPENAI_COMPLETIONS) {
    if ((v = field(root, "best_of"))) {
      int64_t b;
      if (want_int(p, v, "best_of", INT64_MIN, INT64_MAX, &b)) return -1;
      if (b != 1) return refuse(p, "best_of", "best_of: %s is not supported by this server (only 1)", DESCRIBE(v));
    }
    if ((v = field(root, "suffix"))) {
      const char *s;
      size_t len;
      if (want_string(p, v, "suffix", &s, &len)) return -1;
      if (len) return refuse(p, "suffix", "suffix: is not supported by this server");
    }
  }
  static const char *const tool_keys[] = {"tools", "functions"};
  for (size_t i = 0; i < 2; i++) {
    if (!(v = field(root, tool_keys[i]))) continue;
    if (!json_is_array(v)) return wrong_type(p, tool_keys[i], "a list", v);
    if (json_array_size(v))
      return refuse(p, tool_keys[i], "%s: tool calling is not supported by this server", tool_keys[i]);
  }
  if ((v = field(root, "response_format"))) {
    if (!json_is_object(v)) return wrong_type(p, "response_format", "an object ({\"type\": \"text\"})", v);
    const json_t *type = field(v, "type");
    if (!type) return refuse(p, "response_format.type", "response_format.type: required (\"text\")");
    if (!json_is_string(type)) return wrong_type(p, "response_format.type", "a string (\"text\")", type);
    if (strcmp(json_string_value(type), "text") != 0 || json_string_length(type) != 4)
      return refuse(p, "response_format.type", "response_format.type: %s is not supported by this server (only \"text\")",
                    DESCRIBE(type));
  }
  if ((v = field(root, "logit_bias"))) {
    if (!json_is_object(v)) return wrong_type(p, "logit_bias", "an object", v);
    if (json_object_size(v)) return refuse(p, "logit_bias", "logit_bias: is not supported by this server (only {})");
  }
  return 0;
}

static int parse_sampling(parser_t *p, const json_t *root, ina_openai_request_t *r) {
  const json_t *v;
  const int chat = r->endpoint == INA_OPENAI_CHAT;
  /* max_tokens, and for chat max_completion_tokens, which wins when both are given (as
   * vLLM reads them; OpenAI deprecates max_tokens in chat). Both are checked. */
  if ((v = field(root, "max_tokens")) && want_int(p, v, "max_tokens", 1, INT64_MAX, &r->max_tokens)) return -1;
  if (chat && (v = field(root, "max_completion_tokens")) &&
      want_int(p, v, "max_completion_tokens", 1, INT64_MAX, &r->max_tokens))
    return -1;
  if ((v = field(root, "temperature")) && want_number(p, v, "temperature", 0, 2, 0, &r->temperature)) return -1;
  if ((v = field(root, "top_p")) && want_number(p, v, "top_p", 0, 1, 1, &r->top_p)) return -1;
  if ((v = field(root, "top_k"))) {
    int64_t k;
    if (want_int(p, v, "top_k", INT32_MIN, INT32_MAX, &k)) return -1;
    if (k < -1) return refuse(p, "top_k", "top_k: %s is invalid (-1 or 0 for off, else at least 1)", DESCRIBE(v));
    r->top_k = k < 0 ? 0 : (int32_t)k;
  }
  if ((v = field(root, "seed"))) {
    int64_t s;
    if (want_int(p, v, "seed", INT64_MIN, INT64_MAX, &s)) return -1;
    r->has_seed = 1;
    r->seed = (uint64_t)s;
  }
  if (parse_stop(p, root, r)) return -1;
  if ((v = field(root, "stop_token_ids"))) {
    if (!json_is_array(v)) return wrong_type(p, "stop_token_ids", "a list of token ids", v);
    const size_t n = json_array_size(v);
    if (n) {
      if (!(r->stop_token_ids = malloc(n * sizeof *r->stop_token_ids))) return out_of_memory(p);
      r->num_stop_token_ids = n;
      char path[64];
      for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof path, "stop_token_ids[%zu]", i);
        if (want_token_id(p, json_array_get(v, i), path, &r->stop_token_ids[i])) return -1;
      }
    }
  }
  if ((v = field(root, "ignore_eos")) && want_bool(p, v, "ignore_eos", &r->ignore_eos)) return -1;
  if ((v = field(root, "n"))) {
    int64_t n;
    if (want_int(p, v, "n", INT64_MIN, INT64_MAX, &n)) return -1;
    if (n != 1) return refuse(p, "n", "n: %s is not supported by this server (only 1)", DESCRIBE(v));
  }
  return 0;
}

static int parse_output(parser_t *p, const json_t *root, ina_openai_request_t *r) {
  const json_t *v;
  const int chat = r->endpoint == INA_OPENAI_CHAT;
  if ((v = field(root, "stream")) && want_bool(p, v, "stream", &r->stream)) return -1;
  if ((v = field(root, "stream_options"))) {
    if (!json_is_object(v)) return wrong_type(p, "stream_options", "an object", v);
    if (!r->stream) return refuse(p, "stream_options", "stream_options: only allowed when stream is true");
    const json_t *u = field(v, "include_usage");
    if (u && want_bool(p, u, "stream_options.include_usage", &r->include_usage)) return -1;
  }
  if (chat) {
    int logprobs = 0;
    if ((v = field(root, "logprobs")) && want_bool(p, v, "logprobs", &logprobs)) return -1;
    r->logprobs = logprobs ? 0 : -1;
    if ((v = field(root, "top_logprobs"))) {
      int64_t top;
      if (want_int(p, v, "top_logprobs", 0, INA_OPENAI_MAX_LOGPROBS, &top)) return -1;
      if (!logprobs) return refuse(p, "top_logprobs", "top_logprobs: needs logprobs to be true");
      r->logprobs = (int)top;
    }
  } else {
    if ((v = field(root, "logprobs"))) {
      int64_t top;
      if (!json_is_number(v)) return wrong_type(p, "logprobs", "an integer (0 to 20) or null", v);
      if (want_int(p, v, "logprobs", 0, INA_OPENAI_MAX_LOGPROBS, &top)) return -1;
      r->logprobs = (int)top;
    }
    int echo = 0;
    if ((v = field(root, "echo")) && want_bool(p, v, "echo", &echo)) return -1;
    if (echo) return refuse(p, "echo", "echo: true is not supported by this server");
  }
  return 0;
}

static int parse_chat_options(parser_t *p, const json_t *root, ina_openai_request_t *r) {
  const json_t *v;
  if ((v = field(root, "add_generation_prompt")) && want_bool(p, v, "add_generation_prompt", &r->add_generation_prompt))
    return -1;
  if (!(v = field(root, "chat_template_kwargs"))) return 0;
  if (!json_is_object(v)) return wrong_type(p, "chat_template_kwargs", "an object", v);
  const json_t *t = field(v, "thinking"), *e = field(v, "enable_thinking");
  int thinking = -1, enable = -1;
  if (t && want_bool(p, t, "chat_template_kwargs.thinking", &thinking)) return -1;
  if (e && want_bool(p, e, "chat_template_kwargs.enable_thinking", &enable)) return -1;
  if (t && e && thinking != enable)
    return refuse(p, "chat_template_kwargs.enable_thinking",
                  "chat_template_kwargs.enable_thinking: %s contradicts chat_template_kwargs.thinking %s",
                  DESCRIBE(e), DESCRIBE(t));
  r->thinking = t ? thinking : enable;
  return 0;
}

static int parse_root(parser_t *p, ina_openai_endpoint_t ep, const json_t *root, ina_openai_request_t *r) {
  r->endpoint = ep;
  r->max_tokens = -1;
  r->temperature = 1;
  r->top_p = 1;
  r->logprobs = -1;
  r->thinking = -1;
  r->add_generation_prompt = ep == INA_OPENAI_CHAT;
  const json_t *v = field(root, "model");
  if (!v) return refuse(p, "model", "model: required (a string naming the model)");
  if (take_string(p, v, "model", &r->model, NULL)) return -1;
  if (ep == INA_OPENAI_CHAT ? parse_messages(p, root, r) : parse_prompt(p, root, r)) return -1;
  if (parse_sampling(p, root, r) || parse_output(p, root, r) || refuse_unsupported(p, root, ep)) return -1;
  if (ep == INA_OPENAI_CHAT && parse_chat_options(p, root, r)) return -1;
  return 0;
}

/* jansson's message, with bytes that are not printable ASCII shown as '?' (it quotes the
 * input near the fault, which may be any bytes). */
static void printable(char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7E) *s = '?';
}

ina_status_t ina_openai_parse_request(ina_openai_endpoint_t endpoint, const char *body, size_t len,
                                      int32_t vocab_size, size_t max_body, ina_openai_request_t *out,
                                      ina_openai_error_t *err) {
  ina_openai_error_t scratch;
  if (!err) err = &scratch;
  if (out) memset(out, 0, sizeof *out);
  if (!out || (!body && len) || (endpoint != INA_OPENAI_COMPLETIONS && endpoint != INA_OPENAI_CHAT)) {
    ina_openai_error_set(err, 500, "", "ina_openai_parse_request: invalid arguments");
    return INA_ERR_INVALID_ARGUMENT;
  }
  if (max_body && len > max_body) {
    ina_openai_error_set(err, 413, "", "the request body is %zu bytes, more than this server's limit of %zu", len,
                         max_body);
    return INA_ERR_INVALID_ARGUMENT;
  }
  json_error_t jerr;
  /* Duplicate keys are refused: a proxy that reads the first and a server that reads the
   * last must not see different requests. \u0000 is decoded, and refused with the field's
   * name where a kept string holds it (unknown fields may hold it). */
  json_t *root = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_ANY, &jerr);
  if (!root) {
    printable(jerr.text);
    ina_openai_error_set(err, 400, "", "the body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line,
                         jerr.column);
    return INA_ERR_INVALID_ARGUMENT;
  }
  parser_t p = {.err = err, .vocab_size = vocab_size};
  int rc;
  if (!json_is_object(root)) {
    rc = refuse(&p, "", "the body must be a JSON object, not %s", DESCRIBE(root));
  } else {
    rc = parse_root(&p, endpoint, root, out);
  }
  json_decref(root);
  if (rc) {
    ina_openai_request_release(out);
    return p.out_of_memory ? INA_ERR_OUT_OF_MEMORY : INA_ERR_INVALID_ARGUMENT;
  }
  ina_openai_error_set(err, 0, "", NULL);
  err->type = "";
  return INA_OK;
}

void ina_openai_request_release(ina_openai_request_t *req) {
  if (!req) return;
  free(req->model);
  for (size_t i = 0; i < req->num_prompts; i++) {
    free(req->prompts[i].text);
    free(req->prompts[i].ids);
  }
  free(req->prompts);
  for (size_t i = 0; i < req->num_messages; i++) free(req->messages[i].content);
  free(req->messages);
  for (size_t i = 0; i < INA_OPENAI_MAX_STOP; i++) free(req->stop[i]);
  free(req->stop_token_ids);
  memset(req, 0, sizeof *req);
}

/* ---- rendering ------------------------------------------------------------------------- */

/* Builders: a NULL value or a failed insertion clears *ok (and the value is released);
 * the document is written only when everything went in. */
static void put(int *ok, json_t *obj, const char *key, json_t *v) {
  if (!v || json_object_set_new(obj, key, v) != 0) *ok = 0;
}

static void append(int *ok, json_t *arr, json_t *v) {
  if (!v || json_array_append_new(arr, v) != 0) *ok = 0;
}

/* A JSON string of any bytes (ill-formed UTF-8 replaced); s NULL is "". */
static json_t *text_json(const char *s, size_t len) {
  size_t n;
  char *valid = utf8_repair(s, s ? len : 0, &n);
  if (!valid) return NULL;
  json_t *v = json_stringn_nocheck(valid, n);
  free(valid);
  return v;
}

static json_t *cstr_json(const char *s) { return text_json(s, s ? strlen(s) : 0); }

static json_t *text_or_null(const char *s, size_t len) { return s ? text_json(s, len) : json_null(); }

/* A log probability as the shortest decimal that reads back as the same float (0.1f is
 * written 0.1, not 0.10000000149011612); -inf, NaN and values below -9999 are written
 * -9999.0 as vLLM clamps them. The document is dumped with 9 significant digits, which
 * keeps these decimals as they are. */
static json_t *logprob_json(float f) {
  if (isnan(f) || f < -9999.0f) f = -9999.0f;
  if (f > 0) f = 0; /* +inf or rounding above 0 */
  char buf[32];
  for (int prec = 1; prec <= 9; prec++) {
    snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
    if (strtof(buf, NULL) == f) break;
  }
  return json_real(strtod(buf, NULL));
}

static json_t *bytes_json(int *ok, const char *s, size_t len) {
  json_t *arr = json_array();
  for (size_t i = 0; i < len; i++) append(ok, arr, json_integer((unsigned char)s[i]));
  return arr;
}

static int logprobs_valid(const ina_openai_logprob_t *lp, size_t n) {
  if (n && !lp) return 0;
  for (size_t i = 0; i < n; i++) {
    if ((!lp[i].token && lp[i].token_len) || lp[i].num_top > INA_OPENAI_MAX_LOGPROBS) return 0;
    if (lp[i].num_top && (!lp[i].top_tokens || !lp[i].top_token_lens || !lp[i].top_logprobs)) return 0;
    for (size_t k = 0; k < lp[i].num_top; k++)
      if (!lp[i].top_tokens[k] && lp[i].top_token_lens[k]) return 0;
  }
  return 1;
}

/* Completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
 * "text_offset"}, offsets in characters from text_offset (the choice's text before these
 * tokens). Of two alternatives with the same text the first (likelier) is kept. */
static json_t *completion_logprobs(int *ok, const ina_openai_logprob_t *lp, size_t n, size_t text_offset) {
  json_t *o = json_object(), *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
  size_t offset = text_offset;
  for (size_t i = 0; i < n; i++) {
    append(ok, tokens, text_json(lp[i].token, lp[i].token_len));
    append(ok, lps, logprob_json(lp[i].logprob));
    json_t *top = json_object();
    for (size_t k = 0; k < lp[i].num_top; k++) {
      json_t *key = text_json(lp[i].top_tokens[k], lp[i].top_token_lens[k]);
      if (!key) {
        *ok = 0;
        continue;
      }
      /* By length: a token's text may hold NUL bytes. */
      const char *ks = json_string_value(key);
      const size_t kn = json_string_length(key);
      if (!json_object_getn(top, ks, kn)) {
        json_t *val = logprob_json(lp[i].top_logprobs[k]);
        if (!val || json_object_setn_new_nocheck(top, ks, kn, val) != 0) *ok = 0;
      }
      json_decref(key);
    }
    append(ok, tops, top);
    append(ok, offs, json_integer((json_int_t)offset));
    offset += ina_openai_text_chars(lp[i].token, lp[i].token ? lp[i].token_len : 0);
  }
  put(ok, o, "tokens", tokens);
  put(ok, o, "token_logprobs", lps);
  put(ok, o, "top_logprobs", tops);
  put(ok, o, "text_offset", offs);
  return o;
}

static json_t *chat_token(int *ok, const char *token, size_t len, float logprob) {
  json_t *o = json_object();
  put(ok, o, "token", text_json(token, len));
  put(ok, o, "logprob", logprob_json(logprob));
  put(ok, o, "bytes", bytes_json(ok, token, token ? len : 0));
  return o;
}

/* Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
 * "bytes"}]}]}; "bytes" are the token's own bytes, before any U+FFFD replacement. */
static json_t *chat_logprobs(int *ok, const ina_openai_logprob_t *lp, size_t n) {
  json_t *o = json_object(), *content = json_array();
  for (size_t i = 0; i < n; i++) {
    json_t *t = chat_token(ok, lp[i].token, lp[i].token_len, lp[i].logprob);
    json_t *top = json_array();
    for (size_t k = 0; k < lp[i].num_top; k++)
      append(ok, top, chat_token(ok, lp[i].top_tokens[k], lp[i].top_token_lens[k], lp[i].top_logprobs[k]));
    put(ok, t, "top_logprobs", top);
    append(ok, content, t);
  }
  put(ok, o, "content", content);
  return o;
}

static json_t *logprobs_json(int *ok, ina_openai_endpoint_t ep, const ina_openai_choice_t *c, size_t text_offset) {
  if (!c->logprobs) return json_null();
  return ep == INA_OPENAI_CHAT ? chat_logprobs(ok, c->logprobs, c->num_logprobs)
                               : completion_logprobs(ok, c->logprobs, c->num_logprobs, text_offset);
}

static json_t *usage_json(int *ok, const ina_openai_usage_t *u) {
  json_t *o = json_object(), *details = json_object();
  put(ok, o, "prompt_tokens", json_integer(u->prompt_tokens));
  put(ok, o, "completion_tokens", json_integer(u->completion_tokens));
  put(ok, o, "total_tokens", json_integer(u->prompt_tokens + u->completion_tokens));
  put(ok, details, "cached_tokens", json_integer(u->cached_tokens));
  put(ok, o, "prompt_tokens_details", details);
  return o;
}

/* Writes the document and releases it; NULL when anything failed. */
static char *finish(json_t *doc, int ok) {
  char *text = ok && doc ? json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) : NULL;
  json_decref(doc);
  return text;
}

static int endpoint_valid(ina_openai_endpoint_t ep) { return ep == INA_OPENAI_COMPLETIONS || ep == INA_OPENAI_CHAT; }

static int choice_valid(const ina_openai_choice_t *c) {
  return (c->text || !c->text_len) && (c->reasoning || !c->reasoning_len) &&
         logprobs_valid(c->logprobs, c->num_logprobs);
}

/* {"id", "object", "created", "model"}, the head of every answer. */
static json_t *answer_head(int *ok, const char *id, const char *object, int64_t created, const char *model) {
  json_t *o = json_object();
  put(ok, o, "id", cstr_json(id));
  put(ok, o, "object", json_string(object));
  put(ok, o, "created", json_integer(created));
  put(ok, o, "model", cstr_json(model));
  return o;
}

char *ina_openai_render_error(const ina_openai_error_t *err) {
  if (!err) return NULL;
  int ok = 1;
  json_t *doc = json_object(), *e = json_object();
  const size_t mlen = strnlen(err->message, sizeof err->message);
  const size_t plen = strnlen(err->param, sizeof err->param);
  char code[16];
  snprintf(code, sizeof code, "%d", err->http_status);
  put(&ok, e, "message", text_json(err->message, mlen));
  put(&ok, e, "type", cstr_json(err->type && err->type[0] ? err->type : error_type(err->http_status)));
  put(&ok, e, "param", plen ? text_json(err->param, plen) : json_null());
  put(&ok, e, "code", json_string(code));
  put(&ok, doc, "error", e);
  return finish(doc, ok);
}

char *ina_openai_render_models(const char *model, int64_t created, int64_t max_model_len) {
  if (!model) return NULL;
  int ok = 1;
  json_t *doc = json_object(), *data = json_array(), *m = json_object();
  put(&ok, doc, "object", json_string("list"));
  put(&ok, m, "id", cstr_json(model));
  put(&ok, m, "object", json_string("model"));
  put(&ok, m, "created", json_integer(created));
  put(&ok, m, "owned_by", json_string("ina"));
  put(&ok, m, "max_model_len", json_integer(max_model_len));
  append(&ok, data, m);
  put(&ok, doc, "data", data);
  return finish(doc, ok);
}

char *ina_openai_render_response(ina_openai_endpoint_t endpoint, const char *id, int64_t created,
                                 const char *model, const ina_openai_choice_t *choices, size_t num_choices,
                                 const ina_openai_usage_t *usage) {
  if (!endpoint_valid(endpoint) || !id || !model || (num_choices && !choices)) return NULL;
  for (size_t i = 0; i < num_choices; i++)
    if (!choice_valid(&choices[i])) return NULL;
  const int chat = endpoint == INA_OPENAI_CHAT;
  int ok = 1;
  json_t *doc = answer_head(&ok, id, chat ? "chat.completion" : "text_completion", created, model);
  json_t *arr = json_array();
  for (size_t i = 0; i < num_choices; i++) {
    const ina_openai_choice_t *c = &choices[i];
    json_t *ch = json_object();
    put(&ok, ch, "index", json_integer((json_int_t)i));
    if (chat) {
      json_t *msg = json_object();
      put(&ok, msg, "role", json_string("assistant"));
      put(&ok, msg, "content", text_or_null(c->text, c->text_len));
      if (c->reasoning) put(&ok, msg, "reasoning_content", text_json(c->reasoning, c->reasoning_len));
      put(&ok, ch, "message", msg);
    } else {
      put(&ok, ch, "text", text_json(c->text, c->text_len));
    }
    put(&ok, ch, "logprobs", logprobs_json(&ok, endpoint, c, 0));
    put(&ok, ch, "finish_reason", c->finish_reason ? cstr_json(c->finish_reason) : json_null());
    append(&ok, arr, ch);
  }
  put(&ok, doc, "choices", arr);
  if (usage) put(&ok, doc, "usage", usage_json(&ok, usage));
  return finish(doc, ok);
}

char *ina_openai_render_chunk_at(ina_openai_endpoint_t endpoint, const char *id, int64_t created, const char *model,
                                 size_t index, int first_chunk, const ina_openai_choice_t *choice,
                                 const ina_openai_usage_t *usage, size_t text_offset) {
  if (!endpoint_valid(endpoint) || !id || !model || (!choice && !usage)) return NULL;
  if (choice && !choice_valid(choice)) return NULL;
  const int chat = endpoint == INA_OPENAI_CHAT;
  int ok = 1;
  json_t *doc = answer_head(&ok, id, chat ? "chat.completion.chunk" : "text_completion", created, model);
  json_t *arr = json_array();
  if (choice) {
    json_t *ch = json_object();
    put(&ok, ch, "index", json_integer((json_int_t)index));
    if (chat) {
      json_t *delta = json_object();
      if (first_chunk) put(&ok, delta, "role", json_string("assistant"));
      if (choice->reasoning_len) put(&ok, delta, "reasoning_content", text_json(choice->reasoning, choice->reasoning_len));
      if (choice->text_len || first_chunk) put(&ok, delta, "content", text_json(choice->text, choice->text_len));
      put(&ok, ch, "delta", delta);
    } else {
      put(&ok, ch, "text", text_json(choice->text, choice->text_len));
    }
    put(&ok, ch, "logprobs", logprobs_json(&ok, endpoint, choice, text_offset));
    put(&ok, ch, "finish_reason", choice->finish_reason ? cstr_json(choice->finish_reason) : json_null());
    append(&ok, arr, ch);
  }
  put(&ok, doc, "choices", arr);
  if (usage) put(&ok, doc, "usage", usage_json(&ok, usage));
  return finish(doc, ok);
}

char *ina_openai_render_chunk(ina_openai_endpoint_t endpoint, const char *id, int64_t created, const char *model,
                              size_t index, int first_chunk, const ina_openai_choice_t *choice,
                              const ina_openai_usage_t *usage) {
  return ina_openai_render_chunk_at(endpoint, id, created, model, index, first_chunk, choice, usage, 0);
}
