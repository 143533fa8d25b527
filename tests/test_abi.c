/* The ABI policy (docs/DESIGN.md, "ABI"; clattn.h): a public parameter
 * struct grows at its end and carries struct_size, the size its caller's
 * header gave it; the library reads no byte past it and takes every later
 * field as its default. Fields never move without a new soname
 * (CLATTN_ABI_VERSION), so this soname's first layout is recorded here: a
 * field moved, or a struct shrunk, fails this test. A program built against
 * this soname's first header (tests/abi/, a fixture) runs against the
 * library in test abi-old-header. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "api/api.h"
#include "check.h"

/* ABI 5's first layout (LP64): each struct's size and its last field's offset. */
static const struct {
  const char *name;
  size_t size, last_at, now, now_last_at;
} layouts[] = {
#define ROW(type, last, size, last_at) {#type, size, last_at, sizeof(type), offsetof(type, last)}
    ROW(clattn_options, tuning_file, 56, 48),
    ROW(clattn_tensor, stride, 48, 16),
    ROW(clattn_params, argmax, 856, 808),
    ROW(clattn_merge_params, out_dtype, 248, 244),
    ROW(clattn_append_params, capacity, 360, 356),
    ROW(clattn_backward_params, d_bias, 1128, 1080),
    ROW(clattn_kvcache_params, rotary_interleaved, 1104, 1096),
    ROW(clattn_step, lse_offset, 40, 32),
    ROW(clattn_launch, local_given, 80, 72),
#undef ROW
};

static void header_and_soname_agree(void) {
  CHECKF(CLATTN_ABI_VERSION == ABI_SONAME, "clattn.h says ABI %d, meson.build's soname is %d", CLATTN_ABI_VERSION,
         ABI_SONAME);
}

/* A struct holding a clattn_params (clattn_backward_params.fwd,
 * clattn_kvcache_params.attn): the fields after it follow the caller's
 * inner size (docs/DESIGN.md, "ABI"), so they keep their offset from the
 * inner struct's end as clattn_params grows. */
static size_t inner_growth(const char *name) {
  const int nests = strcmp(name, "clattn_backward_params") == 0 || strcmp(name, "clattn_kvcache_params") == 0;
  return nests ? sizeof(clattn_params) - layouts[2].size : 0;
}

static void fields_stay_where_this_soname_put_them(void) {
  if (sizeof(void *) != 8 || CLATTN_ABI_VERSION != 5) return; /* recorded for LP64, ABI 5 */
  CHECK(strcmp(layouts[2].name, "clattn_params") == 0);
  for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
    const size_t grown = inner_growth(layouts[i].name);
    CHECKF(layouts[i].now_last_at == layouts[i].last_at + grown,
           "%s: its last field of ABI 5 moved to %zu (was %zu, %zu past its clattn_params)", layouts[i].name,
           layouts[i].now_last_at, layouts[i].last_at, layouts[i].last_at - (grown ? layouts[2].size : 0));
    CHECKF(layouts[i].now >= layouts[i].size, "%s: %zu bytes, smaller than ABI 5's %zu", layouts[i].name,
           layouts[i].now, layouts[i].size);
  }
  /* structs that clattn fills for the caller cannot grow (clattn_launch,
   * clattn_tensor); the parameter structs begin with struct_size */
  CHECK(sizeof(clattn_tensor) == 48 && sizeof(clattn_launch) == 80);
  CHECK(offsetof(clattn_params, struct_size) == 0 && offsetof(clattn_backward_params, struct_size) == 0 &&
        offsetof(clattn_kvcache_params, struct_size) == 0 && offsetof(clattn_append_params, struct_size) == 0 &&
        offsetof(clattn_merge_params, struct_size) == 0 && offsetof(clattn_step, struct_size) == 0 &&
        offsetof(clattn_options, struct_size) == 0);
}

/* The initialisers write no byte past the caller's struct_size. */
static void init_writes_only_the_callers_bytes(void) {
  unsigned char bytes[sizeof(clattn_params) + 64];
  memset(bytes, 0xA5, sizeof bytes);
  const size_t older = offsetof(clattn_params, lse); /* a header without the optional outputs */
  clattn_params_init((clattn_params *)(void *)bytes, older);
  for (size_t i = older; i < sizeof bytes; i++) CHECKF(bytes[i] == 0xA5, "byte %zu written", i);
  const clattn_params *p = (const clattn_params *)(void *)bytes;
  CHECK(p->struct_size == older && isnan(p->scale) && p->window_left == -1 && p->kv_dtype == CLATTN_DTYPE_SAME);
}

/* A struct from an older header: its fields as given, every later one its
 * default, whatever bytes follow it in the caller's memory. */
static void fields_past_the_callers_size_are_defaults(void) {
  unsigned char bytes[sizeof(clattn_params)];
  memset(bytes, 0xA5, sizeof bytes); /* garbage where an older header has no field */
  const size_t older = offsetof(clattn_params, lse);
  clattn_params *in = (clattn_params *)(void *)bytes;
  clattn_params_init(in, older);
  in->batch = 3;
  in->dropout_p = 0.25f;
  clattn_params out;
  CHECK(ca_params_in(in, &out, "params") == CLATTN_OK);
  CHECK(out.batch == 3 && out.dropout_p == 0.25f && out.struct_size == sizeof out);
  CHECKF(!out.lse.buf && !out.weights.buf && !out.entropy.buf && !out.max_weight.buf && !out.argmax.buf &&
             out.lse.offset == 0,
         "outputs past the caller's size not absent");
  /* 0 is this ABI's first layout; a size no header gives is refused, a newer one unsupported */
  in->struct_size = 0;
  CHECK(ca_params_in(in, &out, "params") == CLATTN_OK && out.lse.buf == (cl_mem)(uintptr_t)0xA5A5A5A5A5A5A5A5ull);
  in->struct_size = 12;
  CHECK(ca_params_in(in, &out, "params") == CLATTN_ERR_INVALID_ARGUMENT);
  in->struct_size = sizeof(clattn_params) + 8;
  CHECK(ca_params_in(in, &out, "params") == CLATTN_ERR_UNSUPPORTED);
}

/* A struct holding a clattn_params from an older header: the fields after
 * it follow the caller's smaller params, and are read from there. */
static void nested_params_of_an_older_header_are_found(void) {
  const size_t fwd_old = offsetof(clattn_params, lse), shift = sizeof(clattn_params) - fwd_old;
  unsigned char bytes[sizeof(clattn_backward_params)];
  memset(bytes, 0, sizeof bytes);
  clattn_backward_params full;
  clattn_backward_params_init(&full, sizeof full);
  full.fwd.struct_size = fwd_old;
  full.fwd.batch = 2;
  full.d_out.offset = 7;
  full.deterministic = 0;
  full.d_bias.offset = 9;
  /* the caller's layout: [struct_size][fwd of fwd_old bytes][d_out ...] */
  const size_t fwd_at = offsetof(clattn_backward_params, fwd), tail_at = fwd_at + sizeof(clattn_params);
  memcpy(bytes, &full, fwd_at + fwd_old);
  memcpy(bytes + fwd_at + fwd_old, (const unsigned char *)&full + tail_at, sizeof full - tail_at);
  ((clattn_backward_params *)(void *)bytes)->struct_size = sizeof full - shift;
  clattn_backward_params out;
  CHECK(ca_backward_params_in((const clattn_backward_params *)(void *)bytes, &out) == CLATTN_OK);
  CHECKF(out.fwd.batch == 2 && out.d_out.offset == 7 && out.deterministic == 0 && out.d_bias.offset == 9,
         "batch %d d_out.offset %zu deterministic %d d_bias.offset %zu", out.fwd.batch, out.d_out.offset,
         out.deterministic, out.d_bias.offset);
  CHECK(!out.fwd.lse.buf);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(header_and_soname_agree),
      CT_TEST(fields_stay_where_this_soname_put_them),
      CT_TEST(init_writes_only_the_callers_bytes),
      CT_TEST(fields_past_the_callers_size_are_defaults),
      CT_TEST(nested_params_of_an_older_header_are_found),
  };
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
