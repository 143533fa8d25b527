/*
 * Option values of the tool's commands. Every parser names the option, the
 * value and the accepted form on stderr ("clattn run: --q-len abc: expected
 * an integer from 1 to 2147483647") and returns -1, so every command rejects
 * a bad value the same way and none is silently taken as 0.
 */
#ifndef CLATTN_TOOLS_CLI_ARGS_H
#define CLATTN_TOOLS_CLI_ARGS_H

#include <getopt.h>
#include <stdint.h>

/* An integer in [min, max]. */
int cli_int(const char *cmd, const char *opt, const char *val, long min, long max, int *out);

/* A non-negative integer that fits 64 bits (seeds). */
int cli_u64(const char *cmd, const char *opt, const char *val, uint64_t *out);

/* A finite number; above min (or at least min when min_inclusive). */
int cli_double(const char *cmd, const char *opt, const char *val, double min, int min_inclusive, double *out);

/* One of n names: *index receives its position. The message lists them. */
int cli_choice(const char *cmd, const char *opt, const char *val, const char *const *names, int n, int *index);

/* Whether s ends with suffix (file names by their extension). */
int cli_ends_with(const char *s, const char *suffix);

/* Parses the options of argv[1..] (argv[0] is the command's name) with
 * getopt_long, calling on(code, optarg, ctx) for each and stopping at the
 * first call that returns non-zero (it reported why). longopts must hold
 * {"help", no_argument, NULL, 'h'}: cli_parse prints help for it. An
 * unknown option, a missing value or a stray operand is reported, naming
 * it. Returns 0, 1 after --help, or -1 after an error (exit status 2). */
typedef int (*cli_handler)(int code, const char *arg, void *ctx);
int cli_parse(const char *cmd, int argc, char **argv, const struct option *longopts, const char *help, cli_handler on,
              void *ctx);

/* The value of an option whose value is optional, from a cli_handler:
 * "--lse=out.npy", or the next argument when it ends in suffix ("--lse
 * out.npy", consumed); NULL for a bare "--lse". */
const char *cli_optional_value(const char *arg, const char *suffix);

#endif
