/* JSON that the `ina` commands print (ina load --json, ina place --show): building a
 * document without checking every allocation, and writing it readably: one member or
 * element per line down to the values that fit on one line, so that an expert map
 * prints one slot per line and large files stay easy to read, edit and diff.
 *
 * Ownership: json_output_set takes `value`'s reference, even when it fails; the writer
 * borrows `doc`. Thread safety: as jansson (several threads may read one document). */
#ifndef INA_TOOLS_JSON_OUTPUT_H
#define INA_TOOLS_JSON_OUTPUT_H

#include <jansson.h>

/* json_dumps flags of every value the commands print, and of values quoted in messages:
 * keys in their order, reals with 9 significant digits. */
#define JSON_OUTPUT_DUMP_FLAGS (JSON_ENCODE_ANY | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9))

/* obj[key] = value, remembering a failure in *bad: value NULL (its constructor ran out
 * of memory) or a failed insertion. Checking *bad once at the end is enough. */
void json_output_set(json_t *obj, const char *key, json_t *value, int *bad);

/* A new empty object appended to `array`, which holds its reference; NULL with *bad = 1
 * when out of memory. */
json_t *json_output_append_object(json_t *array, int *bad);

/* Writes `doc` and a newline to `path`, or to stdout when path is NULL. Returns 0, or 1
 * after printing "ina CMD: ..." to stderr (`path` cannot be opened, as the value of
 * --out; a failed write). */
int json_output_write(const char *cmd, const json_t *doc, const char *path);

#endif
