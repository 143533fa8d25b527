/*
 * A plan's own resources, bound once: its scratch buffers and flag, and a
 * kernel object per launch with every argument set. Each run sets only the
 * arguments that differ from what the kernels hold (a decode step: the
 * scalars struct, whose kv_len changed) and enqueues the launches chained
 * by events, or replays them from a command buffer (command_buffer.c):
 * recorded on the first run that can, replayed as recorded when nothing
 * changed, updated in place (mutable dispatch) when arguments or grids
 * did, recorded anew when the kernels themselves changed (keys split or
 * not). The planner made the list; this file decides nothing about it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run/command_buffer.h"

typedef struct {
  cl_program program;
  char name[40];
  cl_kernel kernel;
  ca_held held;    /* what the kernel object holds */
  ca_held cb_held; /* what the command buffer's command holds */
} slot;

struct ca_bound {
  clattn_context *ctx;
  ca_resources res; /* own scratch and flag */
  size_t scratch_bytes[CA_LIST_SCRATCH];
  int n_scratch;
  slot *slots;
  int n_slots;
  ca_command_buffer *cb; /* recorded at bind time, where the device offers one; NULL: plain enqueues */
  cl_event last;
  int synced; /* the kernel objects hold every argument of the last run's list */
  long replays, updates;
};

static clattn_status own_buffer(clattn_context *ctx, size_t bytes, const void *init, const char *what, cl_mem *out) {
  cl_int err = CL_SUCCESS;
  *out = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE | (init ? CL_MEM_COPY_HOST_PTR : 0), bytes ? bytes : 1,
                        (void *)init, &err);
  if (err == CL_SUCCESS) return CLATTN_OK;
  *out = NULL;
  char msg[96];
  snprintf(msg, sizeof msg, "clCreateBuffer(plan: %s)", what);
  return ca_cl_fail(err, msg);
}

/* Slot i holds a kernel object of launch x's kernel (a new one when it held another). */
static clattn_status slot_for(ca_bound *b, int i, const ca_launch *x) {
  if (i >= b->n_slots) {
    slot *grown = realloc(b->slots, (size_t)(i + 1) * sizeof *grown);
    if (!grown) return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "plan: out of host memory");
    memset(grown + b->n_slots, 0, (size_t)(i + 1 - b->n_slots) * sizeof *grown);
    b->slots = grown;
    b->n_slots = i + 1;
  }
  slot *s = &b->slots[i];
  if (s->kernel && s->program == x->program && strcmp(s->name, x->kernel) == 0) return CLATTN_OK;
  if (s->kernel) clReleaseKernel(s->kernel);
  memset(s, 0, sizeof *s);
  clattn_status st = ca_create_kernel(x->program, x->kernel, &s->kernel);
  if (st != CLATTN_OK) return st;
  s->program = x->program;
  snprintf(s->name, sizeof s->name, "%s", x->kernel);
  return CLATTN_OK;
}

/* A scratch slot the step needs larger than the plan holds (a staged
 * step's chunks take more rows for fewer keys) is made anew at that size;
 * commands still using the old buffer keep it alive until they are done,
 * and the kernels take the new one as a changed argument. */
static clattn_status grow(ca_bound *b, const ca_list *l) {
  clattn_status st = CLATTN_OK;
  for (int i = 0; i < l->n_scratch && st == CLATTN_OK; i++) {
    if (i < b->n_scratch && l->scratch[i] <= b->scratch_bytes[i]) continue;
    if (i < b->n_scratch && b->res.scratch[i]) clReleaseMemObject(b->res.scratch[i]);
    b->res.scratch[i] = NULL;
    st = own_buffer(b->ctx, l->scratch[i], NULL, l->scratch_what[i], &b->res.scratch[i]);
    b->scratch_bytes[i] = st == CLATTN_OK ? l->scratch[i] : 0;
    if (i >= b->n_scratch) b->n_scratch = i + 1;
  }
  if (st == CLATTN_OK) ca_note_scratch(b->ctx, ca_list_scratch_bytes(l));
  return st;
}

/* Every kernel launch's object holds its arguments from l. */
static clattn_status set_all(ca_bound *b, const ca_list *l) {
  clattn_status st = CLATTN_OK;
  for (int i = 0; i < l->n_launch && st == CLATTN_OK; i++) {
    const ca_launch *x = &l->launch[i];
    if (x->kind == CA_LAUNCH_KERNEL && !(st = slot_for(b, i, x)))
      st = ca_set_launch_args(b->slots[i].kernel, &b->slots[i].held, 1, l, x, &b->res);
  }
  return st;
}

/* The arguments a step's kv_len was written into (the list's step sites):
 * all that differs from the last run's list. */
static clattn_status set_sites(ca_bound *b, const ca_list *l) {
  for (int i = 0; i < l->n_step_sites; i++) {
    const ca_step_site *site = &l->step_site[i];
    if (i && site->launch == site[-1].launch && site->arg == site[-1].arg) continue; /* set with the one before */
    const ca_arg *a = &l->arg[l->launch[site->launch].first_arg + site->arg];
    slot *s = &b->slots[site->launch];
    const cl_int err = ca_held_set(s->kernel, &s->held, (cl_uint)site->arg, a->size, l->arena + a->at, 1);
    if (err != CL_SUCCESS) {
      char what[96];
      snprintf(what, sizeof what, "clSetKernelArg(%s, argument %d)", s->name, site->arg);
      return ca_cl_fail(err, what);
    }
  }
  return CLATTN_OK;
}

/* Whether the command buffer's command of slot s holds (size, value) as argument j. */
static int cb_holds(const slot *s, cl_uint j, size_t size, const void *value) {
  const ca_held *h = &s->cb_held;
  return j < CA_HELD_ARGS && h->known[j] && h->size[j] == size && memcmp(h->bytes + h->at[j], value, size) == 0;
}

/* The command buffer's view of what it holds: every argument of l. */
static void cb_note(ca_bound *b, const ca_list *l) {
  for (int i = 0; i < l->n_launch; i++) b->slots[i].cb_held = b->slots[i].held;
}

clattn_status ca_bind(clattn_context *ctx, const ca_list *l, ca_bound **out) {
  *out = NULL;
  if (l->error) return l->error;
  clattn_status st = ca_check_scratch(ctx, l);
  if (st != CLATTN_OK) return st;
  ca_bound *b = calloc(1, sizeof *b);
  if (!b) return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "plan: out of host memory");
  b->ctx = ctx;
  for (int i = 0; i < l->n_scratch && st == CLATTN_OK; i++) {
    st = own_buffer(ctx, l->scratch[i], NULL, l->scratch_what[i], &b->res.scratch[i]);
    b->scratch_bytes[i] = l->scratch[i];
    b->n_scratch = i + 1;
  }
  static const cl_int zero = 0;
  if (st == CLATTN_OK && l->flag) st = own_buffer(ctx, sizeof zero, &zero, "empty-row flag", &b->res.flag);
  if (st == CLATTN_OK) st = set_all(b, l);
  b->synced = st == CLATTN_OK;
  /* recorded now, where the device offers command buffers: the first step
   * then replays it, as planned or updated in place */
  ca_kernel_launch now[CA_CB_LAUNCHES];
  const int n = st == CLATTN_OK ? ca_bound_launches(b, l, now, CA_CB_LAUNCHES) : -1;
  if (n > 0 && n <= CA_CB_LAUNCHES && (st = ca_command_buffer_record(ctx, now, n, &b->cb)) == CLATTN_OK && b->cb)
    cb_note(b, l);
  if (st != CLATTN_OK) {
    ca_bound_release(b);
    return st;
  }
  ca_note_scratch(ctx, ca_list_scratch_bytes(l));
  *out = b;
  return CLATTN_OK;
}

int ca_bound_launches(ca_bound *b, const ca_list *l, ca_kernel_launch *out, int max) {
  int n = 0;
  for (int i = 0; i < l->n_launch; i++) {
    const ca_launch *x = &l->launch[i];
    if (x->kind != CA_LAUNCH_KERNEL || i >= b->n_slots) return -1;
    if (n < max)
      out[n] = (ca_kernel_launch){b->slots[i].kernel, b->slots[i].name, x->dims,
                                  {x->global[0], x->global[1], x->global[2]}, x->local_given ? x->local : NULL};
    n++;
  }
  return n;
}

/* Replays the command buffer for l when it can hold l's launches: as
 * recorded, updated in place (mutable dispatch), or recorded anew when the
 * kernels changed. *used 0: the plain path's turn. */
static clattn_status replay(ca_bound *b, const ca_list *l, const ca_kernel_launch *now, int n, cl_uint n_wait,
                            const cl_event *wait, cl_event *last, int *used) {
  clattn_status st = CLATTN_OK;
  *used = 0;
  if (!b->cb) return CLATTN_OK;
  {
    const ca_kernel_launch *rec;
    const int n_rec = ca_command_buffer_launches(b->cb, &rec);
    int same_kernels = n_rec == n, same_grids = 1;
    for (int i = 0; same_kernels && i < n; i++) {
      same_kernels = rec[i].kernel == now[i].kernel;
      same_grids &= memcmp(rec[i].global, now[i].global, sizeof now[i].global) == 0;
    }
    /* the arguments that differ from the recorded commands' */
    ca_arg_update u[CA_CB_LAUNCHES * CA_CB_ARGS];
    cl_mem mems[CA_CB_LAUNCHES * CA_CB_ARGS];
    int n_u = 0, too_many = 0;
    for (int i = 0; same_kernels && i < n; i++) {
      const ca_launch *x = &l->launch[i];
      int per_launch = 0;
      for (int j = 0; j < x->n_args; j++) {
        const ca_arg *a = &l->arg[x->first_arg + j];
        const void *value = l->arena + a->at;
        size_t size = a->size;
        if (a->is_buf) {
          mems[n_u] = ca_resolve_buf(&b->res, a->buf);
          value = &mems[n_u];
          size = sizeof(cl_mem);
        }
        if (cb_holds(&b->slots[i], (cl_uint)j, size, value)) continue;
        if (per_launch++ == CA_CB_ARGS) {
          too_many = 1;
          break;
        }
        u[n_u++] = (ca_arg_update){i, (cl_uint)j, size, value};
      }
    }
    const int changed = !same_kernels || !same_grids || n_u > 0;
    if (changed) {
      if (!ca_command_buffer_mutable(b->cb) || too_many) return CLATTN_OK;
      if (!same_kernels) {
        ca_command_buffer_release(b->cb);
        b->cb = NULL;
        if ((st = ca_command_buffer_record(b->ctx, now, n, &b->cb)) || !b->cb) return st;
      } else {
        if ((st = ca_command_buffer_update(b->cb, u, n_u, now))) return st;
        b->updates++;
      }
      cb_note(b, l);
    }
  }
  *used = 1;
  b->replays++;
  return ca_command_buffer_enqueue(b->cb, n_wait, wait, last);
}

/* EMPTY_ERROR: the flag after the run; raised, it is zeroed after last
 * (*last becomes the zeroing) and the run returns CLATTN_ERR_EMPTY_ROW. */
static clattn_status check_flag(ca_bound *b, cl_event *last) {
  static const cl_int zero = 0; /* static: the non-blocking write may read it after this returns */
  int raised = 0;
  const clattn_status st = ca_read_flag(b->ctx, b->res.flag, *last, &raised);
  if (!raised) return st;
  cl_event zeroed = NULL;
  const cl_int err =
      clEnqueueWriteBuffer(b->ctx->queue, b->res.flag, CL_FALSE, 0, sizeof zero, &zero, 1, last, &zeroed);
  if (err != CL_SUCCESS) return ca_cl_fail(err, "clEnqueueWriteBuffer(zeroing an empty-row flag)");
  clReleaseEvent(*last);
  *last = zeroed;
  return st;
}

clattn_status ca_run_bound(ca_bound *b, const ca_list *l, int planned, cl_uint n_wait, const cl_event *wait,
                           cl_event *done) {
  clattn_context *ctx = b->ctx;
  if (done) *done = NULL;
  if (l->error) return l->error;
  if (l->n_scratch > CA_LIST_SCRATCH || (l->flag && !b->res.flag))
    return ca_fail(CLATTN_ERR_UNSUPPORTED, "plan: a step needs buffers the plan does not hold");
  const int patched = !planned && b->synced; /* the last run's list at its step sites */
  clattn_status st = patched ? CLATTN_OK : ca_check_scratch(ctx, l);
  if (st == CLATTN_OK && !patched) st = grow(b, l);
  if (st != CLATTN_OK) return st;
  cl_event local[8], *list = local, prev = NULL;
  cl_uint n = n_wait;
  if (ctx->out_of_order && b->last) { /* its scratch is this run's */
    if (n_wait + 1 > sizeof local / sizeof local[0] && !(list = malloc((n_wait + 1) * sizeof *list)))
      return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "plan: out of host memory");
    if (n_wait) memcpy(list, wait, n_wait * sizeof *list);
    list[n++] = b->last;
    wait = list;
  }
  ca_trace_begin(l->what);
  st = patched ? set_sites(b, l) : set_all(b, l);
  b->synced = st == CLATTN_OK;
  ca_kernel_launch now[CA_CB_LAUNCHES];
  const int n_now = st == CLATTN_OK && b->cb ? ca_bound_launches(b, l, now, CA_CB_LAUNCHES) : -1;
  int replayed = 0;
  if (n_now > 0 && n_now <= CA_CB_LAUNCHES) st = replay(b, l, now, n_now, n, n ? wait : NULL, &prev, &replayed);
  if (replayed)
    for (int i = 0; i < l->n_launch; i++) ca_trace_kernel(l->launch[i].kernel);
  for (int i = 0; i < l->n_launch && st == CLATTN_OK && !replayed; i++) {
    const ca_launch *x = &l->launch[i];
    st = ca_enqueue_launch(ctx, x->kind == CA_LAUNCH_KERNEL ? b->slots[i].kernel : NULL, l, x, &b->res, n, wait,
                           &prev);
  }
  if (list != local) free(list);
  if (st == CLATTN_OK && l->flag && l->empty_rows == CLATTN_EMPTY_ERROR) st = check_flag(b, &prev);
  if (prev && ctx->out_of_order) {          /* whatever went in, the next run waits for it */
    const cl_int err = clRetainEvent(prev); /* one reference for the bound, one for *done */
    if (b->last) clReleaseEvent(b->last);
    b->last = prev;
    if (err != CL_SUCCESS) {
      if (st == CLATTN_OK) st = ca_cl_fail(err, "clRetainEvent(a plan step's last event)");
      prev = NULL;
    }
  }
  ca_hand_out(st, &prev, done);
  return st;
}

long ca_bound_replays(const ca_bound *b) { return b->replays; }
long ca_bound_updates(const ca_bound *b) { return b->updates; }

void ca_bound_release(ca_bound *b) {
  if (!b) return;
  ca_command_buffer_release(b->cb);
  for (int i = 0; i < b->n_slots; i++)
    if (b->slots[i].kernel) clReleaseKernel(b->slots[i].kernel);
  free(b->slots);
  for (int i = 0; i < b->n_scratch; i++)
    if (b->res.scratch[i]) clReleaseMemObject(b->res.scratch[i]);
  if (b->res.flag) clReleaseMemObject(b->res.flag);
  if (b->last) clReleaseEvent(b->last);
  free(b);
}
