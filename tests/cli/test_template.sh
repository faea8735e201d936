#!/usr/bin/env bash
# sluice template: byte-exact prompts from a model folder and from --template, and failures that exit non-zero.
set -euo pipefail
BIN=${SLUICE_BIN:?}
FIX=${SLUICE_FIXTURES:?}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# 1. chat template and bos token from tokenizer_config.json
cat >"$TMP/chat.json" <<'JSON'
{"messages": [{"role": "user", "content": "What is the capital of France?"}], "add_generation_prompt": true}
JSON
printf '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n' >"$TMP/want1"
"$BIN" template "$FIX/tokenizers/llama3" "$TMP/chat.json" >"$TMP/got1"
cmp "$TMP/want1" "$TMP/got1"

# 2. --template without a model; extra keys of the chat file become variables
cat >"$TMP/multi.json" <<'JSON'
{"messages": [{"role": "system", "content": "You are concise."}, {"role": "user", "content": "2+2?"},
              {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}],
 "add_generation_prompt": true}
JSON
printf '<|im_start|>system\nYou are concise.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n' >"$TMP/want2"
"$BIN" template "$TMP/multi.json" --template "$FIX/chat_templates/templates/Qwen-Qwen2.5-7B-Instruct.jinja" >"$TMP/got2"
cmp "$TMP/want2" "$TMP/got2"

cat >"$TMP/hello.json" <<'JSON'
{"messages": [{"role": "user", "content": "Hello!"}], "add_generation_prompt": true,
 "bos_token": "<|bos|>", "date_string": "26 Jul 2024"}
JSON
printf '<|bos|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n' >"$TMP/want3"
"$BIN" template --template "$FIX/chat_templates/templates/meta-llama-Llama-3.1-8B-Instruct.jinja" "$TMP/hello.json" >"$TMP/got3"
cmp "$TMP/want3" "$TMP/got3"

# 3. a template that raises: non-zero exit, the message and its line on stderr, nothing on stdout
if "$BIN" template "$TMP/multi.json" --template "$FIX/chat_templates/templates/google-gemma-2-2b-it.jinja" \
    >"$TMP/out4" 2>"$TMP/err4"; then
    echo "expected failure for gemma-2 with a system message" >&2
    exit 1
fi
grep -q "System role not supported" "$TMP/err4"
grep -q "line 1" "$TMP/err4"
[ ! -s "$TMP/out4" ]

# 4. a syntax error names its line
printf 'ok\n{%% if x %%}\n{{ x +* }}\n{%% endif %%}\n' >"$TMP/bad.jinja"
if "$BIN" template "$TMP/chat.json" --template "$TMP/bad.jinja" 2>"$TMP/err5"; then
    echo "expected a syntax error" >&2
    exit 1
fi
grep -q "line 3" "$TMP/err5"

# 5. usage
"$BIN" template --help | grep -q "usage: sluice template"
if "$BIN" template 2>/dev/null; then exit 1; fi
echo "template CLI: ok"
