/* Soak test of an in-process agent (tiny model, CPU, 127.0.0.1:0): 64 client threads run
 * Generate streams back to back for a bounded time against a KV pool far too small for
 * them all, so the scheduler queues and preempts all along. Prompts come from a small
 * pool of random prompts whose greedy tokens were computed once with ina_generate on a
 * separate engine; lengths, stream intervals and eos handling are random. About 1 stream
 * in 8 is cancelled by its client mid-stream, 1 in 16 through Cancel from another thread.
 *
 * Checked, per stream: no unexpected RPC error, at most one final message and nothing
 * after it, exactly one final message unless the client cancelled, the tokens a prefix
 * of the reference (all of it when not cancelled). Per round: every thread finishes
 * within the soak time plus a margin (every call has a deadline), the pool was actually
 * exhausted (requests queued, pages nearly all used), and afterwards GetLoad shows the
 * KV pages back at the baseline with nothing running or queued. Across two identical
 * rounds: resident memory and live heap do not grow beyond fixed bounds; under ASan,
 * LeakSanitizer checks at exit that nothing leaked.
 *
 * INA_SOAK_SECONDS (default 1.5) sets the length of each of the two rounds. */
#include <unistd.h>

#include "tests/test_util.h"
#include "tests/agent/daemon/agent_test_util.h"

#if defined(__SANITIZE_ADDRESS__)
/* From the sanitizer runtime's allocator interface (its header is not always installed). */
size_t __sanitizer_get_current_allocated_bytes(void);
#define SOAK_ASAN 1
#else
#include <malloc.h>
#define SOAK_ASAN 0
#endif

#define NUM_THREADS 64
#define NUM_CLIENTS 4 /* gRPC channels the stream threads share */
/* 24 pages of 16 tokens. A stream needs up to MAX_PROMPT + MAX_NEW = 32 tokens (2
 * pages), 64 of them about 100 pages: the pool runs out, requests queue, and running
 * ones that cannot grow preempt the youngest. Streams are short so that each thread
 * runs several per round even under ASan on 2 cores (some 500 tokens/s there). */
#define KV_TOKENS 384
#define NUM_PROMPTS 8
#define MAX_PROMPT 16
#define MAX_NEW 16
/* Deadline of a stream. In a healthy run a stream waits at most for the backlog ahead
 * of it, 64 streams of at most 32 tokens: about 2 s under ASan on 2 cores, which other
 * work on the machine can stretch severalfold (seen: past 4 s). */
#define STREAM_DEADLINE_MS 10000
/* Time allowed after the soak time for the threads to end: a stream started just before
 * the end runs at most until its deadline, so a hung one surfaces as DEADLINE_EXCEEDED
 * before the wait gives up. */
#define MARGIN_SECONDS (STREAM_DEADLINE_MS / 1000.0 + 1.0)
/* Growth allowed from the end of round 1 to the end of round 2, which does the same
 * work: round 1 brings the allocator arenas, gRPC's per-thread caches and the threads'
 * stacks to their steady size. The live heap (bytes allocated and not freed) is exact:
 * what grows there is kept by the process (measured: +50 KiB, the same for any round
 * length). 1 MiB fails a leak of 1 KiB per stream over the ~1000 streams of a default
 * round of the plain build (~100 under ASan). Resident memory adds page-granular
 * fragmentation and the allocator's free lists, hence 16 MiB; under ASan freed blocks
 * also sit in the quarantine, resident but not live, until it is full, so its size (set
 * small below, from the default 256 MiB) is added there. LeakSanitizer checks at exit
 * that nothing became unreachable. */
#define HEAP_GROWTH_BOUND (1u << 20)
#define RSS_GROWTH_BOUND (16u << 20)
#define ASAN_QUARANTINE_MB 16
#define SOAK_STR_(x) #x
#define SOAK_STR(x) SOAK_STR_(x)

#if SOAK_ASAN
/* Read by the ASan runtime at start; ASAN_OPTIONS in the environment overrides it. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "quarantine_size_mb=" SOAK_STR(ASAN_QUARANTINE_MB); }
#define ASAN_QUARANTINE_BYTES ((size_t)ASAN_QUARANTINE_MB << 20)
#else
#define ASAN_QUARANTINE_BYTES ((size_t)0)
#endif

/* ---- the reference ------------------------------------------------------------------ */

typedef struct prompt_ref {
  int32_t prompt[MAX_PROMPT];
  int32_t len;
  int32_t tokens[MAX_NEW]; /* greedy, ignoring eos */
} prompt_ref_t;

static prompt_ref_t g_prompts[NUM_PROMPTS];
static int32_t g_eos = -1;

static void make_references(at_reference_t *ref, test_rng_t *rng) {
  for (int p = 0; p < NUM_PROMPTS; p++) {
    prompt_ref_t *r = &g_prompts[p];
    /* Edge cases: a one-token prompt and one filling exactly one page. */
    r->len = p == 0 ? 1 : p == 1 ? 16 : (int32_t)test_rng_int(rng, 2, MAX_PROMPT);
    for (int32_t i = 0; i < r->len; i++) r->prompt[i] = (int32_t)test_rng_int(rng, 0, 1023);
    int32_t n = at_reference_run(ref, r->prompt, r->len, MAX_NEW, 1, r->tokens);
    CHECKF(n == MAX_NEW, "reference of prompt %d: %d tokens", p, n);
  }
  g_eos = ina_model_config(ref->model)->eos_token_id;
}

/* The tokens a complete stream must deliver: the reference cut at max_new and, unless
 * eos is ignored, after the first eos. */
static int32_t expected_tokens(const prompt_ref_t *r, int32_t max_new, int ignore_eos) {
  if (!ignore_eos && g_eos >= 0)
    for (int32_t i = 0; i < max_new; i++)
      if (r->tokens[i] == g_eos) return i + 1;
  return max_new;
}

/* ---- stream threads ----------------------------------------------------------------- */

typedef enum { MODE_PLAIN, MODE_CLIENT_CANCEL, MODE_ID_CANCEL } stream_mode_t;

/* What the Cancel thread needs of a stream thread's current stream, under `lock`. */
typedef struct cancel_slot {
  pthread_mutex_t lock;
  int armed;              /* cancel `id` once `stream` has `at_tokens` tokens */
  char id[64];
  int at_tokens;
  const at_stream_t *stream;
} cancel_slot_t;

typedef struct worker {
  int index, round;
  ina_rpc_client_t *client;
  cancel_slot_t *slot;
  double end_s;
  test_rng_t rng;
  at_stream_t stream;
  atomic_int done;
  /* Results, read by the main thread once done. */
  int streams[3];         /* by mode */
  int cancelled_ends;     /* streams that ended cancelled (either way) */
  long long tokens;
  int failures;
} worker_t;

static void fail(worker_t *w, const char *what, const at_stream_t *s) {
  if (w->failures++ < 3)
    fprintf(stderr, "worker %d: stream %s: %s (call %s '%s', %d tokens, %d finals, %d bad, %d after final)\n",
            w->index, s->request_id, what, ina_rpc_code_name(s->status.code), s->status.message,
            atomic_load(&s->num_tokens), s->finals, s->bad, s->after_final);
}

/* Checks one finished stream against the reference. */
static void check_stream(worker_t *w, stream_mode_t mode, const prompt_ref_t *r, int32_t max_new,
                         int ignore_eos) {
  const at_stream_t *s = &w->stream;
  int32_t full = expected_tokens(r, max_new, ignore_eos);
  int32_t n = atomic_load(&s->num_tokens);
  if (s->bad || s->after_final) return fail(w, "malformed responses", s);
  if (n > full || !at_same_tokens(s, r->tokens, n)) return fail(w, "tokens differ from ina_generate", s);
  int complete = s->st == INA_OK && s->status.code == INA_RPC_OK && s->finals == 1;
  int client_cancelled = s->status.code == INA_RPC_CANCELLED && s->finals <= 1;
  int server_cancelled = complete && s->finish == INA__V1__FINISH_REASON__FINISH_REASON_CANCELLED;
  if (complete && s->prompt_tokens != (uint32_t)r->len) return fail(w, "wrong prompt_tokens", s);
  if (complete && s->completion_tokens != (uint32_t)n) return fail(w, "wrong completion_tokens", s);
  if (server_cancelled) {
    if (mode != MODE_ID_CANCEL) return fail(w, "cancelled without a Cancel call", s);
  } else if (complete) {
    Ina__V1__FinishReason want = n == max_new && (ignore_eos || r->tokens[n - 1] != g_eos)
                                     ? INA__V1__FINISH_REASON__FINISH_REASON_LENGTH
                                     : INA__V1__FINISH_REASON__FINISH_REASON_STOP;
    if (n != full || s->finish != want) return fail(w, "incomplete or wrong finish reason", s);
  } else if (!(client_cancelled && mode == MODE_CLIENT_CANCEL)) {
    return fail(w, "unexpected call status", s);
  }
  w->cancelled_ends += server_cancelled || client_cancelled;
  w->tokens += n;
}

/* One Generate stream of the worker's, with the deadline; the Cancel slot is armed once
 * the stream is reset, so the Cancel thread never reads it half-written. */
static void run_one(worker_t *w, int seq) {
  test_rng_t *rng = &w->rng;
  /* 1 in 16 cancelled by id, 2 in 16 by the client: rotating over the threads and their
   * streams, so that every round has its share even when each thread runs few. */
  int kind = (w->index + 7 * seq) % 16;
  stream_mode_t mode = kind == 0 ? MODE_ID_CANCEL : kind <= 2 ? MODE_CLIENT_CANCEL : MODE_PLAIN;
  const prompt_ref_t *r = &g_prompts[test_rng_int(rng, 0, NUM_PROMPTS - 1)];
  int32_t max_new = (int32_t)test_rng_int(rng, mode == MODE_CLIENT_CANCEL ? 2 : 1, MAX_NEW);
  int ignore_eos = test_rng_int(rng, 0, 3) != 0;
  static const uint32_t intervals[4] = {0, 1, 2, 5};
  uint32_t interval = intervals[test_rng_int(rng, 0, 3)];

  at_stream_t *s = &w->stream;
  memset(s, 0, sizeof *s);
  snprintf(s->request_id, sizeof s->request_id, "soak-r%d-w%d-s%d", w->round, w->index, seq);
  if (mode == MODE_CLIENT_CANCEL) s->cancel_after = (int)test_rng_int(rng, 1, max_new - 1);
  if (mode == MODE_ID_CANCEL) {
    pthread_mutex_lock(&w->slot->lock);
    snprintf(w->slot->id, sizeof w->slot->id, "%s", s->request_id);
    w->slot->at_tokens = (int)test_rng_int(rng, 0, max_new - 1); /* 0: maybe still queued */
    w->slot->stream = s;
    w->slot->armed = 1;
    pthread_mutex_unlock(&w->slot->lock);
  }
  at_request_t req = {s->request_id, r->prompt, r->len, (uint32_t)max_new, ignore_eos, interval};
  uint8_t *bytes = NULL;
  size_t size = 0;
  at_pack_request(&req, &bytes, &size);
  s->st = ina_rpc_client_stream(w->client, AT_GENERATE, bytes, size, STREAM_DEADLINE_MS, at_stream_message, s,
                                &s->status);
  free(bytes);
  if (mode == MODE_ID_CANCEL) {
    pthread_mutex_lock(&w->slot->lock);
    w->slot->armed = 0;
    pthread_mutex_unlock(&w->slot->lock);
  }
  w->streams[mode]++;
  check_stream(w, mode, r, max_new, ignore_eos);
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  for (int seq = 0; test_now_s() < w->end_s; seq++) run_one(w, seq);
  atomic_store(&w->done, 1);
  return NULL;
}

/* ---- the Cancel thread and the load monitor ------------------------------------------ */

typedef struct control {
  ina_rpc_client_t *client;
  cancel_slot_t *slots;
  atomic_int stop;
  int cancel_calls, cancel_hits, cancel_errors;
  uint32_t peak_queued;
  uint64_t peak_pages;
  int load_errors;
} control_t;

static void *cancel_main(void *arg) {
  control_t *c = arg;
  while (!atomic_load(&c->stop)) {
    for (int i = 0; i < NUM_THREADS; i++) {
      cancel_slot_t *slot = &c->slots[i];
      char id[64] = "";
      pthread_mutex_lock(&slot->lock);
      if (slot->armed && atomic_load(&slot->stream->num_tokens) >= slot->at_tokens) {
        snprintf(id, sizeof id, "%s", slot->id);
        slot->armed = 0;
      }
      pthread_mutex_unlock(&slot->lock);
      if (!id[0]) continue;
      int cancelled = -1;
      c->cancel_calls++;
      if (at_cancel(c->client, id, &cancelled) != INA_RPC_OK || cancelled < 0) c->cancel_errors++;
      c->cancel_hits += cancelled == 1;
    }
    at_sleep_ms(1);
  }
  return NULL;
}

static void *monitor_main(void *arg) {
  control_t *c = arg;
  while (!atomic_load(&c->stop)) {
    Ina__V1__NodeLoad l;
    if (at_load(c->client, &l) != 0) {
      c->load_errors++;
    } else {
      if (l.queued_requests > c->peak_queued) c->peak_queued = l.queued_requests;
      if (l.kv_pages_used > c->peak_pages) c->peak_pages = l.kv_pages_used;
    }
    at_sleep_ms(25);
  }
  return NULL;
}

/* ---- memory ------------------------------------------------------------------------- */

static size_t resident_bytes(void) {
  unsigned long size = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  if (fscanf(f, "%lu %lu", &size, &resident) != 2) resident = 0;
  fclose(f);
  return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

/* Heap bytes allocated and not freed (ASan: blocks in the quarantine count as freed). */
static size_t live_heap_bytes(void) {
#if SOAK_ASAN
  return __sanitizer_get_current_allocated_bytes();
#else
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
#endif
}

/* ---- one round ---------------------------------------------------------------------- */

static worker_t g_workers[NUM_THREADS];
static cancel_slot_t g_slots[NUM_THREADS];

static void soak_round(int round, double seconds, uint64_t seed, ina_rpc_client_t **clients,
                       ina_rpc_client_t *control_client, uint64_t baseline_pages) {
  control_t ctl;
  memset(&ctl, 0, sizeof ctl);
  ctl.client = control_client;
  ctl.slots = g_slots;
  pthread_t canceller, monitor, threads[NUM_THREADS];
  CHECK(pthread_create(&canceller, NULL, cancel_main, &ctl) == 0);
  CHECK(pthread_create(&monitor, NULL, monitor_main, &ctl) == 0);
  double t0 = test_now_s();
  for (int i = 0; i < NUM_THREADS; i++) {
    worker_t *w = &g_workers[i];
    memset(w, 0, sizeof *w);
    w->index = i;
    w->round = round;
    w->client = clients[i % NUM_CLIENTS];
    w->slot = &g_slots[i];
    w->end_s = t0 + seconds;
    w->rng.s = seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(i + 1)); /* the same work each round */
    CHECK(pthread_create(&threads[i], NULL, worker_main, w) == 0);
  }

  /* Bounded wait: a thread stuck past the margin fails the test instead of hanging it. */
  int all_done = 0;
  while (!all_done && test_now_s() < t0 + seconds + MARGIN_SECONDS) {
    all_done = 1;
    for (int i = 0; i < NUM_THREADS; i++) all_done &= atomic_load(&g_workers[i].done);
    if (!all_done) at_sleep_ms(5);
  }
  double elapsed = test_now_s() - t0;
  CHECKF(all_done, "round %d: threads still running %.1f s after a %.1f s soak", round, elapsed - seconds, seconds);
  if (!all_done) {
    test_finish("test_agent_soak");
    _exit(1);
  }
  for (int i = 0; i < NUM_THREADS; i++) pthread_join(threads[i], NULL);
  atomic_store(&ctl.stop, 1);
  pthread_join(canceller, NULL);
  pthread_join(monitor, NULL);

  int streams[3] = {0, 0, 0}, cancelled = 0, failures = 0;
  long long tokens = 0;
  for (int i = 0; i < NUM_THREADS; i++) {
    for (int m = 0; m < 3; m++) streams[m] += g_workers[i].streams[m];
    cancelled += g_workers[i].cancelled_ends;
    failures += g_workers[i].failures;
    tokens += g_workers[i].tokens;
  }
  int total = streams[0] + streams[1] + streams[2];
  printf("round %d: %.2f s, %d streams (%d plain, %d client-cancelled, %d Cancel), %lld tokens, %d ended "
         "cancelled; Cancel %d calls, %d hits; peak %u queued, %llu/%d pages\n",
         round, elapsed, total, streams[0], streams[1], streams[2], tokens, cancelled, ctl.cancel_calls,
         ctl.cancel_hits, ctl.peak_queued, (unsigned long long)ctl.peak_pages, KV_TOKENS / 16);
  CHECKF(failures == 0, "round %d: %d streams failed their checks", round, failures);
  CHECK(ctl.cancel_errors == 0 && ctl.load_errors == 0);
  /* Every thread ran at least one stream and the mix reached each kind. */
  CHECKF(total >= NUM_THREADS && streams[1] > 0 && streams[2] > 0 && cancelled > 0, "round %d: %d streams", round,
         total);
  /* The pool was exhausted: requests waited and pages ran (nearly) out. */
  CHECKF(ctl.peak_queued > 0 && ctl.peak_pages >= KV_TOKENS / 16 * 3 / 4, "round %d: peak %u queued, %llu pages",
         round, ctl.peak_queued, (unsigned long long)ctl.peak_pages);

  /* Everything returned: no request left, pages back at the baseline. */
  CHECKF(at_wait_pages(control_client, baseline_pages, 3000), "round %d: KV pages or requests left over", round);
  Ina__V1__NodeLoad l;
  CHECK(at_load(control_client, &l) == 0 && l.kv_pages_used == baseline_pages && l.running_requests == 0 &&
        l.queued_requests == 0 && l.kv_pages_used + l.kv_pages_free == KV_TOKENS / 16);
}

static double soak_seconds(void) {
  const char *env = getenv("INA_SOAK_SECONDS");
  double s = env ? strtod(env, NULL) : 1.5;
  return s > 0 ? s : 1.5;
}

int main(void) {
  test_rng_t rng = {test_seed("test_agent_soak")};
  ina_log_set_quiet_errors(1);
  for (int i = 0; i < NUM_THREADS; i++) pthread_mutex_init(&g_slots[i].lock, NULL);
  uint64_t model_seed = test_rng_next(&rng);
  ina_agent_options_t o = at_options(model_seed, KV_TOKENS);
  ina_agent_t *agent = NULL;
  CHECK_OK(ina_agent_create(&o, &agent));
  if (!agent) return test_finish("test_agent_soak");

  /* The references while the agent warms up. */
  double t0 = test_now_s();
  at_reference_t ref;
  at_reference_open(&ref, model_seed);
  make_references(&ref, &rng);
  at_reference_close(&ref);
  printf("references of %d prompts: %.2f s\n", NUM_PROMPTS, test_now_s() - t0);
  CHECK_OK(ina_agent_wait_serving(agent, 30000));

  ina_rpc_client_t *clients[NUM_CLIENTS];
  for (int i = 0; i < NUM_CLIENTS; i++) clients[i] = at_client(ina_agent_port(agent), NULL);
  ina_rpc_client_t *control = at_client(ina_agent_port(agent), NULL);
  Ina__V1__NodeLoad l;
  CHECK(at_load(control, &l) == 0);
  uint64_t baseline = l.kv_pages_used;
  CHECK(baseline == 0); /* no prefix cache */

  double seconds = soak_seconds();
  uint64_t round_seed = test_rng_next(&rng);
  soak_round(1, seconds, round_seed, clients, control, baseline);
  size_t rss1 = resident_bytes(), heap1 = live_heap_bytes();
  soak_round(2, seconds, round_seed, clients, control, baseline);
  size_t rss2 = resident_bytes(), heap2 = live_heap_bytes();
  double mib = 1.0 / (1 << 20);
  printf("after round 1: RSS %.1f MiB, live heap %.2f MiB; after round 2: RSS %.1f MiB (%+.2f), live heap %.2f MiB "
         "(%+.3f)\n",
         rss1 * mib, heap1 * mib, rss2 * mib, ((double)rss2 - (double)rss1) * mib, heap2 * mib,
         ((double)heap2 - (double)heap1) * mib);
  CHECK(rss1 > 0 && rss2 > 0);
  size_t rss_bound = RSS_GROWTH_BOUND + ASAN_QUARANTINE_BYTES;
  CHECKF(rss2 <= rss1 + rss_bound, "RSS grew by %.1f MiB", ((double)rss2 - (double)rss1) * mib);
  CHECKF(heap2 <= heap1 + HEAP_GROWTH_BOUND, "live heap grew by %.3f MiB", ((double)heap2 - (double)heap1) * mib);

  ina_agent_request_stop(agent);
  CHECK_OK(ina_agent_wait(agent));
  for (int i = 0; i < NUM_CLIENTS; i++) ina_rpc_client_destroy(clients[i]);
  ina_rpc_client_destroy(control);
  ina_agent_destroy(agent);
  for (int i = 0; i < NUM_THREADS; i++) pthread_mutex_destroy(&g_slots[i].lock);
  return test_finish("test_agent_soak");
}
