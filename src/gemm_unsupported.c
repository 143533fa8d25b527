/* The GEMM path of a build without CLBlast (meson -Dclblast=disabled, or not
 * found): CLATTN_ALGO_GEMM is refused before anything is enqueued, and AUTO
 * never picks it (tuning.c). */
#include "internal.h"

int ca_gemm_available(void) { return 0; }

void ca_gemm_release(clattn_context *ctx) { (void)ctx; }

clattn_status ca_gemm_forward(clattn_context *ctx, const clattn_params *p, const ca_plan *plan, cl_uint n_wait,
                              const cl_event *wait, cl_event *done) {
  (void)ctx, (void)p, (void)plan, (void)n_wait, (void)wait, (void)done;
  return ca_fail(CLATTN_ERR_UNSUPPORTED,
                 "algo GEMM: this clattn was built without CLBlast (meson -Dclblast); use AUTO, FUSED or STAGED");
}
