#!/usr/bin/env bash
# The output parser a chat template selects, end to end: scripted models (tools/make_scripted_model.py) that
# answer in gpt-oss harmony and in GLM-4.5 markup, whose markup tokens are special (decoding keeps them for
# the parser), through the OpenAI, Responses and Anthropic APIs; reasoning_effort reaching the template.
. "$(dirname "$0")/serve_lib.sh"

ASK='"messages":[{"role":"user","content":"Weather?"}]'
TOOLS='"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]'

# chat POST BODY: the message of the first choice
chat() { curl -s "$URL/v1/chat/completions" -d "$1" | jq -c '.choices[0] | .message + {finish: .finish_reason}'; }
# streamed_args BODY: the concatenated tool-call argument deltas of a streamed chat
streamed() {
    curl -sN "$URL/v1/chat/completions" -d "$1" | grep '^data: {' | sed 's/^data: //' >"$T/sse"
    jq -sc '{name: (map(.choices[0].delta.tool_calls[0]?.function.name // empty) | join("")),
             args: (map(.choices[0].delta.tool_calls[0]?.function.arguments // empty) | join("")),
             reasoning: (map(.choices[0].delta.reasoning_content // empty) | join("")),
             content: (map(.choices[0].delta.content // empty) | join("")),
             finish: (map(.choices[0].finish_reason // empty) | join(""))}' "$T/sse"
}
expect() { [ "$2" = "$3" ] || fail "$1: got $2, want $3"; }
# after a tool result the scripted models answer in text, unless tool_choice forces a call, which the prompt
# opens in the format's own markup up to the arguments (their grammar: the enum leaves one answer)
AFTER='"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"}]'
ONE='"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Oslo"]}},"required":["city"],"additionalProperties":false}}}]'
forced() {
    for tc in '"required"' '{"type":"function","function":{"name":"get_weather"}}'; do
        expect "$1 tool_choice $tc" "$(chat "{\"model\":\"m\",$AFTER,$ONE,\"tool_choice\":$tc,\"temperature\":0}" |
            jq -c '[.tool_calls[0].function.name, .tool_calls[0].function.arguments, .finish]')" \
            '["get_weather","{\"city\":\"Oslo\"}","tool_calls"]'
    done
}

# ---- gpt-oss harmony
start harmony "$FIX/scripted_harmony"
expect "harmony text" "$(chat "{\"model\":\"m\",$ASK}" | jq -c '[.content, .reasoning_content]')" \
    '["Sunny skies over Paris.",null]'
expect "harmony call" "$(chat "{\"model\":\"m\",$ASK,$TOOLS}" |
    jq -c '[.content, .reasoning_content, .tool_calls[0].function.name, .tool_calls[0].function.arguments, .finish]')" \
    '[null,"Need the weather.","get_weather","{\"city\":\"Paris\"}","tool_calls"]'
expect "harmony streamed call" "$(streamed "{\"model\":\"m\",$ASK,$TOOLS,\"stream\":true}")" \
    '{"name":"get_weather","args":"{\"city\":\"Paris\"}","reasoning":"Need the weather.","content":"","finish":"tool_calls"}'
# reasoning_effort reaches the template (the scripted template answers "high" with a reasoning block)
expect "harmony reasoning_effort" "$(chat "{\"model\":\"m\",$ASK,\"reasoning_effort\":\"high\"}" |
    jq -c '[.reasoning_content, .content]')" '["Thinking hard.","Sunny skies over Paris."]'
expect "harmony chat_template_kwargs" "$(chat "{\"model\":\"m\",$ASK,\"chat_template_kwargs\":{\"reasoning_effort\":\"high\"}}" |
    jq -c '[.reasoning_content, .content]')" '["Thinking hard.","Sunny skies over Paris."]'
expect "harmony low effort" "$(chat "{\"model\":\"m\",$ASK,\"reasoning_effort\":\"low\"}" | jq -c '.content')" \
    '"Sunny skies over Paris."'
r=$(curl -s "$URL/v1/responses" -d "{\"model\":\"m\",\"input\":\"Weather?\",\"reasoning\":{\"effort\":\"high\"}}")
expect "responses reasoning.effort" "$(echo "$r" | jq -c '[.output[] | .type]')" '["reasoning","message"]'
expect "responses text" "$(echo "$r" | jq -r '.output[1].content[0].text')" "Sunny skies over Paris."
r=$(curl -s "$URL/v1/messages" -d "{\"model\":\"m\",\"max_tokens\":64,$ASK,\"tools\":[{\"name\":\"get_weather\",\"input_schema\":{\"type\":\"object\"}}]}")
expect "anthropic harmony tool_use" "$(echo "$r" | jq -c '[.content[] | .type] + [.content[-1].input.city, .stop_reason]')" \
    '["thinking","tool_use","Paris","tool_use"]'
r=$(curl -s "$URL/api/chat" -d "{\"model\":\"m\",$ASK,\"stream\":false,\"think\":\"high\"}")
expect "ollama think level" "$(echo "$r" | jq -c '[.message.thinking, .message.content]')" \
    '["Thinking hard.","Sunny skies over Paris."]'
forced harmony
# a JSON answer comes in the final channel
expect "harmony json_schema" "$(chat "{\"model\":\"m\",$ASK,\"temperature\":0,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[1]}},\"required\":[\"a\"],\"additionalProperties\":false}}}}" |
    jq -c '[(.content | fromjson), .reasoning_content]')" '[{"a":1},null]'
kill "$PID"

# ---- GLM-4.5
start glm "$FIX/scripted_glm"
expect "glm text" "$(chat "{\"model\":\"m\",$ASK}" | jq -c '.content')" '"Sunny skies over Paris."'
expect "glm call" "$(chat "{\"model\":\"m\",$ASK,$TOOLS}" |
    jq -c '[.content, .tool_calls[0].function.name, .tool_calls[0].function.arguments, .finish]')" \
    '[null,"get_weather","{\"city\":\"Paris\"}","tool_calls"]'
expect "glm streamed call" "$(streamed "{\"model\":\"m\",$ASK,$TOOLS,\"stream\":true}")" \
    '{"name":"get_weather","args":"{\"city\":\"Paris\"}","reasoning":"","content":"","finish":"tool_calls"}'
expect "glm thinking" "$(chat "{\"model\":\"m\",$ASK,\"chat_template_kwargs\":{\"enable_thinking\":true}}" |
    jq -c '[.reasoning_content, .content]')" '["The user wants the weather.","Sunny skies over Paris."]'
forced glm
echo "formats: all checks passed"
