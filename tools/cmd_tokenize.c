/* ina tokenize | detokenize: a model's tokenizer from the command line. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "tools/cli.h"
#include "tools/cli_tokenizer.h"

static void usage(FILE *f, const char *command) {
  if (strcmp(command, "tokenize") == 0)
    fprintf(f,
            "usage: ina tokenize --model DIR|NAME [--no-special] TEXT...\n"
            "\n"
            "Prints the token ids of each TEXT (comma-separated, one line each) with the model's\n"
            "tokenizer: a checkpoint directory's tokenizer.json, or a built-in model's own.\n"
            "\n"
            "  --model M       checkpoint directory or built-in model (tiny, v3.2-tiny, ...)\n"
            "  --no-special    no special tokens (by default BOS as the checkpoint asks)\n"
            "  -h, --help      this help\n");
  else
    fprintf(f,
            "usage: ina detokenize --model DIR|NAME [--keep-special] IDS...\n"
            "\n"
            "Prints the text of each comma-separated list of token ids, one line each.\n"
            "\n"
            "  --model M        checkpoint directory or built-in model (tiny, v3.2-tiny, ...)\n"
            "  --keep-special   print special tokens too (by default they are skipped)\n"
            "  -h, --help       this help\n");
}

int cmd_tokenize(int argc, char **argv) {
  const int detok = strcmp(argv[0], "detokenize") == 0;
  const char *command = detok ? "ina detokenize" : "ina tokenize";
  enum { O_MODEL = 256, O_SPECIAL };
  static const struct option opts[] = {{"model", required_argument, 0, O_MODEL},
                                       {"no-special", no_argument, 0, O_SPECIAL},
                                       {"keep-special", no_argument, 0, O_SPECIAL},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *model = NULL;
  int special_flag = 0, c, rc = 1;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case O_MODEL: model = optarg; break;
    case O_SPECIAL: special_flag = 1; break;
    case 'h': usage(stdout, argv[0]); return 0;
    default: usage(stderr, argv[0]); return 2;
    }
  }
  if (!model || optind >= argc) {
    fprintf(stderr, "%s: --model and at least one %s are required\n\n", command, detok ? "IDS" : "TEXT");
    usage(stderr, argv[0]);
    return 2;
  }
  ina_tokenizer_t *tok = NULL;
  if (cli_tokenizer_open(command, model, &tok)) return 1;
  for (int i = optind; i < argc; i++) {
    if (detok) {
      int32_t *ids = NULL, n = 0;
      if (cli_parse_ids(command, argv[i], &ids, &n)) goto done;
      char *text = NULL;
      size_t len = 0;
      const ina_status_t st = ina_tokenizer_decode(tok, ids, (size_t)n, !special_flag, &text, &len);
      free(ids);
      if (st != INA_OK) {
        fprintf(stderr, "%s: '%s': %s\n", command, argv[i], ina_last_error());
        goto done;
      }
      fwrite(text, 1, len, stdout);
      printf("\n");
      free(text);
    } else {
      int32_t *ids = NULL;
      size_t n = 0;
      if (ina_tokenizer_encode(tok, argv[i], strlen(argv[i]), !special_flag, &ids, &n) != INA_OK) {
        fprintf(stderr, "%s: %s\n", command, ina_last_error());
        goto done;
      }
      for (size_t k = 0; k < n; k++) printf("%s%d", k ? "," : "", ids[k]);
      printf("\n");
      free(ids);
    }
  }
  rc = 0;
done:
  ina_tokenizer_destroy(tok);
  return rc;
}
