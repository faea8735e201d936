#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/commands.h"

static const sl_command commands[] = {
    /* one line per command, kept in the order --help lists them */
    {"run", "chat with a model in the terminal, or answer one prompt", cmd_run},
    {"serve", "OpenAI, Anthropic and Ollama HTTP APIs on one port", cmd_serve},
    {"show", "architecture, sizes, dtypes and parameter counts of a model", cmd_show},
    {"logits", "raw float32 logits for token ids (validation)", cmd_logits},
    {"tokenize", "print the token ids of a text", cmd_tokenize},
    {"template", "render a chat template on a conversation", cmd_template},
    {"bench", "prefill and decode speed, and decode weight bandwidth", cmd_bench},
    {"pack", "copy each routed expert into one contiguous range, for streaming", cmd_pack},
    {"pull", "download a model from the Hugging Face Hub into the local cache", cmd_pull},
    {"list", "models in the local Hugging Face cache", cmd_list},
    {"rm", "remove a model from the local Hugging Face cache", cmd_rm},
    {"ppl", "perplexity over a text file, chunked as llama-perplexity does", cmd_ppl},
    {NULL, NULL, NULL},
};
static const int n_commands = (int)(sizeof commands / sizeof commands[0]) - 1;

static void usage(FILE *f) {
    fprintf(f, "sluice %s: LLM inference engine\n\nusage: sluice COMMAND [ARGS]\n\ncommands:\n", SLUICE_VERSION);
    for (int i = 0; i < n_commands; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'sluice COMMAND --help' describes a command.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("sluice %s (%s)\n", SLUICE_VERSION, sl_backends_compiled());
        return 0;
    }
    for (int i = 0; i < n_commands; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "sluice: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
