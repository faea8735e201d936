/* Tokenizers read from GGUF vocabularies (llama.cpp's models/ggml-vocab-*.gguf), held to the ids Hugging Face
 * tokenizers gives for each test string (the .inp/.out files beside them), and decoded back. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "text/detok.h"
#include "text/tokenizer.h"

static const char SEP[] = "\n__ggml_vocab_test__\n";

/* Encodes every input of vocab/ggml-vocab-NAME.gguf.inp without specials and compares with the .out line;
 * decodes each back to the input. Returns the number of strings checked. */
static int check_vocab(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "vocab/ggml-vocab-%s.gguf", name);
    char *path = tu_fixture(rel);
    size_t pl = strlen(path), inl, outl;
    char *inp_path = malloc(pl + 5), *out_path = malloc(pl + 5);
    snprintf(inp_path, pl + 5, "%s.inp", path);
    snprintf(out_path, pl + 5, "%s.out", path);
    char *inp = tu_slurp(inp_path, &inl), *out = tu_slurp(out_path, &outl);
    cr_assert(inp && out, "%s: missing .inp/.out", path);
    sl_tokenizer *t;
    sl_err e;
    cr_assert_eq(sl_tokenizer_load(path, &t, &e), 0, "%s", e.msg);
    int count = 0;
    char *in = inp, *line = out, *in_end = inp + inl, *out_end = out + outl;
    while (in < in_end) { /* as llama.cpp reads them: a separator may end the file */
        cr_assert(line < out_end, "%s: .out has fewer lines than .inp has tests", name);
        char *next = strstr(in, SEP);
        size_t n = next ? (size_t)(next - in) : strlen(in);
        char *eol = strchr(line, '\n');
        if (eol) *eol = 0;
        int32_t want[4096];
        int nw = 0;
        for (char *p = line, *q; nw < 4096; p = q) {
            long v = strtol(p, &q, 10);
            if (q == p) break;
            want[nw++] = (int32_t)v;
        }
        int32_t *ids;
        int ni;
        cr_assert_eq(sl_tokenizer_encode(t, in, n, 0, &ids, &ni, &e), 0, "%s", e.msg);
        int same = ni == nw;
        for (int i = 0; same && i < ni; i++) same = ids[i] == want[i];
        if (!same) {
            char got[8192];
            size_t k = 0;
            for (int i = 0; i < ni && k + 16 < sizeof got; i++)
                k += (size_t)snprintf(got + k, sizeof got - k, " %d", ids[i]);
            got[k] = 0;
            cr_assert_fail("%s: \"%.*s\": got%s, want %s", name, (int)n, in, got, line);
        }
        char *back;
        size_t bl;
        cr_assert_eq(sl_tokenizer_decode(t, ids, ni, 0, &back, &bl, &e), 0, "%s", e.msg);
        cr_expect(bl == n && !memcmp(back, in, n), "%s: \"%.*s\" decodes to \"%s\"", name, (int)n, in, back);
        /* the streamed decode agrees with the whole one */
        sl_detok d;
        sl_detok_init(&d, t, 0);
        char *st = malloc(bl + 64);
        size_t sk = 0;
        for (int i = 0; i < ni; i++) {
            const char *o;
            size_t ol;
            cr_assert_eq(sl_detok_push(&d, ids[i], &o, &ol, &e), 0, "%s", e.msg);
            cr_assert(sk + ol <= bl + 60);
            memcpy(st + sk, o, ol);
            sk += ol;
        }
        const char *o;
        size_t ol;
        cr_assert_eq(sl_detok_flush(&d, &o, &ol, &e), 0);
        memcpy(st + sk, o, ol);
        sk += ol;
        cr_expect(sk == bl && !memcmp(st, back, bl), "%s: streamed decode of \"%.*s\" differs", name, (int)n, in);
        sl_detok_free(&d);
        free(st);
        free(back);
        free(ids);
        count++;
        in = next ? next + strlen(SEP) : in_end;
        line = eol ? eol + 1 : out_end;
    }
    cr_expect(line == out_end, "%s: .out has more lines than .inp has tests", name);
    sl_tokenizer_free(t);
    free(inp);
    free(out);
    free(inp_path);
    free(out_path);
    free(path);
    return count;
}

Test(tokenizer_vocab, llama_spm) {
    cr_expect_gt(check_vocab("llama-spm"), 30);
}
Test(tokenizer_vocab, phi_3) {
    cr_expect_gt(check_vocab("phi-3"), 30);
}
Test(tokenizer_vocab, gpt_2) {
    cr_expect_gt(check_vocab("gpt-2"), 30);
}
Test(tokenizer_vocab, deepseek_llm) {
    cr_expect_gt(check_vocab("deepseek-llm"), 30);
}
Test(tokenizer_vocab, deepseek_coder) {
    cr_expect_gt(check_vocab("deepseek-coder"), 30);
}
Test(tokenizer_vocab, falcon) {
    cr_expect_gt(check_vocab("falcon"), 30);
}
Test(tokenizer_vocab, starcoder) {
    cr_expect_gt(check_vocab("starcoder"), 30);
}
Test(tokenizer_vocab, refact) {
    cr_expect_gt(check_vocab("refact"), 30);
}
