/*
 * What clattn knows of device families, kept as data (rules.c): values
 * looked up by device, then architecture, then vendor, then device type,
 * then a default, as CLBlast keeps its tuned values. A pure function of a
 * device description (tiles.h's tl_device), so tests try made-up devices.
 */
#ifndef CLATTN_RULES_H
#define CLATTN_RULES_H

#include "device/tiles.h"

typedef enum {
  CA_RULE_BLOCK_BUDGET,    /* floats of scores and accumulator a flash_block work-item may hold */
  CA_RULE_SLOT_UNITS,      /* compute units one work-group slot spans (split-KV's slots) */
  CA_RULE_GROUPS_PER_UNIT, /* work-groups per compute unit split-KV counts; 0 = max_wg / group */
  CA_RULE_FLASH_BM_WIDE,   /* flash_rows' rows per work-item with 16-wide vectors (narrower: 4) */
  CA_RULE_COMMAND_BUFFERS, /* plans replay command buffers by default (where offered) */
  CA_RULE_BLOCK_PRIVATE,   /* private bytes per work-item past which a built flash_block steps down; -1 = none */
  CA_RULE_X86_PREFETCH,    /* the CPU kernels' prefetches as x86 instructions where __x86_64__ does not say so */
  CA_RULE_COUNT
} ca_rule_key;

/* The value for dev and, when from is non-NULL, where it came from
 * ("architecture amd-rdna", "vendor intel-gpu", "default", ...). */
long long ca_rule(const tl_device *dev, ca_rule_key key, const char **from);
const char *ca_rule_name(ca_rule_key key);
/* Looks every rule up once into dev->rules, which ca_rule then answers
 * from (a planned step asks some on every call). */
void ca_rules_resolve(tl_device *dev);
/* The device's architecture as the rules name it, from its queries:
 * amd-rdna, amd-gcn, intel-xe, nvidia, cpu-avx512, cpu-avx2, cpu, other. */
const char *ca_architecture(const tl_device *dev);

#endif
