/* Cost of grammar-constrained decoding per token: a JSON document that follows a schema is tokenized, then
 * fed token by token to a constraint, timing the full mask over the vocabulary (what a step costs when the
 * sampler's first pick is refused), the single-token check (when it is accepted) and the advance.
 *
 *   cmake --build build --target bench_grammar && ./build/bench_grammar TOKENIZER_DIR [TOKENIZER_DIR ...]
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "text/grammar.h"
#include "text/json_schema.h"
#include "text/tokenizer.h"

static const char SCHEMA[] =
    "{\"type\": \"object\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"maxLength\": 40},"
    "\"age\": {\"type\": \"integer\", \"minimum\": 0, \"maximum\": 150},"
    "\"kind\": {\"enum\": [\"cat\", \"dog\", \"robot\"]},"
    "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"maxItems\": 5},"
    "\"address\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"zip\": {\"type\": "
    "\"string\", \"pattern\": \"^[0-9]{5}$\"}}, \"required\": [\"city\"], \"additionalProperties\": false},"
    "\"score\": {\"type\": \"number\"}},"
    "\"required\": [\"name\", \"age\", \"kind\", \"tags\", \"address\"], \"additionalProperties\": false}";

static const char DOC[] = "{\n  \"name\": \"Ada Lovelace, the first programmer\",\n  \"age\": 36,\n  \"kind\": "
                          "\"robot\",\n  \"tags\": [\"mathematics\", \"analytical engine\", \"poetry\"],\n  "
                          "\"address\": {\"city\": \"London\", \"zip\": \"12345\"},\n  \"score\": 99.5\n}";

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s TOKENIZER_DIR [TOKENIZER_DIR ...]\n", argv[0]);
        return 2;
    }
    sl_err e;
    json_t *schema = json_loads(SCHEMA, 0, NULL);
    sl_grammar *g;
    if (!schema || sl_json_schema_grammar(schema, "schema", &g, &e)) {
        fprintf(stderr, "schema: %s\n", e.msg);
        return 1;
    }
    if (sl_grammar_match(g, DOC, strlen(DOC), &e) != 1) {
        fprintf(stderr, "the document does not follow the schema\n");
        return 1;
    }
    printf("%-40s %7s %7s %9s %9s %9s %9s %9s\n", "tokenizer", "vocab", "tokens", "trie ms", "mask ms", "mask p50",
           "mask max", "check us");
    for (int a = 1; a < argc; a++) {
        sl_tokenizer *t;
        if (sl_tokenizer_load(argv[a], &t, &e)) {
            fprintf(stderr, "%s\n", e.msg);
            return 1;
        }
        int V = sl_tokenizer_vocab_size(t), n;
        int32_t *ids;
        if (sl_tokenizer_encode(t, DOC, strlen(DOC), 0, &ids, &n, &e)) return 1;
        double t0 = sl_now();
        sl_gvocab *v;
        if (sl_gvocab_create(t, V, &v, &e)) return 1;
        double trie = sl_now() - t0;
        sl_gconstraint *c;
        if (sl_gconstraint_init(g, v, &c, &e)) return 1;
        uint8_t *m = malloc((size_t)V);
        double *mask_s = malloc((size_t)n * sizeof *mask_s), check_s = 0, sum = 0;
        for (int i = 0; i < n; i++) {
            double s0 = sl_now();
            if (sl_gconstraint_mask(c, m, &e) < 0) return 1;
            double s1 = sl_now();
            if (sl_gconstraint_allows(c, ids[i], &e) != 1 || !m[ids[i]]) {
                fprintf(stderr, "token %d refused\n", i);
                return 1;
            }
            double s2 = sl_now();
            if (sl_gconstraint_accept(c, ids[i], &e)) return 1;
            mask_s[i] = s1 - s0;
            sum += s1 - s0;
            check_s += s2 - s1;
        }
        qsort(mask_s, (size_t)n, sizeof *mask_s, cmp_d);
        printf("%-40s %7d %7d %9.1f %9.3f %9.3f %9.3f %9.2f\n", argv[a], V, n, trie * 1e3, sum / n * 1e3,
               mask_s[n / 2] * 1e3, mask_s[n - 1] * 1e3, check_s / n * 1e6);
        free(m);
        free(mask_s);
        free(ids);
        sl_gconstraint_free(c);
        sl_gvocab_free(v);
        sl_tokenizer_free(t);
    }
    sl_grammar_free(g);
    json_decref(schema);
    return 0;
}
