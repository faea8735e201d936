#!/usr/bin/env python3
"""Writes a randomly initialised bf16 checkpoint (config.json + model.safetensors) with the shape of a
real model, for measuring speed: the values are meaningless, the bytes moved and FLOPs done are real.

    tools/make_bench_model.py OUT_DIR --shape qwen3-0.6b

Standard library only. Weights are seeded pseudo-random bytes whose bf16 high byte is remapped so every
value is finite with magnitude 2^-9..2^-6 (about 1e-2); norm weights are 1.0.
"""
import argparse
import json
import os
import random
import struct
import sys

SHAPES = {
    # the real Qwen3-0.6B: 596 M parameters, 1.19 GB in bf16
    "qwen3-0.6b": dict(model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       tie_word_embeddings=True, max_position_embeddings=40960),
    # Qwen3-MoE layout scaled to this size class: 64 experts, 8 active; 1.01 B parameters, 2.0 GB in bf16
    "qwen3-moe-1b": dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                         moe_intermediate_size=512, num_experts=64, num_experts_per_tok=8, norm_topk_prob=True,
                         decoder_sparse_step=1, mlp_only_layers=[], num_hidden_layers=8,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                         max_position_embeddings=40960),
}

COMMON = dict(hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1000000.0, attention_bias=False,
              use_sliding_window=False, torch_dtype="bfloat16")

# high byte of a bf16: keep the sign, force the exponent to 118..121 (the low exponent bit lives in the
# low byte and stays random)
HIGH = bytes((b & 0x80) | (0x3B + (b & 1)) for b in range(256))
CHUNK = 16 << 20  # bytes generated at a time; even, so element boundaries stay aligned


def tensors(c):
    """(name, shape, kind) in file order; kind is 'w' (random) or 'norm' (ones)."""
    H, L = c["hidden_size"], c["num_hidden_layers"]
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    out = [("model.embed_tokens.weight", [c["vocab_size"], H], "w")]
    for l in range(L):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", [H], "norm"),
                (p + "post_attention_layernorm.weight", [H], "norm"),
                (p + "self_attn.q_proj.weight", [nh * hd, H], "w"),
                (p + "self_attn.k_proj.weight", [nkv * hd, H], "w"),
                (p + "self_attn.v_proj.weight", [nkv * hd, H], "w"),
                (p + "self_attn.o_proj.weight", [H, nh * hd], "w"),
                (p + "self_attn.q_norm.weight", [hd], "norm"),
                (p + "self_attn.k_norm.weight", [hd], "norm")]
        if c.get("num_experts"):
            E, I = c["num_experts"], c["moe_intermediate_size"]
            out.append((p + "mlp.gate.weight", [E, H], "w"))
            for x in range(E):
                q = f"{p}mlp.experts.{x}."
                out += [(q + "gate_proj.weight", [I, H], "w"), (q + "up_proj.weight", [I, H], "w"),
                        (q + "down_proj.weight", [H, I], "w")]
        else:
            I = c["intermediate_size"]
            out += [(p + "mlp.gate_proj.weight", [I, H], "w"), (p + "mlp.up_proj.weight", [I, H], "w"),
                    (p + "mlp.down_proj.weight", [H, I], "w")]
    out.append(("model.norm.weight", [H], "norm"))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", [c["vocab_size"], H], "w"))
    return out


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def write_tensor(f, rng, nbytes, kind):
    if kind == "norm":
        f.write(b"\x80\x3f" * (nbytes // 2))  # bf16 1.0, little-endian
        return
    left = nbytes
    while left:
        n = min(left, CHUNK)
        buf = bytearray(rng.randbytes(n))
        buf[1::2] = buf[1::2].translate(HIGH)
        f.write(buf)
        left -= n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    cfg = dict(SHAPES[a.shape], **COMMON)
    cfg["architectures"] = ["Qwen3MoeForCausalLM" if cfg.get("num_experts") else "Qwen3ForCausalLM"]
    ts = tensors(cfg)
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in ts:
        n = numel(shape) * 2
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)  # keeps the data 8-byte aligned

    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    rng = random.Random(a.seed)
    path = os.path.join(a.out_dir, "model.safetensors")
    with open(path + ".part", "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for name, shape, kind in ts:
            write_tensor(f, rng, numel(shape) * 2, kind)
    os.replace(path + ".part", path)
    params = sum(numel(s) for _, s, _ in ts)
    print(f"{a.out_dir}: {a.shape}, {params / 1e6:.1f} M parameters, {off / 1e9:.2f} GB", file=sys.stderr)


if __name__ == "__main__":
    main()
