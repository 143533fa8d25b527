/* The program cache's size cap: least recently used entries go first. An
 * entry's mtime is its last use (set when it is written and on every load:
 * atime is unreliable under relatime and noatime mounts). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "device/device.h"

enum { DEFAULT_CAP_MB = 512 };

uint64_t ca_cache_cap(void) {
  const char *env = getenv("CLATTN_CACHE_MAX_BYTES");
  if (env && *env >= '0' && *env <= '9') {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(env, &end, 10);
    if (errno == 0 && *end == '\0' && v > 0) return v;
  }
  return (uint64_t)DEFAULT_CAP_MB << 20;
}

/* "<32 hex digits>.bin": the names entries have (temporary files and load
 * markers are not counted, nor anything else in the directory). */
static int is_entry(const char *name) {
  if (strlen(name) != 36 || strcmp(name + 32, ".bin") != 0) return 0;
  for (int i = 0; i < 32; i++)
    if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f'))) return 0;
  return 1;
}

typedef struct {
  char name[37];
  struct timespec used;
  uint64_t size;
} entry;

static int older_first(const void *a, const void *b) {
  const entry *x = a, *y = b;
  if (x->used.tv_sec != y->used.tv_sec) return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
  if (x->used.tv_nsec != y->used.tv_nsec) return x->used.tv_nsec < y->used.tv_nsec ? -1 : 1;
  return strcmp(x->name, y->name);
}

void ca_cache_evict(const char *dir, const char *keep, uint64_t cap) {
  DIR *d = opendir(dir);
  if (!d) return;
  const size_t path_len = strlen(dir) + 1 + 36 + 1;
  char *path = malloc(path_len);
  entry *all = NULL;
  size_t n = 0, room = 0;
  uint64_t total = 0;
  for (struct dirent *de; path && (de = readdir(d));) {
    struct stat sb;
    if (!is_entry(de->d_name)) continue;
    snprintf(path, path_len, "%s/%s", dir, de->d_name);
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    if (n == room) {
      entry *grown = realloc(all, (room = room ? 2 * room : 64) * sizeof *all);
      if (!grown) break;
      all = grown;
    }
    snprintf(all[n].name, sizeof all[n].name, "%s", de->d_name);
    all[n].used = sb.st_mtim;
    all[n].size = (uint64_t)sb.st_size;
    total += all[n++].size;
  }
  closedir(d);
  if (total > cap && all) {
    qsort(all, n, sizeof *all, older_first);
    for (size_t i = 0; i < n && total > cap; i++) {
      snprintf(path, path_len, "%s/%s", dir, all[i].name);
      if (keep && strcmp(path, keep) == 0) continue;
      if (unlink(path) == 0) total -= all[i].size;
    }
  }
  free(all);
  free(path);
}
