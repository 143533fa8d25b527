/*
 * The modifiers' tables of the fp64 reference (reference.h's ref_inputs
 * mod_allowed, mod_score). A modifier is OpenCL C, so the device runs it:
 * clattn_modifier_eval at every pair, one pointwise kernel apart from the
 * attention kernels, on the reference's own f32-rounded scores; the rest
 * of the reference stays fp64 on the host.
 */
#ifndef CLATTN_REFERENCE_MODIFIER_H
#define CLATTN_REFERENCE_MODIFIER_H

#include "reference.h"

/* Fills *allowed (with p->mask_mod), *scores and *grads (with
 * p->score_mod; grads where it defines clattn_score_mod_grad), each
 * malloc'ed dense [B, Hq, M, N] (NULL without); pairs outside a sequence
 * are disallowed. 0, or -1 with clattn's message in err. */
int ref_modifier_tables(clattn_context *ctx, const clattn_params *p, const ref_inputs *in, unsigned char **allowed,
                        float **scores, float **grads, char *err, size_t errlen);

#endif
