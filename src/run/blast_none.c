/* The GEMM path of a build without CLBlast (meson -Dclblast=disabled, or not
 * found): CLATTN_ALGO_GEMM is refused when planned (plan/gemm.c), and AUTO
 * never picks it (device/tuning.c). */
#include "run/run.h"

clattn_status ca_blast_gemm(clattn_context *ctx, const ca_gemm *g, const size_t *offsets, cl_mem a, cl_mem b, cl_mem c,
                            cl_uint n_wait, const cl_event *wait, cl_event *prev) {
  (void)ctx, (void)g, (void)offsets, (void)a, (void)b, (void)c, (void)n_wait, (void)wait, (void)prev;
  return ca_fail(CLATTN_ERR_UNSUPPORTED,
                 "algo GEMM: this clattn was built without CLBlast (meson -Dclblast); use AUTO, FUSED or STAGED");
}

void ca_blast_release(clattn_context *ctx) { (void)ctx; }
