"""The example modifiers (the checkout's examples/modifiers/*.cl) as OpenCL C
text for Context.flex_attention and Context.create_block_mask:

    CAUSAL          mask_mod: kv_idx <= q_idx
    SLIDING_WINDOW  mask_mod: causal and q_idx - kv_idx <= ints[0]
    PREFIX_LM       mask_mod: kv_idx < ints[0] (the prefix), else causal
    DOCUMENT        mask_mod: doc[q_idx] == doc[kv_idx], doc = captures[0]
                    (int32, a document id per position)
    ALIBI           score_mod: score - slope[h] |q_idx - kv_idx|, slope = captures[0]
                    (float32, one per query head)
    TANH_SOFTCAP    score_mod: floats[0] tanh(score / floats[0])
    RELATIVE_BIAS   score_mod: score + table[clamp(q_idx - kv_idx, 1 - R, R - 1) + R - 1],
                    table = captures[0] (float32, 2 R - 1 entries), R = ints[0]

The score modifiers define clattn_score_mod_grad too (attention_backward
takes them). source(name) reads one by its file name ("causal"). The
files are installed with the package; run from a checkout, they are read
from its examples/modifiers.
"""
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_TREE = os.path.join(_HERE, "..", "..", "..", "examples", "modifiers")

NAMES = ("CAUSAL", "SLIDING_WINDOW", "PREFIX_LM", "DOCUMENT", "ALIBI", "TANH_SOFTCAP", "RELATIVE_BIAS")
__all__ = list(NAMES) + ["source"]
_texts = {}


def _path(name):
    for d in (_HERE, _TREE):
        p = os.path.join(d, name + ".cl")
        if os.path.isfile(p):
            return p
    raise FileNotFoundError("clattn.modifiers: no %s.cl next to the package (%s) or in a checkout's "
                            "examples/modifiers (%s)" % (name, _HERE, os.path.normpath(_TREE)))


def source(name):
    """The text of example modifier `name` (its file name without .cl, e.g.
    "sliding_window")."""
    if name not in _texts:
        with open(_path(name), encoding="utf-8") as f:
            _texts[name] = f.read()
    return _texts[name]


def __getattr__(attr):  # the constants, read on first use
    if attr in NAMES:
        return source(attr.lower())
    raise AttributeError("module %r has no attribute %r" % (__name__, attr))


def __dir__():
    return sorted(list(globals()) + list(NAMES))
