/*
 * The context's kernel objects, created once and reused by every call.
 *
 * A kernel object holds its argument values, so two threads must never set
 * arguments on one at the same time: a call takes an idle object of
 * (program, name) from the pool, or creates one when all are busy, and
 * gives it back once its last enqueue has returned (OpenCL captures the
 * arguments at enqueue, so the object may be reused right away). The pool
 * therefore holds, per kernel, as many objects as calls ever ran it at once.
 * Each object remembers the argument values it holds (ca_kernel_take_args),
 * so the next call sets only those that changed.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct ca_pooled_kernel {
  struct ca_pooled_kernel *next;
  cl_program program;
  cl_kernel kernel;
  int busy;
  char name[48];
  ca_arg_cache held; /* what its arguments hold (launch.c) */
};

/* The pooled object taken for this call. */
static clattn_status take(clattn_context *ctx, cl_program program, const char *name, struct ca_pooled_kernel **out) {
  *out = NULL;
  pthread_mutex_lock(&ctx->kernels_lock);
  for (struct ca_pooled_kernel *k = ctx->kernels; k; k = k->next)
    if (!k->busy && k->program == program && strcmp(k->name, name) == 0) {
      k->busy = 1;
      *out = k;
      break;
    }
  pthread_mutex_unlock(&ctx->kernels_lock);
  if (*out) return CLATTN_OK;

  if (strlen(name) >= sizeof((struct ca_pooled_kernel *)0)->name)
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "kernel pool: kernel name %s is too long", name);
  struct ca_pooled_kernel *k = calloc(1, sizeof *k);
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

clattn_status ca_kernel_take(clattn_context *ctx, cl_program program, const char *name, cl_kernel *out) {
  struct ca_pooled_kernel *k = NULL;
  clattn_status st = take(ctx, program, name, &k);
  *out = k ? k->kernel : NULL;
  return st;
}

clattn_status ca_kernel_take_args(clattn_context *ctx, cl_program program, const char *name, ca_args *out) {
  struct ca_pooled_kernel *k = NULL;
  clattn_status st = take(ctx, program, name, &k);
  *out = (ca_args){k ? k->kernel : NULL, name, 0, 0, CL_SUCCESS, k ? &k->held : NULL};
  return st;
}

void ca_kernel_give(clattn_context *ctx, cl_kernel kernel) {
  if (!kernel) return;
  pthread_mutex_lock(&ctx->kernels_lock);
  for (struct ca_pooled_kernel *k = ctx->kernels; k; k = k->next)
    if (k->kernel == kernel) {
      k->busy = 0;
      break;
    }
  pthread_mutex_unlock(&ctx->kernels_lock);
}

int ca_kernel_pool_size(clattn_context *ctx) {
  int n = 0;
  pthread_mutex_lock(&ctx->kernels_lock);
  for (struct ca_pooled_kernel *k = ctx->kernels; k; k = k->next) n++;
  pthread_mutex_unlock(&ctx->kernels_lock);
  return n;
}

void ca_kernel_pool_trim(clattn_context *ctx) {
  pthread_mutex_lock(&ctx->kernels_lock);
  for (struct ca_pooled_kernel **at = &ctx->kernels; *at;) {
    struct ca_pooled_kernel *k = *at;
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
