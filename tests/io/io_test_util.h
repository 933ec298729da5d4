/* Helpers for the file-format tests: a scratch directory under /tmp, whole-file reads
 * and writes, and checks on the status, output and message of a failed call. */
#ifndef INA_TESTS_IO_TEST_UTIL_H
#define INA_TESTS_IO_TEST_UTIL_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "core/status.h"
#include "tests/test_util.h"

/* A fresh directory /tmp/ina-io-XXXXXX; the caller frees the string after io_remove_tree. */
static inline char *io_make_temp_dir(void) {
  char tmpl[] = "/tmp/ina-io-XXXXXX";
  if (!mkdtemp(tmpl)) {
    perror("mkdtemp");
    exit(1);
  }
  return strdup(tmpl);
}

static inline int io_remove_entry_(const char *path, const struct stat *sb, int type,
                                   struct FTW *ftw) {
  (void)sb;
  (void)type;
  (void)ftw;
  return remove(path);
}

/* rm -r, not following symbolic links. */
static inline void io_remove_tree(const char *dir) {
  if (nftw(dir, io_remove_entry_, 16, FTW_DEPTH | FTW_PHYS) != 0) perror(dir);
}

/* dir + "/" + name into buf; a path that does not fit ends the test. */
static inline const char *io_join(char *buf, size_t size, const char *dir, const char *name) {
  int n = snprintf(buf, size, "%s/%s", dir, name);
  if (n < 0 || (size_t)n >= size) {
    fprintf(stderr, "path %s/%s too long for the test's buffer\n", dir, name);
    exit(1);
  }
  return buf;
}

static inline int io_write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  int ok = n == 0 || fwrite(data, 1, n, f) == n;
  return fclose(f) == 0 && ok;
}

static inline int io_write_text(const char *path, const char *text) {
  return io_write_file(path, text, strlen(text));
}

/* The whole file, malloc'ed (plus a terminating zero byte), or NULL. */
static inline unsigned char *io_read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc((size_t)size + 1);
  if (buf && fread(buf, 1, (size_t)size, f) != (size_t)size) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (buf) buf[size] = 0;
  *n = (size_t)size;
  return buf;
}

static inline int io_file_exists(const char *path) { return access(path, F_OK) == 0; }

/* Checks that a call failed with `want`, and that the recorded message names `must_name`
 * (a path) and, when given, `also_name` (a tensor or key). */
#define CHECK_FAILS_WITH(got, want, must_name, also_name)                                          \
  do {                                                                                             \
    ina_status_t got_ = (got);                                                                     \
    const char *also_ = (also_name);                                                               \
    CHECKF(got_ == (want), "status %s, wanted %s (message: %s)", ina_status_string(got_),          \
           ina_status_string(want), ina_last_error());                                             \
    CHECKF(strstr(ina_last_error(), (must_name)) != NULL, "message '%s' lacks '%s'",               \
           ina_last_error(), (must_name));                                                         \
    if (also_)                                                                                     \
      CHECKF(strstr(ina_last_error(), also_) != NULL, "message '%s' lacks '%s'", ina_last_error(), \
             also_);                                                                               \
  } while (0)

#endif
