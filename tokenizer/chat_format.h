/* DeepSeek chat formats, rendered natively: a conversation (system / user / assistant
 * messages) to the prompt text that the checkpoint's chat template would produce through
 * Hugging Face transformers' apply_chat_template(tokenize=False). ina carries no Jinja
 * interpreter; it recognizes which DeepSeek release a tokenizer_config.json chat_template
 * belongs to and renders that release's format in C, byte for byte as the template does
 * (tests/chat checks this against transformers on random conversations).
 *
 * Formats (names as --chat-format takes them):
 *   deepseek-v2        DeepSeek-V2-Chat / V2-Lite-Chat: "User: ...\n\nAssistant: ...<eos>".
 *   deepseek-v3        DeepSeek-V3: <｜User｜>, <｜Assistant｜>; an assistant message keeps only
 *                      what follows its last </think>.
 *   deepseek-v3-0324   DeepSeek-V3-0324: a user turn ends with <｜Assistant｜>; the generation
 *                      prompt is added only after a non-user turn.
 *   deepseek-v3.1      DeepSeek-V3.1 / V3.1-Terminus: hybrid thinking; the first assistant
 *                      turn after a user opens with <｜Assistant｜></think>, an assistant
 *                      message keeps what follows its first </think>, the generation prompt
 *                      (after a user turn only) ends with <think> or </think> per `thinking`.
 *   deepseek-v3.2-exp  DeepSeek-V3.2-Exp: as deepseek-v3.1, but with add_generation_prompt the
 *                      generation prompt is added after any last turn.
 *   deepseek-v3.2      DeepSeek-V3.2: its release has no Jinja template, only a Python encoder
 *                      (encoding_dsv32.py, encode_messages with drop_thinking); rendered as it
 *                      does: system text in place, each user turn ends with <｜Assistant｜> and
 *                      <think> (the last user turn in thinking mode) or </think>, assistant
 *                      turns after the last user carry their reasoning_content and </think> in
 *                      thinking mode. Every user turn already opens the assistant's reply, so
 *                      add_generation_prompt changes nothing.
 *
 * Messages: role "system", "user" or "assistant"; content UTF-8, NUL-terminated. Tool calls,
 * tool results, "developer" and other roles are refused (INA_ERR_UNSUPPORTED) rather than
 * rendered approximately. reasoning_content is read by deepseek-v3.2 only (the other
 * templates ignore it, as ina does). Every error names the message and field:
 * "messages[2].role: 'tool' is not supported by deepseek-v3 (system, user, assistant)".
 *
 * Ownership: the caller owns the messages and options; *text is malloc'ed, NUL-terminated,
 * freed by the caller with free() (NULL on failure). Thread safety: every function is
 * thread-safe (no state; the name table is static). */
#ifndef INA_TOKENIZER_CHAT_FORMAT_H
#define INA_TOKENIZER_CHAT_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ina_chat_format {
  INA_CHAT_DEEPSEEK_V2 = 0,
  INA_CHAT_DEEPSEEK_V3,
  INA_CHAT_DEEPSEEK_V3_0324,
  INA_CHAT_DEEPSEEK_V3_1,
  INA_CHAT_DEEPSEEK_V3_2_EXP,
  INA_CHAT_DEEPSEEK_V3_2,
  INA_CHAT_FORMAT_COUNT
} ina_chat_format_t;

typedef struct ina_chat_message {
  const char *role;              /* "system", "user", "assistant" */
  const char *content;           /* UTF-8, NUL-terminated; "" is allowed, NULL is not */
  const char *reasoning_content; /* may be NULL; read by deepseek-v3.2 in thinking mode */
} ina_chat_message_t;

/* Versioned (core/check.h): fill with INA_CHAT_OPTIONS_INIT. */
typedef struct ina_chat_options {
  size_t struct_size;
  uint32_t version;
  int add_generation_prompt; /* end with the opening of the assistant's reply */
  int thinking;              /* deepseek-v3.1 and later: thinking mode; refused as 1 by older formats */
  const char *bos_token;     /* NULL: "<｜begin▁of▁sentence｜>"; "" for none */
  const char *eos_token;     /* NULL: "<｜end▁of▁sentence｜>" (deepseek-v2 reads it; V3 templates spell it out) */
} ina_chat_options_t;

#define INA_CHAT_OPTIONS_VERSION 1u
#define INA_CHAT_OPTIONS_INIT {sizeof(ina_chat_options_t), INA_CHAT_OPTIONS_VERSION, 1, 0, NULL, NULL}

/* The format's name ("deepseek-v3.1"); "unknown" out of range. Static. */
const char *ina_chat_format_name(ina_chat_format_t format);
/* All names, comma-separated, for help and error messages. Static. */
const char *ina_chat_format_names(void);
/* 1 when the format has a thinking mode (options.thinking may be 1). */
int ina_chat_format_has_thinking(ina_chat_format_t format);

/* A name as --chat-format takes it (exact, lower case). Unknown: INA_ERR_NOT_FOUND with a
 * message listing the names. */
ina_status_t ina_chat_format_from_name(const char *name, ina_chat_format_t *out);

/* The format whose chat template this is (tokenizer_config.json's chat_template text). The
 * template is recognized by the statements that decide its output for system, user and
 * assistant messages, compared after dropping whitespace outside string literals and
 * Jinja's trim markers, and by the DeepSeek special-token literals it may contain; so a
 * re-indented copy is recognized and a template that renders differently (another model's,
 * a generic ChatML or Llama-3 one, an edited DeepSeek one) is not. Not recognized:
 * INA_ERR_UNSUPPORTED, the message saying that it is not one of the known DeepSeek formats
 * and that --chat-format NAME picks one. NULL (a checkpoint without a template, as
 * DeepSeek-V3.2 ships): INA_ERR_NOT_FOUND, saying the same. */
ina_status_t ina_chat_format_recognize(const char *template_text, ina_chat_format_t *out);

/* Renders n messages (messages may be NULL when n == 0). opts may be NULL (defaults of
 * INA_CHAT_OPTIONS_INIT). *len excludes the NUL. Errors: INA_ERR_INVALID_ARGUMENT (NULL
 * role or content, invalid UTF-8, bad options), INA_ERR_UNSUPPORTED (a role or option the
 * format does not have, a conversation its template or encoder refuses). */
ina_status_t ina_chat_render(ina_chat_format_t format, const ina_chat_message_t *messages, size_t n,
                             const ina_chat_options_t *opts, char **text, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
