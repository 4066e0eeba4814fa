#!/usr/bin/env python3
"""Writes a tiny Llama-architecture GGUF model with random weights for llama-server.

Nothing is downloaded: the weights are random (seeded), the tokenizer is a SentencePiece-style
("llama") vocabulary of the control tokens, the 256 byte tokens (so any text encodes) and a few
hundred word pieces. The chat template is ChatML. Usage: make_tiny_gguf.py OUT.gguf
[--embd 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --ctx 2048 --seed 7]
"""
import argparse
import string

import numpy as np
import gguf

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)


def vocab():
    tokens, scores, types = [], [], []

    def add(piece, score, kind):
        tokens.append(piece.encode("utf-8"))
        scores.append(score)
        types.append(kind)

    T = gguf.TokenType
    add("<unk>", 0.0, T.UNKNOWN)
    add("<s>", 0.0, T.CONTROL)
    add("</s>", 0.0, T.CONTROL)
    for b in range(256):
        add(f"<0x{b:02X}>", 0.0, T.BYTE)
    words = (
        "the of and to in is that for it as was with be by on not he this are or his from at "
        "which but have an they you were her she there one all we their can has more will if "
        "would about so when what up out no said do into time only new some could them these "
        "proxy engine token stream queue batch cache model request first last fast slow good"
    ).split()
    pieces = ["\u2581" + w for w in words] + list(string.ascii_lowercase) + [
        "\u2581", ".", ",", "!", "?"
    ]
    for i, p in enumerate(pieces):
        add(p, -float(i + 1), T.NORMAL)
    return tokens, scores, types


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ff", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    tokens, scores, types = vocab()
    n_vocab, head_dim = len(tokens), a.embd // a.heads

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("tiny-random")
    w.add_context_length(a.ctx)
    w.add_embedding_length(a.embd)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.ff)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_chat_template(CHATML)

    def t(name, *shape, scale=0.05):
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    # numpy shapes are GGUF's dimensions reversed: (rows = outputs, cols = inputs)
    t("token_embd.weight", n_vocab, a.embd, scale=0.5)
    w.add_tensor("output_norm.weight", np.ones(a.embd, dtype=np.float32))
    t("output.weight", n_vocab, a.embd, scale=0.5)
    for i in range(a.layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(a.embd, dtype=np.float32))
        t(f"blk.{i}.attn_q.weight", a.heads * head_dim, a.embd)
        t(f"blk.{i}.attn_k.weight", a.kv_heads * head_dim, a.embd)
        t(f"blk.{i}.attn_v.weight", a.kv_heads * head_dim, a.embd)
        t(f"blk.{i}.attn_output.weight", a.embd, a.heads * head_dim)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(a.embd, dtype=np.float32))
        t(f"blk.{i}.ffn_gate.weight", a.ff, a.embd)
        t(f"blk.{i}.ffn_up.weight", a.ff, a.embd)
        t(f"blk.{i}.ffn_down.weight", a.embd, a.ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
