#!/usr/bin/env python3
"""Writes the seed corpora under tests/fuzz/corpus/ from the test fixtures (small files only; run from anywhere).
The fuzzers grow their own corpora in their build folder; these seeds are what is committed."""
import json
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")
OUT = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, meta=None):
    """tensors: name -> (dtype, shape, bytes)"""
    hdr, blob = {}, b""
    if meta:
        hdr["__metadata__"] = meta
    for name, (dt, shape, raw) in tensors.items():
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + blob


# ---- safetensors and the sharded index
put("safetensors", "small", safetensors({
    "model.embed_tokens.weight": ("F32", [2, 3], struct.pack("<6f", *range(6))),
    "model.norm.weight": ("BF16", [3], b"\x80\x3f" * 3),
    "lm_head.weight": ("F16", [3, 2], b"\x00\x3c" * 6),
}, {"format": "pt"}))
put("safetensors", "empty", safetensors({}))
with open(os.path.join(FIX, "models/qwen3/model.safetensors"), "rb") as f:
    raw = f.read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
put("safetensors", "qwen3_truncated", raw[:8 + n + 512])
names = sorted(k for k in header if k != "__metadata__")
put("st_index", "index", json.dumps({"metadata": {"total_size": 1}, "weight_map": {
    k: "model-%05d-of-00002.safetensors" % (1 + i % 2) for i, k in enumerate(names)}}))
put("st_index", "one_shard", json.dumps({"weight_map": {k: "model-00001-of-00002.safetensors" for k in names}}))


# ---- GGUF: the fixture's metadata (config, tokenizer) with no tensors, and with its tensor table but no data
def gguf_header(path):
    with open(path, "rb") as f:
        b = f.read()
    pos = 24
    n_tensors, n_kv = struct.unpack("<QQ", b[8:24])

    def string(p):
        ln = struct.unpack("<Q", b[p:p + 8])[0]
        return p + 8 + ln

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def value(p, t):
        if t == 8:
            return string(p)
        if t == 9:
            et, cnt = struct.unpack("<IQ", b[p:p + 12])
            p += 12
            for _ in range(cnt):
                p = value(p, et)
            return p
        return p + sizes[t]

    for _ in range(n_kv):
        pos = string(pos)
        t = struct.unpack("<I", b[pos:pos + 4])[0]
        pos = value(pos + 4, t)
    kv_end = pos
    for _ in range(n_tensors):
        pos = string(pos)
        nd = struct.unpack("<I", b[pos:pos + 4])[0]
        pos += 4 + 8 * nd + 4 + 8
    return b, kv_end, pos


b, kv_end, ti_end = gguf_header(os.path.join(FIX, "gguf/llama-Q8_0/model.gguf"))
no_tensors = b[:8] + struct.pack("<Q", 0) + b[16:kv_end]
put("gguf", "llama_no_tensors", no_tensors)
put("gguf", "llama_table_only", b[:ti_end + 64])
# a split set: the metadata plus split.count = 2 (u16), then a second file with nothing in it
key = b"split.count"
first = (b[:8] + struct.pack("<QQ", 0, struct.unpack("<Q", b[16:24])[0] + 1) + b[24:kv_end] +
         struct.pack("<Q", len(key)) + key + struct.pack("<IH", 2, 2))
second = b[:8] + struct.pack("<QQ", 0, 0)
put("gguf_split", "llama_two_files", struct.pack("<H", len(first)) + first + second)

# ---- config.json
for m in sorted(os.listdir(os.path.join(FIX, "models"))):
    p = os.path.join(FIX, "models", m, "config.json")
    if os.path.exists(p):
        shutil.copyfile(p, os.path.join(OUT, "config", m) if os.path.isdir(os.path.join(OUT, "config"))
                        else (os.makedirs(os.path.join(OUT, "config")) or os.path.join(OUT, "config", m)))

# ---- tokenizer.json and text
with open(os.path.join(FIX, "tiny_tokenizer/tokenizer.json"), "rb") as f:
    put("tokenizer_json", "tiny", f.read())
with open(os.path.join(FIX, "tokenizers/strings.json"), encoding="utf-8") as f:
    texts = json.load(f)["texts"]
for i, t in enumerate(texts[:24]):
    put("encode", "text%02d" % i, t)

# ---- chat templates: the smaller ones
tdir = os.path.join(FIX, "chat_templates/templates")
small = sorted((os.path.getsize(os.path.join(tdir, t)), t) for t in os.listdir(tdir))[:12]
for _, t in small:
    shutil.copyfile(os.path.join(tdir, t), os.path.join(OUT, "jinja", t) if os.path.isdir(os.path.join(OUT, "jinja"))
                    else (os.makedirs(os.path.join(OUT, "jinja")) or os.path.join(OUT, "jinja", t)))
put("jinja", "ops", "{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i ** 2 %}{% endfor %}"
    "{{ ns.n // 2 }} {{ 'ab' * 2 }} {{ [1, 2][::-1]|join(',') }} {{ '%05.1f'|format(3.14159) }} "
    "{{ '{:>6}'.format('x') }} {{ messages|map(attribute='role')|list|tojson }} {{ 7 % 3 }} {{ -2 ** 2 }}")

# ---- tool-call / reasoning output (first byte: mode bits)
outs = [
    "\x03<think>\nLet me see.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "\x02<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    "\x11reasoning</think>answer <tool_call>{\"name\": 1}</tool_call> tail <tool",
    "\x06plain text with < and <t and </thi and a trailing \xe2\x82",
    # bits 5-7 pick the format: GLM, DeepSeek, Kimi, harmony
    "\x22\n<think>Plan.</think>\nOK.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call><tool_call>x\n<arg_key>k</arg_key></tool_call>",
    "\x47<think>\nHmm.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
    "```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
    "{\"days\": 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "\x6aSure.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    "{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.x:1<|tool_call_argument_begin|>{bad"
    "<|tool_call_end|><|tool_calls_section_end|>",
    "\x86<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
    "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
    "\x8e to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": 1}",
    "\x81<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>Done <|ret",
]
for i, o in enumerate(outs):
    put("toolcall", "out%d" % i, o.encode("latin-1") if "\xe2" in o else o.encode())
print("seeds written to", OUT)

# ---- API request bodies (first byte: the route, see targets.c)
ask = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]
tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
          "properties": {"city": {"type": "string"}}}}}]
bodies = {
    "api_openai": [
        (0, {"model": "m", "messages": ask, "stream": True, "max_tokens": 8, "temperature": 0.7, "top_p": 0.9,
             "stop": ["\n"], "seed": 3}),
        (0, {"model": "m", "messages": ask + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], "tools": tools, "tool_choice": "required",
             "response_format": {"type": "json_object"}}),
        (1, {"model": "m", "prompt": "Once upon", "max_tokens": 4, "logprobs": None, "stream": False}),
        (2, {}),
        (0, {"model": "m", "messages": ask, "n": 2, "stream": True, "logprobs": True, "top_logprobs": 2,
             "stream_options": {"include_usage": True}, "seed": 5, "stop": "x"}),
        (1, {"model": "m", "prompt": ["Once"], "n": 3, "max_tokens": 2, "logprobs": 1, "temperature": 0}),
    ],
    "api_anthropic": [
        (0, {"model": "m", "max_tokens": 16, "system": "Be brief.", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Weather?"}]}], "tools": [{"name": "get_weather", "input_schema": {
                "type": "object"}}], "tool_choice": {"type": "any"}, "thinking": {"type": "enabled",
                                                                                 "budget_tokens": 1024}}),
        (0, {"model": "m", "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": "hi"}, {
            "role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}]}),
        (1, {"model": "m", "messages": [{"role": "user", "content": "count me"}]}),
    ],
    "api_ollama": [
        (0, {"model": "m", "messages": ask, "stream": False, "options": {"temperature": 0.5, "num_predict": 8,
             "top_k": 20, "stop": ["x"]}, "format": "json", "think": True}),
        (1, {"model": "m", "prompt": "Hi", "system": "S", "raw": False, "options": {"seed": 1}}),
        (1, {"model": "m", "prompt": "Hi", "raw": True, "images": []}),
        (2, {"model": "m"}),
    ],
}
for target, items in bodies.items():
    for i, (route, body) in enumerate(items):
        put(target, "req%d" % i, bytes([route]) + json.dumps(body).encode())

# ---- expert pack: a head of the right shape for the qwen3_moe fixture, then zeroed tables
with open(os.path.join(FIX, "models/qwen3_moe/config.json")) as f:
    moe = json.load(f)
head = b"SLXPACK1" + struct.pack("<IIIIQQ", moe["num_hidden_layers"], moe.get("num_experts") or moe["num_local_experts"], 1, 0, 20480, 20480)
put("pack", "head", head + bytes(20480 - len(head)))  # room for the file and cell tables
put("pack", "bad_magic", b"SLXPACK0" + head[8:])
