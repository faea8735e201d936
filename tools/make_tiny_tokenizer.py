#!/usr/bin/env python3
"""Write a byte-level BPE tokenizer small enough for the fixture models (vocab <= 512): the 256 byte
tokens, merges learnt from a little English, and Qwen-style special tokens, with a ChatML chat template.
Standard library only.  Usage: make_tiny_tokenizer.py OUT_DIR [--vocab 512]"""
import argparse, collections, json, os

CORPUS = """The quick brown fox jumps over the lazy dog. Hello world! How are you today? I am fine, thank
you. The weather is nice and the sun is shining. What is the capital of France? Paris is the capital of
France. Tell me a story about a small robot that learns to read. Once upon a time there was a robot.
Please write a short poem about the sea. The sea is wide and deep and blue. Numbers: 0 1 2 3 4 5 6 7 8 9.
"""

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return dict(zip(bs, map(chr, cs)))

def main():
    ap = argparse.ArgumentParser(); ap.add_argument("out"); ap.add_argument("--vocab", type=int, default=512)
    a = ap.parse_args()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: i for i, b in enumerate(range(256))}
    words = collections.Counter()
    for w in CORPUS.replace("\n", " ").split(" "):
        if w: words[tuple(b2u[b] for b in (" " + w).encode())] += 1
    merges = []
    while len(vocab) < a.vocab - len(specials):
        pairs = collections.Counter()
        for w, c in words.items():
            for p in zip(w, w[1:]): pairs[p] += c
        if not pairs: break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(list(best)); tok = best[0] + best[1]; vocab[tok] = len(vocab)
        nw = collections.Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best: out.append(tok); i += 2
                else: out.append(w[i]); i += 1
            nw[tuple(out)] += c
        words = nw
    added = [{"id": len(vocab) + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(specials)]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": {"type": "NFC"},
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
              {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
               "behavior": "Isolated", "invert": False}, bl]},
          "post_processor": bl, "decoder": bl,
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                    "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                    "vocab": vocab, "merges": merges}}
    template = ("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
                "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
    cfg = {"add_bos_token": False, "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
           "chat_template": template, "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 4096}
    os.makedirs(a.out, exist_ok=True)
    json.dump(tj, open(os.path.join(a.out, "tokenizer.json"), "w"), ensure_ascii=False)
    json.dump(cfg, open(os.path.join(a.out, "tokenizer_config.json"), "w"), indent=1)
    print(f"{a.out}: {len(vocab) + len(specials)} tokens, {len(merges)} merges")

if __name__ == "__main__":
    main()
