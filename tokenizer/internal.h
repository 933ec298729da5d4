/* What the tokenizer's source files share: the loaded tokenizer's layout, the text
 * pieces an encode passes from stage to stage, and the small helpers (UTF-8, hash maps,
 * growable buffers, PCRE2 regexes) the stages use. Not a public header.
 *
 * Every stage mirrors the Hugging Face `tokenizers` component of the same name; the
 * comments say which behavior of that library a piece of code reproduces. */
#ifndef INA_TOKENIZER_INTERNAL_H
#define INA_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

/* Longest JSON path in messages ("pre_tokenizer.pretokenizers[1].pattern"). */
#define TK_PATH_MAX 256

/* ---- growable byte buffer --------------------------------------------------------- */

typedef struct tk_buf {
  char *p;
  size_t len, cap;
} tk_buf_t;

ina_status_t tk_buf_reserve(tk_buf_t *b, size_t extra);
ina_status_t tk_buf_append(tk_buf_t *b, const void *s, size_t n);
void tk_buf_free(tk_buf_t *b);

/* ---- UTF-8 ------------------------------------------------------------------------ */

/* Decodes the character at s[0..n) (n >= 1). Returns its code point and sets *adv to its
 * length, or returns -1 for an ill-formed sequence with *adv the length of its maximal
 * subpart (Unicode's "substitution of maximal subparts", which Rust's from_utf8_lossy and
 * Python's errors='replace' both follow). *truncated is set when that subpart is a valid
 * prefix cut short by the end of the input (a character a later byte could complete). */
int32_t tk_utf8_next(const unsigned char *s, size_t n, size_t *adv, int *truncated);
/* Length of the UTF-8 encoding of cp (1..4), written to out. */
size_t tk_utf8_put(uint32_t cp, char *out);
/* Appends s with every ill-formed subsequence replaced by U+FFFD. */
ina_status_t tk_utf8_lossy(tk_buf_t *out, const char *s, size_t n);
/* 1 when s[0..n) is well-formed UTF-8. */
int tk_utf8_valid(const char *s, size_t n);

/* Character classes of Rust's char / regex crate that `tokenizers` relies on. */
int tk_is_white_space(uint32_t cp); /* char::is_whitespace (Unicode White_Space) */
int tk_is_numeric(uint32_t cp);     /* char::is_numeric (Nd, Nl, No) */
int tk_is_word(uint32_t cp);        /* regex \w (Alphabetic, M, Nd, Pc, Join_Control) */

/* ---- string → int32 hash map (token strings to ids) -------------------------------- */

typedef struct tk_strmap {
  /* Open addressing: slot i holds key index keys[i] (or -1 when empty). */
  int32_t *slots;
  size_t mask;
  const char **keys; /* borrowed strings */
  uint32_t *key_lens;
  int32_t *values;
  size_t count, cap;
} tk_strmap_t;

ina_status_t tk_strmap_init(tk_strmap_t *m, size_t expected);
/* Sets key → value; returns the previous value through *old (-1 when new). The key is
 * borrowed and must outlive the map. */
ina_status_t tk_strmap_put(tk_strmap_t *m, const char *key, size_t len, int32_t value, int32_t *old);
int32_t tk_strmap_get(const tk_strmap_t *m, const char *key, size_t len);
void tk_strmap_free(tk_strmap_t *m);

/* ---- regexes ---------------------------------------------------------------------- */

typedef struct tk_regex {
  pcre2_code *code;
} tk_regex_t;

/* Compiles a `tokenizers` regex (Oniguruma syntax as its SysRegex reads it) or, with
 * literal set, a plain string. `where` names it in messages. */
ina_status_t tk_regex_compile(tk_regex_t *re, const char *pattern, size_t len, int literal, const char *where);
void tk_regex_free(tk_regex_t *re);

/* Per-call matching state (PCRE2 match data and, when a long input needs it, a larger JIT
 * stack), so that one compiled regex serves every thread. */
typedef struct tk_matcher {
  pcre2_match_data *md;
  pcre2_match_context *mctx;
  pcre2_jit_stack *jit_stack;
} tk_matcher_t;

void tk_matcher_free(tk_matcher_t *m);

/* One match of a find-all iteration over s[0..n), as Oniguruma's find_iter yields them
 * (empty matches included, but never one right where the previous match ended). */
typedef struct tk_match {
  size_t start, end;
  int is_match;
} tk_match_t;

typedef struct tk_matches {
  tk_match_t *v;
  size_t n, cap;
} tk_matches_t;

/* Appends the splits of `tokenizers`' Pattern::find_matches: the matches and the gaps
 * between them, covering s[0..n) in order (one empty gap when n is 0). */
ina_status_t tk_regex_find_matches(const tk_regex_t *re, tk_matcher_t *m, const char *s, size_t n,
                                   tk_matches_t *out);
ina_status_t tk_matches_push(tk_matches_t *ms, size_t start, size_t end, int is_match);

/* ---- text pieces ------------------------------------------------------------------ */

/* One piece of the text between stages: either text (id < 0) still to be tokenized, or an
 * added token already found (id >= 0, no text). */
typedef struct tk_piece {
  size_t off, len; /* into the owning tk_pieces_t's text */
  int32_t id;
} tk_piece_t;

typedef struct tk_pieces {
  tk_buf_t text;
  tk_piece_t *v;
  size_t n, cap;
} tk_pieces_t;

/* Appends a text piece (nothing when n is 0: `tokenizers` drops empty splits). */
ina_status_t tk_pieces_text(tk_pieces_t *p, const char *s, size_t n);
/* Adds a text piece for text already appended to p->text at [off, off + len). */
ina_status_t tk_pieces_range(tk_pieces_t *p, size_t off, size_t len);
ina_status_t tk_pieces_token(tk_pieces_t *p, int32_t id);
void tk_pieces_reset(tk_pieces_t *p);
void tk_pieces_free(tk_pieces_t *p);

/* What a stage of encode may use: the matcher and scratch buffers of this call. */
typedef struct tk_scratch {
  tk_matcher_t matcher;
  tk_matches_t matches;
  tk_buf_t buf;
  /* BPE's symbols and queue (bpe.c). */
  void *sym;
  size_t sym_cap;
  void *heap;
  size_t heap_cap;
} tk_scratch_t;

void tk_scratch_free(tk_scratch_t *s);

/* ---- normalizer (normalize.c) ------------------------------------------------------ */

typedef enum { TK_NORM_NFC, TK_NORM_NFD, TK_NORM_NFKC, TK_NORM_NFKD } tk_norm_kind_t;

typedef struct tk_normalizer {
  tk_norm_kind_t *steps; /* applied in order; none: the identity */
  size_t n;
} tk_normalizer_t;

ina_status_t tk_normalizer_parse(const json_t *j, const char *origin, const char *path, tk_normalizer_t *out);
/* Appends the normalized s[0..n) (well-formed UTF-8) to out. */
ina_status_t tk_normalize(const tk_normalizer_t *nz, const char *s, size_t n, tk_buf_t *out);
void tk_normalizer_free(tk_normalizer_t *nz);

/* ---- pre-tokenizer (pretokenize.c) ------------------------------------------------- */

typedef enum {
  TK_SPLIT_REMOVED,
  TK_SPLIT_ISOLATED,
  TK_SPLIT_MERGED_WITH_PREVIOUS,
  TK_SPLIT_MERGED_WITH_NEXT,
  TK_SPLIT_CONTIGUOUS
} tk_split_behavior_t;

typedef enum { TK_PRE_SPLIT, TK_PRE_BYTE_LEVEL, TK_PRE_DIGITS } tk_pre_kind_t;

typedef struct tk_pre_step {
  tk_pre_kind_t kind;
  tk_regex_t re; /* SPLIT: the pattern; BYTE_LEVEL with use_regex: GPT-2's */
  tk_split_behavior_t behavior;
  int invert;
  int add_prefix_space, use_regex; /* BYTE_LEVEL */
  int individual_digits;           /* DIGITS */
} tk_pre_step_t;

typedef struct tk_pretokenizer {
  tk_pre_step_t *steps;
  size_t n;
} tk_pretokenizer_t;

ina_status_t tk_pretokenizer_parse(const json_t *j, const char *origin, const char *path, tk_pretokenizer_t *out);
/* A SplitPattern, {"Regex": "..."} or {"String": "..."} (Split and Replace use them). */
ina_status_t tk_parse_pattern(const json_t *j, const char *origin, const char *path, tk_regex_t *re);
/* Runs the steps over the text pieces of *p (added tokens pass through); *p is replaced. */
ina_status_t tk_pretokenize(const tk_pretokenizer_t *pt, tk_scratch_t *sc, tk_pieces_t *p, tk_pieces_t *tmp);
void tk_pretokenizer_free(tk_pretokenizer_t *pt);

/* Split behaviors over find_matches output (`NormalizedString::split`): appends the
 * kept pieces of s to out. */
ina_status_t tk_split_apply(const char *s, const tk_matches_t *ms, tk_split_behavior_t behavior,
                            tk_pieces_t *out);

/* ByteLevel's byte ↔ character table (GPT-2's bytes_to_unicode). */
extern const uint16_t tk_byte_to_cp[256];
/* The byte of a ByteLevel character, -1 when cp is not one. */
int tk_cp_to_byte(uint32_t cp);

/* ---- BPE model (bpe.c) ------------------------------------------------------------- */

typedef struct tk_merge_slot {
  uint64_t key; /* (left << 32 | right) + 1; 0: empty */
  uint32_t rank;
  int32_t new_id;
} tk_merge_slot_t;

typedef struct tk_bpe {
  tk_strmap_t vocab;      /* token string → id (keys point into tokens[]) */
  size_t vocab_count;     /* entries of the model's vocabulary */
  tk_merge_slot_t *merges; /* open addressing */
  size_t merge_mask;
  size_t num_merges;
  int32_t char_id[512];   /* id of the one-character token for code points < 512, -1 none */
  int32_t byte_fallback_id[256]; /* <0xXX> tokens when byte_fallback, -1 none */
  int byte_fallback, ignore_merges, fuse_unk;
  int32_t unk_id; /* -1: none */
} tk_bpe_t;

ina_status_t tk_bpe_parse(const json_t *model, const char *origin, ina_tokenizer_t *tok);
/* Appends the ids of one pre-tokenized word to ids. */
ina_status_t tk_bpe_word(const tk_bpe_t *bpe, tk_scratch_t *sc, const char *w, size_t n, int32_t **ids,
                         size_t *count, size_t *cap);
void tk_bpe_free(tk_bpe_t *bpe);

/* ---- added tokens (added_tokens.c) ------------------------------------------------- */

typedef struct tk_added {
  char *content;
  size_t len;
  int32_t id;
  int special, single_word, lstrip, rstrip, normalized;
} tk_added_t;

/* A byte trie over token contents for leftmost-longest matching (Aho-Corasick's
 * LeftmostLongest, which `tokenizers` uses, finds the same matches: at the leftmost
 * position where some token matches, the longest one). Children are sibling lists;
 * `first` filters the positions where no token can start. */
typedef struct tk_trie_node {
  int32_t first_child, next_sibling;
  int32_t token; /* index into added[] of the token ending here, -1 none */
  unsigned char byte;
} tk_trie_node_t;

typedef struct tk_trie {
  tk_trie_node_t *nodes; /* nodes[0] is the root */
  size_t num_nodes, cap;
  uint8_t first[256]; /* 1 when some token starts with this byte */
} tk_trie_t;

ina_status_t tk_trie_build(tk_trie_t *t, const char *const *contents, const size_t *lens, const int32_t *tokens,
                           size_t n);
void tk_trie_free(tk_trie_t *t);

/* Reads added_tokens (after the model: the ids depend on its vocabulary), then, once the
 * normalizer is known, builds the tries and the special flags. */
ina_status_t tk_added_parse(const json_t *list, const char *origin, ina_tokenizer_t *tok);
ina_status_t tk_added_finish(ina_tokenizer_t *tok);

/* Splits the text pieces of in by the tokens of trie (their flags in added[]), appending
 * to out: `AddedVocabulary::find_matches` with its lstrip / rstrip / single_word rules. */
ina_status_t tk_added_split(const ina_tokenizer_t *tok, const tk_trie_t *trie, const char *s, size_t n,
                            tk_pieces_t *out);

/* ---- post-processor ---------------------------------------------------------------- */

typedef struct tk_post {
  int32_t *prefix, *suffix; /* ids around the sequence when add_special */
  size_t num_prefix, num_suffix;
} tk_post_t;

/* ---- decoder (decode.c) ------------------------------------------------------------ */

typedef enum {
  TK_DEC_BYTE_LEVEL,
  TK_DEC_BYTE_FALLBACK,
  TK_DEC_FUSE,
  TK_DEC_STRIP,
  TK_DEC_REPLACE
} tk_dec_kind_t;

typedef struct tk_dec_step {
  tk_dec_kind_t kind;
  uint32_t strip_char;
  size_t strip_start, strip_stop;
  tk_regex_t re;
  char *replace_with;
  size_t replace_len;
} tk_dec_step_t;

typedef struct tk_decoder {
  int present; /* 0: null decoder (tokens joined by spaces) */
  tk_dec_step_t *steps;
  size_t n;
} tk_decoder_t;

ina_status_t tk_decoder_parse(const json_t *j, const char *origin, const char *path, tk_decoder_t *out);
void tk_decoder_free(tk_decoder_t *d);
/* 1 when decode is lossy(concat(bytes of each token)): a lone ByteLevel decoder. The
 * streaming detokenizer then works token by token. */
int tk_decoder_is_byte_level(const tk_decoder_t *d);
/* 1 when the chain has a ByteFallback step, and when id's token is one of its <0xXX>
 * byte tokens. */
int tk_decoder_has_byte_fallback(const tk_decoder_t *d);
int tk_is_fallback_token(const ina_tokenizer_t *tok, int32_t id);
/* The bytes ByteLevel's decoder makes of one token (appended to out). */
ina_status_t tk_byte_level_token_bytes(const char *tok, size_t n, tk_buf_t *out);

/* ---- the tokenizer ----------------------------------------------------------------- */

struct ina_tokenizer {
  char *origin;
  tk_normalizer_t normalizer;
  tk_pretokenizer_t pre;
  tk_bpe_t bpe;
  tk_decoder_t decoder;
  tk_post_t post;

  /* Every id's token string (model vocabulary or added token), NULL in gaps. */
  char **tokens;
  uint32_t *token_lens;
  int32_t num_ids;

  tk_added_t *added;
  size_t num_added;
  tk_strmap_t added_map; /* added content → id */
  uint8_t *special;      /* per id: 1 for a special added token */
  tk_trie_t trie_raw;    /* tokens with normalized false, matched on the raw text */
  tk_trie_t trie_norm;   /* tokens with normalized true, matched on normalized text */
  char **norm_contents;  /* normalized contents of the trie_norm tokens */
  size_t num_norm_contents;

  int32_t bos_id, eos_id;
  char *chat_template;
};

/* The token strings of ids, for decode (skip_special drops special added tokens).
 * Out-of-range ids: INA_ERR_INVALID_ARGUMENT. */
ina_status_t tk_decode_ids(const ina_tokenizer_t *tok, const int32_t *ids, size_t n, int skip_special,
                           tk_buf_t *out);

/* Embedded built-in files (builtin_data.c, generated). */
extern const unsigned char ina_tk_builtin_tiny_json[];
extern const size_t ina_tk_builtin_tiny_json_len;
extern const unsigned char ina_tk_builtin_tiny_config_json[];
extern const size_t ina_tk_builtin_tiny_config_json_len;

#endif
