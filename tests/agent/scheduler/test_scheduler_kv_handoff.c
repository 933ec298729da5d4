/* The scheduler's KV hand-off (ina_kv_pages_t, kv_export / kv_import,
 * ina_scheduler_import_done, ina_scheduler_release_pages), between a prefill scheduler
 * and a decode scheduler over two CPU engines of the tiny model in one process, the
 * transfer being memcpy through kvcache/kv_copy.h:
 *   - 32 requests of mixed prompt lengths (1 to several pages, some sharing a prefix, so
 *     that the decode side's prefix cache holds part of later prompts), greedy and
 *     seeded sampling, some with logprobs: every token and logprob the decode side
 *     streams equals a plain scheduler's over the same requests ("both"), for page sizes
 *     (prefill, decode) = (16, 16), (1, 16), (16, 1), (3, 16);
 *   - a later request with a shared prefix imports only the tokens past the decode
 *     side's cached pages (the copy skips the cached ones: wrong bookkeeping would show
 *     as different tokens);
 *   - faults: a failed import finishes the request with the transfer's error; a cancel
 *     while importing finishes it cancelled and its result is refused afterwards; a
 *     result twice, or for a request not importing, is refused; an importing request
 *     is never preempted; after everything (prefix caches flushed) both pools are whole
 *     and no page reference is lent. */
#include "core/log.h"
#include "tests/test_util.h"

#include "kvcache/kv_copy.h"
#include "tests/agent/scheduler/sched_test_util.h"

#define N 32
#define MAX_PROMPT 80 /* random prompts; the arrays hold a longer one too */
#define PROMPT_CAP 160
#define MAX_NEW 12

typedef struct hcase {
  char id[32];
  int32_t prompt[PROMPT_CAP];
  int32_t prompt_len, max_new, logprobs;
  ina_sampling_params_t sampling;
  sched_collector_t both, decode, prefill;
  float lp_both[MAX_NEW], lp_decode[MAX_NEW];
  int32_t top_both[MAX_NEW], top_decode[MAX_NEW]; /* the first alternative's id */
  float prefill_logprob;
  int32_t prefill_num_top, prefill_top_ids[INA_REQUEST_MAX_LOGPROBS];
  float prefill_top_lps[INA_REQUEST_MAX_LOGPROBS];
  /* The decode side's pages for the prompt, and what the import must write. */
  int32_t dst_pages[PROMPT_CAP];
  int64_t first_token, imported_from_min;
  int64_t sent;      /* prompt tokens copied so far, in every layer */
  int64_t partial_to; /* and of [sent, partial_to), layers [0, partial_layers) */
  int32_t partial_layers;
  int32_t layer_reports; /* exports with fewer than every layer (from inside a step) */
  int import_pending; /* kv_import called, prefill not submitted yet */
  int done;
} hcase_t;

typedef struct world {
  ina_engine_t *pe, *de;
  ina_scheduler_t *ps, *ds;
  ina_kv_layout_t pl, dl;
  uint8_t *pbase, *dbase;
  int64_t copies;
  int fail_next_import; /* fault: the next import fails instead */
} world_t;

static world_t W;
static int32_t g_vocab;


static ina_kv_layout_t layout_of(ina_engine_t *e, uint8_t **base) {
  ina_page_pool_t *pool = ina_engine_page_pool(e);
  ina_tensor_t t = ina_page_pool_layer(pool, 0);
  *base = t.data;
  return (ina_kv_layout_t){ina_page_pool_page_size(pool), ina_page_pool_num_pages(pool),
                           ina_page_pool_num_layers(pool),
                           (int64_t)ina_page_pool_entry_elems(pool) * (int64_t)ina_dtype_size(ina_page_pool_dtype(pool))};
}

/* Prefill side: tokens [0, kv->num_tokens) are final in layers [0, kv->num_layers);
 * copy what the decode side lacks, layer by layer as the agent's link does. */
static void on_export(const ina_kv_pages_t *kv, void *user) {
  hcase_t *c = user;
  const int64_t from = c->sent > c->first_token ? c->sent : c->first_token;
  if (kv->num_tokens != c->partial_to) {
    c->partial_to = kv->num_tokens;
    c->partial_layers = 0;
  }
  c->layer_reports += kv->num_layers < W.pl.num_layers;
  if (kv->num_tokens > from && kv->num_layers > c->partial_layers) {
    ina_kv_copy_t plan[4096];
    int64_t n = 0;
    CHECK_OK(ina_kv_copy_plan(&W.pl, kv->pages, &W.dl, c->dst_pages, from, kv->num_tokens, c->partial_layers,
                              kv->num_layers, plan, 4096, &n));
    for (int64_t i = 0; i < n; i++) memcpy(W.dbase + plan[i].dst_offset, W.pbase + plan[i].src_offset, plan[i].bytes);
    W.copies += n;
    c->partial_layers = kv->num_layers;
  }
  if (kv->num_layers == W.pl.num_layers) {
    c->sent = kv->num_tokens > c->sent ? kv->num_tokens : c->sent;
    c->partial_to = 0;
    c->partial_layers = 0;
  }
  CHECK_OK(ina_scheduler_release_pages(W.ps, kv->pages, kv->num_pages));
}

/* Decode side: pages for the prompt are taken; the prefill runs next (test loop). */
static void on_import(const ina_kv_pages_t *kv, void *user) {
  hcase_t *c = user;
  CHECK(kv->num_tokens == c->prompt_len && kv->first_token < kv->num_tokens && kv->first_token % kv->page_size == 0);
  CHECK(kv->num_pages == (c->prompt_len + kv->page_size - 1) / kv->page_size);
  memcpy(c->dst_pages, kv->pages, (size_t)kv->num_pages * sizeof *kv->pages);
  c->first_token = kv->first_token;
  if (kv->first_token < c->imported_from_min) c->imported_from_min = kv->first_token;
  c->import_pending = 1; /* the references are given back when the import ends (below) */
}

static void on_prefill_event(const ina_request_event_t *ev, void *user) {
  hcase_t *c = user;
  sched_collect(ev, &c->prefill);
  if (ev->finish == INA_FINISH_NONE) {
    c->prefill_logprob = ev->logprob;
    c->prefill_num_top = ev->num_top;
    memcpy(c->prefill_top_ids, ev->top_ids, (size_t)ev->num_top * sizeof(int32_t));
    memcpy(c->prefill_top_lps, ev->top_logprobs, (size_t)ev->num_top * sizeof(float));
    return;
  }
  /* The prefill is over: its first token goes to the decode side with the entries. */
  ina_kv_import_result_t res = {INA_OK, NULL, c->prefill.num_tokens > 0 ? c->prefill.tokens[0] : -1,
                                c->prefill_logprob, c->prefill_num_top, c->prefill_top_ids, c->prefill_top_lps};
  if (ev->finish != INA_FINISH_LENGTH || c->sent < c->prompt_len || W.fail_next_import) {
    res.status = INA_ERR_IO;
    res.error = W.fail_next_import ? "injected: the prefill agent went away" : "the prefill did not finish";
    W.fail_next_import = 0;
  }
  CHECK_OK(ina_scheduler_import_done(W.ds, c->id, &res));
  const int32_t n = (c->prompt_len + W.dl.page_size - 1) / W.dl.page_size;
  CHECK_OK(ina_scheduler_release_pages(W.ds, c->dst_pages, n));
}

/* Records each event's logprob and first alternative beside the collector. */
static void record(const ina_request_event_t *ev, sched_collector_t *col, float *lp, int32_t *top) {
  if (ev->finish == INA_FINISH_NONE && col->num_tokens < MAX_NEW) {
    lp[col->num_tokens] = ev->logprob;
    top[col->num_tokens] = ev->num_top > 0 ? ev->top_ids[0] : -1;
  }
  sched_collect(ev, col);
}
static void on_both(const ina_request_event_t *ev, void *user) {
  hcase_t *c = user;
  record(ev, &c->both, c->lp_both, c->top_both);
}
static void on_decode(const ina_request_event_t *ev, void *user) {
  hcase_t *c = user;
  record(ev, &c->decode, c->lp_decode, c->top_decode);
}

static ina_request_t base_request(hcase_t *c, sched_collector_t *col, ina_request_callback_t cb) {
  ina_request_t r = sched_test_request(col, c->prompt, c->prompt_len, c->max_new);
  r.sampling = c->sampling;
  r.ignore_eos = 1;
  r.logprobs = c->logprobs;
  r.callback = cb;
  r.user_data = c;
  return r;
}

/* Submit the prefill of every case whose import is waiting. */
static void start_prefills(hcase_t *cases) {
  for (int i = 0; i < N; i++) {
    hcase_t *c = &cases[i];
    if (!c->import_pending) continue;
    c->import_pending = 0;
    c->sent = c->partial_to = 0;
    c->partial_layers = 0;
    ina_request_t r = base_request(c, &c->prefill, on_prefill_event);
    r.max_new_tokens = 1;
    r.kv_export = on_export;
    r.kv_user_data = c;
    CHECK_OK(ina_scheduler_submit(W.ps, &r));
  }
}

/* Steps both sides until neither has work. */
static void drive(hcase_t *cases) {
  for (int64_t steps = 0; steps < 20000; steps++) {
    ina_scheduler_stats_t a, b;
    ina_scheduler_stats(W.ps, &a);
    ina_scheduler_stats(W.ds, &b);
    if (a.waiting + a.running + b.waiting + b.running == 0) return;
    sched_test_current_step++;
    CHECK_OK(ina_scheduler_step(W.ds, NULL));
    start_prefills(cases);
    CHECK_OK(ina_scheduler_step(W.ps, NULL));
  }
  CHECK(!"the hand-off did not drain");
}

static void check_pools_whole(const char *when) {
  ina_scheduler_stats_t a, b;
  CHECK_OK(ina_scheduler_flush_prefix_cache(W.ps));
  CHECK_OK(ina_scheduler_flush_prefix_cache(W.ds));
  sched_test_current_step++;
  CHECK_OK(ina_scheduler_step(W.ps, NULL)); /* drops the references given back */
  CHECK_OK(ina_scheduler_step(W.ds, NULL));
  ina_scheduler_stats(W.ps, &a);
  ina_scheduler_stats(W.ds, &b);
  CHECKF(a.kv_pages_free == a.kv_pages_total && a.kv_pages_lent == 0, "%s: prefill pool %d of %d free, %d lent", when,
         a.kv_pages_free, a.kv_pages_total, a.kv_pages_lent);
  CHECKF(b.kv_pages_free == b.kv_pages_total && b.kv_pages_lent == 0 && b.importing == 0,
         "%s: decode pool %d of %d free, %d lent, %d importing", when, b.kv_pages_free, b.kv_pages_total,
         b.kv_pages_lent, b.importing);
}

static void make_cases(hcase_t *cases, test_rng_t *rng) {
  int32_t shared[MAX_PROMPT];
  for (int j = 0; j < MAX_PROMPT; j++) shared[j] = (int32_t)test_rng_int(rng, 0, g_vocab - 1);
  for (int i = 0; i < N; i++) {
    hcase_t *c = &cases[i];
    memset(c, 0, sizeof *c);
    snprintf(c->id, sizeof c->id, "req-%d", i);
    /* A third share the first 40 tokens: the later ones find them cached on the decode side. */
    const int share = i % 3 == 1;
    c->prompt_len = i % 8 == 0 ? 1 : (int32_t)test_rng_int(rng, share ? 42 : 2, MAX_PROMPT);
    for (int j = 0; j < c->prompt_len; j++)
      c->prompt[j] = share && j < 40 ? shared[j] : (int32_t)test_rng_int(rng, 0, g_vocab - 1);
    c->max_new = (int32_t)test_rng_int(rng, 1, MAX_NEW);
    c->sampling = (ina_sampling_params_t)INA_SAMPLING_PARAMS_INIT;
    if (i % 2 == 1) {
      c->sampling.temperature = 0.8f;
      c->sampling.top_p = 0.9f;
      c->sampling.seed = 1000 + (uint64_t)i;
    }
    c->logprobs = i % 4 == 2 ? 3 : -1;
    c->imported_from_min = 1 << 30;
  }
}

static void run_pair(int32_t pps, int32_t dps, uint64_t seed, ina_model_t *m) {
  printf("page sizes: prefill %d, decode %d\n", pps, dps);
  hcase_t *cases = calloc(N, sizeof *cases);
  test_rng_t rng = {seed};
  make_cases(cases, &rng);
  for (int i = 0; i < N; i++) {
    sched_collector_init(&cases[i].both, cases[i].id);
    sched_collector_init(&cases[i].decode, cases[i].id);
    sched_collector_init(&cases[i].prefill, cases[i].id);
  }
  /* "both": one plain scheduler with the decode side's page size. */
  ina_engine_t *be = sched_test_engine(m, dps, 4096 / dps);
  ina_scheduler_t *bs = NULL;
  ina_scheduler_config_t cfg = INA_SCHEDULER_CONFIG_INIT;
  cfg.max_batch_tokens = 48; /* chunked prefill on every side */
  CHECK_OK(ina_scheduler_create(be, &cfg, &bs));
  for (int i = 0; i < N; i++) {
    ina_request_t r = base_request(&cases[i], &cases[i].both, on_both);
    CHECK_OK(ina_scheduler_submit(bs, &r));
  }
  sched_test_drain(bs, 20000);
  ina_scheduler_destroy(bs);
  ina_engine_destroy(be);

  W = (world_t){0};
  W.pe = sched_test_engine(m, pps, 4096 / pps);
  W.de = sched_test_engine(m, dps, 4096 / dps);
  CHECK_OK(ina_scheduler_create(W.pe, &cfg, &W.ps));
  CHECK_OK(ina_scheduler_create(W.de, &cfg, &W.ds));
  W.pl = layout_of(W.pe, &W.pbase);
  W.dl = layout_of(W.de, &W.dbase);
  /* Two waves: the second finds the first's shared prefix in the decode side's cache. */
  for (int wave = 0; wave < 2; wave++) {
    for (int i = wave * N / 2; i < (wave + 1) * N / 2; i++) {
      ina_request_t r = base_request(&cases[i], &cases[i].decode, on_decode);
      r.kv_import = on_import;
      r.kv_user_data = &cases[i];
      CHECK_OK(ina_scheduler_submit(W.ds, &r));
    }
    drive(cases);
  }
  int partial = 0, layer_reports = 0;
  for (int i = 0; i < N; i++) {
    layer_reports += cases[i].layer_reports;
    hcase_t *c = &cases[i];
    CHECKF(c->decode.finals == 1 && c->decode.finish == INA_FINISH_LENGTH && c->decode.status == INA_OK,
           "%s: %d finals, finish %s", c->id, c->decode.finals, ina_finish_reason_string(c->decode.finish));
    CHECKF(c->decode.num_tokens == c->both.num_tokens &&
               memcmp(c->decode.tokens, c->both.tokens, (size_t)c->both.num_tokens * sizeof(int32_t)) == 0,
           "%s (prompt %d, %s): decode side's tokens differ from one scheduler's", c->id, c->prompt_len,
           c->sampling.temperature > 0 ? "sampled" : "greedy");
    CHECK(c->decode.count_mismatch == 0 && c->decode.events_after_final == 0);
    for (int k = 0; k < c->decode.num_tokens && k < MAX_NEW && c->logprobs >= 0; k++)
      CHECKF(c->lp_decode[k] == c->lp_both[k] && c->top_decode[k] == c->top_both[k],
             "%s token %d: logprob %g vs %g", c->id, k, c->lp_decode[k], c->lp_both[k]);
    partial += c->imported_from_min > 0 && c->imported_from_min < (1 << 30);
  }
  ina_scheduler_stats_t ds;
  ina_scheduler_stats(W.ds, &ds);
  CHECKF(partial >= 3 && ds.prefix_cache_hit_tokens > 0,
         "%d imports started past a cached prefix (%lld cached tokens): the prefix path went untested", partial,
         (long long)ds.prefix_cache_hit_tokens);
  CHECK(ds.prefill_tokens == 0); /* the decode side computed no prompt */
  /* Every step's layers but the last reported from inside the step (the CPU engine's hook). */
  CHECKF(layer_reports >= N * (W.pl.num_layers - 1), "%d reports of single layers for %d requests of %d layers",
         layer_reports, N, W.pl.num_layers);
  printf("  %d requests equal; %d imported past a cached prefix; %lld copies\n", N, partial, (long long)W.copies);
  check_pools_whole("after the requests");
  for (int i = 0; i < N; i++) {
    sched_collector_destroy(&cases[i].both);
    sched_collector_destroy(&cases[i].decode);
    sched_collector_destroy(&cases[i].prefill);
  }
  free(cases);
}

/* Faults and refusals on the decode side alone (page size 16). */
static void faults(ina_model_t *m) {
  hcase_t *cases = calloc(N, sizeof *cases);
  test_rng_t rng = {77};
  make_cases(cases, &rng);
  for (int i = 0; i < N; i++) {
    sched_collector_init(&cases[i].decode, cases[i].id);
    sched_collector_init(&cases[i].prefill, cases[i].id);
  }
  W = (world_t){0};
  W.pe = sched_test_engine(m, 16, 64);
  W.de = sched_test_engine(m, 16, 12); /* 192 tokens: room to run short */
  ina_scheduler_config_t cfg = INA_SCHEDULER_CONFIG_INIT;
  cfg.max_batch_tokens = 48;
  cfg.prefix_cache_pages = 0;
  CHECK_OK(ina_scheduler_create(W.pe, &cfg, &W.ps));
  CHECK_OK(ina_scheduler_create(W.de, &cfg, &W.ds));
  W.pl = layout_of(W.pe, &W.pbase);
  W.dl = layout_of(W.de, &W.dbase);
  ina_log_set_quiet_errors(1);

  /* A failed transfer: the request ends with its error. */
  hcase_t *c = &cases[3];
  ina_request_t r = base_request(c, &c->decode, on_decode);
  r.kv_import = on_import;
  r.kv_user_data = c;
  CHECK(ina_scheduler_import_done(W.ds, c->id, &(ina_kv_import_result_t){INA_OK, NULL, 1, 0, 0, NULL, NULL}) ==
        INA_ERR_NOT_FOUND); /* not submitted */
  CHECK_OK(ina_scheduler_submit(W.ds, &r));
  CHECK(ina_scheduler_import_done(W.ds, c->id, &(ina_kv_import_result_t){INA_OK, NULL, 1, 0, 0, NULL, NULL}) ==
        INA_ERR_NOT_FOUND); /* not admitted: no pages lent yet */
  W.fail_next_import = 1;
  drive(cases);
  CHECKF(c->decode.finals == 1 && c->decode.finish == INA_FINISH_ERROR && c->decode.status == INA_ERR_IO &&
             c->decode.num_tokens == 0,
         "failed import: finish %s, %d tokens", ina_finish_reason_string(c->decode.finish), c->decode.num_tokens);
  check_pools_whole("after a failed import");

  /* A cancel while importing; the transfer's result afterwards is refused, and the pages
   * stay out of the pool until the transfer gives them back. */
  c = &cases[5];
  r = base_request(c, &c->decode, on_decode);
  r.kv_import = on_import;
  r.kv_user_data = c;
  CHECK_OK(ina_scheduler_submit(W.ds, &r));
  CHECK_OK(ina_scheduler_step(W.ds, NULL));
  CHECK(c->import_pending);
  c->import_pending = 0;
  ina_scheduler_stats_t st;
  ina_scheduler_stats(W.ds, &st);
  const int32_t lent = (c->prompt_len + 15) / 16;
  CHECK(st.importing == 1 && st.kv_pages_lent == lent);
  CHECK_OK(ina_scheduler_cancel(W.ds, c->id));
  CHECK_OK(ina_scheduler_step(W.ds, NULL));
  ina_scheduler_stats(W.ds, &st);
  CHECK(c->decode.finals == 1 && c->decode.finish == INA_FINISH_CANCELLED);
  CHECKF(st.importing == 0 && st.kv_pages_free == st.kv_pages_total - lent, "cancelled import: %d importing, %d free",
         st.importing, st.kv_pages_free);
  CHECK(ina_scheduler_import_done(W.ds, c->id, &(ina_kv_import_result_t){INA_OK, NULL, 1, 0, 0, NULL, NULL}) ==
        INA_ERR_NOT_FOUND);
  CHECK_OK(ina_scheduler_release_pages(W.ds, c->dst_pages, lent));
  check_pools_whole("after a cancelled import");

  /* An importing request is never preempted: a long decode runs short of pages while a
   * request imports; it waits (or preempts others), and the import still completes. */
  hcase_t *longc = &cases[9], *imp = &cases[10];
  longc->prompt_len = 150;
  for (int j = 0; j < longc->prompt_len; j++) longc->prompt[j] = (int32_t)test_rng_int(&rng, 0, g_vocab - 1);
  longc->max_new = MAX_NEW;
  imp->prompt_len = 40;
  imp->max_new = 2;
  r = base_request(imp, &imp->decode, on_decode);
  r.kv_import = on_import;
  r.kv_user_data = imp;
  CHECK_OK(ina_scheduler_submit(W.ds, &r));
  CHECK_OK(ina_scheduler_step(W.ds, NULL)); /* the import holds 3 of 12 pages */
  r = base_request(longc, &longc->decode, on_decode);
  CHECK_OK(ina_scheduler_submit(W.ds, &r)); /* 150 + 12 tokens: 11 pages, more than are free */
  for (int k = 0; k < 30; k++) CHECK_OK(ina_scheduler_step(W.ds, NULL));
  ina_scheduler_stats(W.ds, &st);
  CHECKF(st.importing == 1 && imp->decode.finals == 0, "the importing request was disturbed: %d importing",
         st.importing);
  drive(cases); /* the prefill runs; the import completes; then the long one */
  CHECK(imp->decode.finals == 1 && imp->decode.finish == INA_FINISH_LENGTH && imp->decode.num_tokens == 2);
  CHECK(longc->decode.finals == 1 && longc->decode.finish == INA_FINISH_LENGTH);
  check_pools_whole("after an import under page pressure");

  /* Refusals: both hooks; a token outside the vocabulary; a second result. */
  r = base_request(&cases[11], &cases[11].decode, on_decode);
  r.kv_import = on_import;
  r.kv_export = on_export;
  CHECK(ina_scheduler_submit(W.ds, &r) == INA_ERR_INVALID_ARGUMENT && strstr(ina_last_error(), "exclusive"));
  c = &cases[12];
  r = base_request(c, &c->decode, on_decode);
  r.kv_import = on_import;
  r.kv_user_data = c;
  CHECK_OK(ina_scheduler_submit(W.ds, &r));
  CHECK_OK(ina_scheduler_step(W.ds, NULL));
  c->import_pending = 0;
  CHECK(ina_scheduler_import_done(W.ds, c->id, &(ina_kv_import_result_t){INA_OK, NULL, g_vocab, 0, 0, NULL, NULL}) ==
        INA_ERR_INVALID_ARGUMENT);
  CHECK_OK(ina_scheduler_import_done(W.ds, c->id, &(ina_kv_import_result_t){INA_ERR_IO, "gone", 0, 0, 0, NULL, NULL}));
  CHECK(ina_scheduler_import_done(W.ds, c->id, &(ina_kv_import_result_t){INA_OK, NULL, 1, 0, 0, NULL, NULL}) ==
        INA_ERR_NOT_FOUND);
  CHECK_OK(ina_scheduler_release_pages(W.ds, c->dst_pages, (c->prompt_len + 15) / 16));
  CHECK_OK(ina_scheduler_step(W.ds, NULL));
  CHECK(c->decode.finals == 1 && c->decode.finish == INA_FINISH_ERROR && c->decode.status == INA_ERR_IO);
  check_pools_whole("after the refusals");
  ina_log_set_quiet_errors(0);

  ina_scheduler_destroy(W.ps);
  ina_scheduler_destroy(W.ds);
  ina_engine_destroy(W.pe);
  ina_engine_destroy(W.de);
  for (int i = 0; i < N; i++) {
    sched_collector_destroy(&cases[i].decode);
    sched_collector_destroy(&cases[i].prefill);
  }
  free(cases);
}

int main(void) {
  const uint64_t seed = (uint64_t)time(NULL);
  printf("test_scheduler_kv_handoff: seed %llu\n", (unsigned long long)seed);
  ina_model_t *m = sched_test_model(7);
  {
    ina_engine_t *e = sched_test_engine(m, 16, 4);
    g_vocab = (int32_t)ina_engine_config(e)->vocab_size;
    ina_engine_destroy(e);
  }
  const int32_t pairs[4][2] = {{16, 16}, {1, 16}, {16, 1}, {3, 16}};
  for (int p = 0; p < 4; p++) {
    run_pair(pairs[p][0], pairs[p][1], seed + (uint64_t)p, m);
    ina_scheduler_destroy(W.ps);
    ina_scheduler_destroy(W.ds);
    ina_engine_destroy(W.pe);
    ina_engine_destroy(W.de);
  }
  faults(m);
  ina_model_destroy(m);
  return test_finish("test_scheduler_kv_handoff");
}
