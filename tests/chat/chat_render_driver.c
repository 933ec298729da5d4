/* chat_render_driver: runs tokenizer/chat_format.h on requests read as JSON, for
 * check_chat_templates.py.
 *
 *   chat_render_driver REQUESTS.json   (or - for stdin)
 *
 * REQUESTS.json: {"requests": [R, ...]} where R is
 *   {"op": "render", "format": NAME, "messages": [{"role": .., "content": .., "reasoning_content": ..}],
 *    "add_generation_prompt": bool, "thinking": bool, "bos_token": str|null, "eos_token": str|null}
 *   {"op": "recognize", "template": TEXT|null}
 * Prints {"results": [..]} with {"ok": true, "text": ..} or {"ok": true, "format": NAME} or
 * {"ok": false, "status": .., "error": ..} for each request, in order. A JSON null role or
 * content is passed as NULL. Exit 0 when every request was read (whatever its result), 2 on
 * a malformed request file. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "tokenizer/chat_format.h"

static const char *opt_string(json_t *obj, const char *key) {
  json_t *v = json_object_get(obj, key);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

static json_t *failure(ina_status_t st) {
  return json_pack("{s:b, s:s, s:s}", "ok", 0, "status", ina_status_string(st), "error", ina_last_error());
}

static json_t *run_render(json_t *req) {
  ina_chat_format_t fmt;
  ina_status_t st = ina_chat_format_from_name(opt_string(req, "format") ? opt_string(req, "format") : "", &fmt);
  if (st != INA_OK) return failure(st);
  json_t *msgs = json_object_get(req, "messages");
  size_t n = json_array_size(msgs);
  ina_chat_message_t *m = calloc(n ? n : 1, sizeof(*m));
  if (!m) return NULL;
  for (size_t i = 0; i < n; i++) {
    json_t *mi = json_array_get(msgs, i);
    m[i].role = opt_string(mi, "role");
    m[i].content = opt_string(mi, "content");
    m[i].reasoning_content = opt_string(mi, "reasoning_content");
  }
  ina_chat_options_t opts = INA_CHAT_OPTIONS_INIT;
  opts.add_generation_prompt = json_is_true(json_object_get(req, "add_generation_prompt"));
  opts.thinking = json_is_true(json_object_get(req, "thinking"));
  opts.bos_token = opt_string(req, "bos_token");
  opts.eos_token = opt_string(req, "eos_token");
  char *text = NULL;
  size_t len = 0;
  st = ina_chat_render(fmt, m, n, &opts, &text, &len);
  free(m);
  if (st != INA_OK) return failure(st);
  json_t *r = json_pack("{s:b, s:s%}", "ok", 1, "text", text, len);
  free(text);
  return r;
}

static json_t *run_recognize(json_t *req) {
  ina_chat_format_t fmt;
  ina_status_t st = ina_chat_format_recognize(opt_string(req, "template"), &fmt);
  if (st != INA_OK) return failure(st);
  return json_pack("{s:b, s:s}", "ok", 1, "format", ina_chat_format_name(fmt));
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s REQUESTS.json|-\n", argv[0]);
    return 2;
  }
  ina_log_set_quiet_errors(1);
  json_error_t err;
  json_t *doc = strcmp(argv[1], "-") == 0 ? json_loadf(stdin, 0, &err) : json_load_file(argv[1], 0, &err);
  json_t *reqs = doc ? json_object_get(doc, "requests") : NULL;
  if (!json_is_array(reqs)) {
    fprintf(stderr, "%s: %s (line %d)\n", argv[1], doc ? "no \"requests\" array" : err.text, err.line);
    json_decref(doc);
    return 2;
  }
  json_t *results = json_array();
  for (size_t i = 0; i < json_array_size(reqs); i++) {
    json_t *req = json_array_get(reqs, i);
    const char *op = opt_string(req, "op");
    json_t *r = NULL;
    if (op && strcmp(op, "render") == 0) {
      r = run_render(req);
    } else if (op && strcmp(op, "recognize") == 0) {
      r = run_recognize(req);
    } else {
      fprintf(stderr, "requests[%zu]: unknown op\n", i);
      json_decref(results);
      json_decref(doc);
      return 2;
    }
    if (!r) {
      fprintf(stderr, "requests[%zu]: out of memory\n", i);
      return 2;
    }
    json_array_append_new(results, r);
  }
  json_t *out = json_pack("{s:o}", "results", results);
  json_dumpf(out, stdout, JSON_COMPACT);
  fputc('\n', stdout);
  json_decref(out);
  json_decref(doc);
  return 0;
}
