#include "core/log.h"
#include "core/check.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SUBSYS_RULES 16

typedef struct {
  char name[32];
  ina_log_level_t level;
} subsys_rule_t;

static struct {
  pthread_once_t once;
  pthread_mutex_t lock;
  ina_log_level_t default_level;
  subsys_rule_t rules[MAX_SUBSYS_RULES];
  int nrules;
  int quiet_errors;
} g_log = {PTHREAD_ONCE_INIT, PTHREAD_MUTEX_INITIALIZER, INA_LOG_WARN, {{{0}, 0}}, 0, 0};

static _Thread_local char t_last_error[1024];

static const char *level_names[] = {"error", "warn", "info", "debug", "trace"};

static int parse_level(const char *s, size_t n, ina_log_level_t *out) {
  for (int i = 0; i <= INA_LOG_TRACE; i++) {
    if (strlen(level_names[i]) == n && strncmp(s, level_names[i], n) == 0) {
      *out = (ina_log_level_t)i;
      return 1;
    }
  }
  return 0;
}

void ina_log_init_from_env(void) {
  const char *env = getenv("INA_LOG");
  pthread_mutex_lock(&g_log.lock);
  g_log.default_level = INA_LOG_WARN;
  g_log.nrules = 0;
  while (env && *env) {
    const char *end = strchr(env, ',');
    size_t len = end ? (size_t)(end - env) : strlen(env);
    const char *eq = memchr(env, '=', len);
    ina_log_level_t level;
    if (!eq) {
      if (parse_level(env, len, &level)) g_log.default_level = level;
    } else if (g_log.nrules < MAX_SUBSYS_RULES && (size_t)(eq - env) < sizeof g_log.rules[0].name &&
               parse_level(eq + 1, len - (size_t)(eq - env) - 1, &level)) {
      subsys_rule_t *r = &g_log.rules[g_log.nrules++];
      memcpy(r->name, env, (size_t)(eq - env));
      r->name[eq - env] = '\0';
      r->level = level;
    }
    env = end ? end + 1 : NULL;
  }
  pthread_mutex_unlock(&g_log.lock);
}

static void init_once(void) { ina_log_init_from_env(); }

int ina_log_enabled(ina_log_level_t level, const char *subsystem) {
  pthread_once(&g_log.once, init_once);
  ina_log_level_t limit = g_log.default_level;
  for (int i = 0; i < g_log.nrules; i++)
    if (subsystem && strcmp(g_log.rules[i].name, subsystem) == 0) limit = g_log.rules[i].level;
  return level <= limit;
}

static void emit(ina_log_level_t level, const char *subsystem, const char *msg) {
  char line[1200];
  snprintf(line, sizeof line, "ina %s [%s] %s\n", level_names[level], subsystem ? subsystem : "ina",
           msg);
  fputs(line, stderr);
}

void ina_logv(ina_log_level_t level, const char *subsystem, const char *fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  if (level == INA_LOG_ERROR) {
    memcpy(t_last_error, msg, sizeof msg);
    if (g_log.quiet_errors) return;
  }
  if (ina_log_enabled(level, subsystem)) emit(level, subsystem, msg);
}

void ina_log(ina_log_level_t level, const char *subsystem, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ina_logv(level, subsystem, fmt, ap);
  va_end(ap);
}

void ina_error(const char *subsystem, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ina_logv(INA_LOG_ERROR, subsystem, fmt, ap);
  va_end(ap);
}

const char *ina_last_error(void) { return t_last_error; }
void ina_clear_error(void) { t_last_error[0] = '\0'; }
void ina_log_set_quiet_errors(int quiet) { g_log.quiet_errors = quiet; }

void ina_check_failed(const char *subsystem, const char *file, int line, const char *expr,
                      ina_status_t status) {
  if (ina_log_enabled(INA_LOG_DEBUG, subsystem))
    ina_log(INA_LOG_DEBUG, subsystem, "%s:%d: %s failed: %s", file, line, expr,
            ina_status_string(status));
}
