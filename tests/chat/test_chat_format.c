/* Unit tests of tokenizer/chat_format.h: names, recognition of the release templates in
 * tests/chat/templates (argv[1]) and its strictness, exact renderings of every format (the
 * deepseek-v3.2 ones are the outputs its encoder's documentation gives), and the errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "tests/test_util.h"
#include "tokenizer/chat_format.h"

#define BOS "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define U "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define A "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"

static char *read_text(const char *dir, const char *name) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
    free(s);
    s = NULL;
  }
  if (s) s[n] = '\0';
  fclose(f);
  return s;
}

/* Replaces every occurrence of `from` by `to` (malloc'ed result). */
static char *replace_all(const char *s, const char *from, const char *to) {
  size_t nf = strlen(from), nt = strlen(to), count = 0;
  for (const char *p = strstr(s, from); p; p = strstr(p + nf, from)) count++;
  char *out = malloc(strlen(s) + count * (nt > nf ? nt - nf : 0) + 1), *o = out;
  for (const char *p = s;;) {
    const char *q = strstr(p, from);
    if (!q) {
      strcpy(o, p);
      break;
    }
    memcpy(o, p, (size_t)(q - p));
    o += q - p;
    memcpy(o, to, nt);
    o += nt;
    p = q + nf;
  }
  return out;
}

static int recognizes(const char *tmpl, ina_chat_format_t want) {
  ina_chat_format_t got = INA_CHAT_FORMAT_COUNT;
  ina_status_t st = ina_chat_format_recognize(tmpl, &got);
  if (st != INA_OK) fprintf(stderr, "  recognize: %s\n", ina_last_error());
  return st == INA_OK && got == want;
}

static int refused(const char *tmpl) {
  ina_chat_format_t got;
  ina_status_t st = ina_chat_format_recognize(tmpl, &got);
  const char *e = ina_last_error();
  return st == INA_ERR_UNSUPPORTED && strstr(e, "not one of the known DeepSeek formats") && strstr(e, "--chat-format NAME");
}

static void test_names(void) {
  for (int f = 0; f < INA_CHAT_FORMAT_COUNT; f++) {
    ina_chat_format_t g;
    CHECK_OK(ina_chat_format_from_name(ina_chat_format_name((ina_chat_format_t)f), &g));
    CHECK(g == (ina_chat_format_t)f);
    CHECK(strstr(ina_chat_format_names(), ina_chat_format_name((ina_chat_format_t)f)) != NULL);
  }
  ina_chat_format_t g;
  CHECK(ina_chat_format_from_name("chatml", &g) == INA_ERR_NOT_FOUND);
  CHECK(strstr(ina_last_error(), "'chatml' is unknown") && strstr(ina_last_error(), "deepseek-v3.2-exp"));
  CHECK(strcmp(ina_chat_format_name(INA_CHAT_FORMAT_COUNT), "unknown") == 0);
  CHECK(!ina_chat_format_has_thinking(INA_CHAT_DEEPSEEK_V3) && ina_chat_format_has_thinking(INA_CHAT_DEEPSEEK_V3_1));
}

static const struct {
  const char *file;
  ina_chat_format_t format;
} k_fixtures[] = {
    {"deepseek-v2-lite-chat.jinja", INA_CHAT_DEEPSEEK_V2},   {"deepseek-v3.jinja", INA_CHAT_DEEPSEEK_V3},
    {"deepseek-v3-0324.jinja", INA_CHAT_DEEPSEEK_V3_0324},   {"deepseek-v3.1.jinja", INA_CHAT_DEEPSEEK_V3_1},
    {"deepseek-v3.2-exp.jinja", INA_CHAT_DEEPSEEK_V3_2_EXP},
};

static void test_recognize(const char *dir) {
  for (size_t i = 0; i < sizeof(k_fixtures) / sizeof(k_fixtures[0]); i++) {
    char *t = read_text(dir, k_fixtures[i].file);
    CHECKF(t != NULL, "cannot read %s/%s", dir, k_fixtures[i].file);
    if (!t) continue;
    CHECKF(recognizes(t, k_fixtures[i].format), "%s", k_fixtures[i].file);
    /* Re-indented as a person would lay it out: spaces inside the tags, trim markers, a
     * newline and indentation between tags. */
    char *a0 = replace_all(t, "{%-", "{%");
    char *a1 = replace_all(a0, "-%}", "%}");
    char *a = replace_all(a1, "{%", "{%- ");
    char *b = replace_all(a, "%}", " -%}\n    ");
    char *c = replace_all(b, "{{", "{{ ");
    char *d = replace_all(c, "}}", " }}\n");
    CHECKF(recognizes(d, k_fixtures[i].format), "%s re-indented", k_fixtures[i].file);
    /* An edit of what it renders is refused: the generation prompt of R1's later releases
     * (a <think> and a newline), or a V2 role prefix without its space. */
    char *e = replace_all(t, "{{'" A "'}}{% endif %}", "{{'" A "<think>\\n'}}{% endif %}");
    if (strcmp(e, t) != 0) CHECKF(refused(e), "%s with R1's generation prompt", k_fixtures[i].file);
    char *f = replace_all(t, "'User: '", "'User:'");
    if (strcmp(f, t) != 0) CHECKF(refused(f), "%s with 'User:'", k_fixtures[i].file);
    char *g = replace_all(t, "split('</think>', 1)[1]", "split('</think>')[-1]");
    if (strcmp(g, t) != 0) CHECKF(refused(g), "%s splitting at the last </think>", k_fixtures[i].file);
    char *h = replace_all(t, "{{ bos_token }}", "");
    if (strcmp(h, t) != 0) CHECKF(refused(h), "%s without BOS", k_fixtures[i].file);
    free(a0), free(a1), free(a), free(b), free(c), free(d), free(e), free(f), free(g), free(h);
    free(t);
  }
  /* Generic templates. */
  CHECK(refused("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                "{% endif %}"));
  CHECK(refused("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
                "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
                "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
                "{{ content }}{% endfor %}{% if add_generation_prompt %}"
                "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"));
  CHECK(refused(""));
  CHECK(refused("{% for message in messages %}" U "{{ message.content }}" A "{% endfor %}"));
  CHECK(strstr(ina_last_error(), "DeepSeek's role markers") != NULL);
  ina_chat_format_t g;
  CHECK(ina_chat_format_recognize(NULL, &g) == INA_ERR_NOT_FOUND);
  CHECK(strstr(ina_last_error(), "--chat-format NAME") != NULL);
}

static int renders(ina_chat_format_t f, const ina_chat_message_t *m, size_t n, const ina_chat_options_t *o,
                   const char *want) {
  char *text = NULL;
  size_t len = 0;
  ina_status_t st = ina_chat_render(f, m, n, o, &text, &len);
  int ok = st == INA_OK && text && strcmp(text, want) == 0 && len == strlen(want);
  if (!ok) fprintf(stderr, "  %s: got '%s' (%s), want '%s'\n", ina_chat_format_name(f), text ? text : "(null)",
                   st == INA_OK ? "ok" : ina_last_error(), want);
  free(text);
  return ok;
}

static void test_render(void) {
  const ina_chat_message_t conv[] = {{"system", "S1", NULL}, {"user", "hi\nthere", NULL},
                                     {"assistant", "r</think>a</think>b", NULL}, {"system", "S2", NULL},
                                     {"user", "\xce\xbb?", NULL}};
  ina_chat_options_t o = INA_CHAT_OPTIONS_INIT;
  CHECK(renders(INA_CHAT_DEEPSEEK_V2, conv, 5, &o,
                BOS "S1\n\nUser: hi\nthere\n\nAssistant: r</think>a</think>b" EOS "S2\n\nUser: \xce\xbb?\n\nAssistant:"));
  o.bos_token = "";
  o.eos_token = "<E>";
  CHECK(renders(INA_CHAT_DEEPSEEK_V2, conv + 1, 2, &o, "User: hi\nthere\n\nAssistant: r</think>a</think>b<E>Assistant:"));
  o = (ina_chat_options_t)INA_CHAT_OPTIONS_INIT;
  CHECK(renders(INA_CHAT_DEEPSEEK_V3, conv, 5, &o, BOS "S1\n\nS2" U "hi\nthere" A "b" EOS U "\xce\xbb?" A));
  CHECK(renders(INA_CHAT_DEEPSEEK_V3_0324, conv, 5, &o,
                BOS "S1\n\nS2" U "hi\nthere" A "r</think>a</think>b" EOS U "\xce\xbb?" A));
  CHECK(renders(INA_CHAT_DEEPSEEK_V3_0324, conv, 3, &o, BOS "S1" U "hi\nthere" A "r</think>a</think>b" EOS A));
  CHECK(renders(INA_CHAT_DEEPSEEK_V3_1, conv, 5, &o,
                BOS "S1\n\nS2" U "hi\nthere" A "</think>a</think>b" EOS U "\xce\xbb?" A "</think>"));
  o.thinking = 1;
  CHECK(renders(INA_CHAT_DEEPSEEK_V3_1, conv, 5, &o,
                BOS "S1\n\nS2" U "hi\nthere" A "</think>a</think>b" EOS U "\xce\xbb?" A "<think>"));
  /* After an assistant turn V3.1 adds no generation prompt, V3.2-Exp does. */
  CHECK(renders(INA_CHAT_DEEPSEEK_V3_1, conv, 3, &o, BOS "S1" U "hi\nthere" A "</think>a</think>b" EOS));
  CHECK(renders(INA_CHAT_DEEPSEEK_V3_2_EXP, conv, 3, &o, BOS "S1" U "hi\nthere" A "</think>a</think>b" EOS A "<think>"));
  o.add_generation_prompt = 0;
  CHECK(renders(INA_CHAT_DEEPSEEK_V3_2_EXP, conv, 5, &o,
                BOS "S1\n\nS2" U "hi\nthere" A "</think>a</think>b" EOS U "\xce\xbb?"));
  o = (ina_chat_options_t)INA_CHAT_OPTIONS_INIT;
  CHECK(renders(INA_CHAT_DEEPSEEK_V3, NULL, 0, &o, BOS A));
  CHECK(renders(INA_CHAT_DEEPSEEK_V3_1, NULL, 0, &o, BOS));
  CHECK(renders(INA_CHAT_DEEPSEEK_V3_2_EXP, NULL, 0, NULL, BOS A "</think>"));

  /* deepseek-v3.2: the example of its encoder's documentation (thinking mode, with and
   * without drop_thinking: the earlier reasoning is not rendered either way). */
  const ina_chat_message_t ex[] = {{"user", "hello", NULL},
                                   {"assistant", "Hello! I am DeepSeek.", "thinking..."},
                                   {"user", "1+1=?", NULL}};
  o.thinking = 1;
  CHECK(renders(INA_CHAT_DEEPSEEK_V3_2, ex, 3, &o,
                BOS U "hello" A "</think>Hello! I am DeepSeek." EOS U "1+1=?" A "<think>"));
  o.thinking = 0;
  CHECK(renders(INA_CHAT_DEEPSEEK_V3_2, ex, 3, &o,
                BOS U "hello" A "</think>Hello! I am DeepSeek." EOS U "1+1=?" A "</think>"));
  /* In place system text; the reasoning of an answer after the last user turn. */
  const ina_chat_message_t ex2[] = {{"system", "You are a helpful assistant.", NULL},
                                    {"user", "1+1=?", NULL},
                                    {"assistant", "2", "one and one"}};
  o.thinking = 1;
  CHECK(renders(INA_CHAT_DEEPSEEK_V3_2, ex2, 3, &o,
                BOS "You are a helpful assistant." U "1+1=?" A "<think>one and one</think>2" EOS));
  o.thinking = 0;
  CHECK(renders(INA_CHAT_DEEPSEEK_V3_2, ex2, 3, &o, BOS "You are a helpful assistant." U "1+1=?" A "</think>2" EOS));
}

static int fails(ina_chat_format_t f, const ina_chat_message_t *m, size_t n, const ina_chat_options_t *o,
                 ina_status_t want, const char *msg) {
  char *text = (char *)1;
  size_t len = 7;
  ina_status_t st = ina_chat_render(f, m, n, o, &text, &len);
  int ok = st == want && text == NULL && len == 0 && strstr(ina_last_error(), msg) != NULL;
  if (!ok) fprintf(stderr, "  %s: status %d, error '%s', want '%s'\n", ina_chat_format_name(f), st, ina_last_error(), msg);
  if (st == INA_OK) free(text);
  return ok;
}

static void test_errors(void) {
  const ina_chat_message_t tool[] = {{"user", "q", NULL}, {"assistant", "a", NULL}, {"tool", "out", NULL}};
  CHECK(fails(INA_CHAT_DEEPSEEK_V3, tool, 3, NULL, INA_ERR_UNSUPPORTED,
              "messages[2].role: 'tool' is not supported by deepseek-v3 (system, user, assistant)"));
  const ina_chat_message_t dev[] = {{"developer", "x", NULL}};
  CHECK(fails(INA_CHAT_DEEPSEEK_V3_2, dev, 1, NULL, INA_ERR_UNSUPPORTED,
              "messages[0].role: 'developer' is not supported by deepseek-v3.2"));
  const ina_chat_message_t nullc[] = {{"user", "q", NULL}, {"assistant", NULL, NULL}};
  CHECK(fails(INA_CHAT_DEEPSEEK_V2, nullc, 2, NULL, INA_ERR_INVALID_ARGUMENT, "messages[1].content is NULL"));
  const ina_chat_message_t nullr[] = {{NULL, "q", NULL}};
  CHECK(fails(INA_CHAT_DEEPSEEK_V3_1, nullr, 1, NULL, INA_ERR_INVALID_ARGUMENT, "messages[0].role is NULL"));
  const ina_chat_message_t bad[] = {{"user", "ok\xc3(", NULL}};
  CHECK(fails(INA_CHAT_DEEPSEEK_V3, bad, 1, NULL, INA_ERR_INVALID_ARGUMENT, "messages[0].content: invalid UTF-8 at byte 2"));
  const ina_chat_message_t sur[] = {{"user", "\xed\xa0\x80", NULL}};
  CHECK(fails(INA_CHAT_DEEPSEEK_V3, sur, 1, NULL, INA_ERR_INVALID_ARGUMENT, "invalid UTF-8 at byte 0"));
  ina_chat_options_t o = INA_CHAT_OPTIONS_INIT;
  o.thinking = 1;
  const ina_chat_message_t one[] = {{"user", "q", NULL}};
  CHECK(fails(INA_CHAT_DEEPSEEK_V3, one, 1, &o, INA_ERR_UNSUPPORTED, "thinking: deepseek-v3 has no thinking mode"));
  CHECK(fails(INA_CHAT_DEEPSEEK_V2, one, 1, &o, INA_ERR_UNSUPPORTED, "thinking: deepseek-v2 has no thinking mode"));
  const ina_chat_message_t noreason[] = {{"user", "q", NULL}, {"assistant", "a", NULL}};
  CHECK(fails(INA_CHAT_DEEPSEEK_V3_2, noreason, 2, &o, INA_ERR_UNSUPPORTED, "messages[1].reasoning_content: deepseek-v3.2"));
  const ina_chat_message_t empty_reason[] = {{"user", "q", NULL}, {"assistant", "a", ""}};
  CHECK(fails(INA_CHAT_DEEPSEEK_V3_2, empty_reason, 2, &o, INA_ERR_UNSUPPORTED, "messages[1].reasoning_content"));
  ina_chat_options_t bad_opts = INA_CHAT_OPTIONS_INIT;
  bad_opts.struct_size = 4;
  CHECK(fails(INA_CHAT_DEEPSEEK_V3, one, 1, &bad_opts, INA_ERR_INVALID_ARGUMENT, "INA_CHAT_OPTIONS_INIT"));
  CHECK(fails(INA_CHAT_DEEPSEEK_V3, NULL, 2, NULL, INA_ERR_INVALID_ARGUMENT, "messages is NULL"));
  CHECK(fails((ina_chat_format_t)99, one, 1, NULL, INA_ERR_INVALID_ARGUMENT, "out of range"));
  size_t len;
  CHECK(ina_chat_render(INA_CHAT_DEEPSEEK_V3, one, 1, NULL, NULL, &len) == INA_ERR_INVALID_ARGUMENT);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s TEMPLATES_DIR\n", argv[0]);
    return 2;
  }
  ina_log_set_quiet_errors(1);
  test_names();
  test_recognize(argv[1]);
  test_render();
  test_errors();
  return test_finish("test_chat_format");
}
