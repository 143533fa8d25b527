/*
 * Index width: views placed at the far end of the largest buffers the device
 * allows, so element offsets (uchar mask) and byte offsets (f32 views) pass
 * 2^31 where the device permits, and every algorithm still matches the fp64
 * reference. Kernels index with 64-bit arithmetic (common.h.cl's ca_at);
 * this proves it on the largest offsets this device can address.
 *
 * Where CL_DEVICE_MAX_MEM_ALLOC_SIZE is below 2^31 + the mask's size, the
 * mask's offsets stay below 2^31 elements (POCL here allows exactly 2 GiB):
 * the test says which case ran.
 */
#include "check.h"
#include "kit_checks.h"

#define HIGH ((size_t)1 << 31)

static cl_mem big_buffer(size_t bytes)
{
  cl_int e;
  cl_mem m = clCreateBuffer(clattn_cl_context(ct_context()), CL_MEM_READ_WRITE, bytes, NULL, &e);
  CHECKF(e == CL_SUCCESS, "clCreateBuffer(%zu bytes): %d", bytes, e);
  return e == CL_SUCCESS ? m : NULL;
}

static int write_at(cl_mem m, size_t byte_offset, const void *data, size_t bytes)
{
  cl_int e = clEnqueueWriteBuffer(clattn_cl_queue(ct_context()), m, CL_TRUE, byte_offset, bytes, data, 0, NULL, NULL);
  return CHECKF(e == CL_SUCCESS, "clEnqueueWriteBuffer at %zu: %d", byte_offset, e);
}

/* Moves a view of `elems` elements (the kit's whole host array) to the end
 * of buffer m (capacity elements), returning the shift added to its offset. */
static size_t place_at_end(clattn_tensor *t, cl_mem m, size_t capacity, const void *host, size_t elems, size_t elem_size)
{
  const size_t shift = capacity - elems - 3;
  if (!write_at(m, shift * elem_size, host, elems * elem_size))
    return 0;
  t->buf = m;
  t->offset += shift;
  return shift;
}

static void views_at_the_end_of_the_largest_buffers(void)
{
  cl_ulong max_alloc = 0;
  REQUIRE(clGetDeviceInfo(clattn_cl_device(ct_context()), CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc,
                          NULL) == CL_SUCCESS);
  cp_shape s = cp_shape_default();
  s.q_heads = 4; s.kv_heads = 2; s.q_len = 37; s.kv_len = 53; s.head_dim = 24; s.value_dim = 20;
  s.causal = 1; s.mask = CP_MASK_RANDOM; s.want_lse = 1; s.want_diag = 1; s.poison_disallowed = 1;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  REQUIRE(cp_reference(pb) == 0);
  /* the same problem through the kit's buffers, to take its outputs' views */
  REQUIRE(cp_upload(pb, ct_context()) == 0);

  const size_t mask_bytes = (size_t)max_alloc < HIGH + (1 << 20) ? (size_t)max_alloc : HIGH + (1 << 20);
  const size_t float_bytes = (size_t)max_alloc;
  printf("  max allocation %llu bytes: mask offsets %s 2^31 elements, f32 byte offsets %s 2^31\n",
         (unsigned long long)max_alloc, mask_bytes > HIGH + pb->mask_elems ? "above" : "just below",
         float_bytes > HIGH ? "above" : "just below");
  cl_mem mask = big_buffer(mask_bytes), floats = big_buffer(float_bytes);
  if (mask && floats) {
    clattn_params p = pb->params;
    const size_t cap = float_bytes / sizeof(float);
    REQUIRE(place_at_end(&p.mask, mask, mask_bytes, pb->mask, pb->mask_elems, 1));
    /* q, k, v side by side at the end of the f32 buffer; the outputs stay in the kit's */
    REQUIRE(place_at_end(&p.q, floats, cap - pb->k_elems - pb->v_elems, pb->q, pb->q_elems, sizeof(float)));
    REQUIRE(place_at_end(&p.k, floats, cap - pb->v_elems, pb->k, pb->k_elems, sizeof(float)));
    REQUIRE(place_at_end(&p.v, floats, cap, pb->v, pb->v_elems, sizeof(float)));
    printf("  mask offset %zu elements; q offset %zu elements (byte %zu)\n", p.mask.offset, p.q.offset,
           p.q.offset * sizeof(float));
    for (size_t a = 0; a < KC_NALGOS; a++) {
      p.algo = kc_algos[a];
      REQUIRE(cp_fill_outputs(pb, NAN) == 0);
      clattn_status st = clattn_forward(ct_context(), &p, 0, NULL, NULL);
      CHECKF(st == CLATTN_OK, "%s: %s: %s", clattn_algo_name(p.algo), clattn_status_string(st),
             clattn_last_error(ct_context()));
      REQUIRE(clFinish(clattn_cl_queue(ct_context())) == CL_SUCCESS);
      cp_result r;
      memset(&r, 0, sizeof r);
      r.status = st;
      if (CHECK(cp_read_outputs(pb) == 0) && CHECK(cp_compare(pb, &r) == 0)) {
        char line[512];
        CHECKF(cp_result_ok(&r, 1e-5), "%s: %s", clattn_algo_name(p.algo), cp_result_format(&r, line, sizeof line));
      }
    }
  }
  if (mask)
    clReleaseMemObject(mask);
  if (floats)
    clReleaseMemObject(floats);
  cp_free(pb);
}

int main(int argc, char **argv)
{
  static const ct_test tests[] = {
    CT_TEST(views_at_the_end_of_the_largest_buffers),
  };
  ct_context();
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
