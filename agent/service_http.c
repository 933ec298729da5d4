/* The OpenAI-compatible HTTP API of ina-agent (rank 0): POST /v1/completions, POST
 * /v1/chat/completions (streamed as server-sent events or whole), GET /v1/models and
 * GET /health, over the same scheduler and registry of generations as gRPC Generate.
 *
 * One HTTP call becomes one scheduler request per choice (a completions call with a list
 * of prompts has one choice per prompt). The scheduler's callback only queues each
 * choice's token ids under the call's lock; the connection's thread does the rest: it
 * detokenizes (whole UTF-8 characters only), applies the stop strings (a stop string
 * cancels the request in the scheduler and ends the choice with finish_reason "stop"),
 * renders the chunks or the whole answer, and notices a client that went away, whose
 * requests it cancels so that their pages return to the pool.
 *
 * A call is freed when both sides are done with it: every submitted choice has had its
 * final event, and the HTTP side has answered (whole answers) or its stream is over
 * (stream done). */
#define INA_LOG_SUBSYS "http"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/agent_internal.h"
#include "agent/http/http_server.h"
#include "agent/http/openai_api.h"
#include "agent/http/stop_text.h"
#include "core/check.h"
#include "core/log.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

#define JSON_TYPE "application/json"
#define SSE_TYPE "text/event-stream"
#define WAIT_SLICE_MS 50
/* Completions' default max_tokens (OpenAI's). */
#define COMPLETIONS_DEFAULT_MAX_TOKENS 16

typedef struct http_call http_call_t;

/* One generated token's log probabilities, as the scheduler's event gave them. */
typedef struct token_logprobs {
  int32_t token;
  float logprob;
  int32_t num_top;
  int32_t top_ids[INA_REQUEST_MAX_LOGPROBS];
  float top_logprobs[INA_REQUEST_MAX_LOGPROBS];
} token_logprobs_t;

typedef struct http_choice {
  agent_generation_t g; /* the registry's entry (writer NULL); g.request_id is the scheduler id */
  http_call_t *call;
  size_t index;
  int submitted;
  /* Filled by the scheduler's callback, under call->mu. */
  int32_t *tokens;
  size_t num_tokens, cap_tokens;
  token_logprobs_t *lps; /* [cap_tokens] when the request asked for logprobs, else NULL */
  int finished; /* the final event came */
  ina_finish_reason_t finish;
  char error[256];
  ina_request_metrics_t metrics;
  /* The connection thread's side. */
  size_t consumed;          /* tokens detokenized so far */
  size_t lp_sent;           /* tokens whose logprobs were rendered */
  size_t text_chars;        /* characters streamed so far (completions' text_offset) */
  ina_detokenizer_t *detok;
  ina_stop_text_t stops;
  int stop_hit;             /* a stop string ended it (its request was cancelled) */
  int ended;                /* finish rendered */
  int first_chunk_done;
  ina_text_buf_t text;      /* whole answers: the text so far */
  int64_t prompt_tokens;
} http_choice_t;

struct http_call {
  ina_agent_t *agent;
  struct agent_http *http;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  ina_openai_request_t req;
  http_choice_t *choices;
  size_t num_choices;
  size_t outstanding; /* submitted choices without their final event */
  int http_done;      /* the HTTP side no longer uses the call */
  char id[48];
  int64_t created;
  const char *model;  /* the served name */
  /* Streams: rendered events not sent yet. */
  ina_text_buf_t out;
  size_t out_pos;
  int finished_all; /* every choice ended and the closing events are rendered */
};

/* ---- the service ----------------------------------------------------------------------- */

struct agent_http {
  ina_agent_t *agent;
  ina_http_server_t *server;
  ina_tokenizer_t *tokenizer; /* NULL: none (text endpoints refuse) */
  char tokenizer_error[256];
  char *served_name;
  char *api_key; /* NULL: open */
  int64_t created; /* when serving began (unix seconds): /v1/models */
  atomic_int active_calls; /* calls whose HTTP side is not done: stop lets them finish */
  int has_chat_format;
  ina_chat_format_t chat_format;
  char chat_format_error[320];
};

static uint64_t pick_seed(void) {
  static atomic_ullong counter;
  const uint64_t n = (uint64_t)atomic_fetch_add(&counter, 1) + 1;
  return (uint64_t)(agent_now_seconds() * 1e9) ^ (n * 0x9E3779B97F4A7C15ull);
}

static int64_t unix_now(void) { return (int64_t)time(NULL); }

/* ---- replies ------------------------------------------------------------------------------ */

static void reply_json(ina_http_reply_t *reply, int status, char *body) {
  reply->status = body ? status : 500;
  reply->content_type = JSON_TYPE;
  reply->body = body;
  reply->body_len = body ? strlen(body) : 0;
}

static void reply_error(ina_http_reply_t *reply, const ina_openai_error_t *err) {
  reply_json(reply, err->http_status, ina_openai_render_error(err));
}

/* The HTTP status of an admission refusal. */
static int status_of(ina_rpc_code_t code) {
  switch (code) {
  case INA_RPC_UNAVAILABLE: return 503;
  case INA_RPC_RESOURCE_EXHAUSTED: return 429;
  case INA_RPC_INVALID_ARGUMENT: return 400;
  default: return 500;
  }
}

/* ---- the call's life --------------------------------------------------------------------- */

static void call_free(http_call_t *c) {
  for (size_t i = 0; i < c->num_choices; i++) {
    http_choice_t *ch = &c->choices[i];
    free(ch->tokens);
    free(ch->lps);
    free(ch->g.request_id);
    ina_detokenizer_destroy(ch->detok);
    ina_stop_text_release(&ch->stops);
    ina_text_buf_release(&ch->text);
  }
  free(c->choices);
  ina_openai_request_release(&c->req);
  ina_text_buf_release(&c->out);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

/* The HTTP side is done; frees the call once the scheduler is too. */
static void call_release_http(http_call_t *c) {
  if (c->http) atomic_fetch_sub(&c->http->active_calls, 1);
  pthread_mutex_lock(&c->mu);
  c->http_done = 1;
  const int last = c->outstanding == 0;
  pthread_mutex_unlock(&c->mu);
  if (last) call_free(c);
}

/* The scheduler's callback, on its driver thread: queue, and wake the connection. */
static void on_event(const ina_request_event_t *event, void *user_data) {
  http_choice_t *ch = user_data;
  http_call_t *c = ch->call;
  ina_agent_t *agent = c->agent;
  if (event->finish == INA_FINISH_NONE) {
    const double now = agent_now_seconds();
    if (ch->g.last_token_seconds > 0) agent_metrics_token_gap(agent->metrics, now - ch->g.last_token_seconds);
    ch->g.last_token_seconds = now;
  } else {
    agent_metrics_request_finished(agent->metrics, event);
  }
  pthread_mutex_lock(&c->mu);
  if (event->finish == INA_FINISH_NONE) {
    if (ch->num_tokens == ch->cap_tokens) {
      const size_t cap = ch->cap_tokens ? 2 * ch->cap_tokens : 64;
      int32_t *grown = realloc(ch->tokens, cap * sizeof *grown);
      if (grown) ch->tokens = grown;
      if (grown && c->req.logprobs >= 0) {
        token_logprobs_t *lps = realloc(ch->lps, cap * sizeof *lps);
        if (lps) ch->lps = lps;
        else grown = NULL;
      }
      if (grown) ch->cap_tokens = cap;
    }
    if (ch->num_tokens < ch->cap_tokens) {
      if (c->req.logprobs >= 0) {
        token_logprobs_t *lp = &ch->lps[ch->num_tokens];
        lp->token = event->token;
        lp->logprob = event->logprob;
        lp->num_top = event->num_top;
        memcpy(lp->top_ids, event->top_ids, (size_t)event->num_top * sizeof *lp->top_ids);
        memcpy(lp->top_logprobs, event->top_logprobs, (size_t)event->num_top * sizeof *lp->top_logprobs);
      }
      ch->tokens[ch->num_tokens++] = event->token;
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return;
  }
  ch->finished = 1;
  ch->finish = event->finish;
  if (event->metrics) ch->metrics = *event->metrics;
  if (event->finish == INA_FINISH_ERROR)
    snprintf(ch->error, sizeof ch->error, "%s", event->error && event->error[0] ? event->error : "the engine failed");
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  /* Unlisted before the call can go: drain counts it until here. */
  agent_registry_remove(agent, &ch->g);
  pthread_mutex_lock(&c->mu);
  c->outstanding--;
  const int last = c->outstanding == 0 && c->http_done;
  pthread_mutex_unlock(&c->mu);
  if (last) call_free(c);
}

/* Cancels every choice still running (the client went away, or a later choice could not
 * be submitted). Without the call's lock: the scheduler's callback takes it. */
static void cancel_choices(http_call_t *c) {
  for (size_t i = 0; i < c->num_choices; i++) {
    pthread_mutex_lock(&c->mu);
    const int running = c->choices[i].submitted && !c->choices[i].finished;
    pthread_mutex_unlock(&c->mu);
    if (running) ina_scheduler_cancel(c->agent->scheduler, c->choices[i].g.request_id);
  }
}

/* ---- turning tokens into text -------------------------------------------------------------- */

static const char *finish_name(const http_choice_t *ch) {
  if (ch->stop_hit) return "stop";
  switch (ch->finish) {
  case INA_FINISH_LENGTH: return "length";
  case INA_FINISH_STOP:
  case INA_FINISH_EOS: return "stop";
  default: return NULL;
  }
}

/* Lock held. Detokenizes the choice's new tokens through its stop strings into `piece`.
 * Returns 1 when a stop string was found now (the caller cancels the request), -1 when
 * out of memory. At the final event, flushes what the detokenizer and the stop strings
 * hold. */
static int advance_choice(http_choice_t *ch, ina_text_buf_t *piece) {
  int hit = 0;
  while (ch->consumed < ch->num_tokens && !ch->stop_hit) {
    char *text = NULL;
    size_t len = 0;
    if (ina_detokenizer_push(ch->detok, ch->tokens[ch->consumed++], &text, &len) != INA_OK) return -1;
    const int r = ina_stop_text_feed(&ch->stops, text, len, piece);
    free(text);
    if (r < 0) return -1;
    if (r == 1) ch->stop_hit = hit = 1;
  }
  if (ch->finished && !ch->stop_hit && ch->consumed == ch->num_tokens && !ch->ended) {
    char *text = NULL;
    size_t len = 0;
    if (ina_detokenizer_flush(ch->detok, &text, &len) != INA_OK) return -1;
    const int r = ina_stop_text_feed(&ch->stops, text, len, piece);
    free(text);
    if (r < 0) return -1;
    if (r == 1) ch->stop_hit = 1; /* the request is over already: nothing to cancel */
    if (!ch->stop_hit && ina_stop_text_flush(&ch->stops, piece) != INA_OK) return -1;
  }
  return hit;
}

/* Lock held: the choice has nothing more to say (its text is all out). */
static int choice_over(const http_choice_t *ch) {
  return ch->finished && (ch->stop_hit || ch->consumed == ch->num_tokens);
}

static void usage_of(const http_call_t *c, ina_openai_usage_t *u) {
  memset(u, 0, sizeof *u);
  for (size_t i = 0; i < c->num_choices; i++) {
    const http_choice_t *ch = &c->choices[i];
    u->prompt_tokens += ch->prompt_tokens;
    /* A stop string ends the answer at the token that completed it; tokens the scheduler
     * made before the cancel took effect are not part of the answer. */
    u->completion_tokens += ch->stop_hit                     ? (int64_t)ch->consumed
                            : ch->metrics.generated_tokens > 0 ? ch->metrics.generated_tokens
                                                               : (int64_t)ch->num_tokens;
    u->cached_tokens += ch->metrics.cached_tokens;
  }
}

/* ---- log probabilities ------------------------------------------------------------------------ */

/* The rendered form of tokens [from, to) of a choice's logprobs: the texts are each token
 * decoded alone (a piece of a character comes out as U+FFFD, as vLLM shows it). */
typedef struct rendered_logprobs {
  ina_openai_logprob_t *items;
  size_t n;
  char **texts;   /* every token text: items' and alternatives', to free */
  size_t num_texts;
  const char **top_texts;
  size_t *top_lens;
} rendered_logprobs_t;

static void rendered_release(rendered_logprobs_t *r) {
  for (size_t i = 0; i < r->num_texts; i++) free(r->texts[i]);
  free(r->texts);
  free(r->items);
  free(r->top_texts);
  free(r->top_lens);
  memset(r, 0, sizeof *r);
}

static char *token_text(const ina_tokenizer_t *tok, int32_t id, size_t *len) {
  char *text = NULL;
  if (ina_tokenizer_decode(tok, &id, 1, 0, &text, len) != INA_OK) {
    *len = 0;
    return strdup("");
  }
  return text;
}

static int render_logprobs(const ina_tokenizer_t *tok, const http_choice_t *ch, size_t from, size_t to,
                           rendered_logprobs_t *out) {
  memset(out, 0, sizeof *out);
  const size_t n = to > from ? to - from : 0;
  const size_t per = 1 + INA_REQUEST_MAX_LOGPROBS;
  out->items = calloc(n + 1, sizeof *out->items);
  out->texts = calloc(n * per + 1, sizeof *out->texts);
  out->top_texts = calloc(n * INA_REQUEST_MAX_LOGPROBS + 1, sizeof *out->top_texts);
  out->top_lens = calloc(n * INA_REQUEST_MAX_LOGPROBS + 1, sizeof *out->top_lens);
  if (!out->items || !out->texts || !out->top_texts || !out->top_lens) return -1;
  for (size_t i = 0; i < n; i++) {
    const token_logprobs_t *lp = &ch->lps[from + i];
    ina_openai_logprob_t *it = &out->items[i];
    size_t len = 0;
    char *t = token_text(tok, lp->token, &len);
    if (!t) return -1;
    out->texts[out->num_texts++] = t;
    it->token = t;
    it->token_len = len;
    it->logprob = lp->logprob;
    it->num_top = (size_t)lp->num_top;
    const char **tt = out->top_texts + i * INA_REQUEST_MAX_LOGPROBS;
    size_t *tl = out->top_lens + i * INA_REQUEST_MAX_LOGPROBS;
    for (int32_t j = 0; j < lp->num_top; j++) {
      char *a = token_text(tok, lp->top_ids[j], &tl[j]);
      if (!a) return -1;
      out->texts[out->num_texts++] = a;
      tt[j] = a;
    }
    it->top_tokens = tt;
    it->top_token_lens = tl;
    it->top_logprobs = lp->top_logprobs;
  }
  out->n = n;
  return 0;
}

/* ---- streams -------------------------------------------------------------------------------- */

static int append_event(http_call_t *c, char *json) {
  if (!json) return -1;
  const int ok = ina_text_buf_append(&c->out, "data: ", 6) == INA_OK &&
                 ina_text_buf_append(&c->out, json, strlen(json)) == INA_OK &&
                 ina_text_buf_append(&c->out, "\n\n", 2) == INA_OK;
  free(json);
  return ok ? 0 : -1;
}

/* Lock held. Renders what the choices have produced since the last call; returns the
 * choices whose stop strings were found now (to cancel), via `cancel` [num_choices]. */
static int render_stream(agent_http_t *h, http_call_t *c, int *cancel) {
  for (size_t i = 0; i < c->num_choices; i++) {
    http_choice_t *ch = &c->choices[i];
    if (ch->ended) continue;
    ina_text_buf_t piece = {0};
    const int r = advance_choice(ch, &piece);
    if (r < 0) {
      ina_text_buf_release(&piece);
      return -1;
    }
    cancel[i] = r == 1;
    const int over = choice_over(ch);
    if (over && ch->finish == INA_FINISH_ERROR && !ch->stop_hit) {
      ina_openai_error_t err;
      ina_openai_error_set(&err, 500, NULL, "choice %zu: %s", i, ch->error);
      if (append_event(c, ina_openai_render_error(&err)) < 0) return -1;
      ch->ended = 1;
    } else if (piece.len > 0 || over) {
      ina_openai_choice_t oc;
      memset(&oc, 0, sizeof oc);
      oc.text = piece.data ? piece.data : "";
      oc.text_len = piece.len;
      oc.finish_reason = over ? finish_name(ch) : NULL;
      rendered_logprobs_t rl;
      memset(&rl, 0, sizeof rl);
      if (c->req.logprobs >= 0 && ch->lps) {
        if (render_logprobs(h->tokenizer, ch, ch->lp_sent, ch->consumed, &rl) < 0) {
          rendered_release(&rl);
          ina_text_buf_release(&piece);
          return -1;
        }
        ch->lp_sent = ch->consumed;
        oc.logprobs = rl.items;
        oc.num_logprobs = rl.n;
      }
      if (c->req.endpoint == INA_OPENAI_CHAT && !ch->first_chunk_done) {
        /* The role first, in a chunk of its own as OpenAI sends it. */
        ina_openai_choice_t role;
        memset(&role, 0, sizeof role);
        role.text = "";
        if (append_event(c, ina_openai_render_chunk(c->req.endpoint, c->id, c->created, c->model, i, 1, &role, NULL)) < 0)
          return -1;
        ch->first_chunk_done = 1;
      }
      const int failed = append_event(c, ina_openai_render_chunk_at(c->req.endpoint, c->id, c->created, c->model, i,
                                                                    0, &oc, NULL, ch->text_chars)) < 0;
      ch->text_chars += ina_openai_text_chars(oc.text, oc.text_len);
      rendered_release(&rl);
      if (failed) {
        ina_text_buf_release(&piece);
        return -1;
      }
      ch->first_chunk_done = 1;
      if (over) ch->ended = 1;
    }
    ina_text_buf_release(&piece);
  }
  if (!c->finished_all) {
    int all = 1;
    for (size_t i = 0; i < c->num_choices; i++) all &= c->choices[i].ended;
    if (all) {
      if (c->req.include_usage) {
        ina_openai_usage_t u;
        usage_of(c, &u);
        if (append_event(c, ina_openai_render_chunk(c->req.endpoint, c->id, c->created, c->model, 0, 0, NULL, &u)) < 0)
          return -1;
      }
      if (ina_text_buf_append(&c->out, "data: [DONE]\n\n", 14) != INA_OK) return -1;
      c->finished_all = 1;
    }
  }
  return 0;
}

static struct timespec deadline_ms(int ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += (long)ms * 1000000L;
  ts.tv_sec += ts.tv_nsec / 1000000000L;
  ts.tv_nsec %= 1000000000L;
  return ts;
}

static void cancel_marked(http_call_t *c, const int *cancel) {
  for (size_t i = 0; i < c->num_choices; i++)
    if (cancel[i]) ina_scheduler_cancel(c->agent->scheduler, c->choices[i].g.request_id);
}

static ssize_t stream_read(void *ctx, char *buf, size_t max) {
  http_call_t *c = ctx;
  agent_http_t *h = c->http;
  int cancel[INA_OPENAI_MAX_PROMPTS] = {0};
  pthread_mutex_lock(&c->mu);
  for (int round = 0; round < 2; round++) {
    if (render_stream(h, c, cancel) < 0) {
      pthread_mutex_unlock(&c->mu);
      cancel_marked(c, cancel);
      return INA_HTTP_STREAM_END; /* out of memory: end the stream short */
    }
    if (c->out_pos < c->out.len || c->finished_all) break;
    /* Nothing to send: wait a little for the scheduler. */
    const struct timespec ts = deadline_ms(WAIT_SLICE_MS);
    pthread_cond_timedwait(&c->cv, &c->mu, &ts);
  }
  ssize_t n = INA_HTTP_STREAM_NOTHING_YET;
  if (c->out_pos < c->out.len) {
    const size_t k = c->out.len - c->out_pos < max ? c->out.len - c->out_pos : max;
    memcpy(buf, c->out.data + c->out_pos, k);
    c->out_pos += k;
    if (c->out_pos == c->out.len) c->out_pos = c->out.len = 0;
    n = (ssize_t)k;
  } else if (c->finished_all) {
    n = INA_HTTP_STREAM_END;
  }
  pthread_mutex_unlock(&c->mu);
  cancel_marked(c, cancel);
  return n;
}

static void stream_done(void *ctx, int completed) {
  http_call_t *c = ctx;
  if (!completed) cancel_choices(c); /* the client went away: its pages go back */
  call_release_http(c);
}

static const ina_http_stream_ops_t stream_ops = {stream_read, stream_done};

/* ---- whole answers ---------------------------------------------------------------------- */

/* Waits for every choice (cancelling them all if the client goes away) and answers. */
static void answer_whole(agent_http_t *h, http_call_t *c, const ina_http_request_t *hreq, ina_http_reply_t *reply) {
  int cancel[INA_OPENAI_MAX_PROMPTS] = {0};
  int gone = 0;
  pthread_mutex_lock(&c->mu);
  for (;;) {
    int all = 1, failed = 0;
    for (size_t i = 0; i < c->num_choices; i++) {
      http_choice_t *ch = &c->choices[i];
      if (!ch->ended) {
        const int r = advance_choice(ch, &ch->text);
        if (r < 0) failed = 1;
        cancel[i] = r == 1;
        if (choice_over(ch)) ch->ended = 1;
      }
      all &= ch->ended;
    }
    if (failed || all) break;
    int any_cancel = 0;
    for (size_t i = 0; i < c->num_choices; i++) any_cancel |= cancel[i];
    if (any_cancel) {
      pthread_mutex_unlock(&c->mu);
      cancel_marked(c, cancel);
      memset(cancel, 0, sizeof cancel);
      pthread_mutex_lock(&c->mu);
      continue;
    }
    const struct timespec ts = deadline_ms(WAIT_SLICE_MS);
    pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    if (!gone && ina_http_request_client_gone(hreq)) {
      gone = 1;
      pthread_mutex_unlock(&c->mu);
      cancel_choices(c);
      pthread_mutex_lock(&c->mu);
    }
  }
  for (size_t i = 0; i < c->num_choices; i++)
    if (c->choices[i].finish == INA_FINISH_ERROR && !c->choices[i].stop_hit) {
      ina_openai_error_t err;
      ina_openai_error_set(&err, 500, NULL, "choice %zu: %s", i, c->choices[i].error);
      pthread_mutex_unlock(&c->mu);
      reply_error(reply, &err);
      return;
    }
  ina_openai_choice_t oc[INA_OPENAI_MAX_PROMPTS];
  rendered_logprobs_t rl[INA_OPENAI_MAX_PROMPTS];
  memset(oc, 0, sizeof oc);
  memset(rl, 0, sizeof rl);
  int failed = 0;
  for (size_t i = 0; i < c->num_choices; i++) {
    oc[i].text = c->choices[i].text.data ? c->choices[i].text.data : "";
    oc[i].text_len = c->choices[i].text.len;
    oc[i].finish_reason = finish_name(&c->choices[i]);
    if (c->req.logprobs >= 0 && c->choices[i].lps) {
      failed |= render_logprobs(h->tokenizer, &c->choices[i], 0, c->choices[i].consumed, &rl[i]) < 0;
      oc[i].logprobs = rl[i].items;
      oc[i].num_logprobs = rl[i].n;
    }
  }
  ina_openai_usage_t u;
  usage_of(c, &u);
  char *body = failed ? NULL : ina_openai_render_response(c->req.endpoint, c->id, c->created, c->model, oc, c->num_choices, &u);
  pthread_mutex_unlock(&c->mu);
  for (size_t i = 0; i < c->num_choices; i++) rendered_release(&rl[i]);
  reply_json(reply, 200, body);
}

/* ---- POST /v1/completions, /v1/chat/completions ---------------------------------------------- */

/* The prompt ids of choice i: the given ids, or the text tokenized (BOS as the checkpoint
 * asks for completions; a chat prompt's template writes its own). */
static int prompt_ids(agent_http_t *h, const http_call_t *c, size_t i, const char *chat_text, size_t chat_len,
                      int32_t **ids, size_t *n, ina_openai_error_t *err) {
  if (c->req.endpoint == INA_OPENAI_COMPLETIONS && c->req.prompts[i].ids) {
    *ids = malloc(c->req.prompts[i].num_ids * sizeof **ids);
    if (!*ids) return ina_openai_error_set(err, 500, NULL, "out of memory");
    memcpy(*ids, c->req.prompts[i].ids, c->req.prompts[i].num_ids * sizeof **ids);
    *n = c->req.prompts[i].num_ids;
    return 0;
  }
  const int chat = c->req.endpoint == INA_OPENAI_CHAT;
  const char *text = chat ? chat_text : c->req.prompts[i].text;
  const size_t len = chat ? chat_len : c->req.prompts[i].text_len;
  if (ina_tokenizer_encode(h->tokenizer, text, len, !chat, ids, n) != INA_OK)
    return ina_openai_error_set(err, 400, chat ? "messages" : "prompt", "the prompt cannot be tokenized: %s",
                                ina_last_error());
  if (*n == 0) {
    free(*ids);
    *ids = NULL;
    return ina_openai_error_set(err, 400, chat ? "messages" : "prompt",
                                "the prompt is empty after tokenization (at least one token is needed)");
  }
  return 0;
}

/* Renders the chat prompt with the checkpoint's format (tokenizer/chat_format.h). */
static int chat_prompt(agent_http_t *h, const http_call_t *c, char **text, size_t *len, ina_openai_error_t *err);

static http_call_t *call_new(ina_agent_t *agent, const char *model) {
  http_call_t *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->agent = agent;
  c->model = model;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  c->created = unix_now();
  return c;
}

static void handle_generate(agent_http_t *h, ina_openai_endpoint_t endpoint, const ina_http_request_t *hreq,
                            ina_http_reply_t *reply) {
  ina_agent_t *agent = h->agent;
  ina_openai_error_t err;
  memset(&err, 0, sizeof err);
  size_t body_len = 0;
  const char *body = ina_http_request_body(hreq, &body_len);
  const ina_model_config_t *cfg = ina_model_config(agent->model);
  http_call_t *c = call_new(agent, h->served_name);
  if (c) {
    c->http = h;
    atomic_fetch_add(&h->active_calls, 1);
  }
  char *chat_text = NULL;
  size_t chat_len = 0;
  if (!c) {
    ina_openai_error_set(&err, 500, NULL, "out of memory");
    goto refuse;
  }
  if (ina_openai_parse_request(endpoint, body, body_len, cfg->vocab_size, 0, &c->req, &err) != INA_OK) goto refuse;
  if (strcmp(c->req.model, h->served_name) != 0) {
    ina_openai_error_set(&err, 404, "model", "the model '%s' does not exist; this server serves '%s'", c->req.model,
                         h->served_name);
    err.type = "not_found_error";
    goto refuse;
  }
  if (!h->tokenizer) { /* answers are text, whatever the prompt */
    ina_openai_error_set(&err, 400, NULL, "this model has no tokenizer, so the server cannot answer in text: %s",
                         h->tokenizer_error);
    goto refuse;
  }
  if (endpoint == INA_OPENAI_CHAT && chat_prompt(h, c, &chat_text, &chat_len, &err) != 0) goto refuse;
  {
    const size_t n = endpoint == INA_OPENAI_CHAT ? 1 : c->req.num_prompts;
    c->choices = calloc(n, sizeof *c->choices);
    if (!c->choices) {
      ina_openai_error_set(&err, 500, NULL, "out of memory");
      goto refuse;
    }
    c->num_choices = n;
  }
  {
    static atomic_ullong serial;
    const unsigned long long k = (unsigned long long)atomic_fetch_add(&serial, 1) + 1;
    snprintf(c->id, sizeof c->id, "%s-%016llx%04llx", endpoint == INA_OPENAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)pick_seed(), k & 0xffffull);
  }
  for (size_t i = 0; i < c->num_choices; i++) {
    http_choice_t *ch = &c->choices[i];
    ch->call = c;
    ch->index = i;
    ch->g.agent = agent;
    char rid[80];
    snprintf(rid, sizeof rid, "%s-%zu", c->id, i);
    ch->g.request_id = strdup(rid);
    if (!ch->g.request_id || ina_detokenizer_create(h->tokenizer, 1, &ch->detok) != INA_OK ||
        ina_stop_text_init(&ch->stops, (const char *const *)c->req.stop, c->req.stop_len, c->req.num_stop) != INA_OK) {
      ina_openai_error_set(&err, 500, NULL, "cannot set the request up: %s", ina_last_error());
      goto refuse;
    }
  }
  /* Check every prompt before submitting any, so that a refusal submits nothing. */
  int32_t *prompt_of[INA_OPENAI_MAX_PROMPTS] = {0};
  size_t len_of[INA_OPENAI_MAX_PROMPTS] = {0};
  int64_t max_tokens[INA_OPENAI_MAX_PROMPTS];
  int failed = 0;
  for (size_t i = 0; i < c->num_choices && !failed; i++) {
    if (prompt_ids(h, c, i, chat_text, chat_len, &prompt_of[i], &len_of[i], &err) != 0) {
      failed = 1;
      break;
    }
    c->choices[i].prompt_tokens = (int64_t)len_of[i];
    const int64_t room = agent->max_context - (int64_t)len_of[i];
    max_tokens[i] = c->req.max_tokens >= 0 ? c->req.max_tokens
                    : endpoint == INA_OPENAI_COMPLETIONS ? COMPLETIONS_DEFAULT_MAX_TOKENS : room;
    if (room < 1 || max_tokens[i] > room) {
      ina_openai_error_set(&err, 400, c->req.max_tokens >= 0 ? "max_tokens" : "messages",
                           "%s: this model's maximum context length is %lld tokens, but the request asks for %lld "
                           "(%zu in the prompt%s, %lld to generate)",
                           c->req.max_tokens >= 0 ? "max_tokens" : "messages",
                           (long long)agent->max_context, (long long)len_of[i] + (max_tokens[i] > 0 ? max_tokens[i] : 0),
                           len_of[i], c->num_choices > 1 ? " of this choice" : "", (long long)max_tokens[i]);
      failed = 1;
    }
  }
  int32_t *stop_ids = NULL;
  if (!failed) {
    stop_ids = malloc((c->req.num_stop_token_ids + 1) * sizeof *stop_ids);
    if (!stop_ids) {
      ina_openai_error_set(&err, 500, NULL, "out of memory");
      failed = 1;
    } else {
      for (size_t k = 0; k < c->req.num_stop_token_ids; k++) stop_ids[k] = c->req.stop_token_ids[k];
    }
  }
  const uint64_t seed = c->req.has_seed ? c->req.seed : pick_seed();
  for (size_t i = 0; i < c->num_choices && !failed; i++) {
    http_choice_t *ch = &c->choices[i];
    ina_request_t r = INA_REQUEST_INIT;
    r.id = ch->g.request_id;
    r.prompt = prompt_of[i];
    r.prompt_len = (int32_t)len_of[i];
    r.max_new_tokens = (int32_t)max_tokens[i];
    r.sampling.temperature = (float)c->req.temperature;
    r.sampling.top_p = (float)c->req.top_p;
    r.sampling.top_k = c->req.top_k > 0 ? c->req.top_k : 0;
    r.sampling.seed = seed + i; /* each choice its own stream, reproducible from the seed */
    r.stop_ids = stop_ids;
    r.num_stop_ids = (int32_t)c->req.num_stop_token_ids;
    r.ignore_eos = c->req.ignore_eos;
    r.logprobs = c->req.logprobs;
    r.callback = on_event;
    r.user_data = ch;
    ch->g.prompt_tokens = (uint32_t)len_of[i];
    pthread_mutex_lock(&c->mu);
    c->outstanding++; /* before submit: the callback may finish it at once */
    pthread_mutex_unlock(&c->mu);
    char msg[INA_RPC_MESSAGE_MAX] = "";
    const ina_rpc_code_t code = agent_submit_generation(agent, &ch->g, &r, msg);
    if (code != INA_RPC_OK) {
      pthread_mutex_lock(&c->mu);
      c->outstanding--;
      pthread_mutex_unlock(&c->mu);
      agent_metrics_refused(agent->metrics, code);
      ina_openai_error_set(&err, status_of(code), NULL, "%s", msg);
      if (code == INA_RPC_RESOURCE_EXHAUSTED) err.type = "rate_limit_error";
      if (code == INA_RPC_UNAVAILABLE) err.type = "server_error";
      failed = 1;
      break;
    }
    ch->submitted = 1;
  }
  free(stop_ids);
  for (size_t i = 0; i < c->num_choices; i++) free(prompt_of[i]);
  free(chat_text);
  chat_text = NULL;
  if (failed) {
    cancel_choices(c); /* those submitted already end as cancelled */
    reply_error(reply, &err);
    call_release_http(c);
    return;
  }
  if (c->req.stream) {
    reply->status = 200;
    reply->content_type = SSE_TYPE;
    reply->stream = &stream_ops;
    reply->stream_ctx = c; /* stream_done releases it */
    return;
  }
  answer_whole(h, c, hreq, reply);
  call_release_http(c);
  return;

refuse:
  free(chat_text);
  if (c) call_release_http(c);
  reply_error(reply, &err);
}

/* ---- chat ------------------------------------------------------------------------------------ */

static int chat_prompt(agent_http_t *h, const http_call_t *c, char **text, size_t *len, ina_openai_error_t *err) {
  if (!h->has_chat_format)
    return ina_openai_error_set(err, 400, "messages", "this server has no chat format for the model: %s",
                                h->chat_format_error);
  static const char *const roles[] = {"system", "user", "assistant"};
  ina_chat_message_t *m = calloc(c->req.num_messages + 1, sizeof *m);
  if (!m) return ina_openai_error_set(err, 500, NULL, "out of memory");
  for (size_t i = 0; i < c->req.num_messages; i++) {
    m[i].role = roles[c->req.messages[i].role];
    m[i].content = c->req.messages[i].content;
  }
  ina_chat_options_t o = INA_CHAT_OPTIONS_INIT;
  o.add_generation_prompt = c->req.add_generation_prompt;
  o.thinking = c->req.thinking > 0;
  const int32_t bos = ina_tokenizer_bos_id(h->tokenizer), eos = ina_tokenizer_eos_id(h->tokenizer);
  if (bos >= 0) o.bos_token = ina_tokenizer_id_to_token(h->tokenizer, bos);
  if (eos >= 0) o.eos_token = ina_tokenizer_id_to_token(h->tokenizer, eos);
  const ina_status_t st = ina_chat_render(h->chat_format, m, c->req.num_messages, &o, text, len);
  free(m);
  if (st != INA_OK)
    return ina_openai_error_set(err, 400, "messages", "%s (chat format %s)", ina_last_error(),
                                ina_chat_format_name(h->chat_format));
  return 0;
}

/* The chat format: the one named, else the checkpoint template's, else (a built-in
 * model, which has no template) its architecture's. Unknown name: a start-up error;
 * an unrecognized template: chat answers 400 saying so, completions keep working. */
static ina_status_t pick_chat_format(agent_http_t *h, const char *name) {
  ina_status_t st = INA_OK;
  if (name && name[0]) {
    INA_CHECK(ina_chat_format_from_name(name, &h->chat_format));
    h->has_chat_format = 1;
    return INA_OK;
  }
  if (!h->tokenizer) {
    snprintf(h->chat_format_error, sizeof h->chat_format_error, "no tokenizer (%s)", h->tokenizer_error);
    return INA_OK;
  }
  const char *tmpl = ina_tokenizer_chat_template(h->tokenizer);
  if (!tmpl && !ina_model_from_checkpoint(h->agent->model)) {
    h->chat_format = ina_cfg_has_indexer(ina_model_config(h->agent->model)) ? INA_CHAT_DEEPSEEK_V3_2 : INA_CHAT_DEEPSEEK_V3;
    h->has_chat_format = 1;
    return INA_OK;
  }
  if (ina_chat_format_recognize(tmpl, &h->chat_format) == INA_OK) {
    h->has_chat_format = 1;
  } else {
    snprintf(h->chat_format_error, sizeof h->chat_format_error, "%s", ina_last_error());
    INA_LOG_W(INA_LOG_SUBSYS, "/v1/chat/completions is off: %s", h->chat_format_error);
  }
fail:
  return st;
}

/* ---- routing ----------------------------------------------------------------------------------- */

static int authorized(const agent_http_t *h, const ina_http_request_t *req) {
  if (!h->api_key) return 1;
  const char *auth = ina_http_request_header(req, "Authorization");
  if (!auth || strncmp(auth, "Bearer ", 7) != 0) return 0;
  /* Compare every byte whatever the first mismatch: no timing hint at the key. */
  const char *given = auth + 7;
  const size_t n = strlen(h->api_key), m = strlen(given);
  unsigned diff = (unsigned)(n != m);
  for (size_t i = 0; i < n; i++) diff |= (unsigned)(h->api_key[i] ^ (i < m ? given[i] : 0));
  return diff == 0;
}

static void handle(void *ctx, const ina_http_request_t *req, ina_http_reply_t *reply) {
  agent_http_t *h = ctx;
  const char *method = ina_http_request_method(req), *path = ina_http_request_path(req);
  ina_openai_error_t err;
  memset(&err, 0, sizeof err);
  const int post = strcmp(method, "POST") == 0, get = strcmp(method, "GET") == 0;
  if (strcmp(path, "/health") == 0) {
    pthread_mutex_lock(&h->agent->lock);
    const int serving = h->agent->state == AGENT_SERVING;
    pthread_mutex_unlock(&h->agent->lock);
    reply->status = serving ? 200 : 503;
    reply->content_type = "text/plain; charset=utf-8";
    reply->body = strdup(serving ? "" : "not serving\n");
    reply->body_len = reply->body ? strlen(reply->body) : 0;
    return;
  }
  const int completions = strcmp(path, "/v1/completions") == 0, chat = strcmp(path, "/v1/chat/completions") == 0,
            models = strcmp(path, "/v1/models") == 0;
  if (!completions && !chat && !models) {
    ina_openai_error_set(&err, 404, NULL, "no route %s %s (this server has POST /v1/completions, POST "
                         "/v1/chat/completions, GET /v1/models, GET /health)", method, path);
    err.type = "not_found_error";
    reply_error(reply, &err);
    return;
  }
  if (!authorized(h, req)) {
    ina_openai_error_set(&err, 401, NULL, "a valid API key is needed: send the header 'Authorization: Bearer KEY'");
    err.type = "authentication_error";
    reply_error(reply, &err);
    return;
  }
  if ((models && !get) || (!models && !post)) {
    ina_openai_error_set(&err, 405, NULL, "%s %s: method not allowed (use %s)", method, path, models ? "GET" : "POST");
    reply_error(reply, &err);
    reply->header_name = "Allow";
    reply->header_value = models ? "GET" : "POST";
    return;
  }
  if (models) {
    reply_json(reply, 200, ina_openai_render_models(h->served_name, h->created, h->agent->max_context));
    return;
  }
  handle_generate(h, chat ? INA_OPENAI_CHAT : INA_OPENAI_COMPLETIONS, req, reply);
}

/* ---- start / stop ------------------------------------------------------------------------------- */

ina_status_t agent_http_start(ina_agent_t *agent, const agent_http_options_t *o, agent_http_t **out) {
  ina_status_t st = INA_OK;
  agent_http_t *h = NULL;
  *out = NULL;
  char host[256];
  int port = 0;
  INA_CHECK(agent_parse_listen("HTTP listen address", o->listen, host, sizeof host, &port));
  h = calloc(1, sizeof *h);
  INA_CHECK_ALLOC(h);
  h->agent = agent;
  h->created = unix_now();
  h->served_name = strdup(o->served_name && o->served_name[0] ? o->served_name : agent->model_name);
  INA_CHECK_ALLOC(h->served_name);
  if (o->api_key && o->api_key[0]) {
    h->api_key = strdup(o->api_key);
    INA_CHECK_ALLOC(h->api_key);
  }
  if (o->tokenizer && o->tokenizer[0]) {
    /* One the operator named: it must load and cover every id the model can produce. */
    const int32_t vocab = ina_model_config(agent->model)->vocab_size;
    INA_CHECK(ina_tokenizer_load_dir(o->tokenizer, &h->tokenizer));
    INA_REQUIRE(ina_tokenizer_vocab_size(h->tokenizer) >= vocab, INA_ERR_INVALID_ARGUMENT,
                "--tokenizer %s: %d ids, fewer than the model's vocabulary of %d", o->tokenizer,
                ina_tokenizer_vocab_size(h->tokenizer), vocab);
    INA_LOG_I(INA_LOG_SUBSYS, "tokenizer %s (%d ids)", o->tokenizer, ina_tokenizer_vocab_size(h->tokenizer));
  } else {
    /* A checkpoint's own tokenizer, or the built-in one of a built-in model. */
    const ina_status_t ts = ina_model_from_checkpoint(agent->model) ? ina_tokenizer_load_dir(agent->model_name, &h->tokenizer)
                                                                     : ina_tokenizer_builtin(agent->model_name, &h->tokenizer);
    if (ts != INA_OK) {
      snprintf(h->tokenizer_error, sizeof h->tokenizer_error, "%s", ina_last_error());
      INA_LOG_W(INA_LOG_SUBSYS, "no tokenizer: %s; the HTTP API answers text requests with an error",
                h->tokenizer_error);
    }
  }
  INA_CHECK(pick_chat_format(h, o->chat_format));
  if (h->has_chat_format) INA_LOG_I(INA_LOG_SUBSYS, "chat format %s", ina_chat_format_name(h->chat_format));
  ina_http_server_options_t so = INA_HTTP_SERVER_OPTIONS_INIT;
  so.address = host;
  so.port = port;
  so.tls_cert_file = o->tls_cert_file;
  so.tls_key_file = o->tls_key_file;
  INA_CHECK(ina_http_server_start(&so, handle, h, &h->server));
  *out = h;
  return INA_OK;
fail:
  agent_http_stop(h);
  return st;
}

int agent_http_port(const agent_http_t *h) { return h ? ina_http_server_port(h->server) : 0; }

/* Streams of generations that just ended still send their last events: let them, for a
 * bounded time, before the connections close. */
#define STOP_FLUSH_MS 5000

void agent_http_stop(agent_http_t *h) {
  if (!h) return;
  for (int waited = 0; atomic_load(&h->active_calls) > 0 && waited < STOP_FLUSH_MS; waited += 2) {
    const struct timespec pause = {0, 2000000L};
    nanosleep(&pause, NULL);
  }
  ina_http_server_stop(h->server);
  ina_tokenizer_destroy(h->tokenizer);
  free(h->served_name);
  free(h->api_key);
  free(h);
}
