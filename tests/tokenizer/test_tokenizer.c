/* The tokenizer on small hand-made tokenizer.json files whose ids can be worked out by
 * hand: the BPE merge order (ranks, ties, stale pairs), each Split behavior and invert,
 * Digits, ByteLevel with and without its regex and prefix space, NFC / NFKC, added
 * tokens (lstrip, rstrip, single_word, normalized), byte_fallback and unk, the
 * post-processor and tokenizer_config.json, the decoders; the refusals of unknown
 * components and malformed files with the place in their messages; outputs reset on
 * failure (a regex that meets PCRE2's match limit included); encode_batch equal to encode; the streaming detokenizer equal to decode on
 * random id sequences (ids that split multi-byte characters included) in its three
 * modes. */
#include "tests/test_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "core/threadpool.h"
#include "tokenizer/tokenizer.h"

#define NAME "test_tokenizer"

/* ---- building tokenizer.json ------------------------------------------------------- */

typedef struct parts {
  const char *normalizer, *pre, *post, *decoder, *added, *model;
} parts_t;

static char *make_json(parts_t p) {
  const char *fmt = "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":%s,"
                    "\"normalizer\":%s,\"pre_tokenizer\":%s,\"post_processor\":%s,\"decoder\":%s,\"model\":%s}";
  const char *a = p.added ? p.added : "[]", *n = p.normalizer ? p.normalizer : "null",
             *pt = p.pre ? p.pre : "null", *po = p.post ? p.post : "null", *d = p.decoder ? p.decoder : "null";
  const size_t len = strlen(fmt) + strlen(a) + strlen(n) + strlen(pt) + strlen(po) + strlen(d) + strlen(p.model) + 1;
  char *s = malloc(len);
  snprintf(s, len, fmt, a, n, pt, po, d, p.model);
  return s;
}

static ina_tokenizer_t *load_cfg(parts_t p, const char *config) {
  char *j = make_json(p);
  ina_tokenizer_t *tok = NULL;
  const ina_status_t st = ina_tokenizer_load_json(j, strlen(j), config, config ? strlen(config) : 0, NULL, &tok);
  CHECKF(st == INA_OK, "load failed: %s\n%s", ina_last_error(), j);
  free(j);
  return tok;
}

static ina_tokenizer_t *load(parts_t p) { return load_cfg(p, NULL); }

/* Loading must fail with `expect`, *out NULL, and a message containing `needle`. */
static void expect_load_fails(const char *json, size_t len, const char *config, ina_status_t expect,
                              const char *needle) {
  ina_tokenizer_t *tok = (ina_tokenizer_t *)(uintptr_t)0x1; /* must be overwritten */
  ina_clear_error();
  ina_log_set_quiet_errors(1);
  const ina_status_t st = ina_tokenizer_load_json(json, len, config, config ? strlen(config) : 0, NULL, &tok);
  ina_log_set_quiet_errors(0);
  CHECKF(st == expect, "status %d (%s), expected %d, for '%s'", (int)st, ina_last_error(), (int)expect, needle);
  CHECKF(tok == NULL, "*out not reset for '%s'", needle);
  CHECKF(strstr(ina_last_error(), needle) != NULL, "message '%s' lacks '%s'", ina_last_error(), needle);
  if (st == INA_OK) ina_tokenizer_destroy(tok);
}

static void expect_parts_fail(parts_t p, const char *config, ina_status_t expect, const char *needle) {
  char *j = make_json(p);
  expect_load_fails(j, strlen(j), config, expect, needle);
  free(j);
}

/* encode(text) must give exactly `want` (n ids). */
static void expect_ids(const ina_tokenizer_t *tok, const char *text, size_t len, int add_special, const int32_t *want,
                       size_t n, const char *what) {
  int32_t *ids = NULL;
  size_t num = 12345;
  CHECK_OK(ina_tokenizer_encode(tok, text, len, add_special, &ids, &num));
  int same = ids != NULL && num == n;
  for (size_t i = 0; same && i < n; i++) same = ids[i] == want[i];
  if (!same) {
    fprintf(stderr, "%s: encode(\"%.*s\") =", what, (int)len, text);
    for (size_t i = 0; ids && i < num; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, ", expected");
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", want[i]);
    fputc('\n', stderr);
  }
  CHECKF(same, "%s", what);
  free(ids);
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t)
#define EXPECT(tok, text, ...) expect_ids(tok, text, strlen(text), 0, IDS(__VA_ARGS__), text)

static void expect_decode(const ina_tokenizer_t *tok, const int32_t *ids, size_t n, int skip, const char *want,
                          size_t want_len, const char *what) {
  char *text = NULL;
  size_t len = 0;
  CHECK_OK(ina_tokenizer_decode(tok, ids, n, skip, &text, &len));
  CHECKF(text && len == want_len && memcmp(text, want, len) == 0 && text[len] == '\0', "%s: decode '%s', expected '%s'",
         what, text ? text : "(null)", want);
  free(text);
}

/* ---- BPE -------------------------------------------------------------------------- */

/* Characters a b c, merges in rank order. No pre-tokenizer: the text is one word. */
static const char *kAbcModel =
    "{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,"
    "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":false,"
    "\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"bc\":4,\"abc\":5,\"aa\":6,\"aaa\":7,\"ca\":8,\"cab\":9,\"ba\":10},"
    "\"merges\":[\"a b\",\"b c\",[\"ab\",\"c\"],\"a a\",\"c ab\",\"aa a\",\"c a\"]}";

static void test_bpe_merges(void) {
  ina_tokenizer_t *tok = load((parts_t){.model = kAbcModel});
  if (!tok) return;
  CHECK(ina_tokenizer_vocab_size(tok) == 11);
  EXPECT(tok, "abc", 5);     /* a b -> ab (rank 0), ab c -> abc (rank 2) */
  EXPECT(tok, "bcab", 4, 3); /* ab (rank 0) before bc (rank 1); then c ab is stale */
  EXPECT(tok, "aaa", 7);     /* a a at 0 and 1 tie: the left merges (aa a -> aaa), not the right (a aa) */
  EXPECT(tok, "aaaa", 6, 6); /* three pairs of rank 3: 0 and 2 merge, 1 goes stale; aa aa has no merge */
  EXPECT(tok, "cab", 9);     /* ab (rank 0) before c a (rank 6), then c ab (rank 4) */
  EXPECT(tok, "ba", 1, 0);   /* in the vocabulary, but no merge makes it */
  EXPECT(tok, "b", 1);
  expect_ids(tok, "", 0, 0, NULL, 0, "empty text");
  ina_tokenizer_destroy(tok);

  /* ignore_merges: a word that is a token is taken whole, even when no merge builds it. */
  char *m = strdup(kAbcModel);
  char *p = strstr(m, "\"ignore_merges\":false");
  memcpy(p, "\"ignore_merges\":true ", strlen("\"ignore_merges\":true "));
  tok = load((parts_t){.model = m});
  if (tok) {
    EXPECT(tok, "ba", 10);
    EXPECT(tok, "bcab", 4, 3);
    ina_tokenizer_destroy(tok);
  }
  free(m);
}

/* ---- pre-tokenizers ---------------------------------------------------------------- */

static const char *kDashModel =
    "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"-\":1,\"b\":2,\"a-\":3,\"-b\":4,\"a-b\":5,\"--\":6,\"1\":7,\"2\":8,"
    "\"12\":9,\"a1\":10},\"merges\":[\"a -\",\"a- b\",\"- b\",\"- -\",\"1 2\",\"a 1\"]}";

static ina_tokenizer_t *split_tok(const char *behavior, int invert) {
  char pre[256];
  snprintf(pre, sizeof pre, "{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"%s\",\"invert\":%s}",
           behavior, invert ? "true" : "false");
  return load((parts_t){.pre = pre, .model = kDashModel});
}

static void test_split_behaviors(void) {
  ina_tokenizer_t *t = load((parts_t){.model = kDashModel});
  if (t) {
    EXPECT(t, "a-b", 5); /* no pre-tokenizer: one word */
    ina_tokenizer_destroy(t);
  }
  static const struct {
    const char *behavior;
    int invert;
    const char *text;
    int32_t ids[4];
    size_t n;
  } cases[] = {
      {"Isolated", 0, "a-b", {0, 1, 2}, 3},
      {"Removed", 0, "a-b", {0, 2}, 2},
      {"MergedWithPrevious", 0, "a-b", {3, 2}, 2},
      {"MergedWithNext", 0, "a-b", {0, 4}, 2},
      {"Contiguous", 0, "a--b", {0, 6, 2}, 3},
      {"Isolated", 0, "a--b", {0, 1, 1, 2}, 4},
      {"Removed", 1, "a-b", {1}, 1},           /* inverted: the text between dashes is removed */
      {"MergedWithPrevious", 1, "a-b", {0, 4}, 2}, /* inverted: "b" joins the "-" before it */
      {"MergedWithNext", 1, "a-b", {3, 2}, 2},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    t = split_tok(cases[i].behavior, cases[i].invert);
    if (!t) continue;
    char what[64];
    snprintf(what, sizeof what, "Split %s%s", cases[i].behavior, cases[i].invert ? " inverted" : "");
    expect_ids(t, cases[i].text, strlen(cases[i].text), 0, cases[i].ids, cases[i].n, what);
    ina_tokenizer_destroy(t);
  }
  /* A regex with a lookahead and Unicode classes; runs of the pattern stay apart. */
  t = load((parts_t){.pre = "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{L}+|\\\\p{N}\"},\"behavior\":\"Isolated\","
                            "\"invert\":false}",
                     .model = kDashModel});
  if (t) {
    EXPECT(t, "a12", 0, 7, 8);
    ina_tokenizer_destroy(t);
  }
}

static void test_digits(void) {
  ina_tokenizer_t *t =
      load((parts_t){.pre = "{\"type\":\"Digits\",\"individual_digits\":true}", .model = kDashModel});
  if (t) {
    EXPECT(t, "a12", 0, 7, 8);
    ina_tokenizer_destroy(t);
  }
  t = load((parts_t){.pre = "{\"type\":\"Digits\",\"individual_digits\":false}", .model = kDashModel});
  if (t) {
    EXPECT(t, "a12", 0, 9);
    EXPECT(t, "12a12", 9, 0, 9);
    ina_tokenizer_destroy(t);
  }
  /* A Sequence: Digits, then a Split. */
  t = load((parts_t){.pre = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":false},"
                            "{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"Isolated\",\"invert\":false}]}",
                     .model = kDashModel});
  if (t) {
    EXPECT(t, "a-12-b", 0, 1, 9, 1, 2);
    ina_tokenizer_destroy(t);
  }
}

/* ByteLevel: space is "Ġ" (U+0120), newline "Ċ" (U+010A). */
static const char *kByteModel =
    "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"\\u0120\":2,\"\\u0120a\":3,\"\\u010a\":4,\"ab\":5,\"\\u0120ab\":6,"
    "\"'\":7,\"s\":8,\"'s\":9,\"\\u00e4\":10,\"\\u00b8\":11,\"\\u0143\":12},"
    "\"merges\":[\"\\u0120 a\",\"a b\",\"\\u0120a b\",\"' s\"]}";

static void test_byte_level(void) {
  ina_tokenizer_t *t = load((parts_t){.pre = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}",
                                      .decoder = "{\"type\":\"ByteLevel\"}", .model = kByteModel});
  if (t) {
    EXPECT(t, "ab ab", 5, 6);
    EXPECT(t, "a's", 0, 9);     /* GPT-2's regex splits 's off */
    EXPECT(t, "a\n b", 0, 4, 2, 1); /* \s+(?!\S) keeps the space before b with b... */
    expect_decode(t, IDS(6, 4, 5), 0, " ab\nab", 6, "byte-level decode");
    /* U+4E2D is E4 B8 AD: its bytes' characters are U+00E4, U+00B8 and U+0143. */
    expect_decode(t, IDS(10, 11, 12), 0, "\xE4\xB8\xAD", 3, "a character from three byte tokens");
    expect_decode(t, IDS(10, 11), 0, "\xEF\xBF\xBD", 3, "a cut character is one U+FFFD");
    expect_decode(t, IDS(10, 0, 11), 0, "\xEF\xBF\xBD" "a\xEF\xBF\xBD", 7, "two ill-formed parts");
    ina_tokenizer_destroy(t);
  }
  t = load((parts_t){.pre = "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":false}",
                     .model = kByteModel});
  if (t) {
    EXPECT(t, "ab", 6);     /* the prefix space */
    EXPECT(t, " ab", 6);    /* already there: not doubled */
    EXPECT(t, "a ab", 3, 6); /* no regex: one word */
    ina_tokenizer_destroy(t);
  }
}

/* ---- normalizers ------------------------------------------------------------------- */

static const char *kNormModel =
    "{\"type\":\"BPE\",\"vocab\":{\"e\":0,\"\\u0301\":1,\"\\u00e9\":2,\"f\":3,\"i\":4,\"fi\":5,\"\\ufb01\":6,\"A\":7},"
    "\"merges\":[\"f i\"]}";

static void test_normalizers(void) {
  ina_tokenizer_t *t = load((parts_t){.model = kNormModel});
  if (t) {
    EXPECT(t, "e\xCC\x81", 0, 1);  /* no normalizer: e + combining acute */
    EXPECT(t, "\xEF\xAC\x81", 6);  /* the ligature as is */
    ina_tokenizer_destroy(t);
  }
  t = load((parts_t){.normalizer = "{\"type\":\"NFC\"}", .model = kNormModel});
  if (t) {
    EXPECT(t, "e\xCC\x81", 2);
    EXPECT(t, "\xEF\xAC\x81", 6); /* NFC keeps compatibility characters */
    ina_tokenizer_destroy(t);
  }
  t = load((parts_t){.normalizer = "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFKC\"}]}", .model = kNormModel});
  if (t) {
    EXPECT(t, "\xEF\xAC\x81", 5);  /* NFKC: fi */
    EXPECT(t, "\xEF\xBC\xA1", 7);  /* fullwidth A */
    ina_tokenizer_destroy(t);
  }
}

/* ---- added tokens ------------------------------------------------------------------ */

static const char *kLetterModel =
    "{\"type\":\"BPE\",\"vocab\":{\"x\":0,\"y\":1,\" \":2,\"z\":3,\"o\":4,\"r\":5,\"k\":6,\"f\":7,\"i\":8,\"n\":9},"
    "\"merges\":[]}";

static void test_added_tokens(void) {
  const char *added =
      "[{\"id\":10,\"content\":\"<L>\",\"single_word\":false,\"lstrip\":true,\"rstrip\":false,\"normalized\":false,"
      "\"special\":true},"
      "{\"id\":11,\"content\":\"<R>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":true,\"normalized\":false,"
      "\"special\":true},"
      "{\"id\":12,\"content\":\"zork\",\"single_word\":true,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,"
      "\"special\":false},"
      "{\"id\":13,\"content\":\"<LR>\",\"single_word\":false,\"lstrip\":true,\"rstrip\":true,\"normalized\":false,"
      "\"special\":true},"
      "{\"id\":14,\"content\":\"\\ufb01n\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":true,"
      "\"special\":false},"
      "{\"id\":15,\"content\":\"<L\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,"
      "\"special\":true}]";
  ina_tokenizer_t *t = load((parts_t){.added = added, .normalizer = "{\"type\":\"NFKC\"}", .model = kLetterModel});
  if (!t) return;
  CHECK(ina_tokenizer_vocab_size(t) == 16);
  CHECK(ina_tokenizer_token_to_id(t, "<R>") == 11);
  CHECK(ina_tokenizer_is_special(t, 11) && !ina_tokenizer_is_special(t, 12) && !ina_tokenizer_is_special(t, 0));
  EXPECT(t, "x  <L> y", 0, 10, 2, 1);      /* lstrip takes the spaces before */
  EXPECT(t, "x <R>  y", 0, 2, 11, 1);      /* rstrip takes the spaces after */
  EXPECT(t, "x <LR> y", 0, 13, 1);
  EXPECT(t, "x <R>\n\t\xE3\x80\x80y", 0, 2, 11, 1); /* any White_Space, U+3000 too */
  EXPECT(t, "x\t\n<L>", 0, 10);           /* any whitespace */
  EXPECT(t, "<L>x", 10, 0);               /* the longest match: <L> over <L */
  EXPECT(t, "<Lx", 15, 0);
  EXPECT(t, "x zork y", 0, 2, 12, 2, 1);   /* single_word: whole word only */
  EXPECT(t, "xzork", 0, 3, 4, 5, 6);
  EXPECT(t, "zorky", 3, 4, 5, 6, 1);
  EXPECT(t, "zork", 12);
  EXPECT(t, "fin", 14);                   /* normalized: matched in the NFKC text */
  EXPECT(t, "\xEF\xAC\x81n", 14);
  /* <R>'s rstrip took the spaces, so <L>'s lstrip finds none left to take. */
  EXPECT(t, "<R> <L>", 11, 10);
  expect_decode(t, IDS(0, 10, 1, 11), 0, "x <L> y <R>", 11, "no decoder: the tokens joined by spaces");
  expect_decode(t, IDS(0, 10, 1, 11), 1, "x y", 3, "skip_special");
  /* A normalized added token's token string is its normalized form, as in `tokenizers`. */
  CHECK(strcmp(ina_tokenizer_id_to_token(t, 14), "fin") == 0 && ina_tokenizer_token_to_id(t, "\xEF\xAC\x81n") == 14);
  ina_tokenizer_destroy(t);
}

/* ---- byte_fallback, unk, post-processor, config ------------------------------------ */

static void test_fallback_and_unk(void) {
  const char *model =
      "{\"type\":\"BPE\",\"byte_fallback\":true,\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>\":0,\"a\":1,\"<0xE4>\":2,"
      "\"<0xB8>\":3,\"<0xAD>\":4,\"\\u2581\":5},\"merges\":[]}";
  const char *dec = "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},"
                    "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\","
                    "\"content\":\" \",\"start\":1,\"stop\":0}]}";
  ina_tokenizer_t *t = load((parts_t){.decoder = dec, .model = model});
  if (t) {
    EXPECT(t, "a\xE4\xB8\xAD", 1, 2, 3, 4); /* U+4E2D as its bytes */
    EXPECT(t, "a\xC3\xA9", 1, 0);          /* é: no byte tokens for C3 A9, so unk */
    expect_decode(t, IDS(5, 1, 2, 3, 4), 0, "a\xE4\xB8\xAD", 4, "fallback decode, leading space stripped");
    expect_decode(t, IDS(1, 2, 1), 0, "a\xEF\xBF\xBD" "a", 5, "a lone byte token");
    ina_tokenizer_destroy(t);
  }
  const char *fuse = "{\"type\":\"BPE\",\"fuse_unk\":true,\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>\":0,\"a\":1},"
                     "\"merges\":[]}";
  t = load((parts_t){.model = fuse});
  if (t) {
    EXPECT(t, "a\xC3\xA9\xC3\xA9" "a", 1, 0, 1); /* two unknown characters, one unk */
    ina_tokenizer_destroy(t);
  }
  const char *nofuse = "{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>\":0,\"a\":1},\"merges\":[]}";
  t = load((parts_t){.model = nofuse});
  if (t) {
    EXPECT(t, "a\xC3\xA9\xC3\xA9" "a", 1, 0, 0, 1);
    ina_tokenizer_destroy(t);
  }
  const char *nounk = "{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}";
  t = load((parts_t){.model = nounk});
  if (t) {
    EXPECT(t, "a\xC3\xA9" "a", 0, 0); /* no unk_token: dropped */
    ina_tokenizer_destroy(t);
  }
}

static const char *kBosAdded =
    "[{\"id\":2,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,"
    "\"special\":true},{\"id\":3,\"content\":\"</s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true}]";
static const char *kXyModel = "{\"type\":\"BPE\",\"vocab\":{\"x\":0,\"y\":1},\"merges\":[]}";

static void test_post_processor_and_config(void) {
  const char *tpl = "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
                    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"SpecialToken\":{\"id\":\"</s>\",\"type_id\":0}}],"
                    "\"pair\":[],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[2],\"tokens\":[\"<s>\"]},"
                    "\"</s>\":{\"id\":\"</s>\",\"ids\":[3],\"tokens\":[\"</s>\"]}}}";
  ina_tokenizer_t *t = load((parts_t){.added = kBosAdded, .post = tpl, .model = kXyModel});
  if (t) {
    expect_ids(t, "xy", 2, 1, IDS(2, 0, 1, 3), "template");
    expect_ids(t, "xy", 2, 0, IDS(0, 1), "template without add_special");
    CHECK(ina_tokenizer_bos_id(t) == -1 && ina_tokenizer_eos_id(t) == -1); /* no config */
    expect_decode(t, IDS(2, 0, 3), 1, "x", 1, "skip_special");
    expect_decode(t, IDS(2, 0, 3), 0, "<s> x </s>", 10, "no decoder joins with spaces");
    ina_tokenizer_destroy(t);
  }
  /* tokenizer_config.json: add_bos_token replaces the template, as transformers' Llama
   * tokenizers do; the chat template is the one named "default". */
  const char *cfg = "{\"bos_token\":{\"content\":\"<s>\",\"__type\":\"AddedToken\"},\"eos_token\":\"</s>\","
                    "\"add_bos_token\":true,\"add_eos_token\":false,"
                    "\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"T\"},{\"name\":\"default\",\"template\":\"D\"}]}";
  t = load_cfg((parts_t){.added = kBosAdded, .post = tpl, .model = kXyModel}, cfg);
  if (t) {
    CHECK(ina_tokenizer_bos_id(t) == 2 && ina_tokenizer_eos_id(t) == 3);
    expect_ids(t, "x", 1, 1, IDS(2, 0), "add_bos_token");
    CHECK(ina_tokenizer_chat_template(t) && strcmp(ina_tokenizer_chat_template(t), "D") == 0);
    ina_tokenizer_destroy(t);
  }
}

static void test_load_dir(void) {
  char dir[] = "/tmp/ina-test-tokenizer-XXXXXX";
  if (!mkdtemp(dir)) {
    CHECK(0);
    return;
  }
  char path[512];
  char *j = make_json((parts_t){.added = kBosAdded, .model = kXyModel});
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  FILE *f = fopen(path, "w");
  fputs(j, f);
  fclose(f);
  free(j);
  ina_tokenizer_t *t = NULL;
  CHECK_OK(ina_tokenizer_load_dir(dir, &t));
  CHECK(t && ina_tokenizer_bos_id(t) == -1 && ina_tokenizer_chat_template(t) == NULL);
  ina_tokenizer_destroy(t);
  char cpath[512];
  snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir);
  f = fopen(cpath, "w");
  fputs("{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"chat_template\":\"{{ messages }}\"}", f);
  fclose(f);
  t = NULL;
  CHECK_OK(ina_tokenizer_load_dir(dir, &t));
  CHECK(t && ina_tokenizer_bos_id(t) == 2 && ina_tokenizer_eos_id(t) == 3);
  CHECK(t && ina_tokenizer_chat_template(t) && strcmp(ina_tokenizer_chat_template(t), "{{ messages }}") == 0);
  ina_tokenizer_destroy(t);
  /* A broken config is named by its own path. */
  f = fopen(cpath, "w");
  fputs("{\"bos_token\":\"<nope>\"}", f);
  fclose(f);
  t = (ina_tokenizer_t *)(uintptr_t)1;
  ina_log_set_quiet_errors(1);
  CHECK(ina_tokenizer_load_dir(dir, &t) == INA_ERR_FORMAT && t == NULL);
  ina_log_set_quiet_errors(0);
  CHECKF(strstr(ina_last_error(), "tokenizer_config.json: bos_token: '<nope>'") != NULL, "%s", ina_last_error());
  unlink(cpath);
  unlink(path);
  rmdir(dir);
  t = (ina_tokenizer_t *)(uintptr_t)1;
  ina_log_set_quiet_errors(1);
  CHECK(ina_tokenizer_load_dir(dir, &t) == INA_ERR_IO && t == NULL);
  ina_log_set_quiet_errors(0);
  CHECKF(strstr(ina_last_error(), "tokenizer.json: cannot open") != NULL, "%s", ina_last_error());
}

/* ---- errors ------------------------------------------------------------------------ */

static void test_errors(void) {
  const char *m = kXyModel;
  expect_parts_fail((parts_t){.normalizer = "{\"type\":\"Lowercase\"}", .model = m}, NULL, INA_ERR_UNSUPPORTED,
                    "tokenizer.json: normalizer: normalizer type 'Lowercase' is not supported");
  expect_parts_fail((parts_t){.normalizer = "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},"
                                            "{\"type\":\"Strip\"}]}",
                              .model = m},
                    NULL, INA_ERR_UNSUPPORTED, "normalizer.normalizers[1]: normalizer type 'Strip'");
  expect_parts_fail((parts_t){.pre = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\"},"
                                     "{\"type\":\"Metaspace\"}]}",
                              .model = m},
                    NULL, INA_ERR_UNSUPPORTED,
                    "tokenizer.json: pre_tokenizer.pretokenizers[1]: pre-tokenizer type 'Metaspace' is not supported");
  expect_parts_fail((parts_t){.pre = "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Sideways\"}",
                              .model = m},
                    NULL, INA_ERR_UNSUPPORTED, "pre_tokenizer.behavior: 'Sideways' is not supported");
  expect_parts_fail((parts_t){.pre = "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},\"behavior\":\"Isolated\"}",
                              .model = m},
                    NULL, INA_ERR_FORMAT, "pre_tokenizer.pattern: invalid regex '(a'");
  expect_parts_fail((parts_t){.pre = "{\"type\":\"Split\",\"pattern\":{\"Glob\":\"a\"},\"behavior\":\"Isolated\"}",
                              .model = m},
                    NULL, INA_ERR_UNSUPPORTED, "pre_tokenizer.pattern: pattern kind 'Glob' is not supported");
  expect_parts_fail((parts_t){.pre = "{\"type\":\"ByteLevel\",\"add_prefix_space\":1}", .model = m}, NULL,
                    INA_ERR_FORMAT, "pre_tokenizer.add_prefix_space: expected a boolean");
  expect_parts_fail((parts_t){.decoder = "{\"type\":\"WordPiece\"}", .model = m}, NULL, INA_ERR_UNSUPPORTED,
                    "decoder: decoder type 'WordPiece' is not supported");
  expect_parts_fail((parts_t){.decoder = "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"},"
                                         "{\"type\":\"Strip\",\"content\":\"ab\",\"start\":1,\"stop\":0}]}",
                              .model = m},
                    NULL, INA_ERR_FORMAT, "decoder.decoders[1].content: expected a one-character string");
  expect_parts_fail((parts_t){.post = "{\"type\":\"RobertaProcessing\"}", .model = m}, NULL, INA_ERR_UNSUPPORTED,
                    "post_processor: post-processor type 'RobertaProcessing' is not supported");
  expect_parts_fail((parts_t){.post = "{\"type\":\"TemplateProcessing\",\"single\":[{\"Sequence\":{\"id\":\"B\"}}]}",
                              .model = m},
                    NULL, INA_ERR_UNSUPPORTED, "post_processor.single[0]: sequence 'B' is not supported");
  expect_parts_fail((parts_t){.post = "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},"
                                      "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<s>\":{\"ids\":[99]}}}",
                              .model = m},
                    NULL, INA_ERR_FORMAT, "post_processor.special_tokens['<s>'].ids[0]: not a token id");
  expect_parts_fail((parts_t){.model = "{\"type\":\"WordPiece\",\"vocab\":{}}"}, NULL, INA_ERR_UNSUPPORTED,
                    "model: type 'WordPiece' is not supported");
  expect_parts_fail((parts_t){.model = "{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"dropout\":0.1}"}, NULL,
                    INA_ERR_UNSUPPORTED, "model.dropout");
  expect_parts_fail((parts_t){.model = "{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],"
                                       "\"continuing_subword_prefix\":\"##\"}"},
                    NULL, INA_ERR_UNSUPPORTED, "model.continuing_subword_prefix");
  expect_parts_fail((parts_t){.model = "{\"type\":\"BPE\",\"merges\":[]}"}, NULL, INA_ERR_FORMAT,
                    "model: missing 'vocab'");
  expect_parts_fail((parts_t){.model = "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":\"1\"},\"merges\":[]}"}, NULL,
                    INA_ERR_FORMAT, "model.vocab['b']: expected an integer id");
  expect_parts_fail((parts_t){.model = "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":-1},\"merges\":[]}"}, NULL,
                    INA_ERR_FORMAT, "model.vocab['b']: id -1 is out of range");
  expect_parts_fail((parts_t){.model = "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}"}, NULL,
                    INA_ERR_FORMAT, "model.vocab: id 0 is given to both");
  expect_parts_fail((parts_t){.model = "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b c\"]}"},
                    NULL, INA_ERR_FORMAT, "model.merges[0]: 'a b c' is not two tokens separated by one space");
  expect_parts_fail((parts_t){.model = "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\",\"a c\"]}"},
                    NULL, INA_ERR_FORMAT, "model.merges[1]: token 'c' is not in the vocabulary");
  expect_parts_fail((parts_t){.model = "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[[\"a\",\"b\"]]}"}, NULL,
                    INA_ERR_FORMAT, "model.merges[0]: the merged token 'ab' is not in the vocabulary");
  expect_parts_fail((parts_t){.model = "{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[[\"a\"]]}"}, NULL,
                    INA_ERR_FORMAT, "model.merges[0]: expected \"a b\" or [\"a\", \"b\"]");
  expect_parts_fail((parts_t){.model = "{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"unk_token\":\"<unk>\"}"},
                    NULL, INA_ERR_FORMAT, "model.unk_token: '<unk>' is not in the vocabulary");
  expect_parts_fail((parts_t){.added = "[{\"id\":5}]", .model = m}, NULL, INA_ERR_FORMAT,
                    "added_tokens[0]: missing string 'content'");
  expect_parts_fail((parts_t){.added = "[{\"id\":5,\"content\":\"q\",\"lstrip\":\"yes\"}]", .model = m}, NULL,
                    INA_ERR_FORMAT, "added_tokens[0].lstrip: expected a boolean");
  expect_parts_fail((parts_t){.model = m}, "{\"bos_token\":\"<s>\"}", INA_ERR_FORMAT,
                    "tokenizer_config.json: bos_token: '<s>' is not a token");
  expect_parts_fail((parts_t){.model = m}, "{\"add_bos_token\":true}", INA_ERR_FORMAT,
                    "add_bos_token is true without a bos_token");
  expect_parts_fail((parts_t){.model = m}, "{\"bos_token\":", INA_ERR_FORMAT, "tokenizer_config.json:1:");

  /* The file as a whole. */
  const char *trunc = "{\"truncation\":{\"max_length\":5},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}";
  expect_load_fails(trunc, strlen(trunc), NULL, INA_ERR_UNSUPPORTED, "truncation: only null is supported");
  const char *extra = "{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},\"surprise\":1}";
  expect_load_fails(extra, strlen(extra), NULL, INA_ERR_UNSUPPORTED, "top-level key 'surprise' is not supported");
  const char *nomodel = "{\"version\":\"1.0\"}";
  expect_load_fails(nomodel, strlen(nomodel), NULL, INA_ERR_FORMAT, "tokenizer.json: missing 'model'");
  const char *syntax = "{\"model\": {\"type\": \"BPE\",}";
  expect_load_fails(syntax, strlen(syntax), NULL, INA_ERR_FORMAT, "tokenizer.json:1:");
  const char *badutf8 = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\xff\":0},\"merges\":[]}}";
  expect_load_fails(badutf8, strlen(badutf8), NULL, INA_ERR_FORMAT, "invalid JSON");
  const char *surrogate = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\\ud800\":0},\"merges\":[]}}";
  expect_load_fails(surrogate, strlen(surrogate), NULL, INA_ERR_FORMAT, "invalid JSON");
  const char *dup = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"a\":1},\"merges\":[]}}";
  expect_load_fails(dup, strlen(dup), NULL, INA_ERR_FORMAT, "invalid JSON");
  expect_load_fails("[]", 2, NULL, INA_ERR_FORMAT, "expected a JSON object at the top");
  /* The origin names the file in messages. */
  ina_tokenizer_t *t = (ina_tokenizer_t *)(uintptr_t)1;
  ina_log_set_quiet_errors(1);
  CHECK(ina_tokenizer_load_json("[]", 2, NULL, 0, "/models/x/tokenizer.json", &t) == INA_ERR_FORMAT && t == NULL);
  ina_log_set_quiet_errors(0);
  CHECK(strstr(ina_last_error(), "/models/x/tokenizer.json: ") != NULL);
}

/* Every output of a failed call is reset; a successful call overwrites poisoned ones. */
static void test_poisoned_outputs(void) {
  ina_tokenizer_t *t = load((parts_t){.model = kAbcModel});
  if (!t) return;
  int32_t *ids = (int32_t *)(uintptr_t)0x1;
  size_t n = 777;
  ina_log_set_quiet_errors(1);
  CHECK(ina_tokenizer_encode(NULL, "a", 1, 0, &ids, &n) == INA_ERR_INVALID_ARGUMENT && ids == NULL && n == 0);
  ids = (int32_t *)(uintptr_t)0x1;
  n = 777;
  CHECK(ina_tokenizer_encode(t, NULL, 3, 0, &ids, &n) == INA_ERR_INVALID_ARGUMENT && ids == NULL && n == 0);
  char *text = (char *)(uintptr_t)0x1;
  size_t len = 777;
  CHECK(ina_tokenizer_decode(t, IDS(0, 99), 0, &text, &len) == INA_ERR_INVALID_ARGUMENT && text == NULL && len == 0);
  CHECKF(strstr(ina_last_error(), "ids[1] = 99 is not a token id") != NULL, "%s", ina_last_error());
  CHECK(ina_tokenizer_decode(t, IDS(-1), 0, &text, &len) == INA_ERR_INVALID_ARGUMENT && text == NULL);
  const char *texts[3] = {"ab", NULL, "c"};
  size_t lens[3] = {2, 4, 1};
  int32_t *bids[3] = {(int32_t *)(uintptr_t)1, (int32_t *)(uintptr_t)1, (int32_t *)(uintptr_t)1};
  size_t bn[3] = {9, 9, 9};
  CHECK(ina_tokenizer_encode_batch(t, texts, lens, 3, 0, NULL, bids, bn) == INA_ERR_INVALID_ARGUMENT);
  for (int i = 0; i < 3; i++) CHECK(bids[i] == NULL && bn[i] == 0);
  ina_detokenizer_t *d = (ina_detokenizer_t *)(uintptr_t)1;
  CHECK(ina_detokenizer_create(NULL, 0, &d) == INA_ERR_INVALID_ARGUMENT && d == NULL);
  CHECK_OK(ina_detokenizer_create(t, 0, &d));
  text = (char *)(uintptr_t)0x1;
  CHECK(ina_detokenizer_push(d, 99, &text, &len) == INA_ERR_INVALID_ARGUMENT && text == NULL && len == 0);
  ina_detokenizer_destroy(d);
  ina_log_set_quiet_errors(0);
  /* Empty text: a non-NULL array of 0 ids. */
  ids = (int32_t *)(uintptr_t)0x1;
  n = 777;
  CHECK_OK(ina_tokenizer_encode(t, "", 0, 0, &ids, &n));
  CHECK(ids != NULL && ids != (int32_t *)(uintptr_t)0x1 && n == 0);
  free(ids);
  CHECK(ina_tokenizer_id_to_token(t, 3) && strcmp(ina_tokenizer_id_to_token(t, 3), "ab") == 0);
  CHECK(ina_tokenizer_id_to_token(t, 11) == NULL && ina_tokenizer_id_to_token(t, -1) == NULL);
  CHECK(ina_tokenizer_token_to_id(t, "abc") == 5 && ina_tokenizer_token_to_id(t, "zz") == -1);
  CHECK(ina_tokenizer_token_to_id(NULL, "a") == -1 && ina_tokenizer_vocab_size(NULL) == 0);
  ina_tokenizer_destroy(NULL);
  ina_detokenizer_destroy(NULL);
  ina_tokenizer_destroy(t);
}

/* A pattern that backtracks without end fails on PCRE2's match limit, with a message;
 * in a batch the message names the text, and every output is reset. */
static void test_match_limit(void) {
  ina_tokenizer_t *t = load((parts_t){.pre = "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a|aa)+$\"},"
                                            "\"behavior\":\"Isolated\",\"invert\":false}",
                                      .model = "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"c\":1},\"merges\":[]}"});
  if (!t) return;
  char bad[64];
  memset(bad, 'a', 40);
  bad[40] = 'c';
  int32_t *ids = (int32_t *)(uintptr_t)1;
  size_t n = 5;
  ina_log_set_quiet_errors(1);
  CHECK(ina_tokenizer_encode(t, bad, 41, 0, &ids, &n) == INA_ERR_INTERNAL && ids == NULL && n == 0);
  CHECKF(strstr(ina_last_error(), "match limit") && strstr(ina_last_error(), "PCRE2 error"), "%s", ina_last_error());
  const char *texts[3] = {"ac", bad, "c"};
  const size_t lens[3] = {2, 41, 1};
  int32_t *bids[3] = {NULL, NULL, NULL};
  size_t bn[3] = {1, 1, 1};
  ina_threadpool_t *pool = NULL;
  CHECK_OK(ina_threadpool_create(2, &pool));
  CHECK(ina_tokenizer_encode_batch(t, texts, lens, 3, 0, pool, bids, bn) == INA_ERR_INTERNAL);
  ina_log_set_quiet_errors(0);
  CHECKF(strstr(ina_last_error(), "texts[1]: regex match failed") != NULL, "%s", ina_last_error());
  for (int i = 0; i < 3; i++) CHECK(bids[i] == NULL && bn[i] == 0);
  ina_threadpool_destroy(pool);
  ina_tokenizer_destroy(t);
}

/* ---- the built-in tokenizer, batches, invalid UTF-8 ----------------------------------- */

static void test_builtin(void) {
  static const char *const names[] = {"tiny", "v3.2-tiny"};
  for (int k = 0; k < 2; k++) {
    ina_tokenizer_t *t = NULL;
    CHECK_OK(ina_tokenizer_builtin(names[k], &t));
    if (!t) continue;
    CHECK(ina_tokenizer_vocab_size(t) == 1024);
    CHECK(ina_tokenizer_bos_id(t) == 0 && ina_tokenizer_eos_id(t) == 1);
    CHECK(strcmp(ina_tokenizer_id_to_token(t, 0), "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>") == 0);
    CHECK(strcmp(ina_tokenizer_id_to_token(t, 1), "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>") == 0);
    CHECK(ina_tokenizer_is_special(t, 0) && ina_tokenizer_is_special(t, 1) && !ina_tokenizer_is_special(t, 2));
    const char *text = "Hello, world! The tokenizer of ina: 12345 tokens.";
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(ina_tokenizer_encode(t, text, strlen(text), 1, &ids, &n));
    CHECK(n > 2 && ids[0] == 0);
    for (size_t i = 1; i < n; i++) CHECK(ids[i] > 1 && ids[i] < 1024);
    char *back = NULL;
    size_t bl = 0;
    CHECK_OK(ina_tokenizer_decode(t, ids, n, 1, &back, &bl));
    CHECKF(back && strcmp(back, text) == 0, "round trip: '%s'", back ? back : "(null)");
    free(back);
    free(ids);
    ina_tokenizer_destroy(t);
  }
  static const char *const others[] = {"v2-lite", "v3-layers", "v3.2-layers"};
  for (int k = 0; k < 3; k++) {
    ina_tokenizer_t *t = (ina_tokenizer_t *)(uintptr_t)1;
    ina_log_set_quiet_errors(1);
    CHECK(ina_tokenizer_builtin(others[k], &t) == INA_ERR_NOT_FOUND && t == NULL);
    ina_log_set_quiet_errors(0);
    CHECKF(strstr(ina_last_error(), others[k]) && strstr(ina_last_error(), "no built-in tokenizer"), "%s",
           ina_last_error());
  }
  ina_tokenizer_t *t = (ina_tokenizer_t *)(uintptr_t)1;
  ina_log_set_quiet_errors(1);
  CHECK(ina_tokenizer_builtin("gpt-7", &t) == INA_ERR_NOT_FOUND && t == NULL);
  ina_log_set_quiet_errors(0);
  CHECK(strstr(ina_last_error(), "'gpt-7'") != NULL);
}

static void test_batch_and_invalid_utf8(test_rng_t *rng) {
  ina_tokenizer_t *t = NULL;
  CHECK_OK(ina_tokenizer_builtin("tiny", &t));
  if (!t) return;
  /* Invalid UTF-8 encodes as its U+FFFD replacement does. */
  int32_t *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  CHECK_OK(ina_tokenizer_encode(t, "x\xff\xe2\x82y\xed\xa0\x80", 8, 0, &a, &na));
  CHECK_OK(ina_tokenizer_encode(t, "x\xEF\xBF\xBD\xEF\xBF\xBDy\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 17, 0, &b, &nb));
  CHECK(na == nb && memcmp(a, b, na * sizeof *a) == 0);
  free(a);
  free(b);

  enum { N = 64 };
  const char *texts[N];
  size_t lens[N];
  char *bufs[N];
  for (int i = 0; i < N; i++) {
    const size_t len = (size_t)test_rng_int(rng, 0, 200);
    bufs[i] = malloc(len + 1);
    for (size_t k = 0; k < len; k++) {
      static const char alphabet[] = "abc de  \n\t12,.!\xE4\xB8\xAD\xF0\x9F\x98\x80\xff";
      bufs[i][k] = alphabet[test_rng_int(rng, 0, (int64_t)sizeof alphabet - 2)];
    }
    texts[i] = bufs[i];
    lens[i] = len;
  }
  ina_threadpool_t *pool = NULL;
  CHECK_OK(ina_threadpool_create(3, &pool));
  int32_t *ids[N];
  size_t n[N];
  CHECK_OK(ina_tokenizer_encode_batch(t, texts, lens, N, 1, pool, ids, n));
  for (int i = 0; i < N; i++) {
    int32_t *one = NULL;
    size_t m = 0;
    CHECK_OK(ina_tokenizer_encode(t, texts[i], lens[i], 1, &one, &m));
    CHECKF(m == n[i] && memcmp(one, ids[i], m * sizeof *one) == 0, "batch text %d differs from encode", i);
    free(one);
    free(ids[i]);
    free(bufs[i]);
  }
  ina_threadpool_destroy(pool);
  ina_tokenizer_destroy(t);
}

/* ---- streaming --------------------------------------------------------------------- */

static int whole_chars(const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    const unsigned char c = (unsigned char)s[i];
    const size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (k == 0 || i + k > n) return 0;
    for (size_t j = 1; j < k; j++)
      if (((unsigned char)s[i + j] & 0xC0) != 0x80) return 0;
    i += k;
  }
  return 1;
}

/* Streams ids and checks every piece is whole characters and all add up to decode. */
static void check_stream(const ina_tokenizer_t *t, const int32_t *ids, size_t n, int skip, const char *what) {
  char *want = NULL;
  size_t wl = 0;
  CHECK_OK(ina_tokenizer_decode(t, ids, n, skip, &want, &wl));
  ina_detokenizer_t *d = NULL;
  CHECK_OK(ina_detokenizer_create(t, skip, &d));
  if (!d || !want) {
    free(want);
    return;
  }
  char *got = malloc(wl + 16);
  size_t gl = 0, cap = wl + 16;
  int whole = 1;
  for (size_t i = 0; i <= n; i++) {
    char *piece = NULL;
    size_t pl = 0;
    if (i < n) CHECK_OK(ina_detokenizer_push(d, ids[i], &piece, &pl));
    else CHECK_OK(ina_detokenizer_flush(d, &piece, &pl));
    if (!piece) break;
    CHECK(piece[pl] == '\0');
    whole &= whole_chars(piece, pl);
    if (gl + pl > cap) got = realloc(got, cap = 2 * (gl + pl));
    memcpy(got + gl, piece, pl);
    gl += pl;
    free(piece);
  }
  CHECKF(whole, "%s: a piece is not whole characters", what);
  CHECKF(gl == wl && memcmp(got, want, wl) == 0, "%s: streamed %zu bytes, decode %zu", what, gl, wl);
  free(got);
  free(want);
  ina_detokenizer_destroy(d);
}

static void test_streaming(test_rng_t *rng) {
  ina_tokenizer_t *bl = NULL;
  CHECK_OK(ina_tokenizer_builtin("tiny", &bl));
  /* Byte tokens for the three bytes of U+4E2D and a 4-byte emoji, among others. */
  const char *fb_model =
      "{\"type\":\"BPE\",\"byte_fallback\":true,\"vocab\":{\"a\":0,\"<0xE4>\":1,\"<0xB8>\":2,\"<0xAD>\":3,"
      "\"<0xF0>\":4,\"<0x9F>\":5,\"<0x98>\":6,\"<0x80>\":7,\"\\u2581\":8,\"<0xFF>\":9,\"b\":10},\"merges\":[]}";
  const char *fb_dec = "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},"
                       "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\","
                       "\"content\":\" \",\"start\":1,\"stop\":0}]}";
  ina_tokenizer_t *fb = load((parts_t){.added = "[{\"id\":11,\"content\":\"<s>\",\"special\":true,\"normalized\":false}]",
                                       .decoder = fb_dec, .model = fb_model});
  ina_tokenizer_t *join = load((parts_t){.model = kAbcModel});
  ina_tokenizer_t *toks[3] = {bl, fb, join};
  const char *names[3] = {"ByteLevel", "ByteFallback chain", "no decoder"};
  for (int k = 0; k < 3; k++) {
    if (!toks[k]) continue;
    const int32_t v = ina_tokenizer_vocab_size(toks[k]);
    for (int trial = 0; trial < 300; trial++) {
      int32_t ids[64];
      const size_t n = (size_t)test_rng_int(rng, 0, 64);
      for (size_t i = 0; i < n; i++) ids[i] = (int32_t)test_rng_int(rng, 0, v - 1);
      check_stream(toks[k], ids, n, trial & 1, names[k]);
    }
  }
  if (bl) {
    /* Text whose characters straddle tokens: CJK and emoji are split over byte tokens. */
    const char *text = "\xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9 ok";
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(ina_tokenizer_encode(bl, text, strlen(text), 1, &ids, &n));
    check_stream(bl, ids, n, 0, "encoded CJK and emoji");
    check_stream(bl, ids, n, 1, "encoded CJK and emoji, skip_special");
    free(ids);
  }
  if (fb) {
    check_stream(fb, IDS(8, 0, 1, 2, 3, 4, 5, 6, 7), 0, "byte runs that complete characters");
    check_stream(fb, IDS(1, 2, 0, 9, 4), 0, "byte runs that do not");
  }
  for (int k = 0; k < 3; k++) ina_tokenizer_destroy(toks[k]);
}

int main(void) {
  test_rng_t rng = {test_seed(NAME)};
  test_bpe_merges();
  test_split_behaviors();
  test_digits();
  test_byte_level();
  test_normalizers();
  test_added_tokens();
  test_fallback_and_unk();
  test_post_processor_and_config();
  test_load_dir();
  test_errors();
  test_poisoned_outputs();
  test_match_limit();
  test_builtin();
  test_batch_and_invalid_utf8(&rng);
  test_streaming(&rng);
  return test_finish(NAME);
}
