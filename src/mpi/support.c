/* What the MPI layer can make exact across shards. A feature that depends on
 * a key's position inside the call (ALiBi, the mask and bias matrices, packed
 * sequences) or needs the whole row at once (weights, route diagnostics) is
 * refused rather than computed with local positions. Sinks join once, as
 * one more state at the merge (O = 0, lse = sinks[h]), which is exact. */
#include "mpi_internal.h"

clattn_status cm_check_support(clattn_mpi *m, const clattn_params *p, const char *fn) {
  const char *what = NULL;
  if (p->dtype != CLATTN_F32)
    what = "f16/bf16 storage (the partial states would be rounded before the merge)";
  else if (p->mask.buf)
    what = "mask";
  else if (p->bias.buf)
    what = "bias";
  else if (p->alibi_slopes)
    what = "ALiBi (its distances are local to a call)";
  else if (p->sinks && p->empty_rows == CLATTN_EMPTY_ERROR)
    what = "sinks with CLATTN_EMPTY_ERROR (the merge cannot tell an empty row from a row that saw only the sink)";
  else if (p->cu_seqlens_q || p->cu_seqlens_k)
    what = "packed sequences (cu_seqlens)";
  else if (p->weights.buf)
    what = "the weights output";
  else if (p->entropy.buf || p->max_weight.buf || p->argmax.buf)
    what = "route diagnostics";
  if (what) return cm_fail(m, CLATTN_ERR_UNSUPPORTED, "%s: %s is not supported across ranks", fn, what);
  if (p->batch <= 0 || p->q_heads <= 0 || p->kv_heads <= 0 || p->q_len <= 0 || p->head_dim <= 0 || p->value_dim <= 0)
    return cm_fail(m, CLATTN_ERR_INVALID_ARGUMENT, "%s: batch, heads, q_len, head_dim and value_dim must be positive",
                   fn);
  if (p->q_heads % p->kv_heads != 0)
    return cm_fail(m, CLATTN_ERR_INVALID_ARGUMENT, "%s: kv_heads (%d) must divide q_heads (%d)", fn, p->kv_heads,
                   p->q_heads);
  if (p->window_left < -1 || p->window_right < -1)
    return cm_fail(m, CLATTN_ERR_INVALID_ARGUMENT, "%s: windows must be -1 (unbounded) or >= 0 (got %d, %d)", fn,
                   p->window_left, p->window_right);
  if (!p->q.buf || !p->out.buf)
    return cm_fail(m, CLATTN_ERR_INVALID_ARGUMENT, "%s: q.buf and out.buf are required", fn);
  return CLATTN_OK;
}
