/* What the targets that fuzz file parsers share: a scratch directory for the files they
 * write back, the fuzzed bytes as a real file (to run the path-taking entry point on the
 * same bytes as the in-memory one), and the checks every failed parse must pass.
 *
 * fuzz_files_init: call from LLVMFuzzerInitialize. Silences the printing of ina's error
 * messages (the last error is still recorded, and checked), makes the scratch directory
 * (under $TMPDIR or /tmp; removed at exit) and the memory file.
 * Paths returned point into static buffers, valid until the next call of the same
 * function. Thread safety: none; libFuzzer runs a target on one thread. */
#ifndef INA_TESTS_FUZZ_FUZZ_FILES_H
#define INA_TESTS_FUZZ_FUZZ_FILES_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

void fuzz_files_init(void);

/* scratch directory + "/" + name. */
const char *fuzz_scratch_path(const char *name);

/* A path that opens a regular file holding exactly these bytes (a memfd, rewritten on
 * every call). */
const char *fuzz_as_file(const uint8_t *data, size_t size);

/* The whole file at path, malloc'ed (one spare byte, zero, after it; never NULL when
 * it returns); traps when it cannot be read. */
uint8_t *fuzz_read_whole_file(const char *path, size_t *size);

/* A failed parse: st is not INA_OK and one of the allowed statuses (a list ending with
 * INA_OK), and ina_last_error() is a message that names `where` (the file name or
 * label the parser was given). `what` names the call in the report. */
void fuzz_require_error(const char *what, ina_status_t st, const ina_status_t *allowed,
                        const char *where);

#endif
