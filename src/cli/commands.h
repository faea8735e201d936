/* Subcommands of the sluice binary. Each takes argc/argv starting at its own name and returns the
 * process exit status. */
#ifndef SLUICE_CLI_COMMANDS_H
#define SLUICE_CLI_COMMANDS_H

typedef struct sl_command {
    const char *name;
    const char *summary;
    int (*fn)(int argc, char **argv);
} sl_command;

int cmd_tokenize(int argc, char **argv);

int cmd_bench(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_show(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_pack(int argc, char **argv);
int cmd_pull(int argc, char **argv);
int cmd_list(int argc, char **argv);
int cmd_rm(int argc, char **argv);
int cmd_ppl(int argc, char **argv);

#endif
