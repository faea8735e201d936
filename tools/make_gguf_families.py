#!/usr/bin/env python3
"""GGUF fixtures of the family checkpoints (tests/fixtures/families/*) as llama.cpp writes them.

For each family fixture, in a work directory:
  1. the checkpoint is converted by llama.cpp's convert_hf_to_gguf.py (run in a child process with the
     tokenizer step replaced: the fixtures have no tokenizer, so the model class's set_vocab writes the
     byte-level vocabulary of the older GGUF fixtures instead -- 256 byte tokens, <|endoftext|>,
     <|im_start|>, <|im_end|>, padded to vocab_size, pre-tokenizer "qwen2", ChatML template -- which also
     bypasses the pre-tokenizer hash lookup and family vocab code such as GLM's special tokens);
  2. the float32 file is quantized by llama-quantize to Q8_0 and Q4_K_M (tiny tensors fall back to the
     types llama-quantize picks for them);
  3. references: every tensor of each file is dequantized with gguf-py and put back into the
     checkpoint's tensors along the converter's own moves, which are traced by converting a copy of the
     checkpoint whose every weight is its own element index (float32 holds integers below 2^24 exactly):
     each element of that file names the checkpoint element it came from. A tensor of the traced file
     whose elements are not such indices (checked against the real float32 conversion, element for
     element) is one the converter computes (Qwen3-Next's norms + 1, ssm_a = -exp(A_log)): it must be
     stored F32 and equal in every file, and the checkpoint's own values are used. transformers (float32)
     then runs the fixture's prompt and decode ids on those weights.
  4. tests/fixtures/gguf/<fixture>-<TYPE>/ gets model.gguf, expected.json (prompt and decode ids of the
     family fixture, a note on how the file was made) and logits_prefill.f32 / logits_decode.f32.

Outputs per fixture (TYPE is llama.cpp's name of the file type):
  bf16 checkpoints  BF16 (--outtype bf16: lossless for them; checked, and the family's own references are
                    copied), Q8_0, Q4_K_M (quantized from the f32 conversion)
  deepseek_v3_fp8   F32 (the converter dequantizes the FP8 tiles; exact in float32, so the family's
                    references apply); --fp8-outtype bf16 gives a BF16 file with recomputed references
  gpt_oss_mxfp4     MXFP4_MOE (--outtype bf16: experts repacked to GGML MXFP4 byte for byte, the rest
                    bf16; lossless, the family's references apply)

What llama.cpp's converter does with each family (conversion/*.py; all seven are supported):
  mixtral           LlamaModel, arch llama: Q/K rows permuted for interleaved RoPE, block_sparse_moe
                    experts w1/w3/w2 stacked into ffn_{gate,up,down}_exps
  qwen3_next        Qwen3NextModel, arch qwen3next: in_proj_qkvz regrouped into attn_qkv (q, k, v of every
                    key head) and attn_gate (z); in_proj_ba kept whole (ssm_ba); conv1d squeezed;
                    dt_bias -> ssm_dt.bias; A_log -> ssm_a = -exp(A_log) and RMSNorm weights + 1 (not the
                    delta-net's gated norm) computed; needs its MTP export turned off (no mtp.* tensors)
  deepseek_v3(_fp8) DeepseekV2Model, arch deepseek2: kv_b_proj split per head into attn_k_b (transposed)
                    and attn_v_b; experts stacked; FP8 weights times their weight_scale_inv tiles
  glm4_moe          Glm4MoeModel, arch glm4moe: no permutes; experts stacked; block_count counts
                    num_nextn_predict_layers (the fixture has no MTP tensors; the key is written as is)
  gpt_oss(_mxfp4)   GptOssModel, arch gpt-oss: bf16 gate_up_proj [E,H,2I] transposed and de-interleaved
                    (even rows gate, odd up), down_proj transposed, biases de-interleaved, sinks ->
                    attn_sinks; MXFP4 blocks/scales repacked to GGML MXFP4
DeepSeek-V3's config as the Hub ships it has scoring_func "sigmoid", which transformers' config no longer
keeps: it is added to the converter's copy so that deepseek2.expert_gating_func is written as in real files.

Needs python3 with torch, numpy, safetensors, transformers (5.x), pyyaml and tqdm (gguf-py's), a llama.cpp
source tree (convert_hf_to_gguf.py, conversion/, gguf-py/) and a built llama-quantize. CPU is enough.
Keeps going when a fixture fails (prints why) and ends with a summary table; exits 1 if anything failed.

  tools/make_gguf_families.py --llama-cpp DIR --quantize BIN [--out DIR] [FIXTURE ...]
  tools/make_gguf_families.py --dry-run --llama-cpp DIR [--quantize BIN]   (checks paths, prints the plan;
                                                                            needs no torch)
"""
import argparse
import ast
import hashlib
import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUANT_TYPES = ("Q8_0", "Q4_K_M")
# baseline: transformers on the checkpoint's weights against the family's shipped logits
BASELINE_TOL = 1e-4
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


class StepError(Exception):
    """A step that failed for a reason already put in words (no traceback needed)."""


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- plumbing that needs no numpy/torch

def byte_vocab(n_vocab):
    """The byte-level vocabulary of the older GGUF fixtures: token i < 256 is byte i in GPT-2's
    bytes-to-unicode spelling, then three ChatML specials, then [PADi] up to the model's vocab_size."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    spell = dict(zip(bs, map(chr, cs)))
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    if n_vocab < 256 + len(specials):
        raise StepError(f"vocab_size {n_vocab} is too small for 256 bytes and {len(specials)} specials")
    tokens = [spell[i] for i in range(256)] + specials + [f"[PAD{i}]" for i in range(259, n_vocab)]
    types = [1] * 256 + [3] * len(specials) + [5] * (n_vocab - 259)  # NORMAL, CONTROL, UNUSED
    return {"pre": "qwen2", "tokens": tokens, "types": types, "eos": 258, "pad": 256, "chat_template": CHATML}


def safetensors_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return h


class Fixture:
    def __init__(self, root, name):
        self.name = name
        self.dir = root / name
        self.cfg = json.loads((self.dir / "config.json").read_text())
        self.expected = json.loads((self.dir / "expected.json").read_text())
        self.arch = (self.cfg.get("architectures") or [None])[0]
        self.quant = (self.cfg.get("quantization_config") or {}).get("quant_method")

    def plan(self, a):
        """[(outtype, lossless, quantize type or None)]: what to write for this fixture."""
        if self.quant == "fp8":
            return [(a.fp8_outtype, a.fp8_outtype == "f32", None)]
        if self.quant == "mxfp4":
            return [("bf16", True, None)]
        if self.quant is not None:
            raise StepError(f"quantization {self.quant!r} has no plan")
        return [("bf16", True, None)] + [("f32", False, q) for q in a.types]

    def converter_config(self):
        """The config the converter gets, with what the Hub's own configs carry and transformers drops."""
        c, added = dict(self.cfg), {}
        if c.get("model_type") in ("deepseek_v3", "kimi_k2") and "scoring_func" not in c:
            added["scoring_func"] = "sigmoid"
        c.update(added)
        return c, added

    def float_config(self):
        c = dict(self.cfg)
        c.pop("quantization_config", None)
        return c


def converter_archs(llama_cpp):
    """Architectures llama.cpp's converter registers: {arch: module}, or None when it cannot be read."""
    init = llama_cpp / "conversion" / "__init__.py"
    if init.exists():
        for node in ast.walk(ast.parse(init.read_text())):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == "TEXT_MODEL_MAP" for t in targets):
                    return ast.literal_eval(node.value)
    found = {}
    for p in [llama_cpp / "convert_hf_to_gguf.py"] + sorted((llama_cpp / "conversion").glob("*.py")):
        if p.exists():
            for args in re.findall(r"register\(([^)]*)\)", p.read_text()):
                for arch in re.findall(r"\"([A-Za-z0-9_]+)\"", args):
                    found[arch] = p.stem
    return found or None


def converter_digest(llama_cpp):
    """sha256 of the converter's sources (convert_hf_to_gguf.py, conversion/*.py), for the record."""
    h = hashlib.sha256()
    for p in [llama_cpp / "convert_hf_to_gguf.py"] + sorted((llama_cpp / "conversion").glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def file_type_label(ftype):
    # llama.cpp's LlamaFileType names, as its converter names files ("MOSTLY_Q4_K_M" -> "Q4_K_M")
    names = {0: "F32", 1: "F16", 7: "Q8_0", 15: "Q4_K_M", 32: "BF16", 38: "MXFP4_MOE"}
    return names.get(ftype, f"FTYPE{ftype}")


def run_logged(cmd, logfile, env=None):
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "w") as f:
        f.write("$ " + " ".join(shlex.quote(str(c)) for c in cmd) + "\n")
        f.flush()
        t0 = time.time()
        r = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=env)
        f.write(f"\n[exit {r.returncode} after {time.time() - t0:.1f} s]\n")
    if r.returncode != 0:
        tail = logfile.read_text(errors="replace").splitlines()[-30:]
        raise StepError(f"{logfile.stem} failed (exit {r.returncode}); the end of {logfile}:\n    " +
                        "\n    ".join(tail))


# ---------------------------------------------------------------- the converter, in a child process

def convert_worker(argv):
    """convert_hf_to_gguf.py's main with the tokenizer step replaced (see the module docstring)."""
    llama_cpp, model_dir, outfile, outtype, vocab_path = argv
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, llama_cpp)  # convert_hf_to_gguf.py puts its own gguf-py right after
    import convert_hf_to_gguf as converter
    try:
        import conversion
        get_class, text_model = conversion.get_model_class, conversion.TextModel
    except ImportError:  # the converter before its split into conversion/
        get_class, text_model = converter.ModelBase.from_model_architecture, converter.TextModel
    vocab = json.loads(Path(vocab_path).read_text())
    arch = json.loads((Path(model_dir) / "config.json").read_text())["architectures"][0]
    cls = get_class(arch)

    def set_vocab(self):
        w = self.gguf_writer
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(vocab["pre"])
        w.add_token_list(vocab["tokens"])
        w.add_token_types(vocab["types"])
        w.add_eos_token_id(vocab["eos"])
        w.add_pad_token_id(vocab["pad"])
        w.add_chat_template(vocab["chat_template"])

    cls.set_vocab = set_vocab
    text_model.get_vocab_base_pre = lambda self, tokenizer: vocab["pre"]
    if getattr(cls, "supports_mtp_export", False):
        cls.no_mtp = True  # as --no-mtp: the fixtures have no MTP tensors (Qwen3-Next asserts otherwise)
    print(f"make_gguf_families: {arch} -> {cls.__name__}, set_vocab replaced"
          f"{', MTP export off' if getattr(cls, 'no_mtp', False) else ''}", flush=True)
    sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outfile", outfile, "--outtype", outtype]
    converter.main()


# ---------------------------------------------------------------- numpy/torch parts

class FloatView:
    """The checkpoint's weights as float32, in its own layout: bf16 upcast, FP8 times its scale tiles,
    MXFP4 decoded to the [E, in, out] parameters transformers holds. All in one flat array (names sorted)
    so that a position in it is a global element index."""

    def __init__(self, fx):
        import numpy as np
        import torch
        from safetensors.torch import load_file
        sd = load_file(str(fx.dir / "model.safetensors"))
        out = {}
        if fx.quant == "fp8":
            block = (fx.cfg.get("quantization_config") or {}).get("weight_block_size")
            for k, v in sd.items():
                if k.endswith("_scale_inv"):
                    continue
                s = sd.get(k + "_scale_inv")
                if s is None:
                    out[k] = v.float()
                    continue
                s = s.float()
                for i, b in enumerate(block or []):  # as the converter's dequant_simple
                    s = s.repeat_interleave(b, i)
                s = s[tuple(slice(0, n) for n in v.shape)]
                out[k] = v.float() * s
        elif fx.quant == "mxfp4":
            lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
            for k, v in sd.items():
                if k.endswith("_scales"):
                    continue
                if not k.endswith("_blocks"):
                    out[k] = v.float()
                    continue
                base = k[:-len("_blocks")]
                s = sd[base + "_scales"]
                # [E, out, in/32, 16] bytes, the even element in the low nibble; scale 2^(s - 127)
                codes = torch.stack([(v & 0x0F).long(), (v >> 4).long()], dim=-1).reshape(*v.shape[:-1], 32)
                w = lut[codes] * torch.exp2(s.float() - 127.0).unsqueeze(-1)
                w = w.reshape(*v.shape[:-2], v.shape[-2] * 32)
                out[base] = w.transpose(-1, -2).contiguous()
        elif fx.quant is None:
            out = {k: v.float() for k, v in sd.items()}
        else:
            raise StepError(f"{fx.name}: quantization {fx.quant!r} not handled")
        self.names = sorted(out)
        self.shapes = {k: tuple(out[k].shape) for k in self.names}
        self.offsets, n = {}, 0
        for k in self.names:
            self.offsets[k] = n
            n += out[k].numel()
        self.n = n
        self.flat = np.concatenate([out[k].reshape(-1).numpy() for k in self.names]).astype(np.float32)
        assert self.flat.size == self.n

    def tensors(self, flat):
        return {k: flat[self.offsets[k]:self.offsets[k] + int(_prod(self.shapes[k]))].reshape(self.shapes[k])
                for k in self.names}

    def range_of(self, k):
        return self.offsets[k], self.offsets[k] + int(_prod(self.shapes[k]))


def _prod(shape):
    p = 1
    for s in shape:
        p *= int(s)
    return p


def write_index_copy(fv, cfg, dst):
    """The checkpoint with every weight replaced by its global element index + 1 (0 names nothing)."""
    import numpy as np
    import torch
    from safetensors.torch import save_file
    if fv.n + 1 >= 1 << 24:
        raise StepError(f"{fv.n} weights: element indices above 2^24 are not exact in float32")
    idx = np.arange(1, fv.n + 1, dtype=np.int64).astype(np.float32)
    tensors = {k: torch.from_numpy(idx[a:b].reshape(fv.shapes[k]).copy()) for k in fv.names
               for a, b in [fv.range_of(k)]}
    dst.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))


def gguf_tensors(path):
    """{name: (ggml type, float32 array in numpy order)} of a GGUF file, dequantized by gguf-py."""
    import numpy as np
    import gguf
    r = gguf.GGUFReader(str(path))
    out = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        v = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        if v.size != _prod(shape):
            raise StepError(f"{path}: {t.name} dequantized to {v.size} values, shape {shape}")
        out[t.name] = (t.tensor_type.name, v.reshape(shape))
    return out


def gguf_field(path, key):
    import gguf
    f = gguf.GGUFReader(str(path)).fields.get(key)
    if f is None:
        return None
    try:
        return f.contents()
    except AttributeError:  # gguf-py before ReaderField.contents
        return f.parts[f.data[0]].tolist()[0]


class TensorMap:
    """Which checkpoint elements each tensor of the converter's output holds (moved tensors), and the
    tensors it computes (kept as the f32 conversion has them)."""

    def __init__(self, fv, index_gguf, f32_gguf):
        import numpy as np
        idx, real = gguf_tensors(index_gguf), gguf_tensors(f32_gguf)
        if set(idx) != set(real):
            raise StepError(f"the index copy converts to other tensors than the checkpoint: only in the index "
                            f"file {sorted(set(idx) - set(real))}, only in the real one {sorted(set(real) - set(idx))}")
        self.moved, self.computed = {}, {}
        for name, (_, v) in idx.items():
            rv = real[name][1]
            if rv.shape != v.shape:
                raise StepError(f"{name}: shape {rv.shape} in the f32 file, {v.shape} in the index file")
            d = v.reshape(-1).astype(np.float64)
            ok = d.size > 0 and bool(np.isfinite(d).all()) and bool((d == np.floor(d)).all()) and \
                d.min() >= 1 and d.max() <= fv.n
            if ok:
                pos = d.astype(np.int64) - 1
                ok = bool(np.array_equal(rv.reshape(-1), fv.flat[pos]))
            if ok:
                self.moved[name] = pos
            else:
                self.computed[name] = rv.reshape(-1).copy()
        counts = np.bincount(np.concatenate(list(self.moved.values())) if self.moved else
                             np.zeros(0, dtype=np.int64), minlength=fv.n)
        if (counts > 1).any():
            twice = [n for n, p in self.moved.items() if (counts[p] > 1).any()]
            raise StepError(f"checkpoint elements held twice, by {twice}")
        self.kept = []  # checkpoint tensors no moved tensor holds: the computed ones' sources
        for k in fv.names:
            a, b = fv.range_of(k)
            c = counts[a:b]
            if c.all():
                continue
            if c.any():
                raise StepError(f"{k}: {int(c.sum())} of {b - a} elements found in the converted file")
            self.kept.append(k)
        # the converters only compute vectors (norms + 1, -exp(A_log)): a matrix here is a weight the trace
        # lost, e.g. one whose float values in the real conversion are not the checkpoint's
        big = sorted(n for n, v in self.computed.items() if len(real[n][1].shape) > 1)
        if big:
            raise StepError(f"matrices not traced to the checkpoint: {big[:8]}")
        # each kept checkpoint tensor needs a computed one of its size (else the converter dropped it)
        sizes = Counter(v.size for v in self.computed.values())
        for k in self.kept:
            n = _prod(fv.shapes[k])
            if sizes[n] == 0:
                raise StepError(f"{k} {fv.shapes[k]} is in no tensor of the converted file")
            sizes[n] -= 1
        if sum(sizes.values()):
            log(f"  note: {sum(sizes.values())} computed tensor(s) with no checkpoint tensor of their size "
                f"(generated by the converter)")

    def weights(self, fv, path):
        """The checkpoint's flat weights with every moved tensor of the file at path put back; computed
        tensors checked equal to the f32 conversion's. Returns (flat, Counter of tensor types)."""
        import numpy as np
        got = gguf_tensors(path)
        want = set(self.moved) | set(self.computed)
        if set(got) != want:
            raise StepError(f"{path.name}: tensors differ from the f32 conversion: extra {sorted(set(got) - want)}, "
                            f"missing {sorted(want - set(got))}")
        flat = fv.flat.copy()
        types = Counter()
        for name, (ty, v) in got.items():
            types[ty] += 1
            if name in self.moved:
                flat[self.moved[name]] = v.reshape(-1)
            elif ty != "F32" or not np.array_equal(v.reshape(-1), self.computed[name]):
                raise StepError(f"{path.name}: {name} is computed by the converter, so it must stay F32 and equal "
                                f"to the f32 conversion's, but it is {ty}"
                                f"{'' if ty != 'F32' else ' with other values'}")
        return flat, types


def fused_experts(k, shape, tensors, used):
    """transformers' fused expert parameters from per-expert checkpoint tensors (as the Hub stores them,
    Mixtral's block_sparse_moe.experts.N.w1/w3/w2 included)."""
    import numpy as np
    for suffix, hf, mixtral in (("gate_up_proj", ("gate_proj", "up_proj"), ("w1", "w3")),
                                ("down_proj", ("down_proj",), ("w2",))):
        if not (k.endswith(".experts." + suffix) or k.endswith(".experts." + suffix + ".weight")):
            continue
        base = k[:k.rindex(".experts.") + len(".experts.")]
        for pre, parts in ((base, hf), (base.replace(".mlp.experts.", ".block_sparse_moe.experts."), mixtral)):
            keys = [[f"{pre}{e}.{p}.weight" for p in parts] for e in range(shape[0])]
            if all(x in tensors for ks in keys for x in ks):
                used.update(x for ks in keys for x in ks)
                return np.stack([np.concatenate([tensors[x] for x in ks], axis=0) for ks in keys])
    return None


def model_state(model, tensors):
    """The model's state dict from the checkpoint's tensors (names as stored)."""
    import numpy as np
    import torch
    sd, used, missing = {}, set(), []
    for k, ref in model.state_dict().items():
        shape = tuple(ref.shape)
        v = None
        if k in tensors:
            v = tensors[k]
            used.add(k)
        if v is None:
            v = fused_experts(k, shape, tensors, used)
        if v is None and k.endswith(".mlp.gate.weight"):  # Mixtral's router as the Hub stores it
            alt = k[:-len("mlp.gate.weight")] + "block_sparse_moe.gate.weight"
            if alt in tensors:
                v = tensors[alt]
                used.add(alt)
        if v is None:
            missing.append(k)
            continue
        if tuple(v.shape) != shape:
            raise StepError(f"{k}: the checkpoint gives shape {tuple(v.shape)}, the model has {shape}")
        sd[k] = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)).to(ref.dtype)
    unused = sorted(set(tensors) - used)
    if missing or unused:
        raise StepError(f"checkpoint and transformers model disagree: model tensors not found {missing[:8]}, "
                        f"checkpoint tensors not used {unused[:8]}")
    return sd


class Reference:
    """transformers (float32, eager attention) on given weights: prefill logits for the prompt, then the
    logits after each decode id fed through the cache, as tools/make_fixtures.py computes them."""

    def __init__(self, fx, work, device):
        from transformers import AutoConfig, AutoModelForCausalLM
        d = work / "transformers-config"
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(fx.float_config(), indent=2))
        cfg = AutoConfig.from_pretrained(str(d))
        try:
            m = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
        except (TypeError, ValueError):
            cfg._attn_implementation = "eager"
            m = AutoModelForCausalLM.from_config(cfg)
        self.model = m.float().eval().to(device)
        self.device = device
        self.prompt = fx.expected["prompt_ids"]
        self.decode = fx.expected["decode_ids"]

    def logits(self, tensors):
        import numpy as np
        import torch
        self.model.load_state_dict(model_state(self.model, tensors), strict=True)
        with torch.no_grad():
            out = self.model(torch.tensor([self.prompt], device=self.device), use_cache=True)
            pre = out.logits[0].float().cpu().numpy()
            past = out.past_key_values
            dec = []
            for t in self.decode:
                o = self.model(torch.tensor([[t]], device=self.device), past_key_values=past, use_cache=True)
                past = o.past_key_values
                dec.append(o.logits[0, -1].float().cpu().numpy())
        return pre.astype(np.float32), np.stack(dec).astype(np.float32)


def rel_l2(a, b):
    import numpy as np
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.sqrt(((a - b) ** 2).sum() / (b ** 2).sum()))


def argmax_agree(a, b):
    return int((a.argmax(-1) == b.argmax(-1)).sum()), int(a.shape[0])


def shipped_logits(fx):
    import numpy as np
    e, V = fx.expected, fx.expected["vocab_size"]
    pre = np.fromfile(fx.dir / e["logits_prefill"]["file"], dtype="<f4").reshape(len(e["prompt_ids"]), V)
    dec = np.fromfile(fx.dir / e["logits_decode"]["file"], dtype="<f4").reshape(len(e["decode_ids"]), V)
    return pre, dec


def name_patterns(names):
    return sorted({re.sub(r"blk\.\d+\.", "blk.N.", n) for n in names})


def write_fixture(outdir, gguf_path, fx, pre, dec, note, types, made_with):
    import numpy as np
    stage = outdir.parent / (outdir.name + ".tmp")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    shutil.copyfile(gguf_path, stage / "model.gguf")
    pre.astype("<f4").tofile(stage / "logits_prefill.f32")
    dec.astype("<f4").tofile(stage / "logits_decode.f32")
    e = fx.expected
    exp = {
        "note": note,
        "prompt_ids": e["prompt_ids"],
        "decode_ids": e["decode_ids"],
        "vocab_size": e["vocab_size"],
        "tensor_types": dict(sorted(types.items())),
        "logits_prefill": {"file": "logits_prefill.f32", "shape": list(pre.shape)},
        "logits_decode": {"file": "logits_decode.f32", "shape": list(dec.shape)},
        "greedy_argmax_prefill_last": int(np.argmax(pre[-1])),
        "tolerance": e.get("tolerance", {"fp32_rel_l2": 1e-3, "bf16_rel_l2": 3e-2}),
        "source": f"families/{fx.name}",
        "made_with": made_with,
    }
    (stage / "expected.json").write_text(json.dumps(exp, indent=1) + "\n")
    shutil.rmtree(outdir, ignore_errors=True)
    stage.rename(outdir)


# ---------------------------------------------------------------- one fixture

def make_family(a, fx, work, logs, vocab_json, made_with, rows):
    import numpy as np
    plan = fx.plan(a)
    conv_cfg, added = fx.converter_config()
    cfg_note = "".join(f" The converter's copy of config.json also has {k} = {json.dumps(v)}, as the Hub's "
                       f"configs have it (transformers' config drops it)." for k, v in added.items())
    t0 = time.time()

    def convert(src, out, outtype, tag):
        log(f"  convert {tag} --outtype {outtype}")
        run_logged([sys.executable, Path(__file__).resolve(), "--convert-worker", a.llama_cpp, src, out, outtype,
                    vocab_json], logs / f"convert-{tag}-{outtype}.log", env=child_env())
        return out

    # the checkpoint as it is (named after the fixture: general.name), and the index copy
    src = work / "checkpoint" / fx.name
    src.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(fx.dir / "model.safetensors", src / "model.safetensors")
    (src / "config.json").write_text(json.dumps(conv_cfg, indent=2))
    log(f"  float view of the checkpoint")
    fv = FloatView(fx)
    icfg = dict(conv_cfg)
    icfg.pop("quantization_config", None)
    idx_src = work / "index" / fx.name
    write_index_copy(fv, icfg, idx_src)
    f32 = convert(src, work / "f32.gguf", "f32", "checkpoint")
    idx = convert(idx_src, work / "index.gguf", "f32", "index")
    tmap = TensorMap(fv, idx, f32)
    log(f"  {len(tmap.moved)} tensors moved from the checkpoint, {len(tmap.computed)} computed "
        f"{name_patterns(tmap.computed)}; kept from the checkpoint: {name_patterns(tmap.kept)}")

    ref = Reference(fx, work, a.device)
    base_pre, base_dec = ref.logits(fv.tensors(fv.flat))
    ship_pre, ship_dec = shipped_logits(fx)
    bp, bd = rel_l2(base_pre, ship_pre), rel_l2(base_dec, ship_dec)
    log(f"  transformers on the checkpoint's weights vs the shipped logits: prefill {bp:.1e}, decode {bd:.1e}")
    if not (bp <= BASELINE_TOL and bd <= BASELINE_TOL):
        raise StepError(f"transformers on the checkpoint's own weights is {bp:.1e} / {bd:.1e} from the shipped "
                        f"logits (> {BASELINE_TOL}): the model or its weights are not the fixture's")
    computed_note = (f"Tensors the converter computes ({', '.join(name_patterns(tmap.computed))}) stay F32 and "
                     f"are the checkpoint's. " if tmap.computed else "")
    vocab_note = (f"Tokenizer: byte-level, 256 bytes + 3 ChatML specials, padded to {fx.expected['vocab_size']} "
                  f"(written in place of the converter's tokenizer step).")

    for outtype, lossless, qtype in plan:
        tag = qtype or outtype
        t1 = time.time()
        row = {"fixture": f"{fx.name}-{tag.upper()}", "status": "FAILED", "mb": None, "types": "", "pre": None, "dec": None,
               "argmax": "", "detail": ""}
        rows.append(row)
        mw = dict(made_with)
        try:
            if qtype:
                path = work / f"{qtype}.gguf"
                log(f"  llama-quantize {qtype}")
                run_logged([a.quantize, f32, path, qtype, str(a.threads)], logs / f"quantize-{qtype}.log")
                qlog = (logs / f"quantize-{qtype}.log").read_text(errors="replace").splitlines()[1:]
                build = next((ln.strip() for ln in qlog if re.search(r"\bbuild\s*[:=]\s*\d", ln)), None)
                if build:
                    mw["llama-quantize"] = build
            elif outtype == "f32":
                path = f32
            else:
                path = convert(src, work / f"{outtype}.gguf", outtype, "checkpoint")
            label = file_type_label(gguf_field(path, "general.file_type"))
            row["fixture"] = f"{fx.name}-{label}"
            flat, types = tmap.weights(fv, path)
            row["types"] = " ".join(f"{k}:{v}" for k, v in sorted(types.items()))
            how = (f"{fx.name} (families/{fx.name}) converted by llama.cpp's convert_hf_to_gguf.py "
                   f"(--outtype {'f32' if qtype else outtype})" +
                   (f" and quantized by llama-quantize to {qtype} (tensors whose rows do not fit its blocks "
                    f"fall back to the types llama-quantize picks)" if qtype else ""))
            if lossless:
                if not np.array_equal(flat, fv.flat):
                    got, want = fv.tensors(flat), fv.tensors(fv.flat)
                    bad = [k for k in fv.names if not np.array_equal(got[k], want[k])]
                    raise StepError(f"{label} should be lossless but the weights read back differ in {bad[:8]}")
                pre, dec = ship_pre, ship_dec
                mx = ", the MXFP4 experts as repacked included" if fx.quant == "mxfp4" else ""
                note = (f"{how}: lossless for this checkpoint (checked: every weight read back out of the file "
                        f"equals the checkpoint's{mx}), so the references are the family fixture's own. "
                        f"{computed_note}{vocab_note}{cfg_note}")
            else:
                pre, dec = ref.logits(fv.tensors(flat))
                note = (f"{how}; reference logits from transformers (float32) on the weights dequantized back out of "
                        f"this file (gguf-py) and put back in the checkpoint's tensors along the converter's own "
                        f"moves (traced by converting a copy whose weights are their element indices), so a GGUF "
                        f"reader that dequantizes exactly matches to float32 precision. {computed_note}"
                        f"{vocab_note}{cfg_note}")
            row["pre"], row["dec"] = rel_l2(pre, ship_pre), rel_l2(dec, ship_dec)
            s, n = argmax_agree(np.concatenate([pre, dec]), np.concatenate([ship_pre, ship_dec]))
            row["argmax"] = f"{s}/{n}"
            out = a.out / row["fixture"]
            write_fixture(out, path, fx, pre, dec, note, types, mw)
            row["mb"] = (out / "model.gguf").stat().st_size / 1e6
            row["status"] = "ok"
            log(f"  wrote {out} ({row['mb']:.2f} MB, {row['types']}; vs the float references: prefill "
                f"{row['pre']:.1e}, decode {row['dec']:.1e}, argmax {row['argmax']}) in {time.time() - t1:.0f} s")
        except Exception as ex:  # one output failing leaves the others
            row["detail"] = str(ex) if isinstance(ex, StepError) else traceback.format_exc()
            log(f"  {row['fixture']} ({tag}) FAILED: {row['detail']}")
    log(f"  {fx.name} done in {time.time() - t0:.0f} s")


def child_env():
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


# ---------------------------------------------------------------- main

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fixtures", nargs="*", help="family fixtures (default: every folder of --families)")
    ap.add_argument("--llama-cpp", type=Path, required=True,
                    help="llama.cpp source tree (convert_hf_to_gguf.py, conversion/, gguf-py/)")
    ap.add_argument("--quantize", type=Path, help="the llama-quantize binary (needed for Q8_0 / Q4_K_M)")
    ap.add_argument("--families", type=Path, default=REPO / "tests" / "fixtures" / "families",
                    help="the family fixtures (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "gguf",
                    help="where the <fixture>-<TYPE> folders go (default: %(default)s)")
    ap.add_argument("--types", default=",".join(QUANT_TYPES),
                    help="llama-quantize types for the bf16 checkpoints, comma-separated, '' for none "
                         "(default: %(default)s)")
    ap.add_argument("--fp8-outtype", choices=["f32", "bf16"], default="f32",
                    help="converter output type of FP8 checkpoints: f32 is exact (the family's references "
                         "apply), bf16 rounds (references recomputed) (default: %(default)s)")
    ap.add_argument("--work", type=Path, help="work folder, kept (default: a temporary one, removed)")
    ap.add_argument("--logs", type=Path, help="where the converter's and llama-quantize's logs go (default: the "
                                              "work folder)")
    ap.add_argument("--device", default="cpu", help="torch device of the references (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1), help="llama-quantize threads")
    ap.add_argument("--dry-run", action="store_true",
                    help="check the paths and print the plan; needs neither torch nor numpy")
    a = ap.parse_args(argv)
    a.types = [t for t in a.types.split(",") if t]
    for t in a.types:
        if t not in QUANT_TYPES:
            ap.error(f"--types: {t!r} is not one of {', '.join(QUANT_TYPES)}")
    a.llama_cpp = a.llama_cpp.resolve()
    a.out = a.out.resolve()
    return ap, a


def check_paths(ap, a, fixtures):
    for p in ("convert_hf_to_gguf.py", "gguf-py/gguf/__init__.py"):
        if not (a.llama_cpp / p).exists():
            ap.error(f"--llama-cpp {a.llama_cpp}: no {p}")
    needs_quantize = a.types and any(fx.quant is None for fx in fixtures)
    if needs_quantize:
        if a.quantize is None:
            ap.error("--quantize BIN is needed for " + ", ".join(a.types) + " (or --types '')")
        if not (a.quantize.is_file() and os.access(a.quantize, os.X_OK)):
            ap.error(f"--quantize {a.quantize}: not an executable file")
        a.quantize = a.quantize.resolve()


def load_fixtures(ap, a):
    names = a.fixtures or sorted(p.name for p in a.families.iterdir()
                                 if (p / "config.json").exists() and (p / "model.safetensors").exists())
    out, bad = [], []
    for n in names:
        try:
            out.append(Fixture(a.families, n))
        except (OSError, ValueError) as ex:
            bad.append(f"{n}: {ex}")
    if bad:
        ap.error("fixtures not readable: " + "; ".join(bad))
    if not out:
        ap.error(f"no fixtures in {a.families}")
    return out


def dry_run(a, fixtures):
    archs = converter_archs(a.llama_cpp)
    print(f"llama.cpp: {a.llama_cpp} ({'converter registry read' if archs else 'converter registry not found'}; "
          f"converter sources sha256 {converter_digest(a.llama_cpp)})")
    print(f"out:       {a.out}")
    print(f"quantize:  {a.quantize or '-'} ({', '.join(a.types) or 'no quantized outputs'})")
    ok = True
    for fx in fixtures:
        h = safetensors_header(fx.dir / "model.safetensors")
        n = sum(_prod(v["shape"]) * (2 if k.endswith("_blocks") else 1) for k, v in h.items()
                if not k.endswith(("_scale_inv", "_scales")))  # two MXFP4 values a byte
        module = archs.get(fx.arch) if archs else None
        plan = fx.plan(a)
        _, added = fx.converter_config()
        outs = ", ".join((f"{q} (from f32)" if q else f"--outtype {o}") + (" lossless" if ll else "")
                         for o, ll, q in plan)
        support = ("converter: " + module) if module else (
            "NOT in the converter's registry" if archs else "converter registry unknown")
        print(f"{fx.name:16s} {fx.arch} ({support}); {fx.quant or 'bf16'}; ~{n} weights "
              f"({'index-traceable' if n + 1 < 1 << 24 else 'TOO MANY for float32 indices'}); -> {outs}"
              + (f"; config + {added}" if added else ""))
        ok &= bool(module) or archs is None
    vocab = byte_vocab(fixtures[0].expected["vocab_size"])
    print(f"vocab: {len(vocab['tokens'])} tokens, {vocab['tokens'][256:259]}, pre {vocab['pre']}")
    return 0 if ok else 1


def preflight(a):
    sys.path.insert(0, str(a.llama_cpp / "gguf-py"))
    versions, missing = {}, []
    for mod in ("numpy", "torch", "safetensors", "transformers", "yaml", "tqdm", "gguf"):
        try:
            m = __import__(mod)
            versions[mod] = getattr(m, "__version__", "?")
        except Exception as ex:  # noqa: BLE001 - report every missing module at once
            missing.append(f"{mod} ({ex})")
    if missing:
        raise SystemExit("make_gguf_families: missing Python modules: " + ", ".join(missing))
    py = a.llama_cpp / "gguf-py" / "pyproject.toml"
    m = re.search(r'^version\s*=\s*"([^"]+)"', py.read_text(), re.M) if py.exists() else None
    versions["gguf"] = m.group(1) if m else versions["gguf"]
    import gguf
    if not str(Path(gguf.__file__).resolve()).startswith(str((a.llama_cpp / "gguf-py").resolve())):
        raise SystemExit(f"make_gguf_families: gguf imported from {gguf.__file__}, not from {a.llama_cpp}/gguf-py")
    return versions


def main(argv):
    if argv[:1] == ["--convert-worker"]:
        convert_worker(argv[1:])
        return 0
    ap, a = parse_args(argv)
    fixtures = load_fixtures(ap, a)
    check_paths(ap, a, fixtures)
    if a.dry_run:
        return dry_run(a, fixtures)
    versions = preflight(a)
    log("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    archs = converter_archs(a.llama_cpp)
    made_with = {"transformers": versions["transformers"], "torch": versions["torch"], "gguf-py": versions["gguf"],
                 "converter-sha256": converter_digest(a.llama_cpp)}
    work_root = a.work.resolve() if a.work else Path(tempfile.mkdtemp(prefix="gguf-families-"))
    work_root.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    vocab_json = work_root / "vocab.json"
    rows = []
    try:
        for fx in fixtures:
            log(f"{fx.name}: {fx.arch}, {fx.quant or 'bf16'}")
            if archs is not None and fx.arch not in archs:
                rows.append({"fixture": fx.name, "status": "skipped", "mb": None, "types": "", "pre": None,
                             "dec": None, "argmax": "", "detail": f"{fx.arch} is not in the converter's registry"})
                continue
            try:
                vocab_json.write_text(json.dumps(byte_vocab(fx.expected["vocab_size"])))
                work = work_root / fx.name
                shutil.rmtree(work, ignore_errors=True)
                logs = (a.logs.resolve() / fx.name) if a.logs else work / "logs"
                make_family(a, fx, work, logs, vocab_json, made_with, rows)
            except Exception as ex:  # keep going with the next fixture
                detail = str(ex) if isinstance(ex, StepError) else traceback.format_exc()
                log(f"{fx.name} FAILED: {detail}")
                rows.append({"fixture": fx.name, "status": "FAILED", "mb": None, "types": "", "pre": None,
                             "dec": None, "argmax": "", "detail": detail})
    finally:
        if not a.work:
            shutil.rmtree(work_root, ignore_errors=True)
    print_summary(rows, a.out)
    return 0 if rows and all(r["status"] in ("ok", "skipped") for r in rows) else 1


def print_summary(rows, out):
    print(f"\nSummary (rel-L2 and argmax: against the family fixture's float references; files in {out})")
    print(f"{'fixture':26s} {'status':8s} {'MB':>6s} {'prefill':>8s} {'decode':>8s} {'argmax':>7s}  tensor types / detail")
    total = 0.0
    for r in rows:
        mb = f"{r['mb']:.2f}" if r["mb"] is not None else "-"
        total += r["mb"] or 0.0
        pre = f"{r['pre']:.1e}" if r["pre"] is not None else "-"
        dec = f"{r['dec']:.1e}" if r["dec"] is not None else "-"
        detail = r["types"] if r["status"] == "ok" else r["detail"].strip().splitlines()[-1][:160] if r["detail"] else ""
        print(f"{r['fixture']:26s} {r['status']:8s} {mb:>6s} {pre:>8s} {dec:>8s} {r['argmax']:>7s}  {detail}")
    print(f"{len([r for r in rows if r['status'] == 'ok'])} of {len(rows)} written, {total:.1f} MB of model.gguf")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
