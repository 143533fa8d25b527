/* The ABI policy (docs/DESIGN.md, "ABI"): callers hold clattn's structs by
 * value, so a public struct's layout changes only together with a new
 * CLATTN_ABI_VERSION, which is the soname. Each version's layout is
 * recorded here: a struct changed without a bump fails this test. */
#include <stddef.h>

#include "check.h"
#include "clattn.h"

static const struct {
  int abi;
  /* params_last, merge_last: offsets of the structs' last fields (a field
   * appended into padding keeps the size) */
  size_t options, tensor, params, params_last, merge, merge_last, append, backward;
} layouts[] = {
    /* LP64 */
    {0, 48, 48, 664, 660, 240, 232, 0, 0},
    /* ABI 1: kv_dtype, k_scale, v_scale, block_table, block_table_stride,
     * page_size, num_pages appended to clattn_params; clattn_append_params;
     * clattn_backward_params (which holds a clattn_params) */
    {1, 48, 48, 792, 784, 240, 232, 352, 1008},
    /* ABI 2: alibi_batch_stride appended to clattn_params, out_dtype to
     * clattn_merge_params, d_bias to clattn_backward_params */
    {2, 48, 48, 792, 788, 240, 236, 352, 1056},
    /* ABI 3: v_dtype, bias_dtype, bias_scale, sinks_offset appended to
     * clattn_params (so to clattn_backward_params' fwd); clattn_dtype gains
     * Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL */
    {3, 48, 48, 816, 808, 240, 236, 352, 1080},
    /* ABI 4: dropout_p, dropout_seed, dropout_offset, cache_leftpad
     * appended to clattn_params */
    {4, 48, 48, 848, 840, 240, 236, 352, 1112},
};

/* The last field of each struct in this version's header. */
#define PARAMS_LAST cache_leftpad
#define MERGE_LAST  out_dtype

static void header_and_soname_agree(void) {
  CHECKF(CLATTN_ABI_VERSION == ABI_SONAME, "clattn.h says ABI %d, meson.build's soname is %d", CLATTN_ABI_VERSION,
         ABI_SONAME);
}

static void public_structs_have_this_versions_layout(void) {
  if (sizeof(void *) != 8) return; /* layouts recorded for LP64 */
  for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
    if (layouts[i].abi != CLATTN_ABI_VERSION) continue;
    CHECKF(sizeof(clattn_options) == layouts[i].options, "clattn_options: %zu bytes, ABI %d has %zu",
           sizeof(clattn_options), CLATTN_ABI_VERSION, layouts[i].options);
    CHECKF(sizeof(clattn_tensor) == layouts[i].tensor, "clattn_tensor: %zu bytes", sizeof(clattn_tensor));
    CHECKF(sizeof(clattn_params) == layouts[i].params,
           "clattn_params: %zu bytes, ABI %d has %zu: bump CLATTN_ABI_VERSION", sizeof(clattn_params),
           CLATTN_ABI_VERSION, layouts[i].params);
    CHECKF(offsetof(clattn_params, total_kv) == 660, "clattn_params: fields moved (total_kv at %zu)",
           offsetof(clattn_params, total_kv));
    CHECKF(offsetof(clattn_params, PARAMS_LAST) == layouts[i].params_last,
           "clattn_params: fields moved (its last field at %zu)", offsetof(clattn_params, PARAMS_LAST));
    CHECKF(offsetof(clattn_merge_params, MERGE_LAST) == layouts[i].merge_last,
           "clattn_merge_params: fields moved (its last field at %zu)", offsetof(clattn_merge_params, MERGE_LAST));
    CHECKF(sizeof(clattn_append_params) == layouts[i].append, "clattn_append_params: %zu bytes",
           sizeof(clattn_append_params));
    CHECKF(sizeof(clattn_merge_params) == layouts[i].merge, "clattn_merge_params: %zu bytes",
           sizeof(clattn_merge_params));
    CHECKF(sizeof(clattn_backward_params) == layouts[i].backward, "clattn_backward_params: %zu bytes",
           sizeof(clattn_backward_params));
    /* clattn_step (plans, added without changing another struct): kv_len, then three offsets */
    CHECKF(sizeof(clattn_step) == 32 && offsetof(clattn_step, lse_offset) == 24, "clattn_step: %zu bytes",
           sizeof(clattn_step));
    /* clattn_kvcache_params (clattn_forward_kvcache, added without changing another struct): the
     * attention's params, then the step's fields, rotary_interleaved last */
    CHECKF(sizeof(clattn_kvcache_params) == 1088 && offsetof(clattn_kvcache_params, cache_seqlens) == 848 &&
               offsetof(clattn_kvcache_params, rotary_interleaved) == 1080,
           "clattn_kvcache_params: %zu bytes", sizeof(clattn_kvcache_params));
    return;
  }
  CHECKF(0, "no layout recorded for ABI %d: add this version's row", CLATTN_ABI_VERSION);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(header_and_soname_agree),
      CT_TEST(public_structs_have_this_versions_layout),
  };
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
