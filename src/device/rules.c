/* The rules table (rules.h): what each family of devices is known to need,
 * with the measurement behind each value. */
#include "device/rules.h"

#include <stdio.h>
#include <string.h>

typedef enum { MATCH_DEVICE, MATCH_ARCH, MATCH_VENDOR, MATCH_TYPE, MATCH_DEFAULT } match;

typedef struct {
  match level;
  const char *what; /* a device-name substring, an architecture, vendor or type name; NULL: default */
  ca_rule_key key;
  long long value;
} rule;

/* Most specific first within each key (the lookup takes the first match). */
static const rule rules[] = {
    /* flash_block's register budget: gfx1100 (128 registers, clang-15) spilled 4x4 and 2x4 at d=64, 1x4 at
     * d=128 with f16 storage; Intel's Xe (IGC: 8 lanes of 128 registers per thread, ocloc tgllp and dg2)
     * spilled 4x4 at d=64 and 2x4 at d=128; CDNA and NVIDIA (256 registers) hold 48 floats */
    {MATCH_ARCH, "amd-rdna", CA_RULE_BLOCK_BUDGET, 18},
    {MATCH_VENDOR, "intel-gpu", CA_RULE_BLOCK_BUDGET, 20},
    {MATCH_DEFAULT, NULL, CA_RULE_BLOCK_BUDGET, 48},
    /* Intel's GPUs report EUs as compute units, and a work-group runs inside one subslice of 8 EUs (Gen9
     * to Gen12; an Xe core's 8 or 16 vector engines likewise) */
    {MATCH_VENDOR, "intel-gpu", CA_RULE_SLOT_UNITS, 8},
    {MATCH_DEFAULT, NULL, CA_RULE_SLOT_UNITS, 1},
    /* a CPU thread runs one group at a time; four per thread keep the threads evenly busy when rows differ
     * in work (windows, causal, kv_lens). A GPU unit holds max_wg / group of a kernel's groups */
    {MATCH_TYPE, "cpu", CA_RULE_GROUPS_PER_UNIT, 4},
    {MATCH_DEFAULT, NULL, CA_RULE_GROUPS_PER_UNIT, 0},
    /* flash_rows' score tile stays in registers: AVX-512's 32 vector registers hold 8 rows, AVX2's 16 hold 4 */
    {MATCH_TYPE, "cpu", CA_RULE_FLASH_BM_WIDE, 8},
    {MATCH_DEFAULT, NULL, CA_RULE_FLASH_BM_WIDE, 4},
    /* replaying a command buffer cost the host more than plain enqueues on both CPU runtimes (POCL 4.8 us
     * against 1.0, Intel's 7.5 against 2.3: docs/performance.md) */
    {MATCH_TYPE, "gpu", CA_RULE_COMMAND_BUFFERS, 1},
    {MATCH_DEFAULT, NULL, CA_RULE_COMMAND_BUFFERS, 0},
    /* a GPU's flash_block with more than 64 bytes of private memory spills its registers */
    {MATCH_TYPE, "gpu", CA_RULE_BLOCK_PRIVATE, 64},
    {MATCH_DEFAULT, NULL, CA_RULE_BLOCK_PRIVATE, -1},
    /* Intel's CPU runtime compiles x86 inline assembly but defines no __x86_64__ for its kernels (POCL does);
     * its OpenCL prefetch() made flash_rows 0.64x as fast, the instruction 1.22x (H8 N1024 d256, 2-core
     * Xeon, docs/performance.md) */
    {MATCH_VENDOR, "intel-cpu", CA_RULE_X86_PREFETCH, 1},
    {MATCH_DEFAULT, NULL, CA_RULE_X86_PREFETCH, 0},
};

const char *ca_architecture(const tl_device *dev) {
  const int cpu = (dev->type & CL_DEVICE_TYPE_CPU) != 0;
  if (cpu) {
    const cl_uint w = dev->vec_float_pref > dev->vec_float_native ? dev->vec_float_pref : dev->vec_float_native;
    return w >= 16 ? "cpu-avx512" : w >= 8 ? "cpu-avx2" : "cpu";
  }
  switch (dev->vendor_id) {
    case TL_VENDOR_AMD: return dev->pref_multiple == 32 ? "amd-rdna" : "amd-gcn";
    case TL_VENDOR_INTEL: return "intel-xe";
    case 0x10de: return "nvidia";
    default: return "other";
  }
}

/* "amd-gpu", "intel-cpu", ...: the vendor with the device's type. */
static const char *vendor_of(const tl_device *dev) {
  static const char *const names[4][2] = {
      {"amd-gpu", "amd-cpu"}, {"intel-gpu", "intel-cpu"}, {"nvidia-gpu", "nvidia-cpu"}, {"other-gpu", "other-cpu"}};
  const int v = dev->vendor_id == TL_VENDOR_AMD ? 0 : dev->vendor_id == TL_VENDOR_INTEL ? 1 : dev->vendor_id == 0x10de ? 2 : 3;
  return names[v][(dev->type & CL_DEVICE_TYPE_CPU) != 0];
}

_Static_assert(CA_RULE_COUNT <= sizeof ((tl_device *)0)->rules / sizeof(long long), "tl_device.rules too small");

long long ca_rule(const tl_device *dev, ca_rule_key key, const char **from) {
  if (dev->rules_known && !from && key < CA_RULE_COUNT) return dev->rules[key];
  static const char *const levels[] = {"device", "architecture", "vendor", "device type", "default"};
  static _Thread_local char where[96];
  const char *type = (dev->type & CL_DEVICE_TYPE_CPU) ? "cpu" : "gpu";
  for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
    const rule *r = &rules[i];
    if (r->key != key) continue;
    const int hit = r->level == MATCH_DEFAULT  ? 1
                    : r->level == MATCH_DEVICE ? strstr(dev->name, r->what) != NULL
                    : r->level == MATCH_ARCH   ? !strcmp(ca_architecture(dev), r->what)
                    : r->level == MATCH_VENDOR ? !strcmp(vendor_of(dev), r->what)
                                               : !strcmp(type, r->what);
    if (!hit) continue;
    if (from) {
      snprintf(where, sizeof where, "%s%s%s", levels[r->level], r->what ? " " : "", r->what ? r->what : "");
      *from = where;
    }
    return r->value;
  }
  if (from) *from = "none";
  return 0;
}

void ca_rules_resolve(tl_device *dev) {
  dev->rules_known = 0;
  for (int k = 0; k < CA_RULE_COUNT; k++) dev->rules[k] = ca_rule(dev, (ca_rule_key)k, NULL);
  dev->rules_known = 1;
}

const char *ca_rule_name(ca_rule_key key) {
  static const char *const names[CA_RULE_COUNT] = {"block_budget",      "slot_units",      "groups_per_unit",
                                                   "flash_bm_wide",     "command_buffers", "block_private_max",
                                                   "x86_prefetch"};
  return key < CA_RULE_COUNT ? names[key] : "?";
}
