/* Leveled logging with subsystems, configured by the INA_LOG environment variable.
 *
 * INA_LOG is a comma-separated list of `level` or `subsystem=level` items, e.g.
 * `INA_LOG=info` or `INA_LOG=warn,model=debug`. Levels: error, warn, info, debug, trace.
 * The default level is warn. Messages go to stderr, one line each, prefixed with the
 * level and subsystem.
 *
 * Errors also land in a thread-local "last error" buffer (ina_last_error) so that a
 * caller can show the precise reason of a failed call, e.g. a tool printing it or a
 * test checking that a message names the bad tensor.
 *
 * Thread safety: all functions are thread-safe; a line is written with one fputs. */
#ifndef INA_CORE_LOG_H
#define INA_CORE_LOG_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ina_log_level {
  INA_LOG_ERROR = 0,
  INA_LOG_WARN = 1,
  INA_LOG_INFO = 2,
  INA_LOG_DEBUG = 3,
  INA_LOG_TRACE = 4,
} ina_log_level_t;

/* True when a message of this level for this subsystem would be printed. */
int ina_log_enabled(ina_log_level_t level, const char *subsystem);

/* Print a message (no trailing newline needed). ERROR messages also set the last error. */
void ina_log(ina_log_level_t level, const char *subsystem, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void ina_logv(ina_log_level_t level, const char *subsystem, const char *fmt, va_list ap);

/* Record an error message as this thread's last error and log it at ERROR level
 * (unless quiet logging of errors was requested with ina_log_set_quiet_errors). */
void ina_error(const char *subsystem, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* This thread's last error message ("" when none). Valid until the next error on
 * this thread. */
const char *ina_last_error(void);
void ina_clear_error(void);

/* Tests that provoke errors on purpose can silence their printing; the last error is
 * still recorded. */
void ina_log_set_quiet_errors(int quiet);

/* Re-read INA_LOG (the first log call reads it automatically). */
void ina_log_init_from_env(void);

#define INA_LOG_E(sub, ...) ina_log(INA_LOG_ERROR, sub, __VA_ARGS__)
#define INA_LOG_W(sub, ...) ina_log(INA_LOG_WARN, sub, __VA_ARGS__)
#define INA_LOG_I(sub, ...) ina_log(INA_LOG_INFO, sub, __VA_ARGS__)
#define INA_LOG_D(sub, ...) ina_log(INA_LOG_DEBUG, sub, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
