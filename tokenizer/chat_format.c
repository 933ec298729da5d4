/* DeepSeek chat formats: recognition of the checkpoint's chat template and native rendering
 * (chat_format.h). Each renderer follows its template statement by statement for system,
 * user and assistant messages; the comments quote the deciding statements. */
#define INA_LOG_SUBSYS "chat"

#include "tokenizer/chat_format.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

#define BOS_DEFAULT "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define EOS_DEFAULT "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define USER_TAG "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define ASSISTANT_TAG "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define EOS_LITERAL EOS_DEFAULT
#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"

static const char *const k_names[INA_CHAT_FORMAT_COUNT] = {
    "deepseek-v2", "deepseek-v3", "deepseek-v3-0324", "deepseek-v3.1", "deepseek-v3.2-exp", "deepseek-v3.2",
};

const char *ina_chat_format_name(ina_chat_format_t format) {
  if ((int)format < 0 || format >= INA_CHAT_FORMAT_COUNT) return "unknown";
  return k_names[format];
}

const char *ina_chat_format_names(void) {
  return "deepseek-v2, deepseek-v3, deepseek-v3-0324, deepseek-v3.1, deepseek-v3.2-exp, deepseek-v3.2";
}

int ina_chat_format_has_thinking(ina_chat_format_t format) {
  return format == INA_CHAT_DEEPSEEK_V3_1 || format == INA_CHAT_DEEPSEEK_V3_2_EXP || format == INA_CHAT_DEEPSEEK_V3_2;
}

ina_status_t ina_chat_format_from_name(const char *name, ina_chat_format_t *out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_chat_format_from_name: out is NULL");
  INA_REQUIRE(name != NULL, INA_ERR_INVALID_ARGUMENT, "ina_chat_format_from_name: name is NULL");
  for (int f = 0; f < INA_CHAT_FORMAT_COUNT; f++) {
    if (strcmp(name, k_names[f]) == 0) {
      *out = (ina_chat_format_t)f;
      return INA_OK;
    }
  }
  INA_REQUIRE(0, INA_ERR_NOT_FOUND, "chat format '%s' is unknown (known: %s)", name, ina_chat_format_names());
fail:
  return st;
}

/* ---------------------------------------------------------------------------------------
 * Recognition. The template is reduced to a canonical text: comments dropped, whitespace
 * outside string literals dropped inside tags, Jinja's trim markers ({%- -%} {{- -}}) and
 * whitespace-only text between tags dropped. String literals keep their bytes. A format
 * matches when every required statement occurs in that text, no forbidden one does, and
 * every literal that carries a DeepSeek marker is one the format's template has. */

/* A growable NUL-terminated string; once out of memory it takes nothing more. */
typedef struct buf {
  char *p;
  size_t len, cap;
  int oom;
} buf_t;

static void put(buf_t *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

typedef struct canon {
  buf_t text;
  char **lits; /* literals (quoted strings, and non-blank text outside tags) */
  size_t nlits, caplits;
  int oom;     /* the literals' allocation failed */
} canon_t;

static void canon_lit(canon_t *c, const char *s, size_t n) {
  if (c->oom) return;
  if (c->nlits == c->caplits) {
    size_t cap = c->caplits ? 2 * c->caplits : 32;
    char **p = realloc(c->lits, cap * sizeof(*p));
    if (!p) {
      c->oom = 1;
      return;
    }
    c->lits = p;
    c->caplits = cap;
  }
  char *l = malloc(n + 1);
  if (!l) {
    c->oom = 1;
    return;
  }
  memcpy(l, s, n);
  l[n] = '\0';
  c->lits[c->nlits++] = l;
}

static void canon_free(canon_t *c) {
  for (size_t i = 0; i < c->nlits; i++) free(c->lits[i]);
  free(c->lits);
  free(c->text.p);
}

static int is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }

static void canonicalize(const char *t, canon_t *c) {
  size_t n = strlen(t), i = 0;
  put(&c->text, "", 0);
  while (i < n) {
    if (t[i] == '{' && i + 1 < n && t[i + 1] == '#') {
      const char *e = strstr(t + i + 2, "#}");
      i = e ? (size_t)(e - t) + 2 : n;
      continue;
    }
    if (t[i] == '{' && i + 1 < n && (t[i + 1] == '{' || t[i + 1] == '%')) {
      char close0 = t[i + 1] == '{' ? '}' : '%';
      put(&c->text, t + i, 2);
      i += 2;
      if (i < n && (t[i] == '-' || t[i] == '+')) i++;
      while (i < n) {
        char ch = t[i];
        if (ch == '\'' || ch == '"') {
          size_t j = i + 1;
          while (j < n && t[j] != ch) j += (t[j] == '\\' && j + 1 < n) ? 2 : 1;
          if (j >= n) j = n - 1;
          canon_lit(c, t + i + 1, j - i - 1);
          put(&c->text, t + i, j - i + 1);
          i = j + 1;
          continue;
        }
        if ((ch == '-' || ch == '+') && i + 2 < n && t[i + 1] == close0 && t[i + 2] == '}') {
          i++;
          continue;
        }
        if (ch == close0 && i + 1 < n && t[i + 1] == '}') {
          put(&c->text, t + i, 2);
          i += 2;
          break;
        }
        if (!is_ws(ch)) put(&c->text, &t[i], 1);
        i++;
      }
      continue;
    }
    size_t j = i;
    while (j < n && !(t[j] == '{' && j + 1 < n && (t[j + 1] == '{' || t[j + 1] == '%' || t[j + 1] == '#'))) j++;
    int blank = 1;
    for (size_t k = i; k < j; k++)
      if (!is_ws(t[k])) blank = 0;
    if (!blank) {
      put(&c->text, t + i, j - i);
      canon_lit(c, t + i, j - i);
    }
    i = j;
  }
}

/* A literal carries a DeepSeek marker: a fullwidth bar (U+FF5C), a think tag, or the V2
 * role words. */
static int is_marker_literal(const char *l) {
  return strstr(l, "\xef\xbd\x9c") || strstr(l, "think>") || strstr(l, "User") || strstr(l, "Assistant");
}

typedef struct format_rule {
  ina_chat_format_t format;
  const char *const *required;
  const char *const *forbidden;
  const char *const *literals; /* the marker literals the format's template may contain */
} format_rule_t;

/* Canonical statements (see canonicalize). Backslash-n is the two characters of the Jinja
 * escape, as tokenizer_config.json stores it. */
#define SYS_JOIN "{%setns.system_prompt=ns.system_prompt+'\\n\\n'+message['content']%}"
#define SYS_FIRST "{%ifns.is_first_sp%}{%setns.system_prompt=ns.system_prompt+message['content']%}"
#define SYS_EMIT "{{bos_token}}{{ns.system_prompt}}"

static const char *const v2_required[] = {
    "{{bos_token}}{%formessageinmessages%}",
    "{%ifmessage['role']=='user'%}{{'User: '+message['content']+'\\n\\n'}}",
    "{%elifmessage['role']=='assistant'%}{{'Assistant: '+message['content']+eos_token}}",
    "{%elifmessage['role']=='system'%}{{message['content']+'\\n\\n'}}{%endif%}{%endfor%}",
    "{%ifadd_generation_prompt%}{{'Assistant:'}}{%endif%}",
    NULL};
static const char *const v2_forbidden[] = {"thinking", NULL};
static const char *const v2_literals[] = {"User: ", "Assistant: ", "Assistant:", NULL};

#define V3_TOOL_LITERALS                                                                                             \
  "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c><\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" \
  "begin\xef\xbd\x9c>",                                                                                              \
      "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>" EOS_LITERAL,                              \
      "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>",                                       \
      "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>",                                         \
      "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>",                                                            \
      "<\xef\xbd\x9ctool\xe2\x96\x81" "output\xe2\x96\x81" "begin\xef\xbd\x9c>",                                     \
      "<\xef\xbd\x9ctool\xe2\x96\x81" "output\xe2\x96\x81" "end\xef\xbd\x9c>",                                       \
      "<\xef\xbd\x9ctool\xe2\x96\x81" "outputs\xe2\x96\x81" "begin\xef\xbd\x9c><\xef\xbd\x9ctool\xe2\x96\x81"          \
      "output\xe2\x96\x81" "begin\xef\xbd\x9c>",                                                                     \
      "<\xef\xbd\x9ctool\xe2\x96\x81" "outputs\xe2\x96\x81" "end\xef\xbd\x9c>",                                      \
      "\\n<\xef\xbd\x9ctool\xe2\x96\x81" "output\xe2\x96\x81" "begin\xef\xbd\x9c>"

static const char *const v3_required[] = {
    SYS_FIRST, SYS_JOIN, SYS_EMIT,
    "{%ifmessage['role']=='user'%}{%setns.is_tool=false%}{{'" USER_TAG "'+message['content']}}{%endif%}",
    "{%setcontent=message['content']%}{%if'</think>'incontent%}{%setcontent=content.split('</think>')[-1]%}{%endif%}"
    "{{'" ASSISTANT_TAG "'+content+'" EOS_LITERAL "'}}",
    "{%ifadd_generation_promptandnotns.is_tool%}{{'" ASSISTANT_TAG "'}}{%endif%}",
    NULL};
static const char *const v3_forbidden[] = {"is_last_user", "thinking", NULL};
static const char *const v3_literals[] = {USER_TAG, ASSISTANT_TAG, EOS_LITERAL, THINK_CLOSE,
                                          ASSISTANT_TAG "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81"
                                                        "begin\xef\xbd\x9c><\xef\xbd\x9ctool\xe2\x96\x81"
                                                        "call\xe2\x96\x81" "begin\xef\xbd\x9c>",
                                          V3_TOOL_LITERALS, NULL};

static const char *const v3_0324_required[] = {
    SYS_FIRST, SYS_JOIN, SYS_EMIT,
    "{%setns.is_last_user=true%}{{'" USER_TAG "'+message['content']+'" ASSISTANT_TAG "'}}{%endif%}",
    "{%else%}{%setcontent=message['content']%}{{content+'" EOS_LITERAL "'}}{%endif%}",
    "{%ifadd_generation_promptandnotns.is_last_userandnotns.is_tool%}{{'" ASSISTANT_TAG "'}}{%endif%}",
    NULL};
static const char *const v3_0324_forbidden[] = {"thinking", "</think>", NULL};
static const char *const v3_0324_literals[] = {USER_TAG, ASSISTANT_TAG, EOS_LITERAL, V3_TOOL_LITERALS, NULL};

#define V31_COMMON                                                                                                   \
  SYS_FIRST, SYS_JOIN, SYS_EMIT, "{%ifnotthinkingisdefined%}",                                                       \
      "{%setns.is_last_user=true%}{{'" USER_TAG "'+message['content']}}{%endif%}",                                   \
      "{%ifns.is_last_user%}{{'" ASSISTANT_TAG "'}}{%ifmessage['prefix']isdefinedandmessage['prefix']andthinking%}"   \
      "{{'<think>'}}{%else%}{{'</think>'}}{%endif%}{%endif%}",                                                       \
      "{%setcontent=message['content']%}{%if'</think>'incontent%}{%setcontent=content.split('</think>',1)[1]%}"      \
      "{%endif%}{{content+'" EOS_LITERAL "'}}"

static const char *const v31_required[] = {
    V31_COMMON,
    "{%ifadd_generation_promptandns.is_last_userandnotns.is_tool%}{{'" ASSISTANT_TAG "'}}{%ifnotthinking%}"
    "{{'</think>'}}{%else%}{{'<think>'}}{%endif%}{%endif%}",
    NULL};
static const char *const v31_forbidden[] = {"is_only_sys", "is_prefix", NULL};
static const char *const v31_literals[] = {USER_TAG, ASSISTANT_TAG, EOS_LITERAL, THINK_OPEN, THINK_CLOSE,
                                           ASSISTANT_TAG THINK_CLOSE, V3_TOOL_LITERALS, NULL};

static const char *const v32exp_required[] = {
    V31_COMMON,
    "{%ifmessage['role']!='system'%}{%setns.is_only_sys=false%}{%endif%}",
    "{%ifadd_generation_promptandnotns.is_tool%}{%ifns.is_last_userorns.is_only_sysornotns.is_prefix%}"
    "{{'" ASSISTANT_TAG "'}}{%ifnotthinking%}{{'</think>'}}{%else%}{{'<think>'}}{%endif%}{%endif%}{%endif%}",
    NULL};
static const char *const v32exp_forbidden[] = {NULL};

static const format_rule_t k_rules[] = {
    {INA_CHAT_DEEPSEEK_V2, v2_required, v2_forbidden, v2_literals},
    {INA_CHAT_DEEPSEEK_V3, v3_required, v3_forbidden, v3_literals},
    {INA_CHAT_DEEPSEEK_V3_0324, v3_0324_required, v3_0324_forbidden, v3_0324_literals},
    {INA_CHAT_DEEPSEEK_V3_1, v31_required, v31_forbidden, v31_literals},
    {INA_CHAT_DEEPSEEK_V3_2_EXP, v32exp_required, v32exp_forbidden, v31_literals},
};

static int rule_matches(const format_rule_t *r, const canon_t *c) {
  for (const char *const *q = r->required; *q; q++)
    if (!strstr(c->text.p, *q)) return 0;
  for (const char *const *q = r->forbidden; *q; q++)
    if (strstr(c->text.p, *q)) return 0;
  for (size_t i = 0; i < c->nlits; i++) {
    if (!is_marker_literal(c->lits[i])) continue;
    int known = 0;
    for (const char *const *q = r->literals; *q && !known; q++) known = strcmp(c->lits[i], *q) == 0;
    if (!known) return 0;
  }
  return 1;
}

ina_status_t ina_chat_format_recognize(const char *template_text, ina_chat_format_t *out) {
  ina_status_t st = INA_OK;
  canon_t c = {0};
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_chat_format_recognize: out is NULL");
  INA_REQUIRE(template_text != NULL, INA_ERR_NOT_FOUND,
              "the checkpoint has no chat template (DeepSeek-V3.2 ships a Python encoder instead); "
              "--chat-format NAME picks one of the known DeepSeek formats (%s)",
              ina_chat_format_names());
  canonicalize(template_text, &c);
  INA_CHECK_ALLOC(!c.oom && !c.text.oom ? c.text.p : NULL);
  int found = -1;
  for (size_t r = 0; r < sizeof(k_rules) / sizeof(k_rules[0]); r++) {
    if (rule_matches(&k_rules[r], &c)) {
      INA_REQUIRE(found < 0, INA_ERR_INTERNAL, "chat template matches both %s and %s", k_names[found],
                  k_names[k_rules[r].format]);
      found = (int)k_rules[r].format;
    }
  }
  int deepseekish = strstr(c.text.p, USER_TAG) != NULL || strstr(c.text.p, "'User: '") != NULL;
  INA_REQUIRE(found >= 0, INA_ERR_UNSUPPORTED,
              "the checkpoint's chat template is not one of the known DeepSeek formats (%s)%s; "
              "--chat-format NAME picks one",
              ina_chat_format_names(),
              deepseekish ? ": it uses DeepSeek's role markers but renders differently from every known release" : "");
  *out = (ina_chat_format_t)found;
fail:
  canon_free(&c);
  return st;
}

/* ---------------------------------------------------------------------------------------
 * Rendering. */

static void puts_(buf_t *b, const char *s) { put(b, s, strlen(s)); }

typedef enum role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT } role_t;

/* Offset of the first invalid UTF-8 byte, or -1 (overlongs, surrogates and code points
 * above U+10FFFF are invalid, as Python's decoder says). */
static long utf8_invalid_at(const char *s) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (u[i]) {
    unsigned c = u[i];
    size_t k;
    unsigned cp;
    if (c < 0x80) {
      i++;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      k = 1;
      cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      k = 2;
      cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      k = 3;
      cp = c & 0x07;
    } else {
      return (long)i;
    }
    for (size_t j = 1; j <= k; j++) {
      if ((u[i + j] & 0xc0) != 0x80) return (long)i;
      cp = (cp << 6) | (u[i + j] & 0x3f);
    }
    if ((k == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (k == 3 && (cp < 0x10000 || cp > 0x10ffff)))
      return (long)i;
    i += k + 1;
  }
  return -1;
}

/* The text after the first (last = 0) or last (last = 1) "</think>", or all of it. */
static const char *after_think(const char *s, int last) {
  const char *p = strstr(s, THINK_CLOSE);
  if (!p) return s;
  if (last) {
    const char *q;
    while ((q = strstr(p + 1, THINK_CLOSE)) != NULL) p = q;
  }
  return p + strlen(THINK_CLOSE);
}

/* deepseek-v3 family: the system messages, wherever they stand, joined by "\n\n" after BOS
 * ({%- if ns.is_first_sp %}{% set ns.system_prompt = ns.system_prompt + message['content'] %}
 * {%- else %}{% set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] %}). */
static void put_systems(buf_t *b, const ina_chat_message_t *m, const role_t *roles, size_t n) {
  int first = 1;
  for (size_t i = 0; i < n; i++) {
    if (roles[i] != ROLE_SYSTEM) continue;
    if (!first) puts_(b, "\n\n");
    puts_(b, m[i].content);
    first = 0;
  }
}

ina_status_t ina_chat_render(ina_chat_format_t format, const ina_chat_message_t *m, size_t n,
                             const ina_chat_options_t *opts, char **text, size_t *len) {
  ina_status_t st = INA_OK;
  buf_t b = {0};
  role_t *roles = NULL;
  static const ina_chat_options_t defaults = INA_CHAT_OPTIONS_INIT;
  if (text) *text = NULL;
  if (len) *len = 0;
  INA_REQUIRE(text != NULL && len != NULL, INA_ERR_INVALID_ARGUMENT, "ina_chat_render: text or len is NULL");
  INA_REQUIRE((int)format >= 0 && format < INA_CHAT_FORMAT_COUNT, INA_ERR_INVALID_ARGUMENT,
              "ina_chat_render: chat format %d is out of range", (int)format);
  if (!opts) opts = &defaults;
  INA_REQUIRE_VERSIONED(opts, offsetof(ina_chat_options_t, eos_token) + sizeof(opts->eos_token),
                        "ina_chat_render options", "INA_CHAT_OPTIONS_INIT");
  const char *fname = k_names[format];
  INA_REQUIRE(n == 0 || m != NULL, INA_ERR_INVALID_ARGUMENT, "ina_chat_render: messages is NULL (n = %zu)", n);
  INA_REQUIRE(!opts->thinking || ina_chat_format_has_thinking(format), INA_ERR_UNSUPPORTED,
              "thinking: %s has no thinking mode (deepseek-v3.1 and later have one)", fname);
  const char *bos = opts->bos_token ? opts->bos_token : BOS_DEFAULT;
  const char *eos = opts->eos_token ? opts->eos_token : EOS_DEFAULT;
  INA_REQUIRE(utf8_invalid_at(bos) < 0 && utf8_invalid_at(eos) < 0, INA_ERR_INVALID_ARGUMENT,
              "bos_token or eos_token is not valid UTF-8");

  roles = calloc(n ? n : 1, sizeof(*roles));
  INA_CHECK_ALLOC(roles);
  for (size_t i = 0; i < n; i++) {
    const char *r = m[i].role;
    INA_REQUIRE(r != NULL, INA_ERR_INVALID_ARGUMENT, "messages[%zu].role is NULL", i);
    if (strcmp(r, "system") == 0) {
      roles[i] = ROLE_SYSTEM;
    } else if (strcmp(r, "user") == 0) {
      roles[i] = ROLE_USER;
    } else if (strcmp(r, "assistant") == 0) {
      roles[i] = ROLE_ASSISTANT;
    } else {
      INA_REQUIRE(0, INA_ERR_UNSUPPORTED, "messages[%zu].role: '%s' is not supported by %s (system, user, assistant)",
                  i, r, fname);
    }
    INA_REQUIRE(m[i].content != NULL, INA_ERR_INVALID_ARGUMENT, "messages[%zu].content is NULL", i);
    long bad = utf8_invalid_at(m[i].content);
    INA_REQUIRE(bad < 0, INA_ERR_INVALID_ARGUMENT, "messages[%zu].content: invalid UTF-8 at byte %ld", i, bad);
    if (m[i].reasoning_content) {
      bad = utf8_invalid_at(m[i].reasoning_content);
      INA_REQUIRE(bad < 0, INA_ERR_INVALID_ARGUMENT, "messages[%zu].reasoning_content: invalid UTF-8 at byte %ld",
                  i, bad);
    }
  }

  switch (format) {
  case INA_CHAT_DEEPSEEK_V2:
    /* {{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}
     * {{ 'User: ' + message['content'] + '\n\n' }}{% elif message['role'] == 'assistant' %}
     * {{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == 'system' %}
     * {{ message['content'] + '\n\n' }}{% endif %}{% endfor %}
     * {% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %} */
    puts_(&b, bos);
    for (size_t i = 0; i < n; i++) {
      if (roles[i] == ROLE_USER) {
        puts_(&b, "User: ");
        puts_(&b, m[i].content);
        puts_(&b, "\n\n");
      } else if (roles[i] == ROLE_ASSISTANT) {
        puts_(&b, "Assistant: ");
        puts_(&b, m[i].content);
        puts_(&b, eos);
      } else {
        puts_(&b, m[i].content);
        puts_(&b, "\n\n");
      }
    }
    if (opts->add_generation_prompt) puts_(&b, "Assistant:");
    break;

  case INA_CHAT_DEEPSEEK_V3:
    /* user: {{'<｜User｜>' + message['content']}}; assistant: {% if '</think>' in content %}
     * {% set content = content.split('</think>')[-1] %}{% endif %}
     * {{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}};
     * {% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %} */
    puts_(&b, bos);
    put_systems(&b, m, roles, n);
    for (size_t i = 0; i < n; i++) {
      if (roles[i] == ROLE_USER) {
        puts_(&b, USER_TAG);
        puts_(&b, m[i].content);
      } else if (roles[i] == ROLE_ASSISTANT) {
        puts_(&b, ASSISTANT_TAG);
        puts_(&b, after_think(m[i].content, 1));
        puts_(&b, EOS_LITERAL);
      }
    }
    if (opts->add_generation_prompt) puts_(&b, ASSISTANT_TAG);
    break;

  case INA_CHAT_DEEPSEEK_V3_0324: {
    /* user: {%- set ns.is_last_user = true -%}{{'<｜User｜>' + message['content'] + '<｜Assistant｜>'}};
     * assistant: {%- set ns.is_last_user = false -%}{{content + '<｜end▁of▁sentence｜>'}};
     * {% if add_generation_prompt and not ns.is_last_user and not ns.is_tool %}{{'<｜Assistant｜>'}} */
    int last_user = 0;
    puts_(&b, bos);
    put_systems(&b, m, roles, n);
    for (size_t i = 0; i < n; i++) {
      if (roles[i] == ROLE_USER) {
        puts_(&b, USER_TAG);
        puts_(&b, m[i].content);
        puts_(&b, ASSISTANT_TAG);
        last_user = 1;
      } else if (roles[i] == ROLE_ASSISTANT) {
        puts_(&b, m[i].content);
        puts_(&b, EOS_LITERAL);
        last_user = 0;
      }
    }
    if (opts->add_generation_prompt && !last_user) puts_(&b, ASSISTANT_TAG);
    break;
  }

  case INA_CHAT_DEEPSEEK_V3_1:
  case INA_CHAT_DEEPSEEK_V3_2_EXP: {
    /* user: {%- set ns.is_last_user = true -%}{{'<｜User｜>' + message['content']}};
     * assistant: {%- if ns.is_last_user %}{{'<｜Assistant｜>'}}...{{'</think>'}}{%- endif %}
     * {%- set ns.is_last_user = false -%}{%- if '</think>' in content %}
     * {%- set content = content.split('</think>', 1)[1] -%}{%- endif %}
     * {{content + '<｜end▁of▁sentence｜>'}};
     * V3.1:    {%- if add_generation_prompt and ns.is_last_user and not ns.is_tool %}
     * V3.2-Exp: {% if add_generation_prompt and not ns.is_tool%}{% if ns.is_last_user or
     *          ns.is_only_sys or not ns.is_prefix %} (is_prefix is never set without prefix
     *          messages, so the prompt is always added)
     *          {{'<｜Assistant｜>'}}{%- if not thinking %}{{'</think>'}}{%- else %}{{'<think>'}} */
    int last_user = 0;
    puts_(&b, bos);
    put_systems(&b, m, roles, n);
    for (size_t i = 0; i < n; i++) {
      if (roles[i] == ROLE_USER) {
        puts_(&b, USER_TAG);
        puts_(&b, m[i].content);
        last_user = 1;
      } else if (roles[i] == ROLE_ASSISTANT) {
        if (last_user) puts_(&b, ASSISTANT_TAG THINK_CLOSE);
        last_user = 0;
        puts_(&b, after_think(m[i].content, 0));
        puts_(&b, EOS_LITERAL);
      }
    }
    if (opts->add_generation_prompt && (last_user || format == INA_CHAT_DEEPSEEK_V3_2_EXP)) {
      puts_(&b, ASSISTANT_TAG);
      puts_(&b, opts->thinking ? THINK_OPEN : THINK_CLOSE);
    }
    break;
  }

  case INA_CHAT_DEEPSEEK_V3_2: {
    /* encode_messages(messages, thinking_mode, drop_thinking=True, add_default_bos_token=True):
     * system: {content}; user: <｜User｜>{content}<｜Assistant｜> then <think> when it is the last
     * user message in thinking mode, else </think>; assistant: in thinking mode after the last
     * user message {reasoning_content}</think> (the encoder asserts there is reasoning), then
     * {content}<｜end▁of▁sentence｜>. drop_thinking removes reasoning only before the last user
     * message, where it is not rendered anyway. */
    long last_user_idx = -1;
    for (size_t i = 0; i < n; i++)
      if (roles[i] == ROLE_USER) last_user_idx = (long)i;
    puts_(&b, bos);
    for (size_t i = 0; i < n; i++) {
      if (roles[i] == ROLE_SYSTEM) {
        puts_(&b, m[i].content);
      } else if (roles[i] == ROLE_USER) {
        puts_(&b, USER_TAG);
        puts_(&b, m[i].content);
        puts_(&b, ASSISTANT_TAG);
        puts_(&b, (long)i == last_user_idx && opts->thinking ? THINK_OPEN : THINK_CLOSE);
      } else {
        if (opts->thinking && (long)i > last_user_idx) {
          INA_REQUIRE(m[i].reasoning_content && m[i].reasoning_content[0], INA_ERR_UNSUPPORTED,
                      "messages[%zu].reasoning_content: deepseek-v3.2 in thinking mode needs the reasoning of an "
                      "assistant message after the last user message (its encoder refuses one without)",
                      i);
          puts_(&b, m[i].reasoning_content);
          puts_(&b, THINK_CLOSE);
        }
        puts_(&b, m[i].content);
        puts_(&b, EOS_LITERAL);
      }
    }
    break;
  }

  default:
    INA_REQUIRE(0, INA_ERR_INTERNAL, "chat format %d has no renderer", (int)format);
  }
  if (!b.p && !b.oom) put(&b, "", 0);
  INA_CHECK_ALLOC(!b.oom ? b.p : NULL);
  *text = b.p;
  *len = b.len;
  b.p = NULL;
fail:
  free(b.p);
  free(roles);
  return st;
}
