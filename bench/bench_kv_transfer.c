/* KV-cache pages over UCX between two processes on one host (the prefill/decode hand-off)
 * against memcpy of the same copy plan inside one process. Host only by default: no
 * device needed; --device (CUDA builds) adds the same cases with caches in device memory.
 *
 * The program forks before anything of UCX exists: the parent is the "prefill" process,
 * the child the "decode" process (cma writes into a child are allowed by Yama's
 * ptrace_scope 1, not the other way), and they talk over a socketpair. Each creates its
 * own UCX engine (comm/ucx_engine.h). For every case the decode process allocates its
 * destination caches, fills them with the poison byte 0xFF, registers them and sends its
 * endpoint blob; the prefill process fills its source caches with a seeded pattern,
 * registers them, connects, plans the copy of the prompt's tokens [0, N) over all layers
 * with ina_kv_copy_plan (kvcache/kv_copy.h) and posts every piece as one INA_UCX_PUT batch
 * (ina_ucx_post, then ina_ucx_batch_wait, which ends with an endpoint flush: the bytes are
 * at the decode process when it returns). The decode process runs
 * ina_ucx_engine_progress in a loop while a case is open, until told to stop.
 *
 * Caches are laid out as page_pool.h stores them: [layers][num_pages][page_size][entry],
 * num_pages = needed + needed / 4 + 1 on each side, so pages outside the prompt exist
 * and must keep their poison. Page lists are either random (a shuffled permutation of
 * the cache's pages, each side its own) or consecutive (a run starting at a random page:
 * with equal page sizes the plan merges into one piece per layer).
 *
 * Check before timing: after the first UCX batch the decode process compares every entry
 * of its destination cache with the pattern (seed sent over the socket) at the planned
 * tokens and with the poison elsewhere; after timing it checks every rotated cache again.
 * The memcpy figures are checked the same way. Any mismatch: exit 1.
 *
 * Timing: warm-up batches, then timed repetitions; each repetition is one whole batch
 * (post + wait; for memcpy, the plan's copies in order), on cache pair (iteration % R).
 * R pairs rotate so that each side's working set is at least 2x the L3 cache (from
 * sysconf; --rotate-mib) where the per-side memory limit (--max-mib) allows. Figures:
 *   bytes  = N * layers * entry_bytes (what the plan moves; each byte read once and
 *            written once)
 *   GB/s   = bytes / time / 1e9, time = median (or min) over the timed repetitions
 *   ratio  = UCX GB/s / memcpy GB/s (medians)
 * memcpy runs in the prefill process while the decode process sleeps in a blocking read.
 *
 * The UCX transports: when UCX_LOG_LEVEL is not set, the prefill process raises UCX's
 * log level to info and keeps (without printing) the `ep_cfg[...]` lines UCX logs when it
 * makes an endpoint configuration; they are printed before the table. With Debian's
 * UCX 1.13 they read `rma_am(tcp/lo)`: the engine's endpoints ask for peer error handling,
 * which the shared-memory transports (posix, sysv, self) lack, and cma has no bcopy, so
 * the puts are emulated over active messages on loopback TCP (UCX_TLS=sm,self cannot
 * connect at all). The figures are those of that path.
 *
 * --device (CUDA builds; exit 77 without a CUDA device): after a case's host figures, the
 * same case again with both processes' caches in cudaMalloc'ed memory of device 0, as a
 * GPU engine keeps its cache. The parent touches CUDA only after the fork and the child
 * only when its first device case opens (CUDA does not survive a fork). Each cache is
 * registered as an INA_UCX_MEM_CUDA region, as agent/handoff/kv_link.c registers a CUDA
 * engine's cache, so the puts take the agent's path: without CUDA support in UCX (Debian's
 * UCX) a region is reached through a host mirror; ina_ucx_post copies each source piece
 * device -> mirror before its put, and the decode side copies the received pieces mirror
 * -> device (ina_ucx_region_stage_in over the identity plan of its pages, as
 * handoff_link_stage_in does before the entries are used); with CUDA in UCX the puts read
 * and write device memory directly and the stage-in is a no-op. Which path ran is printed.
 * Source caches are poisoned before they are registered (the mirror starts as a copy) and
 * get the pattern only afterwards, so data that skipped the copy-out arrives as poison.
 * One timed repetition is the whole hand-off:
 *   prefill: ina_ucx_post + ina_ucx_batch_wait (copy-out, puts, endpoint flush), then a
 *   socket message to the decode process, which copies in every piece of the plan and
 *   synchronizes the device (a pageable host -> device cudaMemcpy may return before its
 *   DMA lands), then answers; the repetition ends when the answer arrives.
 * The socket round trip (tens of microseconds) is inside that time, as the agent's gRPC
 * answer is inside its hand-off. Also reported: the put part and the decode's own
 * copy-in time (medians), and the staging ceiling: one cudaMemcpy device -> host of the
 * plan's bytes plus one host -> device of them (pageable host memory, as the mirror is;
 * one contiguous copy each way instead of one per piece), in the prefill process:
 *   ceiling GB/s = bytes / (time of both copies). The check reads the decode process's
 * device caches back (cudaMemcpy) and compares them as above, after the first batch and
 * after timing. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ucp/api/ucp.h>
#include <ucs/config/global_opts.h>
#include <ucs/debug/log_def.h>

#include "bench/bench_util.h"
#include "comm/ucx_engine.h"
#include "core/cuda.h"
#include "core/log.h"
#include "kvcache/kv_copy.h"

#define POISON 0xFF
#define MAX_TOKENS_LIST 16
#define MAX_PAIRS 256
#define MAX_TLS_LINES 8
#define DEVICE 0 /* the CUDA device both processes use with --device */
/* Bytes per token and layer of the GPU engine's DeepSeek-V3 cache: bf16 latent 512 +
 * rope 64; V3.2 adds a bf16 index key of 128. */
#define GPU_ENTRY_V3 1152
#define GPU_ENTRY_V32 1408

/* ---- options and cases ---------------------------------------------------------------- */

typedef struct options {
  int64_t tokens[MAX_TOKENS_LIST];
  int num_tokens;
  int32_t page, dst_page, layers;
  int64_t entry_bytes; /* 0: the default of the run (host: 2304, --device: 1152) */
  int shape_tiny, shape_v3, shape_v32;
  int device; /* also the same cases with device caches */
  int layout_shuffled, layout_consecutive;
  int warmup, reps;
  uint64_t seed;
  int64_t rotate_bytes; /* per side; 0: 2x L3 */
  int64_t max_bytes;    /* per side */
  double timeout_s;
} options_t;

/* What both processes need to know about one case (sent over the socket). */
typedef struct kv_case {
  char shape[16];
  int32_t src_page, dst_page, layers, shuffled;
  int64_t entry_bytes, tokens;
  int32_t src_num_pages, dst_num_pages;
  int32_t pairs;
  int32_t device; /* the caches are device memory (--device) */
  uint64_t seed; /* page lists and the source pattern */
} kv_case_t;

static void usage(FILE *f, const char *prog) {
  fprintf(f,
          "usage: %s [options]\n"
          "KV-cache pages over UCX between two processes on this host (a fork: prefill puts,\n"
          "decode receives) against memcpy of the same copy plan in one process.\n"
          "  --tokens LIST       prompt lengths N (default 512,4096,16384)\n"
          "  --page P            tokens per page of the 'tiny' shape (default 16)\n"
          "  --dst-page P        destination page size of the 'tiny' shape (default: --page)\n"
          "  --layers L          layers of the 'tiny' shape (default 4)\n"
#ifdef INA_HAVE_CUDA
          "  --entry-bytes E     bytes per token and layer of the 'tiny' shape (default 2304,\n"
          "                      576 f32 as the CPU engine stores it; with --device 1152,\n"
          "                      576 bf16 as the GPU engine does)\n"
#else
          "  --entry-bytes E     bytes per token and layer of the 'tiny' shape (default 2304,\n"
          "                      576 f32 as the CPU engine stores it)\n"
#endif
          "  --shapes LIST       tiny,v3,v3.2 (default tiny,v3; v3: 61 layers, 1152 bytes =\n"
          "                      576 bf16, page 64; v3.2: the same with V3.2's 128 bf16 index\n"
          "                      dims, 1408 bytes)\n"
          "  --layouts LIST      shuffled,consecutive (default both)\n"
          "  --warmup W          untimed batches after the checked one (default 3)\n"
          "  --reps R            timed batches, >= 1 (default 20)\n"
          "  --seed S            page lists and data (default 1)\n"
          "  --rotate-mib M      rotate cache pairs until each side holds M MiB (default 2x L3)\n"
          "  --max-mib M         at most M MiB of caches per side (default 1024; one pair is\n"
          "                      always made)\n"
          "  --timeout S         seconds a batch may take (default 120)\n"
#ifdef INA_HAVE_CUDA
          "  --device            also every case with both caches in memory of CUDA device 0,\n"
          "                      registered as the agent registers a GPU engine's cache; timed\n"
          "                      as a whole hand-off (copy-out + puts + flush + the decode's\n"
          "                      copy-in to the device), beside the host figures and a\n"
          "                      cudaMemcpy D2H + H2D staging ceiling (exit 77 without a device)\n"
#endif
          "  --help              this text\n"
          "Figures: bytes = N * layers * entry_bytes; GB/s = bytes / time / 1e9 (median and\n"
          "min over the timed batches); ratio = UCX GB/s / memcpy GB/s. UCX reads its\n"
          "environment (UCX_TLS, ...). Exit 0 on success, 1 when a check or a transfer\n"
          "failed, 2 on bad options.\n",
          prog);
}

static int parse_int(const char *text, int64_t lo, int64_t hi, int64_t *out) {
  char *end = NULL;
  errno = 0;
  const long long v = strtoll(text, &end, 10);
  if (errno || !end || end == text || *end || v < lo || v > hi) return 0;
  *out = v;
  return 1;
}

/* "a,b" against the names in `names`; sets flags[i] for each name found. */
static int parse_names(const char *text, const char *const *names, int n, int *flags) {
  for (int i = 0; i < n; i++) flags[i] = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", text);
  char *save = NULL;
  int any = 0;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int found = 0;
    for (int i = 0; i < n; i++)
      if (strcmp(tok, names[i]) == 0) flags[i] = found = any = 1;
    if (!found) return 0;
  }
  return any;
}

static int parse_options(int argc, char **argv, options_t *o) {
  memset(o, 0, sizeof *o);
  o->tokens[0] = 512, o->tokens[1] = 4096, o->tokens[2] = 16384, o->num_tokens = 3;
  o->page = 16, o->dst_page = 0, o->layers = 4, o->entry_bytes = 0;
  o->shape_tiny = o->shape_v3 = 1, o->shape_v32 = 0;
  o->layout_shuffled = o->layout_consecutive = 1;
  o->warmup = 3, o->reps = 20, o->seed = 1;
  o->rotate_bytes = 0, o->max_bytes = 1024ll << 20, o->timeout_s = 120;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout, argv[0]);
      exit(0);
    }
    if (strcmp(a, "--device") == 0) {
      o->device = 1;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "%s: unknown option or missing value: %s\n", argv[0], a);
      return 0;
    }
    const char *v = argv[++i];
    int64_t x = 0;
    int ok = 1;
    if (strcmp(a, "--tokens") == 0) {
      ok = ina_bench_parse_list(v, 1, 1 << 24, o->tokens, MAX_TOKENS_LIST, &o->num_tokens) == 0 &&
           o->num_tokens > 0;
    } else if (strcmp(a, "--page") == 0) {
      ok = parse_int(v, 1, 1 << 20, &x), o->page = (int32_t)x;
    } else if (strcmp(a, "--dst-page") == 0) {
      ok = parse_int(v, 1, 1 << 20, &x), o->dst_page = (int32_t)x;
    } else if (strcmp(a, "--layers") == 0) {
      ok = parse_int(v, 1, 4096, &x), o->layers = (int32_t)x;
    } else if (strcmp(a, "--entry-bytes") == 0) {
      ok = parse_int(v, 1, 1 << 24, &x), o->entry_bytes = x;
    } else if (strcmp(a, "--shapes") == 0) {
      static const char *const names[] = {"tiny", "v3", "v3.2"};
      int f[3];
      ok = parse_names(v, names, 3, f), o->shape_tiny = f[0], o->shape_v3 = f[1], o->shape_v32 = f[2];
    } else if (strcmp(a, "--layouts") == 0) {
      static const char *const names[] = {"shuffled", "consecutive"};
      int f[2];
      ok = parse_names(v, names, 2, f), o->layout_shuffled = f[0], o->layout_consecutive = f[1];
    } else if (strcmp(a, "--warmup") == 0) {
      ok = parse_int(v, 0, 1000, &x), o->warmup = (int)x;
    } else if (strcmp(a, "--reps") == 0) {
      ok = parse_int(v, 1, 100000, &x), o->reps = (int)x;
    } else if (strcmp(a, "--seed") == 0) {
      ok = parse_int(v, 0, INT64_MAX, &x), o->seed = (uint64_t)x;
    } else if (strcmp(a, "--rotate-mib") == 0) {
      ok = parse_int(v, 1, 1 << 20, &x), o->rotate_bytes = x << 20;
    } else if (strcmp(a, "--max-mib") == 0) {
      ok = parse_int(v, 1, 1 << 20, &x), o->max_bytes = x << 20;
    } else if (strcmp(a, "--timeout") == 0) {
      ok = parse_int(v, 1, 86400, &x), o->timeout_s = (double)x;
    } else {
      fprintf(stderr, "%s: unknown option %s (try --help)\n", argv[0], a);
      return 0;
    }
    if (!ok) {
      fprintf(stderr, "%s: bad value for %s: %s\n", argv[0], a, v);
      return 0;
    }
  }
  if (!o->dst_page) o->dst_page = o->page;
  if (!o->entry_bytes) o->entry_bytes = o->device ? GPU_ENTRY_V3 : 2304;
  return 1;
}

/* ---- layouts, page lists and data ------------------------------------------------------- */

static int64_t cache_bytes(int32_t num_pages, int32_t page, int32_t layers, int64_t entry) {
  return (int64_t)layers * num_pages * page * entry;
}

static int32_t needed_pages(int64_t tokens, int32_t page) { return (int32_t)((tokens + page - 1) / page); }

static ina_kv_layout_t layout_of(const kv_case_t *c, int dst) {
  ina_kv_layout_t l = {.page_size = dst ? c->dst_page : c->src_page,
                       .num_pages = dst ? c->dst_num_pages : c->src_num_pages,
                       .num_layers = c->layers,
                       .entry_bytes = c->entry_bytes};
  return l;
}

static uint64_t mix64(uint64_t x) {
  uint64_t s = x;
  return ina_bench_splitmix64(&s);
}

/* The page list of one side: `needed` ids in [0, num_pages), shuffled or consecutive. */
static void make_pages(const kv_case_t *c, int dst, int32_t *pages) {
  const int32_t num_pages = dst ? c->dst_num_pages : c->src_num_pages;
  const int32_t needed = needed_pages(c->tokens, dst ? c->dst_page : c->src_page);
  uint64_t st = mix64(c->seed ^ (dst ? 0xD5ull : 0x5Cull));
  if (c->shuffled) {
    int32_t *perm = malloc((size_t)num_pages * sizeof *perm);
    if (!perm) abort();
    for (int32_t i = 0; i < num_pages; i++) perm[i] = i;
    for (int32_t i = num_pages - 1; i > 0; i--) {
      const int32_t j = (int32_t)(ina_bench_splitmix64(&st) % (uint64_t)(i + 1));
      const int32_t t = perm[i];
      perm[i] = perm[j], perm[j] = t;
    }
    memcpy(pages, perm, (size_t)needed * sizeof *pages);
    free(perm);
  } else {
    const int32_t start = (int32_t)(ina_bench_splitmix64(&st) % (uint64_t)(num_pages - needed + 1));
    for (int32_t i = 0; i < needed; i++) pages[i] = start + i;
  }
}

/* token_of[page * page_size + slot]: the prompt token stored there, -1 for none. */
static int64_t *token_map(const kv_case_t *c, int dst) {
  const int32_t num_pages = dst ? c->dst_num_pages : c->src_num_pages;
  const int32_t page = dst ? c->dst_page : c->src_page;
  const int32_t needed = needed_pages(c->tokens, page);
  int32_t *pages = malloc((size_t)needed * sizeof *pages);
  int64_t *map = malloc((size_t)num_pages * page * sizeof *map);
  if (!pages || !map) abort();
  make_pages(c, dst, pages);
  for (int64_t i = 0; i < (int64_t)num_pages * page; i++) map[i] = -1;
  for (int64_t t = 0; t < c->tokens; t++) map[(int64_t)pages[t / page] * page + t % page] = t;
  free(pages);
  return map;
}

/* The entry of token t in `layer` (tag 0), or the decoy bytes of a source slot outside the
 * prompt (tag 1): a splitmix64 stream keyed by all of them. */
static void fill_entry(uint8_t *out, int64_t bytes, uint64_t seed, uint64_t tag, int64_t layer, int64_t idx) {
  uint64_t st = mix64(seed ^ mix64((tag << 62) ^ ((uint64_t)layer << 40) ^ (uint64_t)idx));
  int64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const uint64_t w = ina_bench_splitmix64(&st);
    memcpy(out + i, &w, 8);
  }
  if (i < bytes) {
    const uint64_t w = ina_bench_splitmix64(&st);
    memcpy(out + i, &w, (size_t)(bytes - i));
  }
}

static void fill_source(const kv_case_t *c, const int64_t *map, uint8_t *cache) {
  const int64_t slots = (int64_t)c->src_num_pages * c->src_page, e = c->entry_bytes;
  for (int64_t l = 0; l < c->layers; l++)
    for (int64_t s = 0; s < slots; s++) {
      uint8_t *p = cache + (l * slots + s) * e;
      if (map[s] >= 0) fill_entry(p, e, c->seed, 0, l, map[s]);
      else fill_entry(p, e, c->seed, 1, l, s);
    }
}

/* Compares a destination cache with what the plan must have left there: the pattern at
 * the prompt's tokens, the poison elsewhere. Returns the number of wrong entries and
 * describes the first in first[size]. */
static int64_t verify_dest(const kv_case_t *c, const int64_t *map, const uint8_t *cache, char *first, int size) {
  const int64_t slots = (int64_t)c->dst_num_pages * c->dst_page, e = c->entry_bytes;
  uint8_t *expect = malloc((size_t)e), *poison = malloc((size_t)e);
  if (!expect || !poison) abort();
  memset(poison, POISON, (size_t)e);
  int64_t wrong = 0;
  first[0] = 0;
  for (int64_t l = 0; l < c->layers; l++)
    for (int64_t s = 0; s < slots; s++) {
      const uint8_t *p = cache + (l * slots + s) * e;
      const uint8_t *want = poison;
      if (map[s] >= 0) {
        fill_entry(expect, e, c->seed, 0, l, map[s]);
        want = expect;
      }
      if (memcmp(p, want, (size_t)e) != 0) {
        if (!wrong)
          snprintf(first, (size_t)size, "layer %lld page %lld slot %lld (%s)", (long long)l,
                   (long long)(s / c->dst_page), (long long)(s % c->dst_page),
                   map[s] >= 0 ? "a prompt token: not the source pattern" : "outside the plan: not poison");
        wrong++;
      }
    }
  free(expect);
  free(poison);
  return wrong;
}

static uint8_t *alloc_cache(int64_t bytes) {
  const size_t rounded = ((size_t)bytes + 4095) & ~(size_t)4095;
  return aligned_alloc(4096, rounded);
}

/* ---- the socket between the two processes ---------------------------------------------- */

enum { MSG_CASE = 1, MSG_BLOB, MSG_VERIFY, MSG_RESULT, MSG_END_CASE, MSG_ACK, MSG_QUIT, MSG_ERROR, MSG_STAGE_IN };

typedef struct msg {
  uint32_t type;
  uint32_t pad;
  int64_t a, b;        /* VERIFY: pairs [a, b); RESULT: wrong entries, entries checked (after
                        * STAGE_IN: 0, the copy-in's nanoseconds); BLOB: 1 when the decode's
                        * regions are staged; STAGE_IN: the pair */
  uint64_t size;       /* bytes that follow (case, blob) */
  char text[256];      /* RESULT: first wrong entry; ERROR: the reason */
} msg_t;

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    const ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return 0;
    c += w, n -= (size_t)w;
  }
  return 1;
}

static int read_all(int fd, void *p, size_t n) {
  char *c = p;
  while (n) {
    const ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;
    c += r, n -= (size_t)r;
  }
  return 1;
}

static int send_msg(int fd, uint32_t type, int64_t a, int64_t b, const void *payload, uint64_t size,
                    const char *text) {
  msg_t m;
  memset(&m, 0, sizeof m);
  m.type = type, m.a = a, m.b = b, m.size = size;
  if (text) snprintf(m.text, sizeof m.text, "%s", text);
  return write_all(fd, &m, sizeof m) && (size == 0 || write_all(fd, payload, (size_t)size));
}

/* ---- the decode process ------------------------------------------------------------------ */

typedef struct decode_case {
  kv_case_t c;
  int64_t *map;
  uint8_t *caches[MAX_PAIRS]; /* host memory, or device memory for a device case */
  ina_ucx_region_t *regions[MAX_PAIRS];
  ina_kv_copy_t *stage;       /* device case: the identity plan of the prompt over this cache */
  int64_t stage_count;
} decode_case_t;

static void decode_close(decode_case_t *d) {
  for (int r = 0; r < MAX_PAIRS; r++) {
    ina_ucx_region_deregister(d->regions[r]);
    if (d->c.device) ina_cuda_free(d->caches[r]);
    else free(d->caches[r]);
  }
  free(d->map);
  free(d->stage);
  memset(d, 0, sizeof *d);
}

static int decode_fail(int fd, const char *what) {
  char why[256];
  snprintf(why, sizeof why, "decode: %s: %s", what, ina_last_error());
  send_msg(fd, MSG_ERROR, 0, 0, NULL, 0, why);
  return 0;
}

/* A device case's destination caches: cudaMalloc'ed on DEVICE and poisoned through a host
 * buffer of poison (the region's mirror, made at registration, starts as a copy), and the
 * plan of the copy-in that handoff_link_stage_in runs: tokens [0, N) of this side's pages in
 * every layer, planned from the cache onto itself. */
static int decode_open_device(int fd, decode_case_t *d, int64_t bytes) {
  static int device_set;
  if (!device_set) { /* CUDA starts here, in the child, long after the fork */
    if (ina_cuda_set_device(DEVICE) != INA_OK) return decode_fail(fd, "cudaSetDevice");
    device_set = 1;
  }
  const ina_kv_layout_t dst = layout_of(&d->c, 1);
  const int32_t needed = needed_pages(d->c.tokens, d->c.dst_page);
  int32_t *pages = malloc((size_t)needed * sizeof *pages);
  const int64_t cap = ina_kv_copy_max(&dst, &dst, 0, d->c.tokens, 0, d->c.layers);
  d->stage = malloc((size_t)(cap > 0 ? cap : 1) * sizeof *d->stage);
  uint8_t *poison = malloc((size_t)bytes);
  int ok = 0;
  if (!pages || !d->stage || !poison) {
    send_msg(fd, MSG_ERROR, 0, 0, NULL, 0, "decode: out of host memory for a device case");
    goto out;
  }
  make_pages(&d->c, 1, pages);
  if (ina_kv_copy_plan(&dst, pages, &dst, pages, 0, d->c.tokens, 0, d->c.layers, d->stage, cap, &d->stage_count) !=
      INA_OK) {
    decode_fail(fd, "the copy-in plan");
    goto out;
  }
  memset(poison, POISON, (size_t)bytes);
  for (int r = 0; r < d->c.pairs; r++) {
    void *p = NULL;
    if (ina_cuda_malloc(DEVICE, (size_t)bytes, &p) != INA_OK) {
      decode_fail(fd, "device destination caches");
      goto out;
    }
    d->caches[r] = p;
    if (ina_cuda_memcpy_h2d(p, poison, (size_t)bytes) != INA_OK) {
      decode_fail(fd, "poisoning a device cache");
      goto out;
    }
  }
  ok = 1;
out:
  free(pages);
  free(poison);
  return ok;
}

/* Opens a case: destination caches poisoned and registered, the blob sent back. */
static int decode_open(int fd, ina_ucx_engine_t *e, decode_case_t *d) {
  const int64_t bytes = cache_bytes(d->c.dst_num_pages, d->c.dst_page, d->c.layers, d->c.entry_bytes);
  d->map = token_map(&d->c, 1);
  if (d->c.device && !decode_open_device(fd, d, bytes)) return 0;
  for (int r = 0; r < d->c.pairs; r++) {
    if (!d->c.device) {
      d->caches[r] = alloc_cache(bytes);
      if (!d->caches[r]) {
        send_msg(fd, MSG_ERROR, 0, 0, NULL, 0, "decode: out of memory for the destination caches");
        return 0;
      }
      memset(d->caches[r], POISON, (size_t)bytes);
    }
    if (ina_ucx_region_register(e, d->caches[r], (size_t)bytes, d->c.device ? INA_UCX_MEM_CUDA : INA_UCX_MEM_HOST,
                                &d->regions[r]) != INA_OK)
      return decode_fail(fd, "register");
  }
  void *blob = NULL;
  size_t size = 0;
  if (ina_ucx_engine_pack_blob(e, d->regions, (uint32_t)d->c.pairs, &blob, &size) != INA_OK)
    return decode_fail(fd, "pack blob");
  const int ok = send_msg(fd, MSG_BLOB, ina_ucx_region_is_staged(d->regions[0]), 0, blob, size, NULL);
  free(blob);
  return ok;
}

/* What the decode agent does once the puts of a hand-off landed (handoff_link_stage_in):
 * every piece of the plan mirror -> device, then a device synchronize, since a pageable
 * host -> device copy may return before the data is on the device. A no-op copy for a
 * region UCX writes directly. Answers the copy-in's nanoseconds. */
static int decode_stage_in(int fd, decode_case_t *d, int64_t r) {
  if (!d->c.device || r < 0 || r >= d->c.pairs) {
    send_msg(fd, MSG_ERROR, 0, 0, NULL, 0, "decode: stage-in outside a device case");
    return 0;
  }
  const double t0 = ina_bench_now_s();
  for (int64_t i = 0; i < d->stage_count; i++)
    if (ina_ucx_region_stage_in(d->regions[r], (size_t)d->stage[i].dst_offset, (size_t)d->stage[i].bytes) != INA_OK)
      return decode_fail(fd, "stage-in");
  if (ina_ucx_region_is_staged(d->regions[r]) && ina_cuda_synchronize() != INA_OK)
    return decode_fail(fd, "synchronize after the stage-in");
  const double t1 = ina_bench_now_s();
  return send_msg(fd, MSG_RESULT, 0, (int64_t)((t1 - t0) * 1e9), NULL, 0, NULL);
}

/* Compares pair r's destination cache; a device cache is read back into `host` first. */
static int64_t decode_verify(int fd, decode_case_t *d, int64_t r, uint8_t **host, char *what, int size) {
  const uint8_t *cache = d->caches[r];
  if (d->c.device) {
    const int64_t bytes = cache_bytes(d->c.dst_num_pages, d->c.dst_page, d->c.layers, d->c.entry_bytes);
    if (!*host && !(*host = alloc_cache(bytes))) {
      send_msg(fd, MSG_ERROR, 0, 0, NULL, 0, "decode: out of memory for reading a device cache back");
      return -1;
    }
    if (ina_cuda_memcpy_d2h(*host, d->caches[r], (size_t)bytes) != INA_OK) {
      decode_fail(fd, "reading a device cache back");
      return -1;
    }
    cache = *host;
  }
  return verify_dest(&d->c, d->map, cache, what, size);
}

static int decode_main(int fd) {
  ina_ucx_engine_t *e = NULL;
  if (ina_ucx_engine_create(&e) != INA_OK) {
    fprintf(stderr, "decode: ina_ucx_engine_create: %s\n", ina_last_error());
    return 1;
  }
  decode_case_t d;
  memset(&d, 0, sizeof d);
  int open = 0, rc = 1;
  for (;;) {
    /* While a case is open, drive the worker between messages (transports such as tcp
     * need the target's progress); otherwise sleep in read(). */
    if (open) {
      for (unsigned spin = 0;; spin++) {
        const int progressed = ina_ucx_engine_progress(e);
        if (!progressed || (spin & 255) == 0) {
          struct pollfd p = {.fd = fd, .events = POLLIN};
          if (poll(&p, 1, 0) > 0) break;
        }
      }
    }
    msg_t m;
    if (!read_all(fd, &m, sizeof m)) break; /* the prefill process is gone */
    if (m.type == MSG_QUIT) {
      rc = 0;
      break;
    } else if (m.type == MSG_CASE) {
      if (m.size != sizeof d.c || !read_all(fd, &d.c, sizeof d.c)) break;
      if (!decode_open(fd, e, &d)) break;
      open = 1;
    } else if (m.type == MSG_VERIFY) {
      int64_t wrong = 0, checked = 0;
      char first[256] = "", what[160];
      uint8_t *host = NULL;
      int failed = 0;
      for (int64_t r = m.a; r < m.b && r < d.c.pairs; r++) {
        const int64_t w = decode_verify(fd, &d, r, &host, what, sizeof what);
        if (w < 0) {
          failed = 1;
          break;
        }
        if (w && !wrong) snprintf(first, sizeof first, "pair %lld: %s", (long long)r, what);
        wrong += w;
        checked += (int64_t)d.c.layers * d.c.dst_num_pages * d.c.dst_page;
      }
      free(host);
      if (failed || !send_msg(fd, MSG_RESULT, wrong, checked, NULL, 0, first)) break;
    } else if (m.type == MSG_STAGE_IN) {
      if (!decode_stage_in(fd, &d, m.a)) break;
    } else if (m.type == MSG_END_CASE) {
      decode_close(&d);
      open = 0;
      if (!send_msg(fd, MSG_ACK, 0, 0, NULL, 0, NULL)) break;
    } else {
      fprintf(stderr, "decode: unexpected message %u\n", m.type);
      break;
    }
  }
  decode_close(&d);
  ina_ucx_engine_destroy(e);
  return rc;
}

/* ---- UCX transports, from UCX's own info log --------------------------------------------- */

static char tls_lines[MAX_TLS_LINES][320];
static int tls_count;

static ucs_log_func_rc_t capture_log(const char *file, unsigned line, const char *function, ucs_log_level_t level,
                                     const ucs_log_component_config_t *comp_conf, const char *message,
                                     va_list ap) {
  if (level <= UCS_LOG_LEVEL_WARN) return UCS_LOG_FUNC_RC_CONTINUE; /* warnings and errors print */
  if (level == UCS_LOG_LEVEL_INFO && strstr(file, "ucp_worker")) {
    char buf[320];
    vsnprintf(buf, sizeof buf, message, ap);
    if (strstr(buf, "cfg")) {
      int seen = 0;
      for (int i = 0; i < tls_count; i++) seen |= strcmp(tls_lines[i], buf) == 0;
      if (!seen && tls_count < MAX_TLS_LINES) snprintf(tls_lines[tls_count++], sizeof tls_lines[0], "%s", buf);
    }
  }
  return UCS_LOG_FUNC_RC_STOP; /* what the raised level adds (diag, info) stays quiet */
}

/* ---- the prefill process ----------------------------------------------------------------- */

typedef struct figures {
  double median_ms, min_ms;
} figures_t;

typedef struct row {
  kv_case_t c;
  int64_t copies;
  int ok;
  figures_t ucx, mem;
  /* --device: the whole hand-off, its put part (copy-out + puts + flush), the decode's
   * copy-in, and the staging ceiling */
  int dev_ok;
  figures_t dev, dev_put, dev_in, ceiling;
} row_t;

/* Which path the device caches took, printed once and above the device table. */
static char g_device_path[256];

static int recv_msg(int fd, msg_t *m, uint32_t want) {
  if (!read_all(fd, m, sizeof *m)) {
    fprintf(stderr, "prefill: the decode process closed the socket\n");
    return 0;
  }
  if (m->type == MSG_ERROR) {
    fprintf(stderr, "prefill: %s\n", m->text);
    return 0;
  }
  if (m->type != want) {
    fprintf(stderr, "prefill: message %u, expected %u\n", m->type, want);
    return 0;
  }
  return 1;
}

static figures_t summarize(double *times_s, int n) {
  figures_t f = {0, 0};
  f.min_ms = times_s[0] * 1e3;
  for (int i = 1; i < n; i++)
    if (times_s[i] * 1e3 < f.min_ms) f.min_ms = times_s[i] * 1e3;
  f.median_ms = ina_bench_median(times_s, n) * 1e3;
  return f;
}

static int remote_check(int fd, const char *what, int64_t from, int64_t to) {
  msg_t m;
  if (!send_msg(fd, MSG_VERIFY, from, to, NULL, 0, NULL) || !recv_msg(fd, &m, MSG_RESULT)) return -1;
  if (m.a) {
    ina_bench_check_failed(what, "%lld of %lld destination entries wrong, first: %s", (long long)m.a,
                           (long long)m.b, m.text);
    return 0;
  }
  return ina_bench_check(what, "wrong_entries", 0, 0);
}

/* The puts of every cache pair: pair r's `count` plan pieces from srcs[r] into the
 * decode process's region r (which must hold dst_bytes). [pairs * count], malloc'ed;
 * NULL (with a message) when memory or a region falls short. */
static ina_ucx_xfer_t *plan_puts(ina_ucx_peer_t *peer, uint8_t *const *srcs, int pairs, const ina_kv_copy_t *plan,
                                 int64_t count, int64_t dst_bytes) {
  ina_ucx_xfer_t *xfers = malloc(((size_t)pairs * (size_t)count + 1) * sizeof *xfers);
  if (!xfers) {
    fprintf(stderr, "prefill: out of memory for %d x %lld puts\n", pairs, (long long)count);
    return NULL;
  }
  for (int r = 0; r < pairs; r++) {
    uint64_t base = 0, length = 0;
    if (ina_ucx_peer_region(peer, (uint32_t)r, &base, &length) != INA_OK || length < (uint64_t)dst_bytes) {
      fprintf(stderr, "prefill: decode region %d: %s\n", r, ina_last_error());
      free(xfers);
      return NULL;
    }
    for (int64_t i = 0; i < count; i++)
      xfers[(int64_t)r * count + i] =
          (ina_ucx_xfer_t){srcs[r] + plan[i].src_offset, base + plan[i].dst_offset, (size_t)plan[i].bytes};
  }
  return xfers;
}

/* A case's end after timing: the decode process checks all `pairs` caches (figure
 * "<what> <label>_all_<pairs>_pairs_after_timing"), then the peer and the regions go and
 * the decode process closes the case. 1 when done, 0 when the check failed, -1 when the
 * exchange did (the caller's cleanup then drops what is left). */
static int finish_case(int fd, const char *what, const char *label, int pairs, ina_ucx_peer_t **peer,
                       ina_ucx_region_t **regions) {
  char w[256];
  msg_t m;
  snprintf(w, sizeof w, "%s %s_all_%d_pairs_after_timing", what, label, pairs);
  const int ok = remote_check(fd, w, 0, pairs);
  if (ok <= 0) return ok;
  ina_ucx_peer_disconnect(*peer);
  *peer = NULL;
  for (int r = 0; r < pairs; r++) {
    ina_ucx_region_deregister(regions[r]);
    regions[r] = NULL;
  }
  if (!send_msg(fd, MSG_END_CASE, 0, 0, NULL, 0, NULL) || !recv_msg(fd, &m, MSG_ACK)) return -1;
  return 1;
}

static int local_check(const kv_case_t *c, const int64_t *map, uint8_t *const *caches, int from, int to,
                       const char *what) {
  int64_t wrong = 0, checked = 0;
  char first[256] = "", desc[160];
  for (int r = from; r < to; r++) {
    const int64_t w = verify_dest(c, map, caches[r], desc, sizeof desc);
    if (w && !wrong) snprintf(first, sizeof first, "pair %d: %s", r, desc);
    wrong += w;
    checked += (int64_t)c->layers * c->dst_num_pages * c->dst_page;
  }
  if (wrong)
    return ina_bench_check_failed(what, "%lld of %lld destination entries wrong, first: %s", (long long)wrong,
                                  (long long)checked, first);
  return ina_bench_check(what, "wrong_entries", 0, 0);
}

/* The device half of a case (--device), after its host figures: the decode process opens
 * the same case with device caches, this process fills its own device caches from
 * `pattern` (the host source cache of the case), and the hand-off is timed and checked as
 * the header says; then the staging ceiling. Returns as run_case. */
static int run_device_case(int fd, ina_ucx_engine_t *e, const options_t *o, row_t *row, const ina_kv_copy_t *plan,
                           int64_t count, const uint8_t *pattern) {
  kv_case_t dc = row->c;
  dc.device = 1;
  const kv_case_t *c = &dc;
  const int64_t src_bytes = cache_bytes(c->src_num_pages, c->src_page, c->layers, c->entry_bytes);
  const int64_t bytes = c->tokens * c->layers * c->entry_bytes;
  const int P = c->pairs, total = 1 + o->warmup + o->reps;
  char what[192];
  snprintf(what, sizeof what, "%s/%s/N=%lld device", c->shape, c->shuffled ? "shuffled" : "consecutive",
           (long long)c->tokens);
  int status = -1, opened = 0;
  uint8_t *srcs[MAX_PAIRS] = {0}, *hosts[MAX_PAIRS] = {0};
  ina_ucx_region_t *regions[MAX_PAIRS] = {0};
  ina_ucx_peer_t *peer = NULL;
  ina_ucx_xfer_t *xfers = NULL;
  double *times = calloc((size_t)o->reps, sizeof *times);
  double *put_times = calloc((size_t)o->reps, sizeof *put_times);
  double *in_times = calloc((size_t)o->reps, sizeof *in_times);
  uint8_t *poison = malloc((size_t)src_bytes);
  void *blob = NULL;
  msg_t m;
  if (!times || !put_times || !in_times || !poison) goto out;
  memset(poison, POISON, (size_t)src_bytes);

  /* Source caches, poisoned: a staged region's mirror starts as a copy of the device. */
  for (int r = 0; r < P; r++) {
    void *p = NULL;
    if (ina_cuda_malloc(DEVICE, (size_t)src_bytes, &p) != INA_OK ||
        ina_cuda_memcpy_h2d(p, poison, (size_t)src_bytes) != INA_OK) {
      fprintf(stderr, "prefill: %s: device source cache %d of %lld bytes: %s\n", what, r, (long long)src_bytes,
              ina_last_error());
      ina_cuda_free(p);
      goto out;
    }
    srcs[r] = p;
  }
  free(poison);
  poison = NULL;

  if (!send_msg(fd, MSG_CASE, 0, 0, c, sizeof *c, NULL)) goto out;
  opened = 1;
  if (!recv_msg(fd, &m, MSG_BLOB)) goto out;
  const int decode_staged = m.a != 0;
  blob = malloc(m.size ? m.size : 1);
  if (!blob || !read_all(fd, blob, m.size)) goto out;
  for (int r = 0; r < P; r++) {
    if (ina_ucx_region_register(e, srcs[r], (size_t)src_bytes, INA_UCX_MEM_CUDA, &regions[r]) != INA_OK) {
      fprintf(stderr, "prefill: register a device cache: %s\n", ina_last_error());
      goto out;
    }
    /* The pattern only now: a put that skipped the copy-out would send the poison. */
    if (ina_cuda_memcpy_h2d(srcs[r], pattern, (size_t)src_bytes) != INA_OK) {
      fprintf(stderr, "prefill: filling a device cache: %s\n", ina_last_error());
      goto out;
    }
  }
  if (!g_device_path[0]) {
    const int staged = ina_ucx_region_is_staged(regions[0]);
    snprintf(g_device_path, sizeof g_device_path,
             "UCX %s CUDA memory: prefill %s, decode %s", ina_ucx_engine_has_cuda(e) ? "takes" : "does not take",
             staged ? "copies each piece device -> host mirror before its put"
                    : "puts from device memory directly",
             decode_staged ? "copies the pieces host mirror -> device after the flush"
                           : "receives into device memory directly");
    printf("bench_kv_transfer: device caches on device %d: %s\n", DEVICE, g_device_path);
  }
  if (ina_ucx_peer_connect(e, blob, m.size, &peer) != INA_OK) {
    fprintf(stderr, "prefill: ina_ucx_peer_connect: %s\n", ina_last_error());
    goto out;
  }
  if (ina_ucx_peer_region_count(peer) != (uint32_t)P) {
    fprintf(stderr, "prefill: the decode blob has %u regions, expected %d\n", ina_ucx_peer_region_count(peer), P);
    goto out;
  }
  xfers = plan_puts(peer, srcs, P, plan, count,
                    cache_bytes(c->dst_num_pages, c->dst_page, c->layers, c->entry_bytes));
  if (!xfers) goto out;
  for (int it = 0; it < total; it++) {
    const int r = it % P;
    ina_ucx_batch_t *batch = NULL;
    const double t0 = ina_bench_now_s();
    ina_status_t st = ina_ucx_post(peer, INA_UCX_PUT, xfers + (int64_t)r * count, (size_t)count, &batch);
    if (st == INA_OK) st = ina_ucx_batch_wait(batch, o->timeout_s);
    const double tp = ina_bench_now_s();
    ina_ucx_batch_destroy(batch);
    if (st != INA_OK) {
      fprintf(stderr, "prefill: %s: UCX batch %d: %s\n", what, it, ina_last_error());
      status = 0;
      goto out;
    }
    if (!send_msg(fd, MSG_STAGE_IN, r, 0, NULL, 0, NULL) || !recv_msg(fd, &m, MSG_RESULT)) goto out;
    const double t1 = ina_bench_now_s();
    if (it == 0) {
      char w[256];
      snprintf(w, sizeof w, "%s handoff_first_batch", what);
      const int ok = remote_check(fd, w, 0, 1);
      if (ok < 0) goto out;
      if (!ok) {
        status = 0;
        goto out;
      }
    } else if (it > o->warmup) {
      times[it - 1 - o->warmup] = t1 - t0;
      put_times[it - 1 - o->warmup] = tp - t0;
      in_times[it - 1 - o->warmup] = (double)m.b * 1e-9;
    }
  }
  row->dev = summarize(times, o->reps);
  row->dev_put = summarize(put_times, o->reps);
  row->dev_in = summarize(in_times, o->reps);
  {
    const int done = finish_case(fd, what, "handoff", P, &peer, regions);
    if (done < 0) goto out;
    if (!done) {
      status = 0;
      goto out;
    }
  }
  opened = 0;

  /* ---- the staging ceiling: the plan's bytes device -> host -> device in two copies
   * (the decode process sleeps). Each copy writes back what it read, so the caches keep
   * their bytes. ---- */
  for (int r = 0; r < P; r++) {
    hosts[r] = alloc_cache(bytes);
    if (!hosts[r]) {
      fprintf(stderr, "prefill: out of memory for %d host buffers of %lld bytes\n", P, (long long)bytes);
      goto out;
    }
  }
  for (int it = 0; it < total; it++) {
    const int r = it % P;
    const double t0 = ina_bench_now_s();
    ina_status_t st = ina_cuda_memcpy_d2h(hosts[r], srcs[r], (size_t)bytes);
    if (st == INA_OK) st = ina_cuda_memcpy_h2d(srcs[r], hosts[r], (size_t)bytes);
    if (st == INA_OK) st = ina_cuda_synchronize();
    const double t1 = ina_bench_now_s();
    if (st != INA_OK) {
      fprintf(stderr, "prefill: %s: staging ceiling: %s\n", what, ina_last_error());
      goto out;
    }
    if (it > o->warmup) times[it - 1 - o->warmup] = t1 - t0;
  }
  row->ceiling = summarize(times, o->reps);
  row->dev_ok = 1;
  status = 1;

out:
  ina_ucx_peer_disconnect(peer);
  for (int r = 0; r < MAX_PAIRS; r++) {
    ina_ucx_region_deregister(regions[r]);
    ina_cuda_free(srcs[r]);
    free(hosts[r]);
  }
  if (opened && status >= 0) {
    if (!send_msg(fd, MSG_END_CASE, 0, 0, NULL, 0, NULL) || !recv_msg(fd, &m, MSG_ACK)) status = -1;
  }
  free(blob);
  free(xfers);
  free(times);
  free(put_times);
  free(in_times);
  free(poison);
  return status;
}

/* One case: UCX puts to the decode process, then memcpy of the same plan. Returns 0 when
 * the case failed (a check or a transfer), -1 when the run cannot go on. */
static int run_case(int fd, ina_ucx_engine_t *e, const options_t *o, row_t *row) {
  kv_case_t *c = &row->c;
  const ina_kv_layout_t src = layout_of(c, 0), dst = layout_of(c, 1);
  const int64_t src_bytes = cache_bytes(c->src_num_pages, c->src_page, c->layers, c->entry_bytes);
  const int64_t dst_bytes = cache_bytes(c->dst_num_pages, c->dst_page, c->layers, c->entry_bytes);
  const int P = c->pairs, total = 1 + o->warmup + o->reps;
  char what[192];
  snprintf(what, sizeof what, "%s/%s/N=%lld", c->shape, c->shuffled ? "shuffled" : "consecutive",
           (long long)c->tokens);
  int status = -1, opened = 0;
  int64_t *src_map = token_map(c, 0), *dst_map = token_map(c, 1);
  int32_t *src_pages = malloc((size_t)needed_pages(c->tokens, c->src_page) * sizeof *src_pages);
  int32_t *dst_pages = malloc((size_t)needed_pages(c->tokens, c->dst_page) * sizeof *dst_pages);
  uint8_t *srcs[MAX_PAIRS] = {0}, *dsts[MAX_PAIRS] = {0};
  ina_ucx_region_t *regions[MAX_PAIRS] = {0};
  ina_ucx_peer_t *peer = NULL;
  ina_kv_copy_t *plan = NULL;
  ina_ucx_xfer_t *xfers = NULL;
  double *times = calloc((size_t)o->reps, sizeof *times);
  void *blob = NULL;
  if (!src_pages || !dst_pages || !times) goto out;
  make_pages(c, 0, src_pages);
  make_pages(c, 1, dst_pages);

  /* The plan. */
  const int64_t cap = ina_kv_copy_max(&src, &dst, 0, c->tokens, 0, c->layers);
  plan = malloc((size_t)cap * sizeof *plan);
  if (!plan) goto out;
  int64_t count = 0;
  if (ina_kv_copy_plan(&src, src_pages, &dst, dst_pages, 0, c->tokens, 0, c->layers, plan, cap, &count) != INA_OK) {
    fprintf(stderr, "prefill: ina_kv_copy_plan: %s\n", ina_last_error());
    goto out;
  }
  row->copies = count;
  int64_t planned = 0;
  for (int64_t i = 0; i < count; i++) planned += (int64_t)plan[i].bytes;
  if (planned != c->tokens * c->layers * c->entry_bytes) {
    ina_bench_check_failed(what, "the plan moves %lld bytes, N * layers * entry_bytes = %lld", (long long)planned,
                           (long long)(c->tokens * c->layers * c->entry_bytes));
    status = 0;
    goto out;
  }

  /* Source caches: pair 0 filled, the others copies of it. */
  for (int r = 0; r < P; r++) {
    srcs[r] = alloc_cache(src_bytes);
    if (!srcs[r]) {
      fprintf(stderr, "prefill: out of memory for %d source caches of %lld bytes\n", P, (long long)src_bytes);
      goto out;
    }
    if (r == 0) fill_source(c, src_map, srcs[0]);
    else memcpy(srcs[r], srcs[0], (size_t)src_bytes);
  }

  /* ---- UCX ---- */
  msg_t m;
  if (!send_msg(fd, MSG_CASE, 0, 0, c, sizeof *c, NULL)) goto out;
  opened = 1;
  if (!recv_msg(fd, &m, MSG_BLOB)) goto out;
  blob = malloc(m.size ? m.size : 1);
  if (!blob || !read_all(fd, blob, m.size)) goto out;
  for (int r = 0; r < P; r++)
    if (ina_ucx_region_register(e, srcs[r], (size_t)src_bytes, INA_UCX_MEM_HOST, &regions[r]) != INA_OK) {
      fprintf(stderr, "prefill: register: %s\n", ina_last_error());
      goto out;
    }
  if (ina_ucx_peer_connect(e, blob, m.size, &peer) != INA_OK) {
    fprintf(stderr, "prefill: ina_ucx_peer_connect: %s\n", ina_last_error());
    goto out;
  }
  if (ina_ucx_peer_region_count(peer) != (uint32_t)P) {
    fprintf(stderr, "prefill: the decode blob has %u regions, expected %d\n", ina_ucx_peer_region_count(peer), P);
    goto out;
  }
  xfers = plan_puts(peer, srcs, P, plan, count, dst_bytes);
  if (!xfers) goto out;
  for (int it = 0; it < total; it++) {
    const int r = it % P;
    ina_ucx_batch_t *batch = NULL;
    const double t0 = ina_bench_now_s();
    ina_status_t st = ina_ucx_post(peer, INA_UCX_PUT, xfers + (int64_t)r * count, (size_t)count, &batch);
    if (st == INA_OK) st = ina_ucx_batch_wait(batch, o->timeout_s);
    const double t1 = ina_bench_now_s();
    ina_ucx_batch_destroy(batch);
    if (st != INA_OK) {
      fprintf(stderr, "prefill: %s: UCX batch %d: %s\n", what, it, ina_last_error());
      status = 0;
      goto out;
    }
    if (it == 0) {
      char w[256];
      snprintf(w, sizeof w, "%s ucx_first_batch", what);
      const int ok = remote_check(fd, w, 0, 1);
      if (ok < 0) goto out;
      if (!ok) {
        status = 0;
        goto out;
      }
    } else if (it > o->warmup) {
      times[it - 1 - o->warmup] = t1 - t0;
    }
  }
  row->ucx = summarize(times, o->reps);
  {
    const int done = finish_case(fd, what, "ucx", P, &peer, regions);
    if (done < 0) goto out;
    if (!done) {
      status = 0;
      goto out;
    }
  }
  opened = 0;

  /* ---- memcpy of the same plan, in this process (the decode process sleeps) ---- */
  for (int r = 0; r < P; r++) {
    dsts[r] = alloc_cache(dst_bytes);
    if (!dsts[r]) {
      fprintf(stderr, "prefill: out of memory for %d destination caches\n", P);
      goto out;
    }
    memset(dsts[r], POISON, (size_t)dst_bytes);
  }
  for (int it = 0; it < total; it++) {
    const int r = it % P;
    const uint8_t *s = srcs[r];
    uint8_t *d = dsts[r];
    const double t0 = ina_bench_now_s();
    for (int64_t i = 0; i < count; i++) memcpy(d + plan[i].dst_offset, s + plan[i].src_offset, (size_t)plan[i].bytes);
    const double t1 = ina_bench_now_s();
    if (it == 0) {
      char w[256];
      snprintf(w, sizeof w, "%s memcpy_first_run", what);
      if (!local_check(c, dst_map, dsts, 0, 1, w)) {
        status = 0;
        goto out;
      }
    } else if (it > o->warmup) {
      times[it - 1 - o->warmup] = t1 - t0;
    }
  }
  row->mem = summarize(times, o->reps);
  {
    char w[256];
    snprintf(w, sizeof w, "%s memcpy_all_%d_pairs_after_timing", what, P);
    if (!local_check(c, dst_map, dsts, 0, P, w)) {
      status = 0;
      goto out;
    }
  }
  row->ok = 1;
  status = 1;
  if (o->device) {
    for (int r = 0; r < P; r++) {
      free(dsts[r]);
      dsts[r] = NULL;
    }
    status = run_device_case(fd, e, o, row, plan, count, srcs[0]);
  }

out:
  ina_ucx_peer_disconnect(peer);
  for (int r = 0; r < MAX_PAIRS; r++) {
    ina_ucx_region_deregister(regions[r]);
    free(srcs[r]);
    free(dsts[r]);
  }
  if (opened && status >= 0) {
    if (!send_msg(fd, MSG_END_CASE, 0, 0, NULL, 0, NULL) || !recv_msg(fd, &m, MSG_ACK)) status = -1;
  }
  free(blob);
  free(xfers);
  free(plan);
  free(times);
  free(src_pages);
  free(dst_pages);
  free(src_map);
  free(dst_map);
  return status;
}

static int64_t l3_bytes(void) {
#ifdef _SC_LEVEL3_CACHE_SIZE
  const long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (v > 0) return v;
#endif
  return 0;
}

static void make_case(kv_case_t *c, const char *shape, int32_t src_page, int32_t dst_page, int32_t layers,
                      int64_t entry, int64_t tokens, int shuffled, const options_t *o, int64_t rotate, int index) {
  memset(c, 0, sizeof *c);
  snprintf(c->shape, sizeof c->shape, "%s", shape);
  c->src_page = src_page, c->dst_page = dst_page, c->layers = layers, c->entry_bytes = entry;
  c->tokens = tokens, c->shuffled = shuffled;
  const int32_t ns = needed_pages(tokens, src_page), nd = needed_pages(tokens, dst_page);
  c->src_num_pages = ns + ns / 4 + 1;
  c->dst_num_pages = nd + nd / 4 + 1;
  const int64_t side = cache_bytes(c->src_num_pages, src_page, layers, entry) >
                               cache_bytes(c->dst_num_pages, dst_page, layers, entry)
                           ? cache_bytes(c->src_num_pages, src_page, layers, entry)
                           : cache_bytes(c->dst_num_pages, dst_page, layers, entry);
  int64_t pairs = (rotate + side - 1) / side;
  if (pairs > o->max_bytes / side) pairs = o->max_bytes / side;
  if (pairs > MAX_PAIRS) pairs = MAX_PAIRS;
  if (pairs > 1 + o->warmup + o->reps) pairs = 1 + o->warmup + o->reps; /* every pair gets used */
  if (pairs < 1) pairs = 1;
  c->pairs = (int32_t)pairs;
  c->seed = mix64(o->seed * 0x100000001B3ull + (uint64_t)index);
}

static int prefill_main(int fd, const options_t *o, int argc, char **argv) {
  int exit_code = 0;
  printf("bench_kv_transfer: command:");
  for (int i = 0; i < argc; i++) printf(" %s", argv[i]);
  printf("\n");
  if (o->device) { /* after the fork: the decode process starts CUDA on its own */
    if (ina_bench_no_device("bench_kv_transfer")) {
      char why[256];
      printf("bench_kv_transfer: --device: %s\n", ina_cuda_no_device_reason(why, sizeof why));
      return INA_BENCH_SKIP;
    }
    if (ina_cuda_set_device(DEVICE) != INA_OK) {
      fprintf(stderr, "bench_kv_transfer: %s\n", ina_last_error());
      return 1;
    }
  }
  const char *tls = getenv("UCX_TLS");
  printf("bench_kv_transfer: UCX %s, UCX_TLS=%s\n", ucp_get_version_string(), tls ? tls : "(unset: UCX's default)");
  {
    char load[128] = "?";
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
      if (!fgets(load, sizeof load, f)) snprintf(load, sizeof load, "?");
      fclose(f);
      load[strcspn(load, "\n")] = 0;
    }
    printf("bench_kv_transfer: %ld CPUs online, load average %s (UCX over tcp needs two busy cores: the putting "
           "process and the target's progress loop; memcpy one)\n",
           sysconf(_SC_NPROCESSORS_ONLN), load);
  }
  const int64_t l3 = l3_bytes();
  const int64_t rotate = o->rotate_bytes ? o->rotate_bytes : (l3 ? 2 * l3 : 256ll << 20);
  printf("bench_kv_transfer: L3 %lld MiB; cache pairs rotate until each side holds >= %lld MiB (at most %lld "
         "MiB, %d pairs)\n",
         (long long)(l3 >> 20), (long long)(rotate >> 20), (long long)(o->max_bytes >> 20), MAX_PAIRS);
  printf("bench_kv_transfer: warm-up %d, timed %d batches per figure; each batch = every layer of the prompt\n",
         o->warmup, o->reps);

  const int capture = getenv("UCX_LOG_LEVEL") == NULL;
  if (capture) {
    ucs_log_push_handler(capture_log);
    if (ucs_global_opts.log_component.log_level < UCS_LOG_LEVEL_INFO)
      ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_INFO;
  }
  ina_ucx_engine_t *e = NULL;
  if (ina_ucx_engine_create(&e) != INA_OK) {
    fprintf(stderr, "prefill: ina_ucx_engine_create: %s\n", ina_last_error());
    return 1;
  }

  static row_t rows[3 * 2 * MAX_TOKENS_LIST];
  int n = 0;
  for (int s = 0; s < 3; s++) {
    if (s == 0 ? !o->shape_tiny : s == 1 ? !o->shape_v3 : !o->shape_v32) continue;
    for (int lay = 0; lay < 2; lay++) {
      if (lay == 0 ? !o->layout_shuffled : !o->layout_consecutive) continue;
      for (int t = 0; t < o->num_tokens; t++) {
        row_t *row = &rows[n];
        memset(row, 0, sizeof *row);
        if (s == 0)
          make_case(&row->c, "tiny", o->page, o->dst_page, o->layers, o->entry_bytes, o->tokens[t], lay == 0, o,
                    rotate, n);
        else if (s == 1)
          make_case(&row->c, "v3", 64, 64, 61, GPU_ENTRY_V3, o->tokens[t], lay == 0, o, rotate, n);
        else
          make_case(&row->c, "v3.2", 64, 64, 61, GPU_ENTRY_V32, o->tokens[t], lay == 0, o, rotate, n);
        n++;
        const int st = run_case(fd, e, o, row);
        fflush(stdout);
        if (st <= 0) exit_code = 1;
        if (st < 0) goto done;
        if (row->ok) {
          const double bytes = (double)row->c.tokens * row->c.layers * (double)row->c.entry_bytes;
          char name[160], formula[256];
          const char *lname = row->c.shuffled ? "shuffled" : "consecutive";
          snprintf(formula, sizeof formula,
                   "bytes %.0f = N %lld * layers %d * entry_bytes %lld / median time; %lld copies, %d pairs", bytes,
                   (long long)row->c.tokens, row->c.layers, (long long)row->c.entry_bytes, (long long)row->copies,
                   row->c.pairs);
          snprintf(name, sizeof name, "ucx_put_%s_%s_n%lld", row->c.shape, lname, (long long)row->c.tokens);
          ina_bench_result(name, bytes / (row->ucx.median_ms * 1e-3) / 1e9, "GB/s", formula);
          snprintf(name, sizeof name, "memcpy_%s_%s_n%lld", row->c.shape, lname, (long long)row->c.tokens);
          ina_bench_result(name, bytes / (row->mem.median_ms * 1e-3) / 1e9, "GB/s", formula);
        }
        if (row->dev_ok) {
          const double bytes = (double)row->c.tokens * row->c.layers * (double)row->c.entry_bytes;
          char name[160], formula[384];
          const char *lname = row->c.shuffled ? "shuffled" : "consecutive";
          snprintf(formula, sizeof formula,
                   "bytes %.0f = N %lld * layers %d * entry_bytes %lld / median time of prefill copy-out + puts + "
                   "flush + decode copy-in + device sync (device caches); %lld copies, %d pairs",
                   bytes, (long long)row->c.tokens, row->c.layers, (long long)row->c.entry_bytes,
                   (long long)row->copies, row->c.pairs);
          snprintf(name, sizeof name, "ucx_handoff_device_%s_%s_n%lld", row->c.shape, lname,
                   (long long)row->c.tokens);
          ina_bench_result(name, bytes / (row->dev.median_ms * 1e-3) / 1e9, "GB/s", formula);
          snprintf(formula, sizeof formula,
                   "bytes %.0f / median time of one cudaMemcpy D2H + one H2D of them (pageable host memory)", bytes);
          snprintf(name, sizeof name, "staging_ceiling_%s_%s_n%lld", row->c.shape, lname, (long long)row->c.tokens);
          ina_bench_result(name, bytes / (row->ceiling.median_ms * 1e-3) / 1e9, "GB/s", formula);
        }
      }
    }
  }
done:
  ina_ucx_engine_destroy(e);
  if (capture) ucs_log_pop_handler();

  printf("\nUCX transports (UCX's ep_cfg of the prefill process's endpoint):\n");
  if (!capture) printf("  (UCX_LOG_LEVEL is set: not captured; see UCX's own log)\n");
  else if (!tls_count) printf("  (none logged)\n");
  for (int i = 0; i < tls_count; i++) printf("  %s\n", tls_lines[i]);

  printf("\nbytes = N * layers * entry_bytes; GB/s = bytes / time / 1e9; ratio = UCX GB/s / memcpy GB/s (medians)\n");
  printf("%-5s %-11s %6s %7s %6s %6s %9s %7s %9s %5s | %9s %9s %7s %7s | %9s %9s %7s %7s | %6s\n", "shape", "pages",
         "N", "page", "layers", "entry", "MB", "copies", "KB/copy", "pairs", "ucx_med", "ucx_min", "GB/s", "best",
         "mcpy_med", "mcpy_min", "GB/s", "best", "ratio");
  printf("%-5s %-11s %6s %7s %6s %6s %9s %7s %9s %5s | %9s %9s %7s %7s | %9s %9s %7s %7s | %6s\n", "", "", "",
         "src/dst", "", "bytes", "moved", "", "", "", "ms", "ms", "med", "GB/s", "ms", "ms", "med", "GB/s", "");
  for (int i = 0; i < n; i++) {
    const row_t *r = &rows[i];
    const double bytes = (double)r->c.tokens * r->c.layers * (double)r->c.entry_bytes;
    char page[24];
    snprintf(page, sizeof page, "%d/%d", r->c.src_page, r->c.dst_page);
    printf("%-5s %-11s %6lld %7s %6d %6lld %9.2f %7lld %9.1f %5d | ", r->c.shape,
           r->c.shuffled ? "shuffled" : "consecutive", (long long)r->c.tokens, page, r->c.layers,
           (long long)r->c.entry_bytes, bytes / 1e6, (long long)r->copies,
           r->copies ? bytes / (double)r->copies / 1024.0 : 0.0, r->c.pairs);
    if (!r->ok) {
      printf("FAILED\n");
      continue;
    }
    printf("%9.3f %9.3f %7.2f %7.2f | %9.3f %9.3f %7.2f %7.2f | %6.3f\n", r->ucx.median_ms, r->ucx.min_ms,
           bytes / (r->ucx.median_ms * 1e-3) / 1e9, bytes / (r->ucx.min_ms * 1e-3) / 1e9, r->mem.median_ms,
           r->mem.min_ms, bytes / (r->mem.median_ms * 1e-3) / 1e9, bytes / (r->mem.min_ms * 1e-3) / 1e9,
           r->mem.median_ms / r->ucx.median_ms);
  }
  if (o->device) {
    printf("\nDevice caches on device %d: %s.\n"
           "hoff = one hand-off: prefill copy-out + puts + flush, then the decode's copy-in + device sync (the\n"
           "socket round trip included); put = its prefill part; cpyin = the decode's own copy-in time; ceil = one\n"
           "cudaMemcpy D2H + one H2D of the bytes (pageable host memory); /host = hand-off GB/s / the host caches'\n"
           "UCX GB/s above; /ceil = hand-off GB/s / ceil GB/s (medians)\n",
           DEVICE, g_device_path[0] ? g_device_path : "no device case ran");
    printf("%-5s %-11s %6s %9s | %9s %9s %7s %7s | %9s %9s | %9s %7s | %6s %6s\n", "shape", "pages", "N", "MB",
           "hoff_med", "hoff_min", "GB/s", "best", "put_med", "cpyin_med", "ceil_med", "ceil", "/host", "/ceil");
    printf("%-5s %-11s %6s %9s | %9s %9s %7s %7s | %9s %9s | %9s %7s | %6s %6s\n", "", "", "", "moved", "ms", "ms",
           "med", "GB/s", "ms", "ms", "ms", "GB/s", "", "");
    for (int i = 0; i < n; i++) {
      const row_t *r = &rows[i];
      const double bytes = (double)r->c.tokens * r->c.layers * (double)r->c.entry_bytes;
      printf("%-5s %-11s %6lld %9.2f | ", r->c.shape, r->c.shuffled ? "shuffled" : "consecutive",
             (long long)r->c.tokens, bytes / 1e6);
      if (!r->dev_ok) {
        printf("FAILED\n");
        continue;
      }
      const double gbs = bytes / (r->dev.median_ms * 1e-3) / 1e9;
      const double ceil_gbs = bytes / (r->ceiling.median_ms * 1e-3) / 1e9;
      printf("%9.3f %9.3f %7.2f %7.2f | %9.3f %9.3f | %9.3f %7.2f | %6.3f %6.3f\n", r->dev.median_ms, r->dev.min_ms, gbs,
             bytes / (r->dev.min_ms * 1e-3) / 1e9, r->dev_put.median_ms, r->dev_in.median_ms, r->ceiling.median_ms,
             ceil_gbs, r->ucx.median_ms / r->dev.median_ms, gbs / ceil_gbs);
    }
  }
  printf("\n");
  ina_bench_print_json("bench_kv_transfer");
  if (ina_bench_checks_failed() > 0) {
    fprintf(stderr, "bench_kv_transfer: %d of %d checks failed\n", ina_bench_checks_failed(), ina_bench_checks_run());
    exit_code = 1;
  }
  return exit_code;
}

int main(int argc, char **argv) {
  options_t o;
  if (!parse_options(argc, argv, &o)) {
    usage(stderr, argv[0]);
    return 2;
  }
#ifndef INA_HAVE_CUDA
  if (o.device) {
    printf("%s: --device needs a CUDA build (this one was configured without CUDA), skipped\n", argv[0]);
    return INA_BENCH_SKIP;
  }
#endif
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    perror("socketpair");
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return 1;
  }
  if (pid == 0) { /* decode */
    close(sv[0]);
    const int rc = decode_main(sv[1]);
    close(sv[1]);
    _exit(rc);
  }
  close(sv[1]);
  int rc = prefill_main(sv[0], &o, argc, argv);
  send_msg(sv[0], MSG_QUIT, 0, 0, NULL, 0, NULL);
  close(sv[0]);
  int wstatus = 0;
  if (waitpid(pid, &wstatus, 0) != pid || !WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    fprintf(stderr, "bench_kv_transfer: the decode process failed (status 0x%x)\n", wstatus);
    rc = 1;
  }
  fflush(stdout);
  return rc;
}
