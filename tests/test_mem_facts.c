/*
 * Validation keeps what it learns of a caller's cl_mem (size, type, context,
 * flags) until the runtime deletes the object (src/mem_facts.c): a call
 * over buffers seen before asks nothing, and a handle the runtime hands
 * out again for a new buffer is checked anew.
 *
 *  - after a checked call the buffer's facts are kept; once the buffer is
 *    released they are gone;
 *  - a large buffer checked, released, and a small one created (often at the
 *    same handle): a view too big for the small one is BUFFER_TOO_SMALL, a
 *    read-only one refused as an output, every time.
 */
#include "api/api.h" /* ca_mem_facts_cached */
#include "kit_checks.h"

static cl_mem make(size_t bytes, cl_mem_flags flags) {
  cl_int e = CL_SUCCESS;
  cl_mem m = clCreateBuffer(clattn_cl_context(ct_context()), flags, bytes, NULL, &e);
  return e == CL_SUCCESS ? m : NULL;
}

static void facts_live_as_long_as_the_buffer(void) {
  cp_shape s = cp_shape_default();
  cp_problem *pb;
  KC_BUILD(pb, &s);
  cp_result r;
  if (CHECK(cp_run(pb, ct_context(), &r) == 0) && CHECK(cp_result_ok(&r, 1e-5))) {
    ca_mem_facts f;
    CHECKF(ca_mem_facts_cached(pb->q_buf, &f) && f.context == clattn_cl_context(ct_context()),
           "q's facts were not kept after a checked call");
    cl_mem q = pb->q_buf;
    cp_free(pb); /* releases q */
    pb = NULL;
    clFinish(clattn_cl_queue(ct_context()));
    CHECKF(!ca_mem_facts_cached(q, &f), "q's facts outlived the buffer");
  }
  cp_free(pb);
}

static void a_reused_handle_is_checked_anew(void) {
  cp_shape s = cp_shape_default();
  cp_problem *pb;
  KC_BUILD(pb, &s);
  REQUIRE(cp_upload(pb, ct_context()) == 0);
  const size_t q_bytes = pb->q_elems * sizeof(float);
  int reused = 0;
  for (int i = 0; i < 40; i++) {
    cl_mem big = make(q_bytes, CL_MEM_READ_WRITE);
    REQUIRE(big);
    clattn_params p = pb->params;
    p.q.buf = big;
    CHECK_STATUS(clattn_forward(ct_context(), &p, 0, NULL, NULL), CLATTN_OK);
    CHECK(clFinish(clattn_cl_queue(ct_context())) == CL_SUCCESS);
    const cl_mem old = big;
    clReleaseMemObject(big);
    cl_mem small = make(q_bytes / 2, i % 2 ? CL_MEM_READ_ONLY : CL_MEM_READ_WRITE);
    REQUIRE(small);
    reused += small == old;
    if (i % 2) { /* as an output: read-only */
      p = pb->params;
      p.out.buf = small;
      p.out.offset = 0;
      CHECK_STATUS(clattn_forward(ct_context(), &p, 0, NULL, NULL), CLATTN_ERR_INVALID_ARGUMENT);
    } else {
      p.q.buf = small;
      CHECK_STATUS(clattn_forward(ct_context(), &p, 0, NULL, NULL), CLATTN_ERR_BUFFER_TOO_SMALL);
    }
    clReleaseMemObject(small);
  }
  printf("  40 buffers released and recreated; the runtime gave the released handle again %d times\n", reused);
  cp_free(pb);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(facts_live_as_long_as_the_buffer),
      CT_TEST(a_reused_handle_is_checked_anew),
  };
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
