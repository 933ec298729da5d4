#include "tests/fuzz/fuzz_files.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "tests/fuzz/fuzz_check.h"

static char scratch_dir[512];
static int memfd = -1;

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
  (void)sb;
  (void)type;
  (void)ftw;
  return remove(path);
}

static void remove_scratch(void) {
  if (scratch_dir[0]) nftw(scratch_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void fuzz_files_init(void) {
  ina_log_set_quiet_errors(1);
  if (scratch_dir[0]) return;
  const char *tmp = getenv("TMPDIR");
  if (!tmp || !tmp[0]) tmp = "/tmp";
  snprintf(scratch_dir, sizeof scratch_dir, "%s/ina-fuzz-XXXXXX", tmp);
  FUZZ_REQUIRE(mkdtemp(scratch_dir) != NULL, "mkdtemp %s: %s", scratch_dir, strerror(errno));
  atexit(remove_scratch);
  memfd = memfd_create("ina-fuzz-input", MFD_CLOEXEC);
  FUZZ_REQUIRE(memfd >= 0, "memfd_create: %s", strerror(errno));
}

const char *fuzz_scratch_path(const char *name) {
  static char path[640];
  FUZZ_REQUIRE(scratch_dir[0], "fuzz_files_init was not called");
  snprintf(path, sizeof path, "%s/%s", scratch_dir, name);
  return path;
}

const char *fuzz_as_file(const uint8_t *data, size_t size) {
  static char path[64];
  FUZZ_REQUIRE(memfd >= 0, "fuzz_files_init was not called");
  FUZZ_REQUIRE(ftruncate(memfd, 0) == 0, "ftruncate: %s", strerror(errno));
  for (size_t done = 0; done < size;) {
    ssize_t n = pwrite(memfd, data + done, size - done, (off_t)done);
    FUZZ_REQUIRE(n > 0, "writing %zu bytes to the memory file: %s", size, strerror(errno));
    done += (size_t)n;
  }
  snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
  return path;
}

uint8_t *fuzz_read_whole_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  FUZZ_REQUIRE(f != NULL, "cannot open %s: %s", path, strerror(errno));
  struct stat sb;
  FUZZ_REQUIRE(fstat(fileno(f), &sb) == 0, "cannot stat %s", path);
  size_t n = (size_t)sb.st_size;
  uint8_t *buf = malloc(n + 1);
  FUZZ_REQUIRE(buf != NULL, "no memory for %zu bytes of %s", n, path);
  FUZZ_REQUIRE(n == 0 || fread(buf, 1, n, f) == n, "short read of %s", path);
  fclose(f);
  buf[n] = 0;
  *size = n;
  return buf;
}

void fuzz_require_error(const char *what, ina_status_t st, const ina_status_t *allowed,
                        const char *where) {
  FUZZ_REQUIRE(st != INA_OK, "%s: expected a failure", what);
  int known = 0;
  for (size_t i = 0; allowed[i] != INA_OK; i++) known |= allowed[i] == st;
  FUZZ_REQUIRE(known, "%s failed with status %d (%s), not one it documents", what, (int)st,
               ina_status_string(st));
  const char *msg = ina_last_error();
  FUZZ_REQUIRE(msg[0] != '\0', "%s failed (%s) without a message", what, ina_status_string(st));
  FUZZ_REQUIRE(strstr(msg, where) != NULL, "%s: the message does not name %s: %s", what, where,
               msg);
}
