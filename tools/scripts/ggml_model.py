#!/usr/bin/env python3
"""A random-weights llama model (GGUF) of chosen dimensions, for timing
llama.cpp's attention with and without the CLATTN backend (llama-bench):
the tiny models test-llama-archs writes spend next to nothing in attention.

  ggml_model.py OUT.gguf [--embd 4096] [--heads 32] [--kv-heads 8] [--layers 2]
                [--ff 1024] [--ctx 16384] [--vocab 256]

Weights f16, uniform in [-0.05, 0.05] (seed 1), norms 1; the dummy "test"
tokenizer of llama.cpp's test models. Needs numpy and the gguf package
(gguf-py of the llama.cpp tree on PYTHONPATH, or PyPI's gguf).
"""
import argparse

import numpy as np

import gguf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--embd", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--ff", type=int, default=1024)
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--vocab", type=int, default=256)
    a = ap.parse_args()
    head = a.embd // a.heads
    rng = np.random.default_rng(1)

    def weight(*shape):
        return rng.uniform(-0.05, 0.05, size=shape).astype(np.float16)

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("clattn-random-llama")
    w.add_context_length(a.ctx)
    w.add_embedding_length(a.embd)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.ff)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_dimension_count(head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(a.vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("test")
    w.add_token_list(["tok_%d" % i for i in range(a.vocab)])
    w.add_token_scores([0.0] * a.vocab)
    # numpy shapes are ggml's ne reversed: [rows, columns]
    w.add_tensor("token_embd.weight", weight(a.vocab, a.embd))
    w.add_tensor("output_norm.weight", np.ones(a.embd, dtype=np.float32))
    w.add_tensor("output.weight", weight(a.vocab, a.embd))
    kv = a.kv_heads * head
    for i in range(a.layers):
        blk = "blk.%d." % i
        w.add_tensor(blk + "attn_norm.weight", np.ones(a.embd, dtype=np.float32))
        w.add_tensor(blk + "attn_q.weight", weight(a.embd, a.embd))
        w.add_tensor(blk + "attn_k.weight", weight(kv, a.embd))
        w.add_tensor(blk + "attn_v.weight", weight(kv, a.embd))
        w.add_tensor(blk + "attn_output.weight", weight(a.embd, a.embd))
        w.add_tensor(blk + "ffn_norm.weight", np.ones(a.embd, dtype=np.float32))
        w.add_tensor(blk + "ffn_gate.weight", weight(a.ff, a.embd))
        w.add_tensor(blk + "ffn_up.weight", weight(a.ff, a.embd))
        w.add_tensor(blk + "ffn_down.weight", weight(a.embd, a.ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
