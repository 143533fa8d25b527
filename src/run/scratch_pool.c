/*
 * The context's device scratch: buffers created on first need, grown when a
 * call needs more, kept for the context's life (never shrunk), and the
 * empty-row flags; and the largest scratch one call held (clattn_peak_scratch_bytes).
 *
 * A buffer serves one call at a time, and a call must not overtake the
 * commands of the call that used it before. On an in-order queue the new
 * call's commands run after those in queue order, so an idle buffer is
 * reused at once. On an out-of-order queue a buffer keeps the event of its
 * last use, and the call that takes it next adds that event to its first
 * command's wait list (deps.c); a buffer whose last use is not known (a
 * failed call's) gives a marker over every earlier command instead.
 * Waiting beats a fresh buffer per call: calls enqueued faster than they
 * run would otherwise grow the pool without bound, while this way it holds
 * as many buffers as calls ever held at once.
 *
 * Empty-row flags: a call under CLATTN_EMPTY_ERROR takes a zeroed int of its
 * own, pooled the same way. It reads the flag after its last command, so the
 * flag comes back clean, or marked dirty (raised, or given back by a failed
 * call) and is zeroed, after its last use, by a write the taking call's first
 * command waits for. Every other call passes no flag: kernels then raise
 * nothing.
 */
#include <stdio.h>
#include <stdlib.h>

#include "run/run.h"

struct ca_pooled_buffer {
  struct ca_pooled_buffer *next;
  cl_mem mem;
  size_t bytes;
  int busy;
  int dirty;         /* flags: may hold a raised value */
  int unordered;     /* out-of-order queue: its last use is not known; the next waits for every earlier command */
  cl_event last_use; /* out-of-order queue: its last use, NULL when none may be pending */
};

/* What waits for b's last use (out-of-order queues): its pending event, or
 * a marker over every earlier command when not known; NULL when none is
 * pending. The event's reference passes to the caller. */
static clattn_status last_use_event(clattn_context *ctx, struct ca_pooled_buffer *b, cl_event *out) {
  *out = NULL;
  if (b->unordered) {
    cl_int err = clEnqueueMarkerWithWaitList(ctx->queue, 0, NULL, out);
    if (err != CL_SUCCESS) return ca_cl_fail(err, "clEnqueueMarkerWithWaitList(after a scratch buffer's unknown last use)");
    b->unordered = 0;
    if (b->last_use) clReleaseEvent(b->last_use);
  } else {
    *out = b->last_use;
  }
  b->last_use = NULL;
  return CLATTN_OK;
}

/* Orders the taking call after b's last use: its first command waits for it. */
static clattn_status order_after_last_use(clattn_context *ctx, struct ca_pooled_buffer *b, ca_deps *deps) {
  cl_event ev = NULL;
  clattn_status st = last_use_event(ctx, b, &ev);
  return st == CLATTN_OK && ev ? ca_deps_add(ctx, deps, ev) : st;
}

/* Keeps last_use as b's last use (out-of-order queues); NULL: not known. */
static void note_use(clattn_context *ctx, struct ca_pooled_buffer *b, cl_event last_use) {
  if (!ctx->out_of_order) return;
  if (b->last_use) clReleaseEvent(b->last_use);
  b->last_use = NULL;
  if (last_use && clRetainEvent(last_use) == CL_SUCCESS)
    b->last_use = last_use;
  else
    b->unordered = 1;
}

static void unlink_buffer(struct ca_pooled_buffer **list, struct ca_pooled_buffer *b) {
  for (struct ca_pooled_buffer **at = list; *at; at = &(*at)->next)
    if (*at == b) {
      *at = b->next;
      return;
    }
}

/* A new buffer's size: 1/8 headroom (a decode's cache grows by a row per
 * step), in whole 4 KiB, within the device's largest allocation. */
static size_t grown_size(const clattn_context *ctx, size_t bytes) {
  size_t size = bytes + bytes / 8;
  size = size / 4096 * 4096 + 4096;
  if (size < bytes || size > ctx->max_alloc) size = bytes;
  return size;
}

clattn_status ca_scratch_take(clattn_context *ctx, size_t bytes, const char *what, ca_deps *deps, cl_mem *out) {
  *out = NULL;
  if (bytes == 0) bytes = sizeof(cl_int);
  struct ca_pooled_buffer *b = NULL, *largest = NULL;
  pthread_mutex_lock(&ctx->scratch_lock);
  for (struct ca_pooled_buffer *s = ctx->scratch; s; s = s->next) {
    if (s->busy) continue;
    if (s->bytes >= bytes && (!b || s->bytes < b->bytes)) b = s; /* the smallest that fits */
    if (!largest || s->bytes > largest->bytes) largest = s;
  }
  if (!b) b = largest; /* grown in place */
  cl_mem old = NULL;
  if (b) {
    b->busy = 1;
    if (b->bytes < bytes) { /* its handle leaves the list before it is released (and may be reused) */
      old = b->mem;
      b->mem = NULL;
      ctx->scratch_bytes -= b->bytes;
    }
  }
  pthread_mutex_unlock(&ctx->scratch_lock);

  clattn_status st = CLATTN_OK;
  if (b && !old) {
    if ((st = order_after_last_use(ctx, b, deps)) != CLATTN_OK) {
      ca_scratch_give(ctx, b->mem, NULL);
      return st;
    }
    *out = b->mem;
    return CLATTN_OK;
  }
  const int fresh = !b;
  if (fresh && !(b = calloc(1, sizeof *b)))
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "scratch pool: out of host memory");
  if (!fresh) { /* commands still using the old buffer keep it alive until they are done */
    clReleaseMemObject(old);
    if (b->last_use) clReleaseEvent(b->last_use);
    b->last_use = NULL;
    b->unordered = 0;
  }
  cl_int err = CL_SUCCESS;
  const size_t size = grown_size(ctx, bytes);
  cl_mem m = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, size, NULL, &err);
  pthread_mutex_lock(&ctx->scratch_lock); /* ca_scratch_give reads every buffer's mem */
  if (err == CL_SUCCESS) {
    b->mem = m;
    b->bytes = size;
    b->busy = 1;
    ctx->scratch_bytes += size;
    if (fresh) {
      b->next = ctx->scratch;
      ctx->scratch = b;
    }
  } else {
    unlink_buffer(&ctx->scratch, b); /* the pool stays as it was, less the buffer that was to grow */
  }
  pthread_mutex_unlock(&ctx->scratch_lock);
  if (err != CL_SUCCESS) {
    free(b);
    char msg[96];
    snprintf(msg, sizeof msg, "clCreateBuffer(%s)", what);
    return ca_cl_fail(err, msg);
  }
  *out = b->mem;
  return CLATTN_OK;
}

void ca_scratch_give(clattn_context *ctx, cl_mem mem, cl_event last_use) {
  if (!mem) return;
  pthread_mutex_lock(&ctx->scratch_lock);
  for (struct ca_pooled_buffer *b = ctx->scratch; b; b = b->next)
    if (b->mem == mem) {
      note_use(ctx, b, last_use);
      b->busy = 0;
      break;
    }
  pthread_mutex_unlock(&ctx->scratch_lock);
}

clattn_status ca_flag_take(clattn_context *ctx, ca_deps *deps, cl_mem *flag) {
  *flag = NULL;
  struct ca_pooled_buffer *b = NULL;
  pthread_mutex_lock(&ctx->scratch_lock);
  for (b = ctx->flags; b && b->busy; b = b->next) {
  }
  if (b) b->busy = 1;
  pthread_mutex_unlock(&ctx->scratch_lock);

  static const cl_int zero = 0; /* static: the non-blocking write may read it after this returns */
  if (b) {
    clattn_status st = CLATTN_OK;
    if (b->dirty) { /* zeroed after its last use, before the call's first command */
      cl_event last = NULL, zeroed = NULL;
      if ((st = last_use_event(ctx, b, &last)) == CLATTN_OK) {
        cl_int err = clEnqueueWriteBuffer(ctx->queue, b->mem, CL_FALSE, 0, sizeof zero, &zero, last ? 1 : 0,
                                          last ? &last : NULL, ctx->out_of_order ? &zeroed : NULL);
        if (err != CL_SUCCESS) st = ca_cl_fail(err, "clEnqueueWriteBuffer(zeroing an empty-row flag)");
      }
      if (last) clReleaseEvent(last);
      if (st == CLATTN_OK && zeroed) st = ca_deps_add(ctx, deps, zeroed);
      if (st == CLATTN_OK) b->dirty = 0;
    }
    if (st != CLATTN_OK) {
      ca_flag_give(ctx, b->mem, 0, NULL);
      return st;
    }
    *flag = b->mem;
    return CLATTN_OK;
  }
  if (!(b = calloc(1, sizeof *b))) return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "flag pool: out of host memory");
  cl_int err = CL_SUCCESS;
  b->mem = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof zero, (void *)&zero, &err);
  if (err != CL_SUCCESS) {
    free(b);
    return ca_cl_fail(err, "clCreateBuffer(empty-row flag)");
  }
  b->bytes = sizeof zero;
  b->busy = 1;
  pthread_mutex_lock(&ctx->scratch_lock);
  b->next = ctx->flags;
  ctx->flags = b;
  pthread_mutex_unlock(&ctx->scratch_lock);
  *flag = b->mem;
  return CLATTN_OK;
}

void ca_flag_give(clattn_context *ctx, cl_mem flag, int clean, cl_event last_use) {
  if (!flag) return;
  pthread_mutex_lock(&ctx->scratch_lock);
  for (struct ca_pooled_buffer *b = ctx->flags; b; b = b->next)
    if (b->mem == flag) {
      if (!clean) {
        b->dirty = 1;
        note_use(ctx, b, last_use);
      }
      b->busy = 0;
      break;
    }
  pthread_mutex_unlock(&ctx->scratch_lock);
}

void ca_scratch_stats(clattn_context *ctx, int *buffers, size_t *bytes) {
  pthread_mutex_lock(&ctx->scratch_lock);
  *buffers = 0;
  for (struct ca_pooled_buffer *b = ctx->scratch; b; b = b->next) (*buffers)++;
  *bytes = ctx->scratch_bytes;
  pthread_mutex_unlock(&ctx->scratch_lock);
}

void ca_scratch_pool_trim(clattn_context *ctx) {
  pthread_mutex_lock(&ctx->scratch_lock);
  struct ca_pooled_buffer **lists[2] = {&ctx->scratch, &ctx->flags};
  for (int i = 0; i < 2; i++)
    for (struct ca_pooled_buffer **at = lists[i]; *at;) {
      struct ca_pooled_buffer *b = *at;
      if (b->busy) {
        at = &b->next;
        continue;
      }
      *at = b->next;
      if (i == 0) ctx->scratch_bytes -= b->bytes;
      if (b->last_use) clReleaseEvent(b->last_use);
      clReleaseMemObject(b->mem); /* commands still using it keep it alive until they are done */
      free(b);
    }
  pthread_mutex_unlock(&ctx->scratch_lock);
}

void ca_note_scratch(clattn_context *ctx, size_t bytes) {
  pthread_mutex_lock(&ctx->scratch_lock);
  if (bytes > ctx->peak_scratch) ctx->peak_scratch = bytes;
  pthread_mutex_unlock(&ctx->scratch_lock);
}

size_t clattn_peak_scratch_bytes(clattn_context *ctx, int reset) {
  if (!ctx) return 0;
  pthread_mutex_lock(&ctx->scratch_lock);
  size_t peak = ctx->peak_scratch;
  if (reset) ctx->peak_scratch = 0;
  pthread_mutex_unlock(&ctx->scratch_lock);
  return peak;
}
