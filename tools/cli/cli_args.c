/* Option values of the tool's commands (cli_args.h). */
#include "cli_args.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_int(const char *cmd, const char *opt, const char *val, long min, long max, int *out) {
  char *end = NULL;
  errno = 0;
  long v = strtol(val, &end, 10);
  if (end != val && !*end && errno == 0 && v >= min && v <= max) return *out = (int)v, 0;
  if (min == 1 && max == INT_MAX)
    fprintf(stderr, "clattn %s: --%s %s: expected a positive integer\n", cmd, opt, val);
  else if (min == 0 && max == INT_MAX)
    fprintf(stderr, "clattn %s: --%s %s: expected a non-negative integer\n", cmd, opt, val);
  else
    fprintf(stderr, "clattn %s: --%s %s: expected an integer from %ld to %ld\n", cmd, opt, val, min, max);
  return -1;
}

int cli_u64(const char *cmd, const char *opt, const char *val, uint64_t *out) {
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(val, &end, 10);
  /* strtoull takes "-1" as 2^64 - 1: a sign is refused here */
  if (val[0] >= '0' && val[0] <= '9' && !*end && errno == 0) return *out = v, 0;
  fprintf(stderr, "clattn %s: --%s %s: expected a non-negative integer below 2^64\n", cmd, opt, val);
  return -1;
}

int cli_double(const char *cmd, const char *opt, const char *val, double min, int min_inclusive, double *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(val, &end);
  if (end != val && !*end && errno != ERANGE && isfinite(v) && (min_inclusive ? v >= min : v > min)) return *out = v, 0;
  if (min == -HUGE_VAL)
    fprintf(stderr, "clattn %s: --%s %s: expected a finite number\n", cmd, opt, val);
  else
    fprintf(stderr, "clattn %s: --%s %s: expected a finite number %s %g\n", cmd, opt, val, min_inclusive ? ">=" : ">",
            min);
  return -1;
}

int cli_choice(const char *cmd, const char *opt, const char *val, const char *const *names, int n, int *index) {
  for (int i = 0; i < n; i++)
    if (strcmp(val, names[i]) == 0) return *index = i, 0;
  fprintf(stderr, "clattn %s: --%s %s: expected one of ", cmd, opt, val);
  for (int i = 0; i < n; i++) fprintf(stderr, "%s%s", i ? "|" : "", names[i]);
  fprintf(stderr, "\n");
  return -1;
}

int cli_ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The argument vector being parsed, for cli_optional_value. */
static int parse_argc;
static char **parse_argv;

const char *cli_optional_value(const char *arg, const char *suffix) {
  if (arg) return arg;
  if (parse_argv && optind < parse_argc && parse_argv[optind][0] != '-' && cli_ends_with(parse_argv[optind], suffix))
    return parse_argv[optind++];
  return NULL;
}

int cli_parse(const char *cmd, int argc, char **argv, const struct option *longopts, const char *help, cli_handler on,
              void *ctx) {
  opterr = 0; /* the messages below name the command and the option */
  optind = 0; /* glibc: start afresh */
  parse_argc = argc;
  parse_argv = argv;
  int rc = 0;
  for (;;) {
    /* "+": stop at the first operand (reported below) rather than reorder;
     * ":": a missing value returns ':' */
    int c = getopt_long(argc, argv, "+:h", longopts, NULL);
    if (c == -1) break;
    if (c == 'h') {
      fputs(help, stdout);
      rc = 1;
      break;
    }
    if (c == ':') {
      fprintf(stderr, "clattn %s: %s needs a value (clattn %s --help gives its form)\n", cmd, argv[optind - 1], cmd);
      rc = -1;
      break;
    }
    if (c == '?') {
      const char *bad = argv[optind - 1];
      if (strncmp(bad, "--", 2) == 0)
        fprintf(stderr, "clattn %s: %s is unknown, ambiguous, or a value given to a flag", cmd, bad);
      else
        fprintf(stderr, "clattn %s: unknown option -%c", cmd, optopt ? optopt : '?');
      fprintf(stderr, " (clattn %s --help lists the options)\n", cmd);
      rc = -1;
      break;
    }
    if (on(c, optarg, ctx) != 0) {
      rc = -1;
      break;
    }
  }
  if (rc == 0 && optind < argc) {
    fprintf(stderr, "clattn %s: unexpected argument '%s' (clattn %s --help lists the options)\n", cmd, argv[optind],
            cmd);
    rc = -1;
  }
  parse_argv = NULL;
  return rc;
}
