/* Next-token sampler: from one row of LM-head logits to a token id, with the semantics
 * of Hugging Face generate's warpers (transformers generation/logits_process.py).
 *
 * temperature == 0: greedy, the first index of the largest logit (like torch.argmax,
 * but NaN entries are skipped); top_k and top_p are then ignored, as generate ignores its
 * warpers without do_sample.
 *
 * temperature > 0: the warpers in generate's order, then one draw:
 *   1. temperature: logits / temperature (applied as exp((x - max) / T) inside the
 *      softmax: the same distribution without overflow for tiny T);
 *   2. top_k (0 = off): keep every token whose logit is >= the k-th largest logit, so
 *      tokens tied with the k-th are all kept (TopKLogitsWarper: scores < kth are
 *      removed); top_k >= vocab keeps everything;
 *   3. top_p (1 = off): over the probabilities left by 1-2, keep the smallest set of most
 *      probable tokens whose cumulative probability reaches top_p, at least one token
 *      (TopPLogitsWarper: sort ascending, remove while the cumulative sum from the
 *      bottom is <= 1 - top_p). Among equal probabilities the lower token id ranks as
 *      more probable (torch.sort leaves that order unspecified);
 *   4. softmax over the kept tokens and a draw with the sampler's own generator.
 * transformers fills unset generation options with defaults (temperature 1, top_k 50,
 * top_p 1); these params have no hidden defaults: top_k 0 is off, so a client that wants
 * generate's behaviour passes top_k = 50 itself.
 * The draws cannot reproduce torch.multinomial's random stream; the distribution is the
 * same. Draw n of a request (n = 0, 1, ... counting the successful ina_sampler_sample
 * calls since create or reset) is a pure function of (seed, n): the splitmix64 mix of
 * seed + (n + 1) * 0x9E3779B97F4A7C15. Same seed and logits, same tokens.
 *
 * Logits when sampling (temperature > 0): NaN and +inf are rejected (torch.multinomial
 * would fail on the resulting probabilities); -inf marks a forbidden token and is never
 * drawn; at least one logit must be finite.
 *
 * Ownership: the sampler owns its scratch (O(vocab)); callers own logits and outputs.
 * Thread safety: a sampler is used by one thread at a time; distinct samplers are
 * independent; ina_argmax_f32 and ina_sampling_params_validate are reentrant. */
#ifndef INA_MODEL_SAMPLER_H
#define INA_MODEL_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_sampling_params {
  size_t struct_size; /* sizeof(ina_sampling_params_t), set by the INIT macro */
  uint32_t version;   /* 1 */
  float temperature;  /* >= 0 and finite; 0 = greedy */
  int32_t top_k;      /* >= 0; 0 = off */
  float top_p;        /* in (0, 1]; 1 = off */
  uint64_t seed;      /* the request's random stream */
} ina_sampling_params_t;

#define INA_SAMPLING_PARAMS_INIT {sizeof(ina_sampling_params_t), 1, 0.0f, 0, 1.0f, 0}

/* One request's sampler: scratch for one vocabulary size and the draw counter. */
typedef struct ina_sampler ina_sampler_t;

/* INA_ERR_INVALID_ARGUMENT, naming the field and value, unless struct_size / version
 * are valid, temperature is finite and >= 0, top_k >= 0 and top_p is in (0, 1]. */
ina_status_t ina_sampling_params_validate(const ina_sampling_params_t *p);

/* vocab >= 1. Copies the params. On failure *out = NULL. */
ina_status_t ina_sampler_create(int32_t vocab, const ina_sampling_params_t *p,
                                ina_sampler_t **out);
/* Starts a new request on the same scratch: new params (and seed), draw counter 0.
 * On failure the sampler keeps its previous params and counter. */
ina_status_t ina_sampler_reset(ina_sampler_t *s, const ina_sampling_params_t *p);
/* NULL is a no-op. */
void ina_sampler_destroy(ina_sampler_t *s);

/* logits [vocab] -> *token. A successful call advances the draw counter by one (also
 * when greedy, so the stream position always equals the number of tokens sampled); a
 * failed one leaves it and sets *token = -1. Greedy fails only when every logit is NaN. */
ina_status_t ina_sampler_sample(ina_sampler_t *s, const float *logits, int32_t *token);

/* Advances the draw counter by n, as n ina_sampler_sample calls would: a request whose
 * first tokens were sampled elsewhere with the same params (prefill/decode
 * disaggregation) goes on with the draw that comes next. NULL is a no-op. */
void ina_sampler_skip(ina_sampler_t *s, uint64_t n);
/* The distribution ina_sampler_sample draws from, written to probs [vocab] (0 for every
 * filtered token; one-hot at the argmax when greedy). Does not advance the counter. */
ina_status_t ina_sampler_probs(ina_sampler_t *s, const float *logits, float *probs);

/* First index of the maximum of x[0..n); NaN entries are skipped. 0 when every entry
 * is NaN, -1 when n <= 0 or x is NULL. */
int32_t ina_argmax_f32(const float *x, int32_t n);

#ifdef __cplusplus
}
#endif
#endif
