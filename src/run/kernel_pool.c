/*
 * The context's kernel objects, created once and reused by every call, and
 * the argument values each holds.
 *
 * A kernel object holds its argument values, so two threads must never set
 * arguments on one at the same time: a call takes an idle object of
 * (program, name) from the pool, or creates one when all are busy, and
 * gives it back once its last enqueue has returned (OpenCL captures the
 * arguments at enqueue, so the object may be reused right away). The pool
 * therefore holds, per kernel, as many objects as calls ever ran it at once.
 * Each object remembers the argument values it holds, so the next call sets
 * only those that changed.
 */
#include <stdlib.h>
#include <string.h>

#include "run/run.h"

int ca_held_has(const ca_held *held, cl_uint i, size_t size, const void *value) {
  if (!held || i >= CA_HELD_ARGS || !held->known[i] || held->size[i] != size) return 0;
  const unsigned char *have = held->bytes + held->at[i];
  if (size == sizeof(void *)) { /* a buffer, compared inline: most of a launch's arguments */
    void *a, *b;
    memcpy(&a, have, sizeof a);
    memcpy(&b, value, sizeof b);
    return a == b;
  }
  return memcmp(have, value, size) == 0;
}

cl_int ca_held_set(cl_kernel kernel, ca_held *held, cl_uint i, size_t size, const void *value, int holdable) {
  const int room = held && i < CA_HELD_ARGS;
  if (holdable && ca_held_has(held, i, size, value)) return CL_SUCCESS;
  const cl_int err = clSetKernelArg(kernel, i, size, value);
  if (!room) return err;
  /* argument i keeps its place in bytes once it has one of its size */
  if (err != CL_SUCCESS || !holdable) {
    held->known[i] = 0;
    return err;
  }
  if (held->size[i] != size) {
    size_t end = 0;
    for (int a = 0; a < CA_HELD_ARGS; a++)
      if (held->size[a] && held->at[a] + held->size[a] > end) end = held->at[a] + held->size[a];
    if (end + size > CA_HELD_BYTES) {
      held->known[i] = 0;
      return err;
    }
    held->at[i] = end;
    held->size[i] = size;
  }
  memcpy(held->bytes + held->at[i], value, size);
  held->known[i] = 1;
  return err;
}

void ca_held_forget(ca_held *held) { memset(held, 0, sizeof *held); }

/* Releases the idle kernels of programs the table has released (programs
 * with modifiers past its bound): checked when a kernel is created, and
 * only after the table released one, so the pool stays as bounded as the
 * table and a context without modifiers never walks it. */
static void prune(clattn_context *ctx) {
  const unsigned long released = ca_programs_released(ctx);
  pthread_mutex_lock(&ctx->kernels_lock);
  if (ctx->kernels_pruned == released) {
    pthread_mutex_unlock(&ctx->kernels_lock);
    return;
  }
  ctx->kernels_pruned = released;
  for (ca_pooled_kernel **at = &ctx->kernels; *at;) {
    ca_pooled_kernel *k = *at;
    if (k->busy || ca_program_live(ctx, k->program)) {
      at = &k->next;
      continue;
    }
    *at = k->next;
    clReleaseKernel(k->kernel);
    free(k);
  }
  pthread_mutex_unlock(&ctx->kernels_lock);
}

clattn_status ca_kernel_take(clattn_context *ctx, cl_program program, const char *name, ca_pooled_kernel **out) {
  *out = NULL;
  pthread_mutex_lock(&ctx->kernels_lock);
  for (ca_pooled_kernel *k = ctx->kernels; k; k = k->next)
    if (!k->busy && k->program == program && strcmp(k->name, name) == 0) {
      k->busy = 1;
      *out = k;
      break;
    }
  pthread_mutex_unlock(&ctx->kernels_lock);
  if (*out) return CLATTN_OK;

  prune(ctx);
  if (strlen(name) >= sizeof((ca_pooled_kernel *)0)->name)
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "kernel pool: kernel name %s is too long", name);
  ca_pooled_kernel *k = calloc(1, sizeof *k);
  if (!k) return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "kernel pool: out of host memory");
  clattn_status st = ca_create_kernel(program, name, &k->kernel); /* outside the lock: it may take a while */
  if (st != CLATTN_OK) {
    free(k);
    return st;
  }
  k->program = program;
  k->busy = 1;
  strcpy(k->name, name);
  pthread_mutex_lock(&ctx->kernels_lock);
  k->next = ctx->kernels;
  ctx->kernels = k;
  pthread_mutex_unlock(&ctx->kernels_lock);
  *out = k;
  return CLATTN_OK;
}

void ca_kernel_give(clattn_context *ctx, ca_pooled_kernel *k) {
  if (!k) return;
  pthread_mutex_lock(&ctx->kernels_lock);
  k->busy = 0;
  pthread_mutex_unlock(&ctx->kernels_lock);
}

int ca_kernel_pool_size(clattn_context *ctx) {
  int n = 0;
  pthread_mutex_lock(&ctx->kernels_lock);
  for (ca_pooled_kernel *k = ctx->kernels; k; k = k->next) n++;
  pthread_mutex_unlock(&ctx->kernels_lock);
  return n;
}

void ca_kernel_pool_trim(clattn_context *ctx) {
  pthread_mutex_lock(&ctx->kernels_lock);
  for (ca_pooled_kernel **at = &ctx->kernels; *at;) {
    ca_pooled_kernel *k = *at;
    if (k->busy) {
      at = &k->next;
      continue;
    }
    *at = k->next;
    clReleaseKernel(k->kernel);
    free(k);
  }
  pthread_mutex_unlock(&ctx->kernels_lock);
}
