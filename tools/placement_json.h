/* The placement file of `ina place`: an ina.v1.ExpertPlacement as JSON, one MoE layer's
 * expert map per entry of "layers":
 *   {"layout": {"tp": 1, "dp": 1, "ep": 1}, "slots_per_rank": 64, "generation": 1,
 *    "layers": [{"moe_layer": 0, "slots": [{"ep_rank": 0, "slot": 0, "logical_expert": 0},
 *    ...]}, ...]}
 * Reading checks shape and types only (every key known, present and of its type): whether
 * a placement is valid for a job is the agent's answer. "generation" may be absent and is
 * not read back: the generation a change expects travels beside the placement.
 *
 * Ownership: placement_to_json returns a new reference (json_decref); placement_from_json
 * gives a placement that only placement_free frees (not protobuf-c's free: the messages
 * share one allocation). Thread safety: reentrant; a placement is not changed by readers. */
#ifndef INA_TOOLS_PLACEMENT_JSON_H
#define INA_TOOLS_PLACEMENT_JSON_H

#include <jansson.h>
#include <stddef.h>

#include "ina/v1/placement.pb-c.h"

/* The placement as JSON, keys in the order above; an absent layout writes zeros, as
 * proto3 reads it. NULL when out of memory. */
json_t *placement_to_json(const Ina__V1__ExpertPlacement *placement);

/* Reads the placement in `root`, read from `file` (named in messages). Returns 0 with
 * *out set, or -1 with *out = NULL and the first problem in `error` (at most error_size
 * bytes, NUL-terminated): "FILE: KEY.PATH: problem", for example
 * "p.json: layers[2].slots[7].logical_expert: expected a non-negative integer, got \"x\"". */
int placement_from_json(const json_t *root, const char *file, Ina__V1__ExpertPlacement **out,
                        char *error, size_t error_size);

/* Frees a placement of placement_from_json; NULL is a no-op. */
void placement_free(Ina__V1__ExpertPlacement *placement);

#endif
