#!/usr/bin/env python3
"""Recompute fixture logits with transformers from the weights as stored in each fixture's
model.safetensors (bf16 checkpoints; MLX ones are skipped), print their distance to the shipped
reference files, and write OUT/NAME.f32 (prefill rows then decode rows) for
tests/fixtures/models/NAME/logits_stored_weights.f32.

Needs torch and transformers (the GPU machine has both).  Usage: refcheck.py MODELS_DIR OUT_DIR
"""
import json, os, sys, numpy as np, torch
from safetensors.torch import load_file
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM, MistralConfig, MistralForCausalLM)
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM
root, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
classes = {"llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM),
           "qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM),
           "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM), "qwen3_5_moe_text": (Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM)}
def rel(a, b): return float(np.sqrt(((a - b) ** 2).sum() / (b ** 2).sum()))
for name in sorted(os.listdir(root)):
    d = os.path.join(root, name)
    cfg = json.load(open(d + "/config.json"))
    if "quantization" in cfg: continue
    tc = cfg.get("text_config", cfg)
    if "rope_scaling" in tc and "rope_parameters" not in tc:
        rp = dict(tc.pop("rope_scaling")); rp["rope_theta"] = tc.pop("rope_theta"); tc["rope_parameters"] = rp
    C, M = classes[tc["model_type"]]
    tc = {k: v for k, v in tc.items() if k not in ("model_type", "transformers_version", "architectures")}
    conf = C(**tc); conf._attn_implementation = "eager"
    m = M(conf).float().eval()
    sd = {}
    for k, v in load_file(d + "/model.safetensors").items():
        k = k.replace("model.language_model.", "model.")
        sd[k] = v.float()
    # re-fuse per-expert tensors when the model keeps fused experts
    msd = m.state_dict()
    for k in list(msd):
        if k.endswith("mlp.experts.gate_up_proj") and k not in sd:
            b = k[:-len("gate_up_proj")]; E = msd[k].shape[0]
            sd[k] = torch.stack([torch.cat([sd.pop(f"{b}{e}.gate_proj.weight"), sd.pop(f"{b}{e}.up_proj.weight")]) for e in range(E)])
        if k.endswith("mlp.experts.down_proj") and k not in sd:
            b = k[:-len("down_proj")]; E = msd[k].shape[0]
            sd[k] = torch.stack([sd.pop(f"{b}{e}.down_proj.weight") for e in range(E)])
    if "lm_head.weight" not in sd: sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    missing, unexpected = m.load_state_dict(sd, strict=False)
    ex = json.load(open(d + "/expected.json"))
    with torch.no_grad():
        o = m(torch.tensor([ex["prompt_ids"]]), use_cache=True); pre = o.logits[0].numpy(); past = o.past_key_values
        dec = []
        for t in ex["decode_ids"]:
            o = m(torch.tensor([[t]]), past_key_values=past, use_cache=True); past = o.past_key_values; dec.append(o.logits[0, -1].numpy())
    dec = np.stack(dec)
    rp = np.fromfile(d + "/logits_prefill.f32", "<f4").reshape(pre.shape); rd = np.fromfile(d + "/logits_decode.f32", "<f4").reshape(dec.shape)
    np.concatenate([pre, dec]).astype("<f4").tofile(f"{out}/{name}.f32")
    print(f"{name:20s} stored-bf16-weights vs shipped: prefill {rel(pre, rp):.2e} decode {rel(dec, rd):.2e} missing={missing} unexpected={unexpected}", flush=True)
