/* Fuzz target: the placement file of `ina place --file`, read by placement_from_json
 * (tools/placement_json.h) after jansson has parsed it with duplicate keys refused (as
 * ina_json_load_file does). Each input is the file's text.
 *
 * For every input that jansson parses it traps unless:
 *  - a refusal leaves *out NULL and says "FILE: ..." in the error buffer, NUL-terminated;
 *    the same refusal into a 1-byte and a 24-byte buffer is a NUL-terminated prefix of
 *    it (messages are cut, never overrun);
 *  - an accepted placement has the input's layers and slots, in order, and
 *    placement_to_json writes back exactly the input (keys, values; "generation" aside,
 *    which is not read), which reads again to the same document.
 * Everything is freed (LeakSanitizer checks). */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz_check.h"
#include "tools/placement_json.h"

#define NAME "fuzz-placement.json"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_refusal(const json_t *root, const char *error) {
  const size_t len = strnlen(error, 512);
  FUZZ_REQUIRE(len < 512, "the error is not NUL-terminated");
  FUZZ_REQUIRE(strncmp(error, NAME ": ", strlen(NAME) + 2) == 0 && len > strlen(NAME) + 2,
               "the error does not start with the file and say something: %s", error);
  const size_t sizes[] = {1, 24};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    char small[24 + 8];
    memset(small, 'x', sizeof small);
    Ina__V1__ExpertPlacement *p = (Ina__V1__ExpertPlacement *)&p;
    FUZZ_REQUIRE(placement_from_json(root, NAME, &p, small, sizes[i]) == -1 && p == NULL,
                 "the verdict depends on the error buffer's size");
    const size_t n = strnlen(small, sizes[i]);
    FUZZ_REQUIRE(n < sizes[i], "a %zu-byte error buffer is not NUL-terminated", sizes[i]);
    FUZZ_REQUIRE(strncmp(small, error, n) == 0, "the cut error is not a prefix: %s", small);
    FUZZ_REQUIRE(small[sizes[i]] == 'x', "a %zu-byte error buffer overrun", sizes[i]);
  }
}

/* The placement has the document's layers and slots, in order. */
static void check_placement(const Ina__V1__ExpertPlacement *p, const json_t *root) {
  const json_t *layers = json_object_get(root, "layers");
  FUZZ_REQUIRE(p->layout != NULL, "no layout");
  FUZZ_REQUIRE(p->n_layers == json_array_size(layers), "%zu layers read from %zu", p->n_layers,
               json_array_size(layers));
  for (size_t l = 0; l < p->n_layers; l++) {
    const Ina__V1__LayerPlacement *lp = p->layers[l];
    const json_t *slots = json_object_get(json_array_get(layers, l), "slots");
    FUZZ_REQUIRE(lp && lp->n_slots == json_array_size(slots), "layer %zu: %zu slots read", l,
                 lp ? lp->n_slots : 0);
    for (size_t i = 0; i < lp->n_slots; i++) {
      const json_t *s = json_array_get(slots, i);
      const Ina__V1__ExpertSlot *slot = lp->slots[i];
      FUZZ_REQUIRE(slot && (json_int_t)slot->ep_rank == json_integer_value(json_object_get(s, "ep_rank")) &&
                       (json_int_t)slot->slot == json_integer_value(json_object_get(s, "slot")) &&
                       (json_int_t)slot->logical_expert ==
                           json_integer_value(json_object_get(s, "logical_expert")),
                   "layers[%zu].slots[%zu] read wrong", l, i);
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
  if (!root) return 0;
  char error[512];
  memset(error, 'x', sizeof error);
  Ina__V1__ExpertPlacement *p = (Ina__V1__ExpertPlacement *)&p; /* not NULL, to see it reset */
  const int rc = placement_from_json(root, NAME, &p, error, sizeof error);
  if (rc != 0) {
    FUZZ_REQUIRE(rc == -1 && p == NULL, "refused with %d, *out %p", rc, (void *)p);
    check_refusal(root, error);
    json_decref(root);
    return 0;
  }
  FUZZ_REQUIRE(p != NULL, "accepted without a placement");
  FUZZ_REQUIRE(error[0] == '\0', "accepted with an error: %.80s", error);
  check_placement(p, root);

  json_t *doc = placement_to_json(p);
  FUZZ_REQUIRE(doc != NULL, "placement_to_json failed");
  /* "generation" is not read back: compare without it. */
  json_t *input = json_deep_copy(root);
  FUZZ_REQUIRE(input != NULL, "no memory to copy the input");
  json_object_del(input, "generation");
  json_object_del(doc, "generation");
  FUZZ_REQUIRE(json_equal(input, doc), "placement_to_json does not write back the input");

  Ina__V1__ExpertPlacement *again = NULL;
  FUZZ_REQUIRE(placement_from_json(doc, NAME, &again, error, sizeof error) == 0,
               "placement_to_json's document is refused: %s", error);
  json_t *doc2 = placement_to_json(again);
  json_object_del(doc2, "generation");
  FUZZ_REQUIRE(doc2 && json_equal(doc, doc2), "the written document does not read to itself");
  json_decref(doc2);
  placement_free(again);
  json_decref(input);
  json_decref(doc);
  placement_free(p);
  json_decref(root);
  return 0;
}
