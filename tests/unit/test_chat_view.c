/* The terminal view of a reply: fed in every chunking, reasoning comes out dimmed, tool calls on their
 * own line, content as is; without styling the text is untouched. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/chat_view.h"

static char *render_fmt(sl_tc_format fmt, const char *text, int styled, int starts_in_reasoning, size_t chunk) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    chat_view v;
    sl_err e;
    cr_assert_eq(chat_view_begin(&v, f, styled, fmt, starts_in_reasoning, &e), 0);
    for (size_t i = 0; i < strlen(text); i += chunk) {
        size_t n = strlen(text) - i < chunk ? strlen(text) - i : chunk;
        cr_assert_eq(chat_view_feed(&v, text + i, n, &e), 0);
    }
    cr_assert_eq(chat_view_end(&v, &e), 0);
    fclose(f);
    return buf;
}

static char *render(const char *text, int styled, int starts_in_reasoning, size_t chunk) {
    return render_fmt(SL_TC_HERMES, text, styled, starts_in_reasoning, chunk);
}

Test(chat_view, styles_reasoning_and_tool_calls) {
    const char *reply = "<think>\nLet me check.\n</think>\n\nThe weather:<tool_call>\n"
                        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    const char *want =
        "\033[2mLet me check.\033[0m\n\nThe weather:\033[36m[tool call] get_weather({\"city\":\"Paris\"})"
        "\033[0m\n";
    for (size_t chunk = 1; chunk <= strlen(reply); chunk += 7) {
        char *got = render(reply, 1, 0, chunk);
        cr_assert_str_eq(got, want, "chunk %zu", chunk);
        free(got);
    }
}

Test(chat_view, prompt_opened_reasoning) {
    char *got = render("thinking...\n</think>\n\nanswer", 1, 1, 3);
    cr_assert_str_eq(got, "\033[2mthinking...\033[0m\n\nanswer");
    free(got);
}

Test(chat_view, raw_without_a_terminal) {
    const char *reply = "<think>x</think>y <tool_call>{}</tool_call>";
    char *got = render(reply, 0, 0, 5);
    cr_assert_str_eq(got, reply);
    free(got);
}

Test(chat_view, unterminated_reasoning_is_reset) {
    char *got = render("<think>still going", 1, 0, 4);
    cr_assert_str_eq(got, "\033[2mstill going\033[0m");
    free(got);
}

Test(chat_view, harmony) {
    char *got = render_fmt(SL_TC_HARMONY,
                           "<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>final<|message|>Hi.",
                           1, 0, 5);
    cr_assert_str_eq(got, "\033[2mHmm.\033[0m\n\nHi.");
    free(got);
}
