/* `ina`: the command line of the inference node agent project. */
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "tools/cli.h"

/* Client commands (tools/cmd_client.c), talking to a running ina-agent. */
/* Load and placement commands (tools/cmd_place.c), talking to a running ina-agent. */

static void usage(FILE *f) {
  fprintf(f,
          "usage: ina <command> [options]\n"
          "\n"
          "commands:\n"
          "  generate     generate from a model (checkpoint dir, tiny, random:NAME), from token\n"
          "               ids or text\n"
          "  model init   write a built-in configuration with seeded random weights as a\n"
          "               Hugging Face checkpoint\n"
          "  model info   print a model's configuration and size\n"
          "  tokenize     text to token ids with a model's tokenizer\n"
          "  detokenize   token ids to text\n"
          "  info         describe a running ina-agent (--server HOST:PORT)\n"
          "  health       ask a running ina-agent whether it serves (--server HOST:PORT)\n"
          "  load         a running ina-agent's queues, KV pages, throughput and per-expert\n"
          "               token counts (--server HOST:PORT)\n"
          "  place        show a running ina-agent's expert placement as JSON, or apply one\n"
          "               from a file (--server HOST:PORT)\n"
          "  plan         predict the expert-parallel exchange's bytes, messages and time\n"
          "               per rank at given EP degrees (--model SPEC --ep E --batch B)\n"
          "\n"
          "`ina generate --server HOST:PORT` streams from a running ina-agent instead.\n"
          "\n"
          "Run `ina <command> --help` for a command's options.\n"
          "Logging: INA_LOG=info (or warn, debug, trace; per part: INA_LOG=warn,model=debug).\n"
          "Threads: INA_NUM_THREADS (default: all CPUs).\n");
}

int main(int argc, char **argv) {
  /* Commands print the library's last error themselves, once, with their context. */
  ina_log_set_quiet_errors(1);
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
      strcmp(argv[1], "help") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (strcmp(argv[1], "generate") == 0) return cmd_generate(argc - 1, argv + 1);
  if (strcmp(argv[1], "model") == 0) return cmd_model(argc - 1, argv + 1);
  if (strcmp(argv[1], "tokenize") == 0 || strcmp(argv[1], "detokenize") == 0) return cmd_tokenize(argc - 1, argv + 1);
  if (strcmp(argv[1], "info") == 0) return cmd_info(argc - 1, argv + 1);
  if (strcmp(argv[1], "health") == 0) return cmd_health(argc - 1, argv + 1);
  if (strcmp(argv[1], "load") == 0) return cmd_load(argc - 1, argv + 1);
  if (strcmp(argv[1], "place") == 0) return cmd_place(argc - 1, argv + 1);
  if (strcmp(argv[1], "plan") == 0) return cmd_plan(argc - 1, argv + 1);
  fprintf(stderr, "ina: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
