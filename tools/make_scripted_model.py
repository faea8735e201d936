#!/usr/bin/env python3
"""Writes tests/fixtures/scripted_model: a one-layer llama whose attention and MLP weights are zero, so the
logits depend only on the last token (a bigram table), with the tiny tokenizer plus a few added tokens. Its
replies are therefore fixed scripts, which lets the server tests check text, reasoning and tool-call
streaming deterministically:

  prompt ends with "<|tool_turn|>" (the template adds it when tools are given and the last message is
  from the user)  -> <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>
  prompt ends with "<think>" (enable_thinking)  -> <think>The user wants the weather.</think>Sunny skies over Paris.
  any other prompt                              -> Sunny skies over Paris.
  a raw prompt ending with "<|loop|>"           -> " la" forever (for cancellation and load tests)

Each reply ends with <|im_end|>. Two variants write the same kind of scripts in other families' markup, so the
server tests can check the output parsers those templates select:

  scripted_harmony (gpt-oss harmony; <|start|>, <|channel|>, <|message|>, <|end|> are special tokens)
    tool turn  -> <|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather
                  <|channel|>commentary json<|message|>{"city": "Paris"}      (gpt-oss ends on <|call|>, an EOS)
    reasoning_effort "high" -> <|channel|>analysis<|message|>Thinking hard.<|end|><|start|>assistant
                  <|channel|>final<|message|>Sunny skies over Paris.
    otherwise  -> <|channel|>final<|message|>Sunny skies over Paris.
  scripted_glm (GLM-4.5; <tool_call>, <arg_key>, ... are special tokens)
    tool turn  -> <tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>
    <think>, otherwise: as scripted_model

Run once from the repository root; the output is committed."""
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
TOK = os.path.join(ROOT, "tests", "fixtures", "tiny_tokenizer")
VOCAB, HIDDEN, INTER, HEADS, KV, HEAD_DIM = 512, 32, 32, 2, 1, 16

COMMON = [
    ("<|tool_turn|>", True),
    ("<|loop|>", True),
    (" la", False),
    ("<think>", False),
    ("</think>", False),
]
TEXT = [("The user wants the weather.", False), ("Sunny", False), (" skies", False), (" over", False),
        (" Paris.", False)]
TEXT_CHAINS = [
    ["<think>", "The user wants the weather.", "</think>", "Sunny"],
    ["Sunny", " skies", " over", " Paris.", "<|im_end|>"],
    ["<|loop|>", " la", " la"],
]


def write(out, added, chains, first, template):
    """A model whose reply to a prompt is the chain its last token starts, else the chain from `first`."""
    tok = json.load(open(os.path.join(TOK, "tokenizer.json")))
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    next_id = max(ids.values()) + 1
    for content, special in added:
        tok["added_tokens"].append({"id": next_id, "content": content, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": special})
        ids[content] = next_id
        next_id += 1
    assert next_id <= VOCAB

    # bigram chains: token -> next token
    nxt = {}
    for c in chains:
        for a, b in zip(c, c[1:]):
            assert nxt.get(ids[a], ids[b]) == ids[b], "%r has two successors" % a
            nxt[ids[a]] = ids[b]
    DEFAULT = HIDDEN - 1  # every other token: start the text reply
    slots = {t: i for i, t in enumerate(sorted(nxt))}
    assert len(slots) < DEFAULT

    embed = [[0.0] * HIDDEN for _ in range(VOCAB)]
    for t in range(VOCAB):
        embed[t][slots.get(t, DEFAULT)] = 1.0
    head = [[0.0] * HIDDEN for _ in range(VOCAB)]
    for t, s in slots.items():
        head[nxt[t]][s] = 8.0
    head[ids[first]][DEFAULT] = 8.0

    tensors = {
        "model.embed_tokens.weight": (embed, [VOCAB, HIDDEN]),
        "lm_head.weight": (head, [VOCAB, HIDDEN]),
        "model.norm.weight": ([1.0] * HIDDEN, [HIDDEN]),
        "model.layers.0.input_layernorm.weight": ([1.0] * HIDDEN, [HIDDEN]),
        "model.layers.0.post_attention_layernorm.weight": ([1.0] * HIDDEN, [HIDDEN]),
    }
    zeros = {
        "self_attn.q_proj": [HEADS * HEAD_DIM, HIDDEN], "self_attn.k_proj": [KV * HEAD_DIM, HIDDEN],
        "self_attn.v_proj": [KV * HEAD_DIM, HIDDEN], "self_attn.o_proj": [HIDDEN, HEADS * HEAD_DIM],
        "mlp.gate_proj": [INTER, HIDDEN], "mlp.up_proj": [INTER, HIDDEN], "mlp.down_proj": [HIDDEN, INTER],
    }
    for name, shape in zeros.items():
        tensors["model.layers.0.%s.weight" % name] = ([[0.0] * shape[1] for _ in range(shape[0])], shape)


    def flat(v):
        return [x for row in v for x in row] if v and isinstance(v[0], list) else v


    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        data, shape = tensors[name]
        b = struct.pack("<%df" % len(flat(data)), *flat(data))
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))

    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": VOCAB, "hidden_size": HIDDEN,
              "intermediate_size": INTER, "num_hidden_layers": 1, "num_attention_heads": HEADS,
              "num_key_value_heads": KV, "head_dim": HEAD_DIM, "max_position_embeddings": 65536, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "float32"}
    json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=1)
    json.dump(tok, open(os.path.join(out, "tokenizer.json"), "w"), ensure_ascii=False)

    cfg = json.load(open(os.path.join(TOK, "tokenizer_config.json")))
    cfg["chat_template"] = template
    json.dump(cfg, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=1)
    print("wrote", out)


# newlines are written as expressions: the template engine trims a newline that follows a block tag
N = "{{ '\\n' }}"
template = (
    "{% if tools %}<|im_start|>system" + N +
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}" + N + N + "{% endif %}"
    "# Tools" + N + "<tools>{% for t in tools %}" + N + "{{ t | tojson }}{% endfor %}" + N + "</tools>" + N +
    "Call a tool as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call><|im_end|>" + N +
    "{% elif messages[0].role == 'system' %}<|im_start|>system" + N + "{{ messages[0].content }}<|im_end|>" + N +
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'system' and loop.first %}"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant" + N + "{{ m.content }}"
    "{% if m.tool_calls %}{% for tc in m.tool_calls %}<tool_call>{\"name\": \"{{ tc.function.name }}\", \"arguments\": "
    "{% if tc.function.arguments is string %}{{ tc.function.arguments }}{% else %}{{ tc.function.arguments | tojson }}"
    "{% endif %}}</tool_call>{% endfor %}{% endif %}<|im_end|>" + N +
    "{% elif m.role == 'tool' %}<|im_start|>user" + N + "<tool_response>" + N + "{{ m.content }}" + N +
    "</tool_response><|im_end|>" + N +
    "{% else %}<|im_start|>{{ m.role }}" + N + "{{ m.content }}<|im_end|>" + N + "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant" + N +
    "{% if enable_thinking is defined and enable_thinking %}<think>"
    "{% elif tools and messages[-1].role == 'user' %}<|tool_turn|>{% endif %}"
    "{% endif %}")

write(os.path.join(FIXTURES, "scripted_model"),
      COMMON + [("<tool_call>", False), ("</tool_call>", False), ('{"name": "get_weather", ', False),
                ('"arguments": {"city": ', False), ('"Paris"}}', False)] + TEXT,
      [["<|tool_turn|>", "<tool_call>", '{"name": "get_weather", ', '"arguments": {"city": ', '"Paris"}}',
        "</tool_call>", "<|im_end|>"]] + TEXT_CHAINS,
      "Sunny", template)

# harmony: the markup tokens are special, as in gpt-oss's tokenizer; a few others merge markup into one
# token where a chain would otherwise need a token with two successors
HF, HA = "<|channel|>final<|message|>", "<|channel|>analysis<|message|>"
harmony_template = (
    "{% for m in messages %}{% if m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>"
    "{{ m.content }}<|end|>{% elif m.role == 'tool' %}<|start|>functions.get_weather to=assistant<|channel|>"
    "commentary<|message|>{{ m.content }}<|end|>{% else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant"
    "{% if reasoning_effort is defined and reasoning_effort == 'high' %}<|deep|>"
    "{% elif tools and messages[-1].role == 'user' %}<|tool_turn|>{% endif %}{% endif %}")
write(os.path.join(FIXTURES, "scripted_harmony"),
      COMMON + TEXT + [("<|deep|>", True), ("<|start|>", True), ("<|channel|>", True), ("<|message|>", True),
                       ("<|end|>", True), ("analysis", False), ("Need the weather.", False), ("Thinking hard.", False),
                       ("assistant to=functions.get_weather", False),
                       ("<|channel|>commentary json<|message|>", False), ('{"city": "Paris"}', False),
                       (HF, False), (HA, False), ("<|end|><|start|>assistant", False)],
      [["<|tool_turn|>", "<|channel|>", "analysis", "<|message|>", "Need the weather.", "<|end|>", "<|start|>",
        "assistant to=functions.get_weather", "<|channel|>commentary json<|message|>", '{"city": "Paris"}',
        "<|im_end|>"],
       ["<|deep|>", HA, "Thinking hard.", "<|end|><|start|>assistant", HF, "Sunny"]] + TEXT_CHAINS,
      HF, harmony_template)

glm_template = template.replace(
    "Call a tool as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>",
    "Call a tool as <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value></tool_call>")
write(os.path.join(FIXTURES, "scripted_glm"),
      COMMON + TEXT + [("<tool_call>", True), ("</tool_call>", True), ("<arg_key>", True), ("</arg_key>", True),
                       ("<arg_value>", True), ("</arg_value>", True), ("get_weather\n", False), ("city", False),
                       ("Paris", False)],
      [["<|tool_turn|>", "<tool_call>", "get_weather\n", "<arg_key>", "city", "</arg_key>", "<arg_value>", "Paris",
        "</arg_value>", "</tool_call>", "<|im_end|>"]] + TEXT_CHAINS,
      "Sunny", glm_template)
