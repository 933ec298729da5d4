/* Helpers shared by the `ina` subcommands: argument parsing with errors that name the
 * option. Each returns 0 on success and prints the problem to stderr otherwise. */
#ifndef INA_TOOLS_CLI_H
#define INA_TOOLS_CLI_H

#include <stdint.h>

#include "core/dtype.h"

int cli_parse_int(const char *option, const char *text, int64_t min, int64_t max, int64_t *out);
int cli_parse_float(const char *option, const char *text, double min, double max, double *out);
/* "1,2,3" -> malloc'ed array (caller frees). */
int cli_parse_ids(const char *option, const char *text, int32_t **ids, int32_t *count);
/* "f32", "bf16", "fp8" (e4m3 with 128x128 block scales). */
int cli_parse_weight_dtype(const char *option, const char *text, ina_dtype_t *out);

int cmd_generate(int argc, char **argv);
int cmd_model(int argc, char **argv);
/* ina tokenize / ina detokenize (cmd_tokenize.c); argv[0] names which. */
int cmd_tokenize(int argc, char **argv);
/* Clients of a running agent (cmd_client.c): ina info, ina health, ina generate --server. */
int cmd_info(int argc, char **argv);
int cmd_health(int argc, char **argv);
int cmd_generate_remote(int argc, char **argv);
/* Load and placement of a running agent (cmd_load.c, cmd_place.c): ina load, ina place. */
int cmd_load(int argc, char **argv);
int cmd_place(int argc, char **argv);
/* The expert-parallel traffic and time model (cmd_plan.c): ina plan. */
int cmd_plan(int argc, char **argv);

#endif
