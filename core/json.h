/* Small typed accessors over jansson for reading configuration files, with errors that
 * name the file and the key. `where` is a label for messages (usually the file path).
 *
 * The plain getters return INA_ERR_NOT_FOUND (with a message) when the key is absent.
 * The *_opt getters return INA_OK with *out set to the default when the key is absent or
 * JSON null. A value of the wrong type is INA_ERR_FORMAT for both.
 * Thread safety: as jansson (read-only access to a json_t is thread-safe). */
#ifndef INA_CORE_JSON_H
#define INA_CORE_JSON_H

#include <jansson.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Load a JSON object from a file. The caller frees with json_decref. */
ina_status_t ina_json_load_file(const char *path, json_t **out);

ina_status_t ina_json_get_int(const json_t *obj, const char *key, const char *where, int64_t *out);
ina_status_t ina_json_get_double(const json_t *obj, const char *key, const char *where, double *out);
ina_status_t ina_json_get_bool(const json_t *obj, const char *key, const char *where, int *out);
/* Borrowed string, valid while obj lives. */
ina_status_t ina_json_get_string(const json_t *obj, const char *key, const char *where,
                                 const char **out);

ina_status_t ina_json_get_int_opt(const json_t *obj, const char *key, const char *where,
                                  int64_t dflt, int64_t *out);
ina_status_t ina_json_get_double_opt(const json_t *obj, const char *key, const char *where,
                                     double dflt, double *out);
ina_status_t ina_json_get_bool_opt(const json_t *obj, const char *key, const char *where,
                                   int dflt, int *out);
ina_status_t ina_json_get_string_opt(const json_t *obj, const char *key, const char *where,
                                     const char *dflt, const char **out);

#ifdef __cplusplus
}
#endif
#endif
