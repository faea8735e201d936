#include <criterion/criterion.h>
#include <string.h>

#include "hub/select.h"

#define N(a) ((int)(sizeof(a) / sizeof(a)[0]))

static const char *st_repo[] = {"config.json",
                                "generation_config.json",
                                "model-00001-of-00002.safetensors",
                                "model-00002-of-00002.safetensors",
                                "model.safetensors.index.json",
                                "tokenizer.json",
                                "tokenizer_config.json",
                                "chat_template.jinja",
                                "README.md",
                                "pytorch_model.bin",
                                "model.onnx",
                                "original/consolidated.00.pth",
                                "original/model.safetensors",
                                ".gitattributes"};

Test(hub_select, safetensors_repo_takes_what_a_run_needs) {
    int keep[N(st_repo)], gguf;
    sl_err e;
    cr_assert_eq(sl_hub_select("o/r", st_repo, N(st_repo), NULL, keep, &gguf, &e), 0, "%s", e.msg);
    cr_assert_eq(gguf, -1);
    const int want[] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < N(st_repo); i++) cr_assert_eq(keep[i], want[i], "%s", st_repo[i]);
}

static const char *gg_repo[] = {"README.md",
                                "Model-Q4_K_M.gguf",
                                "Model-Q4_K_S.gguf",
                                "Model-Q8_0.gguf",
                                "Q6_K/Model-Q6_K-00001-of-00002.gguf",
                                "Q6_K/Model-Q6_K-00002-of-00002.gguf",
                                "mmproj-Model-f16.gguf"};

Test(hub_select, gguf_quants) {
    int keep[N(gg_repo)], gguf;
    sl_err e;
    /* case-insensitive, whole quant preferred over a prefix of a longer one */
    cr_assert_eq(sl_hub_select("o/r", gg_repo, N(gg_repo), "q4_k_m", keep, &gguf, &e), 0, "%s", e.msg);
    cr_assert_eq(gguf, 1);
    cr_assert(keep[1] && !keep[2] && !keep[3]);
    /* a split set comes whole, the first part named */
    cr_assert_eq(sl_hub_select("o/r", gg_repo, N(gg_repo), "Q6_K", keep, &gguf, &e), 0, "%s", e.msg);
    cr_assert_eq(gguf, 4);
    cr_assert(keep[4] && keep[5] && !keep[1] && !keep[6]);
    /* an exact path; the second part of a split set brings the set */
    cr_assert_eq(sl_hub_select("o/r", gg_repo, N(gg_repo), "Q6_K/Model-Q6_K-00002-of-00002.gguf", keep, &gguf, &e), 0,
                 "%s", e.msg);
    cr_assert(gguf == 4 && keep[4] && keep[5]);
    cr_assert_neq(sl_hub_select("o/r", gg_repo, N(gg_repo), "nothere.gguf", keep, &gguf, &e), 0);
    cr_assert(strstr(e.msg, "o/r: no file nothere.gguf"), "%s", e.msg);
    /* "Q4_K" is a prefix of two quants and a whole one of none: ambiguous */
    cr_assert_neq(sl_hub_select("o/r", gg_repo, N(gg_repo), "Q4_K", keep, &gguf, &e), 0);
    cr_assert(strstr(e.msg, "matches several") && strstr(e.msg, "Q4_K_M, Q4_K_S, Q8_0, Q6_K"), "%s", e.msg);
    /* none named: the offer, without the projector */
    cr_assert_neq(sl_hub_select("o/r", gg_repo, N(gg_repo), NULL, keep, &gguf, &e), 0);
    cr_assert(strstr(e.msg, "pick one, e.g. o/r:Q4_K_M") && !strstr(e.msg, "f16"), "%s", e.msg);
}

Test(hub_select, single_quant_and_no_weights) {
    const char *one[] = {"README.md", "m.Q8_0.gguf"}, *none[] = {"README.md", "model.onnx"};
    int keep[2], gguf;
    sl_err e;
    cr_assert_eq(sl_hub_select("o/r", one, 2, NULL, keep, &gguf, &e), 0, "%s", e.msg);
    cr_assert(gguf == 1 && keep[1] && !keep[0]);
    cr_assert_neq(sl_hub_select("o/r", none, 2, NULL, keep, &gguf, &e), 0);
    cr_assert(strstr(e.msg, "o/r: no safetensors or GGUF weights"), "%s", e.msg);
}
