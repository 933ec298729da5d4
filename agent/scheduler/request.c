/* A request inside the scheduler: validation of what a client submits, the copies the
 * scheduler keeps, and the per-token bookkeeping (finish checks, latency metrics). */
#define INA_LOG_SUBSYS "scheduler"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "agent/scheduler/scheduler_internal.h"

/* Bytes of the version-1 request: everything up to and including user_data. */
#define REQUEST_V1_SIZE (offsetof(ina_request_t, user_data) + sizeof(void *))

/* Token ids of a field in [0, vocab); names the first offender. */
static ina_status_t check_ids(const char *id, const char *field, const int32_t *ids, int32_t n, int32_t vocab) {
  ina_status_t st = INA_OK;
  for (int32_t i = 0; i < n; i++)
    INA_REQUIRE(ids[i] >= 0 && ids[i] < vocab, INA_ERR_INVALID_ARGUMENT,
                "request '%s': %s[%d] = %d is outside the vocabulary [0, %d)", id, field, i, ids[i], vocab);
fail:
  return st;
}

static ina_status_t validate(const ina_scheduler_t *s, const ina_request_t *q) {
  ina_status_t st = INA_OK;
  INA_REQUIRE_VERSIONED(q, REQUEST_V1_SIZE, "request", "INA_REQUEST_INIT");
  INA_REQUIRE(q->id != NULL && q->id[0] != '\0', INA_ERR_INVALID_ARGUMENT, "request: id is empty");
  const char *id = q->id;
  INA_REQUIRE(q->prompt_len >= 1 && q->prompt != NULL, INA_ERR_INVALID_ARGUMENT,
              "request '%s': prompt is empty (prompt_len %d)", id, q->prompt_len);
  INA_CHECK(check_ids(id, "prompt", q->prompt, q->prompt_len, s->vocab));
  INA_REQUIRE(q->max_new_tokens >= 1, INA_ERR_INVALID_ARGUMENT, "request '%s': max_new_tokens %d must be >= 1",
              id, q->max_new_tokens);
  INA_REQUIRE((int64_t)q->prompt_len + q->max_new_tokens <= s->max_context, INA_ERR_INVALID_ARGUMENT,
              "request '%s': prompt_len %d + max_new_tokens %d = %lld exceeds the max context %lld", id,
              q->prompt_len, q->max_new_tokens, (long long)q->prompt_len + q->max_new_tokens,
              (long long)s->max_context);
  INA_REQUIRE(q->num_stop_ids >= 0 && (q->num_stop_ids == 0 || q->stop_ids != NULL), INA_ERR_INVALID_ARGUMENT,
              "request '%s': num_stop_ids %d without stop_ids", id, q->num_stop_ids);
  INA_CHECK(check_ids(id, "stop_ids", q->stop_ids, q->num_stop_ids, s->vocab));
  if (q->struct_size >= offsetof(ina_request_t, logprobs) + sizeof(int32_t))
    INA_REQUIRE(q->logprobs >= -1 && q->logprobs <= INA_REQUEST_MAX_LOGPROBS, INA_ERR_INVALID_ARGUMENT,
                "request '%s': logprobs %d is out of range -1..%d", id, q->logprobs, INA_REQUEST_MAX_LOGPROBS);
  if (q->struct_size >= offsetof(ina_request_t, kv_user_data) + sizeof(void *)) {
    INA_REQUIRE(!(q->kv_export && q->kv_import), INA_ERR_INVALID_ARGUMENT,
                "request '%s': kv_export and kv_import are exclusive", id);
    INA_REQUIRE(!(q->kv_export || q->kv_import) || s->replica_role != SCHED_REPLICA_FOLLOWER, INA_ERR_UNSUPPORTED,
                "request '%s': a follower takes no KV hand-off", id);
    INA_REQUIRE(!q->kv_import || s->replica_role == SCHED_REPLICA_NONE, INA_ERR_UNSUPPORTED,
                "request '%s': kv_import needs a scheduler of one rank (imported entries would reach rank 0's "
                "cache only)", id);
  }
  if (ina_sampling_params_validate(&q->sampling) != INA_OK) {
    char reason[256];
    snprintf(reason, sizeof reason, "%s", ina_last_error());
    INA_REQUIRE(0, INA_ERR_INVALID_ARGUMENT, "request '%s': sampling: %s", id, reason);
  }
fail:
  return st;
}

ina_status_t sched_request_create(const ina_scheduler_t *s, const ina_request_t *q, double now, sched_request_t **out) {
  ina_status_t st = INA_OK;
  sched_request_t *r = NULL;
  *out = NULL;
  INA_CHECK(validate(s, q));
  r = calloc(1, sizeof *r);
  INA_CHECK_ALLOC(r);
  r->id = strdup(q->id);
  r->tokens = malloc(((size_t)q->prompt_len + (size_t)q->max_new_tokens) * sizeof *r->tokens);
  r->stop_ids = malloc((size_t)(q->num_stop_ids > 0 ? q->num_stop_ids : 1) * sizeof *r->stop_ids);
  INA_CHECK_ALLOC(r->id);
  INA_CHECK_ALLOC(r->tokens);
  INA_CHECK_ALLOC(r->stop_ids);
  INA_CHECK(ina_sampler_create(s->vocab, &q->sampling, &r->sampler));
  memcpy(r->tokens, q->prompt, (size_t)q->prompt_len * sizeof *r->tokens);
  if (q->num_stop_ids > 0) memcpy(r->stop_ids, q->stop_ids, (size_t)q->num_stop_ids * sizeof *r->stop_ids);
  r->num_stop_ids = q->num_stop_ids;
  r->prompt_len = r->num_tokens = r->prefill_len = q->prompt_len;
  r->max_new_tokens = q->max_new_tokens;
  r->eos = q->ignore_eos ? -1 : s->eos;
  r->sampling = q->sampling;
  r->ignore_eos = q->ignore_eos != 0;
  r->logprobs = q->struct_size >= offsetof(ina_request_t, logprobs) + sizeof(int32_t) ? q->logprobs : -1;
  r->seq = (ina_kv_seq_t)INA_KV_SEQ_INIT;
  if (q->struct_size >= offsetof(ina_request_t, kv_user_data) + sizeof(void *)) {
    r->kv_export = q->kv_export;
    r->kv_import = q->kv_import;
    r->kv_user_data = q->kv_user_data;
  }
  r->callback = q->callback;
  r->user_data = q->user_data;
  r->status = INA_OK;
  r->t_submit = now;
  r->t_admit = r->t_first = r->t_last = -1;
  *out = r;
  return INA_OK;
fail:
  sched_request_free(NULL, r);
  return st;
}

void sched_request_free(ina_page_pool_t *pool, sched_request_t *r) {
  if (!r) return;
  if (pool) ina_kv_seq_release(pool, &r->seq);
  ina_sampler_destroy(r->sampler);
  free(r->id);
  free(r->tokens);
  free(r->stop_ids);
  free(r);
}

ina_finish_reason_t sched_request_add_token(sched_request_t *r, int32_t token, double now) {
  r->tokens[r->num_tokens++] = token;
  r->num_generated++;
  if (r->t_first < 0) {
    r->t_first = now;
  } else {
    const double gap = now - r->t_last;
    r->gap_sum += gap;
    if (gap > r->gap_max) r->gap_max = gap;
  }
  r->t_last = now;
  /* The model chose to stop: say so even when it was also the last allowed token. */
  for (int32_t i = 0; i < r->num_stop_ids; i++)
    if (token == r->stop_ids[i]) return INA_FINISH_STOP;
  if (token == r->eos) return INA_FINISH_EOS;
  if (r->num_generated >= r->max_new_tokens) return INA_FINISH_LENGTH;
  return INA_FINISH_NONE;
}

void sched_request_metrics(const sched_request_t *r, double now, ina_request_metrics_t *m) {
  memset(m, 0, sizeof *m);
  m->queue_seconds = (r->t_admit >= 0 ? r->t_admit : now) - r->t_submit;
  m->first_token_seconds = r->t_first >= 0 ? r->t_first - r->t_submit : -1;
  m->total_seconds = now - r->t_submit;
  m->mean_token_seconds = r->num_generated >= 2 ? r->gap_sum / (r->num_generated - 1) : 0;
  m->max_token_seconds = r->gap_max;
  m->prompt_tokens = r->prompt_len;
  m->generated_tokens = r->num_generated;
  m->cached_tokens = r->cached_tokens;
  m->preemptions = r->preemptions;
}
