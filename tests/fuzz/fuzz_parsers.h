/*
 * Fuzz cases for the parsers of files clattn reads but did not necessarily
 * write: program cache entries (ca_cache_entry_parse) and tuning files
 * (ca_tuning_parse). Bytes in; the parser must return, touch nothing past
 * the input, and its answer must be consistent (see fuzz_parsers.c).
 *
 * Shared by the libFuzzer targets (fuzz_cache_entry.c, fuzz_tuning_file.c)
 * and the unit-suite test that replays their corpora
 * (tests/test_fuzz_parsers.c). tools/scripts/fuzz_parser_seeds.py writes the seeds.
 */
#ifndef CLATTN_FUZZ_PARSERS_H
#define CLATTN_FUZZ_PARSERS_H

#include <stddef.h>
#include <stdint.h>

#include "fuzz_case.h"

/* The key the cache-entry case checks entries against (besides each
 * input's own key field); the seeds are written for it. */
#define FZ_CACHE_KEY "clattn fuzz key."

/* FZ_PASS, or FZ_FAIL with the violation in why. Never abort. *accepted
 * (when not NULL): whether the parser accepted the input (a cache entry:
 * against FZ_CACHE_KEY). */
int fz_cache_entry(const uint8_t *data, size_t size, int *accepted, char *why, size_t n);
int fz_tuning_file(const uint8_t *data, size_t size, int *accepted, char *why, size_t n);

#endif
