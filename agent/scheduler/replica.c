/* Lockstep replicas of the scheduler (scheduler.h, config.replica_comm): the leader's
 * step intake travels to the followers, which apply it and run the same step.
 *
 * Why this keeps the replicas identical: a step's decisions depend only on the scheduler
 * state and on what the step takes in (new requests in submission order, cancellations
 * in the order they were applied), never on wall time; sampling is seeded per request.
 * So replicas that start equal and take in the same things at the same steps plan the
 * same batches, allocate the same pages and sample the same tokens, and their engines
 * meet in the same collectives.
 *
 * Control commands (control.c) travel the same way, ahead of the step they precede, so
 * every replica runs them at the same point of its step stream.
 *
 * Message (int64 words, broadcast from rank 0 after its length):
 *   magic, kind (STEP, STOP or CONTROL), new requests, cancellations, then
 *   - STEP: per new request: id, prompt, max_new_tokens, sampling parameters, stop ids,
 *     ignore_eos, logprobs; per cancellation: id;
 *   - CONTROL (no requests, no cancellations): the command's bytes.
 * Byte strings and id arrays are a length word then the data. */
#define INA_LOG_SUBSYS "scheduler"
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "agent/scheduler/scheduler_internal.h"

#define REPLICA_MAGIC 0x494E4153 /* "INAS" */
enum { KIND_STEP = 0, KIND_STOP = 1, KIND_CONTROL = 2 };

/* ---- encoding ------------------------------------------------------------------------ */

typedef struct words {
  int64_t *w;
  size_t n, cap;
} words_t;

static ina_status_t put(words_t *b, int64_t v) {
  if (b->n == b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 256;
    int64_t *w = realloc(b->w, cap * sizeof *w);
    if (!w) return INA_ERR_OUT_OF_MEMORY;
    b->w = w;
    b->cap = cap;
  }
  b->w[b->n++] = v;
  return INA_OK;
}

static ina_status_t put_bytes(words_t *b, const void *data, size_t n) {
  ina_status_t st = INA_OK;
  INA_CHECK(put(b, (int64_t)n));
  for (size_t at = 0; at < n; at += 8) {
    int64_t word = 0;
    memcpy(&word, (const uint8_t *)data + at, n - at < 8 ? n - at : 8);
    INA_CHECK(put(b, word));
  }
fail:
  return st;
}

static ina_status_t put_ids(words_t *b, const int32_t *ids, int32_t n) {
  ina_status_t st = INA_OK;
  INA_CHECK(put(b, n));
  for (int32_t i = 0; i < n; i++) INA_CHECK(put(b, ids[i]));
fail:
  return st;
}

/* ---- decoding (every read checked against the message's end) ------------------------- */

typedef struct reader {
  const int64_t *w;
  size_t n, at;
} reader_t;

static ina_status_t get(reader_t *r, int64_t lo, int64_t hi, int64_t *out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(r->at < r->n, INA_ERR_FORMAT, "replica message: truncated at word %zu", r->at);
  *out = r->w[r->at++];
  INA_REQUIRE(*out >= lo && *out <= hi, INA_ERR_FORMAT,
              "replica message: word %zu is %lld, outside [%lld, %lld]", r->at - 1,
              (long long)*out, (long long)lo, (long long)hi);
fail:
  return st;
}

/* A byte string of at most `cap` bytes into out (NUL-terminated; out holds cap + 1). */
static ina_status_t get_bytes(reader_t *r, void *out, size_t cap, size_t *len) {
  ina_status_t st = INA_OK;
  int64_t n = 0;
  INA_CHECK(get(r, 0, (int64_t)cap, &n));
  INA_REQUIRE((size_t)(n + 7) / 8 <= r->n - r->at, INA_ERR_FORMAT,
              "replica message: a %lld-byte string runs past the end", (long long)n);
  memcpy(out, r->w + r->at, (size_t)n);
  ((uint8_t *)out)[n] = 0;
  r->at += (size_t)(n + 7) / 8;
  if (len) *len = (size_t)n;
fail:
  return st;
}

/* A byte string of 1 to `cap` bytes, viewed where it lies in the message (no copy). */
static ina_status_t get_span(reader_t *r, size_t cap, const void **data, size_t *len) {
  ina_status_t st = INA_OK;
  int64_t n = 0;
  INA_CHECK(get(r, 1, (int64_t)cap, &n));
  INA_REQUIRE((size_t)(n + 7) / 8 <= r->n - r->at, INA_ERR_FORMAT,
              "replica message: a %lld-byte string runs past the end", (long long)n);
  *data = r->w + r->at;
  *len = (size_t)n;
  r->at += (size_t)(n + 7) / 8;
fail:
  return st;
}

static ina_status_t get_ids(reader_t *r, int32_t **out, int32_t *count) {
  ina_status_t st = INA_OK;
  int64_t n = 0, v = 0;
  INA_CHECK(get(r, 0, INT32_MAX, &n));
  INA_REQUIRE((size_t)n <= r->n - r->at, INA_ERR_FORMAT,
              "replica message: %lld ids run past the end", (long long)n);
  *out = malloc(((size_t)n + 1) * sizeof **out);
  INA_CHECK_ALLOC(*out);
  for (int64_t i = 0; i < n; i++) {
    INA_CHECK(get(r, INT32_MIN, INT32_MAX, &v));
    (*out)[i] = (int32_t)v;
  }
  *count = (int32_t)n;
fail:
  return st;
}

/* ---- transport ----------------------------------------------------------------------- */

/* Lengths travel in s->rx_len and payloads stay in their buffers until the broadcast
 * returns; after a timeout (the communicator is broken) those buffers are never freed,
 * since the stalled operation may still write them (see sched_replica_free). */
static ina_status_t broadcast_message(ina_scheduler_t *s, words_t *b) {
  ina_status_t st = INA_OK;
  *s->rx_len = (int64_t)b->n;
  INA_CHECK(ina_comm_broadcast(s->replica_comm, s->rx_len, 1, INA_DTYPE_I64, 0, NULL));
  INA_CHECK(ina_comm_broadcast(s->replica_comm, b->w, b->n, INA_DTYPE_I64, 0, NULL));
fail:
  return st;
}

/* Into s->rx_words (grown as needed); *out views it. */
static ina_status_t receive_message(ina_scheduler_t *s, reader_t *out) {
  ina_status_t st = INA_OK;
  INA_CHECK(ina_comm_broadcast(s->replica_comm, s->rx_len, 1, INA_DTYPE_I64, 0, NULL));
  const int64_t n = *s->rx_len;
  INA_REQUIRE(n >= 4 && n <= ((int64_t)1 << 32), INA_ERR_FORMAT,
              "replica message: length %lld words", (long long)n);
  if ((size_t)n > s->rx_capacity) {
    int64_t *w = realloc(s->rx_words, (size_t)n * sizeof *w);
    INA_CHECK_ALLOC(w);
    s->rx_words = w;
    s->rx_capacity = (size_t)n;
  }
  INA_CHECK(ina_comm_broadcast(s->replica_comm, s->rx_words, (size_t)n, INA_DTYPE_I64, 0, NULL));
  *out = (reader_t){s->rx_words, (size_t)n, 0};
fail:
  return st;
}

ina_status_t sched_replica_init(ina_scheduler_t *s) {
  ina_status_t st = INA_OK;
  if (s->replica_role == SCHED_REPLICA_NONE) return INA_OK;
  s->rx_len = malloc(sizeof *s->rx_len);
  INA_CHECK_ALLOC(s->rx_len);
fail:
  return st;
}

void sched_replica_free(ina_scheduler_t *s) {
  free(s->step_new);
  free(s->step_cancelled);
  /* A broken communicator may hold a stalled operation on these: leave them be. */
  if (s->replica_comm && ina_comm_is_broken(s->replica_comm)) return;
  free(s->rx_len);
  free(s->rx_words);
}

/* ---- leader -------------------------------------------------------------------------- */

ina_status_t sched_replica_reserve(ina_scheduler_t *s, int32_t requests) {
  ina_status_t st = INA_OK;
  s->num_step_new = s->num_step_cancelled = 0;
  if (s->replica_role != SCHED_REPLICA_LEADER) return INA_OK;
  if (requests > s->step_new_capacity) {
    sched_request_t **p = realloc(s->step_new, (size_t)requests * sizeof *p);
    INA_CHECK_ALLOC(p);
    s->step_new = p;
    s->step_new_capacity = requests;
  }
  if (requests > s->step_cancelled_capacity) {
    sched_request_t **p = realloc(s->step_cancelled, (size_t)requests * sizeof *p);
    INA_CHECK_ALLOC(p);
    s->step_cancelled = p;
    s->step_cancelled_capacity = requests;
  }
fail:
  return st;
}

static ina_status_t encode_step(const ina_scheduler_t *s, words_t *b) {
  ina_status_t st = INA_OK;
  INA_CHECK(put(b, REPLICA_MAGIC));
  INA_CHECK(put(b, KIND_STEP));
  INA_CHECK(put(b, s->num_step_new));
  INA_CHECK(put(b, s->num_step_cancelled));
  for (int32_t i = 0; i < s->num_step_new; i++) {
    const sched_request_t *r = s->step_new[i];
    INA_CHECK(put_bytes(b, r->id, strlen(r->id)));
    INA_CHECK(put_ids(b, r->tokens, r->prompt_len));
    INA_CHECK(put(b, r->max_new_tokens));
    INA_CHECK(put_bytes(b, &r->sampling, sizeof r->sampling));
    INA_CHECK(put_ids(b, r->stop_ids, r->num_stop_ids));
    INA_CHECK(put(b, r->ignore_eos));
    INA_CHECK(put(b, r->logprobs)); /* decides whether the step computes full logits */
  }
  for (int32_t i = 0; i < s->num_step_cancelled; i++)
    INA_CHECK(put_bytes(b, s->step_cancelled[i]->id, strlen(s->step_cancelled[i]->id)));
fail:
  return st;
}

ina_status_t sched_replica_send_step(ina_scheduler_t *s) {
  ina_status_t st = INA_OK;
  words_t b = {NULL, 0, 0};
  if (s->replica_role != SCHED_REPLICA_LEADER) return INA_OK;
  INA_CHECK(encode_step(s, &b));
  INA_CHECK(broadcast_message(s, &b));
  if (s->num_step_new == 0 && s->num_step_cancelled == 0)
    INA_CHECK(ina_comm_barrier(s->replica_comm, NULL));
fail:
  /* A timed-out broadcast may still read the payload: keep it (the job is ending). */
  if (!ina_comm_is_broken(s->replica_comm)) free(b.w);
  return st;
}

ina_status_t sched_replica_send_control(ina_scheduler_t *s, const void *bytes, size_t size) {
  ina_status_t st = INA_OK;
  words_t b = {NULL, 0, 0};
  if (s->replica_role != SCHED_REPLICA_LEADER) return INA_OK;
  INA_CHECK(put(&b, REPLICA_MAGIC));
  INA_CHECK(put(&b, KIND_CONTROL));
  INA_CHECK(put(&b, 0));
  INA_CHECK(put(&b, 0));
  INA_CHECK(put_bytes(&b, bytes, size));
  INA_CHECK(broadcast_message(s, &b));
fail:
  if (!ina_comm_is_broken(s->replica_comm)) free(b.w);
  return st;
}

void sched_replica_send_stop(ina_scheduler_t *s) {
  words_t b = {NULL, 0, 0};
  if (s->replica_role != SCHED_REPLICA_LEADER || ina_comm_is_broken(s->replica_comm)) return;
  if (put(&b, REPLICA_MAGIC) != INA_OK || put(&b, KIND_STOP) != INA_OK || put(&b, 0) != INA_OK ||
      put(&b, 0) != INA_OK || broadcast_message(s, &b) != INA_OK)
    INA_LOG_W(INA_LOG_SUBSYS, "replicas: the stop message did not reach every follower (%s)",
              ina_last_error());
  if (!ina_comm_is_broken(s->replica_comm)) free(b.w);
}

/* ---- follower ------------------------------------------------------------------------ */

/* One new request of a message, submitted here as the leader's was. */
static ina_status_t take_request(ina_scheduler_t *s, reader_t *rd) {
  ina_status_t st = INA_OK;
  char id[1024];
  int32_t *prompt = NULL, *stops = NULL, prompt_len = 0, num_stops = 0;
  int64_t max_new = 0, ignore_eos = 0, logprobs = -1;
  size_t sampling_len = 0;
  ina_request_t q = INA_REQUEST_INIT;
  uint8_t sampling[sizeof q.sampling + 1];
  INA_CHECK(get_bytes(rd, id, sizeof id - 1, NULL));
  INA_CHECK(get_ids(rd, &prompt, &prompt_len));
  INA_CHECK(get(rd, 1, INT32_MAX, &max_new));
  INA_CHECK(get_bytes(rd, sampling, sizeof q.sampling, &sampling_len));
  INA_REQUIRE(sampling_len == sizeof q.sampling, INA_ERR_FORMAT,
              "replica message: sampling parameters of %zu bytes, expected %zu", sampling_len,
              sizeof q.sampling);
  INA_CHECK(get_ids(rd, &stops, &num_stops));
  INA_CHECK(get(rd, 0, 1, &ignore_eos));
  INA_CHECK(get(rd, -1, INA_REQUEST_MAX_LOGPROBS, &logprobs));
  q.id = id;
  q.prompt = prompt;
  q.prompt_len = prompt_len;
  q.max_new_tokens = (int32_t)max_new;
  memcpy(&q.sampling, sampling, sizeof q.sampling);
  q.stop_ids = stops;
  q.num_stop_ids = num_stops;
  q.ignore_eos = (int)ignore_eos;
  q.logprobs = (int32_t)logprobs;
  INA_CHECK(sched_enqueue(s, &q));
fail:
  free(prompt);
  free(stops);
  return st;
}

/* Applies one STEP message's intake; *empty tells whether it had none. */
static ina_status_t take_intake(ina_scheduler_t *s, reader_t *rd, int64_t new_count,
                                int64_t cancel_count) {
  ina_status_t st = INA_OK;
  for (int64_t i = 0; i < new_count; i++) INA_CHECK(take_request(s, rd));
  for (int64_t i = 0; i < cancel_count; i++) {
    char id[1024];
    INA_CHECK(get_bytes(rd, id, sizeof id - 1, NULL));
    INA_REQUIRE(sched_cancel(s, id) == INA_OK, INA_ERR_INTERNAL,
                "replicas diverged: the leader cancelled request '%s', which is not unfinished "
                "here", id);
  }
  INA_REQUIRE(rd->at == rd->n, INA_ERR_FORMAT, "replica message: %zu words left over",
              rd->n - rd->at);
fail:
  return st;
}

/* Runs one CONTROL message's command here, as the leader runs it. */
static ina_status_t take_control(ina_scheduler_t *s, reader_t *rd) {
  ina_status_t st = INA_OK;
  const void *bytes = NULL;
  size_t size = 0;
  INA_CHECK(get_span(rd, INA_SCHEDULER_CONTROL_MAX_BYTES, &bytes, &size));
  INA_REQUIRE(rd->at == rd->n, INA_ERR_FORMAT, "replica message: %zu words left over after a control command",
              rd->n - rd->at);
  sched_control_run_follower(s, bytes, size);
fail:
  return st;
}

ina_status_t ina_scheduler_follow(ina_scheduler_t *s) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(s != NULL && s->replica_role == SCHED_REPLICA_FOLLOWER, INA_ERR_INVALID_ARGUMENT,
              "follow: the scheduler is not a follower (replica_comm with a rank > 0)");
  for (;;) {
    int64_t magic = 0, kind = 0, new_count = 0, cancel_count = 0;
    reader_t rd;
    INA_CHECK(receive_message(s, &rd));
    INA_CHECK(get(&rd, REPLICA_MAGIC, REPLICA_MAGIC, &magic));
    INA_CHECK(get(&rd, KIND_STEP, KIND_CONTROL, &kind));
    INA_CHECK(get(&rd, 0, kind == KIND_CONTROL ? 0 : INT32_MAX, &new_count));
    INA_CHECK(get(&rd, 0, kind == KIND_CONTROL ? 0 : INT32_MAX, &cancel_count));
    if (kind == KIND_STOP) break;
    if (kind == KIND_CONTROL) {
      INA_CHECK(take_control(s, &rd));
      continue;
    }
    INA_CHECK(take_intake(s, &rd, new_count, cancel_count));
    if (new_count == 0 && cancel_count == 0) INA_CHECK(ina_comm_barrier(s->replica_comm, NULL));
    INA_CHECK(ina_scheduler_step(s, NULL));
  }
fail:
  return st;
}
