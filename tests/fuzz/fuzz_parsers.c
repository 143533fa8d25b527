/*
 * The parser fuzz cases (fuzz_parsers.h).
 *
 * Cache entries: checked against FZ_CACHE_KEY and against the input's own
 * key field (so mutations reach the length and checksum checks). Accepted
 * means: the header is whole, the payload is exactly the rest of the input
 * and not empty, and the checksum field is the checksum of the input.
 * Refused means nothing is reported as payload.
 *
 * Tuning files: accepted means format 1 and non-empty, NUL-terminated
 * platform, device and driver strings, every value present passing
 * ca_tunable_parse (the one rule), AUTO choices that are paths a class may
 * take; refused means a message that names the file.
 */
#include "fuzz_parsers.h"

#include <stdio.h>
#include <string.h>

#include "api/api.h"

static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static int check_entry(const uint8_t *data, size_t size, const ca_cache_key *key, const char *which, int *accepted,
                       char *why, size_t n) {
  size_t at = 7, len = 7;
  int rc = ca_cache_entry_parse(data, size, key, &at, &len);
  if (accepted) *accepted = rc == 0;
  if (rc == -1) {
    if (at != 0 || len != 0)
      return snprintf(why, n, "%s: refused but payload at %zu, %zu bytes", which, at, len), FZ_FAIL;
    return FZ_PASS;
  }
  if (rc != 0) return snprintf(why, n, "%s: returned %d", which, rc), FZ_FAIL;
  if (size < 48 || at != 48 || len == 0 || at + len != size)
    return snprintf(why, n, "%s: accepted %zu bytes with payload at %zu, %zu bytes", which, size, at, len), FZ_FAIL;
  if (memcmp(data, "CLATTNPB", 8) != 0 || memcmp(data + 16, key->bytes, 16) != 0 || le64(data + 32) != len ||
      le64(data + 40) != ca_cache_entry_checksum(data, size))
    return snprintf(why, n, "%s: accepted a header that does not hold", which), FZ_FAIL;
  return FZ_PASS;
}

int fz_cache_entry(const uint8_t *data, size_t size, int *accepted, char *why, size_t n) {
  ca_cache_key key;
  memcpy(key.bytes, FZ_CACHE_KEY, 16);
  if (check_entry(data, size, &key, "fixed key", accepted, why, n) != FZ_PASS) return FZ_FAIL;
  if (size >= 32) {
    memcpy(key.bytes, data + 16, 16);
    if (check_entry(data, size, &key, "own key", NULL, why, n) != FZ_PASS) return FZ_FAIL;
  }
  return FZ_PASS;
}

static int terminated(const char *s, size_t cap) { return memchr(s, '\0', cap) != NULL && s[0] != '\0'; }

int fz_tuning_file(const uint8_t *data, size_t size, int *accepted, char *why, size_t n) {
  ca_tuning t;
  char err[512];
  memset(err, 'x', sizeof err);
  int rc = ca_tuning_parse((const char *)data, size, "fuzz", &t, err, sizeof err);
  if (accepted) *accepted = rc == 0;
  if (rc == -1) {
    if (!memchr(err, '\0', sizeof err) || strncmp(err, "fuzz", 4) != 0)
      return snprintf(why, n, "refused without a message naming the file"), FZ_FAIL;
    return FZ_PASS;
  }
  if (rc != 0) return snprintf(why, n, "returned %d", rc), FZ_FAIL;
  if (!terminated(t.platform, sizeof t.platform) || !terminated(t.device, sizeof t.device) ||
      !terminated(t.driver, sizeof t.driver))
    return snprintf(why, n, "accepted without platform, device and driver strings"), FZ_FAIL;
  for (int k = 0; k < CA_T_COUNT; k++) {
    if (!t.has[k]) continue;
    char text[32], msg[256];
    long long v = 0;
    snprintf(text, sizeof text, "%lld", t.value[k]);
    if (ca_tunable_parse((ca_tunable)k, ca_tunable_name((ca_tunable)k), text, &v, msg, sizeof msg) != 0 ||
        v != t.value[k])
      return snprintf(why, n, "accepted %s = %lld, which its rule refuses", ca_tunable_name((ca_tunable)k), t.value[k]),
             FZ_FAIL;
  }
  if ((t.has[CA_T_BLOCK_RM] || t.has[CA_T_BLOCK_RN]) &&
      (t.has[CA_T_BLOCK_RM] != t.has[CA_T_BLOCK_RN] ||
       !tl_block_allowed((int)t.value[CA_T_BLOCK_RM], (int)t.value[CA_T_BLOCK_RN])))
    return snprintf(why, n, "accepted flash_block's tile %lldx%lld (given: %d, %d)", t.value[CA_T_BLOCK_RM],
                    t.value[CA_T_BLOCK_RN], t.has[CA_T_BLOCK_RM], t.has[CA_T_BLOCK_RN]),
           FZ_FAIL;
  for (int c = 0; c < CA_CLASS_COUNT; c++) {
    clattn_algo a = t.auto_algo[c];
    int ok = a == CLATTN_ALGO_AUTO || a == CLATTN_ALGO_STAGED || a == CLATTN_ALGO_GEMM ||
             (a == CLATTN_ALGO_FUSED && c != CA_CLASS_WEIGHTS);
    if (!ok) return snprintf(why, n, "accepted AUTO choice %d for class %d", (int)a, c), FZ_FAIL;
  }
  return FZ_PASS;
}
