/* Metric and label name rules of the Prometheus data model. Checked with explicit ASCII
 * ranges rather than <ctype.h>, whose answers depend on the locale. */
#include "agent/metrics/metrics_internal.h"

#include <string.h>

static int is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* [a-zA-Z_:][a-zA-Z0-9_:]* */
int ina_metrics_metric_name_ok(const char *name) {
  if (!name || !name[0] || is_digit(name[0])) return 0;
  for (const char *p = name; *p; p++) {
    if (!is_letter(*p) && !is_digit(*p) && *p != '_' && *p != ':') return 0;
  }
  return 1;
}

/* [a-zA-Z_][a-zA-Z0-9_]*, and not starting with "__" (reserved for Prometheus). */
int ina_metrics_label_name_ok(const char *name) {
  if (!name || !name[0] || is_digit(name[0])) return 0;
  if (strncmp(name, "__", 2) == 0) return 0;
  for (const char *p = name; *p; p++) {
    if (!is_letter(*p) && !is_digit(*p) && *p != '_') return 0;
  }
  return 1;
}
