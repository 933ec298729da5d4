/* The OpenAI-compatible HTTP API's messages: parsing and checking the JSON bodies of
 * POST /v1/completions and POST /v1/chat/completions, and rendering the answers
 * (whole responses, server-sent-event chunks, GET /v1/models, errors) as the OpenAI API
 * and vLLM shape them. No I/O and no model here: the HTTP server (http_server.h) and the
 * agent's service (service_http.c) use these, and the fuzzer feeds the parser directly.
 *
 * Requests. Fields read (anything else is ignored, as OpenAI's servers ignore unknown
 * fields; a known field of the wrong type or out of range is refused):
 *   model (string, required), prompt (completions: a string, a list of strings, a list of
 *   token ids, or a list of lists of token ids; each element becomes one choice),
 *   messages (chat: a list of {role: system|user|assistant|developer (as system), content:
 *   a string or a list of {type: "text", text} parts; name ignored}), max_tokens /
 *   max_completion_tokens (>= 1; default 16 for completions as OpenAI, for chat the rest
 *   of the context), temperature (0..2, default 1), top_p (0 < p <= 1, default 1), top_k
 *   (vLLM's extension; -1 or 0 off), seed (integer), stop (a string or a list of up to 4
 *   non-empty strings), stop_token_ids (vLLM's extension: a list of ids), stream (bool),
 *   stream_options.include_usage (bool, only with stream), logprobs (completions: an
 *   integer 0..20, the top alternatives per token; chat: a bool), top_logprobs (chat:
 *   0..20, needs logprobs true), n (only 1; other values are refused naming n), echo
 *   (completions: only false), ignore_eos (vLLM's extension, bool), user (ignored),
 *   chat_template_kwargs (chat, vLLM's extension: {thinking | enable_thinking: bool}),
 *   add_generation_prompt (chat, vLLM's extension, bool, default true).
 *   presence_penalty / frequency_penalty other than 0, best_of other than 1, tools,
 *   functions, response_format other than {type: text}, logit_bias non-empty, suffix:
 *   refused with 400 naming the field ("... is not supported by this server").
 *
 * How the fields read, where OpenAI and vLLM leave room:
 *   - the body is one JSON object (strict JSON: nothing but white space after it); a key
 *     given twice is refused (a proxy reading the first and this server the last must
 *     not see different requests); a field given as null counts as not given;
 *   - integer fields take an integral number written as a real (16.0), as vLLM's
 *     pydantic models do; bools are only true / false;
 *   - strings are UTF-8 (jansson checks); a kept text holding U+0000 (\u0000) is refused
 *     naming its field, since the texts are C strings downstream;
 *   - chat: max_completion_tokens wins over max_tokens when both are given (as vLLM; both
 *     are checked); completions read only max_tokens;
 *   - seed: any integer of int64's range, stored in `seed` as its two's complement;
 *   - top_k: -1 and 0 are off (stored 0), else >= 1;
 *   - prompt: an empty string is one (empty) prompt; an empty list, an empty list of ids
 *     and lists of more than INA_OPENAI_MAX_PROMPTS prompts are refused; a list's kind
 *     is set by its first element and every other must be of that kind;
 *   - messages: content null or absent is allowed for assistant messages only (""); a
 *     list of parts is joined with "\n" (as vLLM joins them); parts other than text,
 *     messages of role tool / function and non-empty tool_calls are refused;
 *   - chat_template_kwargs: "thinking" and "enable_thinking" both set must agree;
 *   - tools / functions: an empty list passes (clients send []), a non-empty one is
 *     refused; suffix: "" passes.
 *
 * Every refusal is an ina_openai_error_t: the HTTP status (400 for a bad field, with the
 * field's name in `param`), OpenAI's `type` ("invalid_request_error") and a message that
 * names the field and says what is wrong ("temperature: 3.5 is out of range [0, 2]").
 *
 * Ownership: a parsed request owns its copies of every string and array; release it with
 * ina_openai_request_release. Rendered texts are malloc'ed, NUL-terminated, freed by the
 * caller. Thread safety: everything here is reentrant. */
#ifndef INA_AGENT_HTTP_OPENAI_API_H
#define INA_AGENT_HTTP_OPENAI_API_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define INA_OPENAI_MAX_STOP 4       /* stop strings per request (OpenAI's limit) */
#define INA_OPENAI_MAX_LOGPROBS 20  /* top alternatives per token */
#define INA_OPENAI_MAX_PROMPTS 64   /* prompts of one completions request */

typedef enum ina_openai_endpoint {
  INA_OPENAI_COMPLETIONS = 0, /* POST /v1/completions */
  INA_OPENAI_CHAT = 1,        /* POST /v1/chat/completions */
} ina_openai_endpoint_t;

typedef struct ina_openai_error {
  int http_status;   /* 400, 401, 404, 405, 413, 429, 500, 503 */
  const char *type;  /* static: "invalid_request_error", "authentication_error",
                        "not_found_error", "rate_limit_error", "server_error" */
  char param[64];    /* the field at fault ("messages[2].role"), "" when none */
  char message[512]; /* what is wrong, naming the field */
} ina_openai_error_t;

/* Fills *err (any of its fields may be reused later) and returns http_status. */
int ina_openai_error_set(ina_openai_error_t *err, int http_status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* One prompt: text or token ids (exactly one of the two is set). */
typedef struct ina_openai_prompt {
  char *text;      /* NUL-terminated UTF-8; NULL when ids are given */
  size_t text_len;
  int32_t *ids;    /* NULL when text is given */
  size_t num_ids;  /* >= 1 when ids is set */
} ina_openai_prompt_t;

typedef enum ina_openai_role {
  INA_OPENAI_ROLE_SYSTEM = 0, /* "system" and "developer" */
  INA_OPENAI_ROLE_USER,
  INA_OPENAI_ROLE_ASSISTANT,
} ina_openai_role_t;

typedef struct ina_openai_message {
  ina_openai_role_t role;
  char *content; /* the text parts joined, NUL-terminated; "" when empty or null */
  size_t content_len;
} ina_openai_message_t;

typedef struct ina_openai_request {
  ina_openai_endpoint_t endpoint;
  char *model;
  ina_openai_prompt_t *prompts; /* completions: [num_prompts], >= 1 */
  size_t num_prompts;
  ina_openai_message_t *messages; /* chat: [num_messages], >= 1 */
  size_t num_messages;
  int64_t max_tokens;   /* -1: not given (the caller applies the endpoint's default) */
  double temperature;   /* default 1 */
  double top_p;         /* default 1 */
  int32_t top_k;        /* 0: off */
  int has_seed;
  uint64_t seed;
  char *stop[INA_OPENAI_MAX_STOP]; /* NUL-terminated, non-empty */
  size_t stop_len[INA_OPENAI_MAX_STOP];
  size_t num_stop;
  int32_t *stop_token_ids;
  size_t num_stop_token_ids;
  int stream;
  int include_usage;   /* stream_options.include_usage */
  int logprobs;        /* -1: none; else the top alternatives per token (0: only the chosen) */
  int ignore_eos;
  /* chat only: vLLM's chat_template_kwargs.thinking / enable_thinking (bool), -1 unset */
  int thinking;
  int add_generation_prompt; /* chat: default 1 */
} ina_openai_request_t;

/* Parses and checks `body` [len] (need not be NUL-terminated) for the endpoint. Token ids
 * must be < vocab_size (0 or less: only >= 0 and int32). INA_OK with *out filled (and
 * *err cleared: status 0, param and message ""), or INA_ERR_INVALID_ARGUMENT with *err
 * filled (status 400; 413 when len exceeds max_body, 0 meaning no limit) and *out zeroed.
 * INA_ERR_OUT_OF_MEMORY (status 500) when an allocation fails; an invalid call (out NULL,
 * body NULL with len > 0, an unknown endpoint) is INA_ERR_INVALID_ARGUMENT with status
 * 500. err may be NULL. Defaults: max_tokens -1, temperature 1, top_p 1, top_k 0,
 * logprobs -1, thinking -1, add_generation_prompt 1 for chat (0 for completions, where
 * it means nothing), everything else 0. */
ina_status_t ina_openai_parse_request(ina_openai_endpoint_t endpoint, const char *body, size_t len,
                                      int32_t vocab_size, size_t max_body, ina_openai_request_t *out,
                                      ina_openai_error_t *err);
void ina_openai_request_release(ina_openai_request_t *req);

/* ---- answers ------------------------------------------------------------------------ *
 * Every renderer returns NULL when out of memory or given invalid arguments (an id or a
 * model NULL, a text NULL with a length, more than INA_OPENAI_MAX_LOGPROBS alternatives).
 * Texts may hold any bytes: ill-formed UTF-8 is written with U+FFFD (one per maximal
 * ill-formed subpart, as Python's errors="replace"). Log probabilities are written as the
 * shortest decimal that reads back as the same float; -inf, NaN and values below -9999
 * as -9999.0 (as vLLM). Output is compact JSON, keys in the order documented. */

/* The error body: {"error": {"message", "type", "param" (null when ""), "code" (the
 * status as a string)}}. */
char *ina_openai_render_error(const ina_openai_error_t *err);

/* GET /v1/models: {"object": "list", "data": [{"id": model, "object": "model", "created",
 * "owned_by": "ina", "max_model_len"}]}. */
char *ina_openai_render_models(const char *model, int64_t created, int64_t max_model_len);

/* Log probabilities of one generated token and its top alternatives. */
typedef struct ina_openai_logprob {
  const char *token;       /* the token's text (may hold invalid UTF-8: rendered with U+FFFD) */
  size_t token_len;
  float logprob;
  size_t num_top;          /* <= INA_OPENAI_MAX_LOGPROBS */
  const char *const *top_tokens;
  const size_t *top_token_lens;
  const float *top_logprobs;
} ina_openai_logprob_t;

typedef struct ina_openai_usage {
  int64_t prompt_tokens, completion_tokens; /* total = their sum */
  int64_t cached_tokens; /* prompt_tokens_details.cached_tokens */
} ina_openai_usage_t;

/* One choice of a whole (non-streamed) answer. */
typedef struct ina_openai_choice {
  const char *text; /* completions: text; chat: message.content */
  size_t text_len;
  const char *reasoning;  /* chat: message.reasoning_content, NULL when none */
  size_t reasoning_len;
  const char *finish_reason; /* "stop", "length", or NULL (rendered null) */
  const ina_openai_logprob_t *logprobs; /* [num_logprobs], NULL when not asked */
  size_t num_logprobs;
} ina_openai_choice_t;

/* A whole answer (usage NULL: no "usage" key): completions {"id", "object": "text_completion", "created", "model",
 * "choices": [{"index", "text", "logprobs", "finish_reason"}], "usage"}; chat {"id",
 * "object": "chat.completion", ..., "choices": [{"index", "message": {"role":
 * "assistant", "content"}, "logprobs", "finish_reason"}], "usage"}. Completions
 * logprobs are {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
 * "text_offset"} (offsets in characters of the choice's text; of alternatives with the
 * same text the first is kept); chat logprobs are {"content": [{"token", "logprob", "bytes",
 * "top_logprobs": [{"token", "logprob", "bytes"}]}]} ("bytes": the token's own bytes,
 * before any U+FFFD). Chat message.content is null when text is NULL; completions text
 * NULL is "". */
char *ina_openai_render_response(ina_openai_endpoint_t endpoint, const char *id, int64_t created,
                                 const char *model, const ina_openai_choice_t *choices, size_t num_choices,
                                 const ina_openai_usage_t *usage);

/* One server-sent event's JSON (without the "data: " framing): a chunk of choice `index`
 * with new text (and its tokens' logprobs), or its finish (finish_reason set, text may be
 * empty), or, with usage set and choice NULL, the final usage chunk ("choices": []).
 * Chat chunks carry {"delta": {"role": "assistant"}} in each choice's first chunk
 * (first_chunk), {"delta": {"content"}} after. object: "text_completion" or
 * "chat.completion.chunk".
 * Chat deltas precisely: "role" when first_chunk; "reasoning_content" when reasoning_len
 * > 0; "content" when text_len > 0 or first_chunk ("" then, as OpenAI's first chunk); so
 * a finish chunk without text has "delta": {}. Completions chunks always carry "text".
 * With usage set and a choice too, the chunk carries both (vLLM's continuous usage).
 * Completions logprobs' text_offset start at 0: see ina_openai_render_chunk_at. */
char *ina_openai_render_chunk(ina_openai_endpoint_t endpoint, const char *id, int64_t created, const char *model,
                              size_t index, int first_chunk, const ina_openai_choice_t *choice,
                              const ina_openai_usage_t *usage);

/* ina_openai_render_chunk with the completions logprobs' text_offset starting at
 * text_offset: the characters of the choice's text sent in earlier chunks (the sum of
 * ina_openai_text_chars over them). Chat chunks ignore it. */
char *ina_openai_render_chunk_at(ina_openai_endpoint_t endpoint, const char *id, int64_t created, const char *model,
                                 size_t index, int first_chunk, const ina_openai_choice_t *choice,
                                 const ina_openai_usage_t *usage, size_t text_offset);

/* The characters (code points) of text [len] as the renderers write it: each ill-formed
 * subpart counts one (its U+FFFD). */
size_t ina_openai_text_chars(const char *text, size_t len);

#ifdef __cplusplus
}
#endif
#endif
