/* sluice tokenize MODEL [TEXT]: prints the token ids of TEXT (or of stdin) as a JSON array. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "core/util.h"
#include "formats/resolve.h"
#include "text/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: sluice tokenize MODEL [TEXT] [--pieces] [--specials]\n"
               "       sluice tokenize MODEL --bench [MB] | --bench-file FILE\n\n"
               "Encodes TEXT (or all of stdin when TEXT is absent) with the tokenizer.json in directory MODEL and\n"
               "prints the ids as one JSON array.\n\n"
               "  --pieces    print [id, \"text\"] pairs (a token that is not whole UTF-8 shows its vocab string)\n"
               "  --specials  add the post-processor's special tokens (BOS/EOS)\n"
               "  --bench     encode MB megabytes (default 8) of generated English-like text, print MB/s\n"
               "  --bench-file FILE  the same with the contents of FILE\n");
}

static int valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        i += k;
    }
    return 1;
}

static void put_json_string(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c == '\r')
            fputs("\\r", stdout);
        else if (c < 0x20 || c == 0x7f)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

/* Deterministic English-like text: common words, capitalised sentences, punctuation, paragraphs. */
static char *bench_text(size_t want, size_t *len) {
    static const char *const words[] = {
        "the",       "of",         "and",       "to",          "in",          "is",           "that",
        "for",       "it",         "as",        "was",         "with",        "be",           "by",
        "on",        "not",        "he",        "this",        "are",         "or",           "his",
        "from",      "at",         "which",     "but",         "have",        "an",           "had",
        "they",      "you",        "were",      "their",       "one",         "all",          "we",
        "can",       "her",        "has",       "there",       "been",        "if",           "more",
        "when",      "will",       "would",     "who",         "so",          "no",           "time",
        "people",    "year",       "way",       "day",         "man",         "thing",        "woman",
        "life",      "child",      "world",     "school",      "state",       "family",       "student",
        "group",     "country",    "problem",   "hand",        "part",        "place",        "case",
        "week",      "company",    "system",    "program",     "question",    "work",         "government",
        "number",    "night",      "point",     "home",        "water",       "room",         "mother",
        "area",      "money",      "story",     "fact",        "month",       "lot",          "right",
        "study",     "book",       "eye",       "job",         "word",        "business",     "issue",
        "side",      "kind",       "head",      "house",       "service",     "friend",       "father",
        "power",     "hour",       "game",      "line",        "end",         "member",       "law",
        "car",       "city",       "community", "name",        "president",   "team",         "minute",
        "idea",      "kid",        "body",      "information", "back",        "parent",       "face",
        "others",    "level",      "office",    "door",        "health",      "person",       "art",
        "war",       "history",    "party",     "result",      "change",      "morning",      "reason",
        "research",  "girl",       "guy",       "moment",      "air",         "teacher",      "force",
        "education", "understand", "remember",  "development", "interesting", "particularly", "responsibility",
        "said",      "made",       "found",     "thought",     "became",      "called",       "don't",
        "it's",      "1999",       "42",        "3.5%",
    };
    const size_t nw = sizeof words / sizeof words[0];
    char *buf = malloc(want + 64);
    if (!buf) return NULL;
    size_t n = 0;
    uint32_t x = 12345;
    int in_sentence = 0, sentences = 0;
    while (n < want) {
        x = x * 1664525u + 1013904223u;
        const char *w = words[(x >> 8) % nw];
        size_t wl = strlen(w);
        if (in_sentence) buf[n++] = ' ';
        memcpy(buf + n, w, wl);
        if (!in_sentence && w[0] >= 'a' && w[0] <= 'z') buf[n] = (char)(w[0] - 32);
        n += wl;
        in_sentence++;
        if (in_sentence > 4 && (x >> 24) % 9 == 0) { /* end of sentence */
            buf[n++] = (x >> 20) % 7 == 0 ? '?' : '.';
            in_sentence = 0;
            buf[n++] = ++sentences % 6 ? ' ' : '\n';
        } else if ((x >> 16) % 17 == 0) {
            buf[n++] = ',';
        }
    }
    *len = n;
    return buf;
}

static int bench(const sl_tokenizer *t, double mb, const char *file) {
    size_t n;
    char *text = NULL;
    sl_err e;
    if (file && sl_read_file(file, &text, &n, &e)) {
        fprintf(stderr, "sluice tokenize: %s\n", e.msg);
        return 1;
    }
    if (!file && !(text = bench_text((size_t)(mb * 1e6), &n))) return 1;
    double best = 1e30;
    int n_ids = 0;
    for (int rep = 0; rep < 3; rep++) {
        int32_t *ids;
        double t0 = sl_now();
        if (sl_tokenizer_encode(t, text, n, 0, &ids, &n_ids, &e)) {
            fprintf(stderr, "sluice tokenize: %s\n", e.msg);
            free(text);
            return 1;
        }
        double dt = sl_now() - t0;
        if (dt < best) best = dt;
        free(ids);
    }
    printf("encoded %.2f MB into %d tokens (%.2f bytes/token) in %.3f s: %.1f MB/s (best of 3, one thread)\n", n / 1e6,
           n_ids, (double)n / n_ids, best, n / 1e6 / best);
    free(text);
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *bench_file = NULL;
    int pieces = 0, specials = 0, do_bench = 0;
    double mb = 8;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--pieces")) {
            pieces = 1;
        } else if (!strcmp(argv[i], "--specials")) {
            specials = 1;
        } else if (!strcmp(argv[i], "--bench")) {
            do_bench = 1;
            if (i + 1 < argc && atof(argv[i + 1]) > 0) mb = atof(argv[++i]);
        } else if (!strcmp(argv[i], "--bench-file") && i + 1 < argc) {
            do_bench = 1;
            bench_file = argv[++i];
        } else if (!strcmp(argv[i], "--")) {
            if (i + 1 < argc && !model) model = argv[++i];
            if (i + 1 < argc && !text) text = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "sluice tokenize: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else if (!model) {
            model = argv[i];
        } else if (!text) {
            text = argv[i];
        } else {
            fprintf(stderr, "sluice tokenize: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!model) {
        usage(stderr);
        return 2;
    }
    sl_tokenizer *t;
    sl_err e;
    char *dir = NULL;
    int lrc = sl_resolve_model(model, &dir, &e) || sl_tokenizer_load(dir, &t, &e);
    free(dir);
    if (lrc) {
        fprintf(stderr, "sluice tokenize: %s\n", e.msg);
        return 1;
    }
    if (do_bench) {
        int rc = bench(t, mb, bench_file);
        sl_tokenizer_free(t);
        return rc;
    }
    char *buf = NULL;
    size_t len;
    if (text) {
        len = strlen(text);
    } else if (sl_read_stream(stdin, "stdin", &buf, &len, &e)) {
        fprintf(stderr, "sluice tokenize: %s\n", e.msg);
        sl_tokenizer_free(t);
        return 1;
    }
    int32_t *ids;
    int n;
    int rc = sl_tokenizer_encode(t, text ? text : buf, len, specials, &ids, &n, &e);
    free(buf);
    if (rc) {
        fprintf(stderr, "sluice tokenize: %s\n", e.msg);
        sl_tokenizer_free(t);
        return 1;
    }
    putchar('[');
    for (int i = 0; i < n; i++) {
        if (i) putchar(',');
        if (pieces) {
            size_t bl;
            const char *b = sl_tokenizer_token_bytes(t, ids[i], &bl);
            printf("[%d,", ids[i]);
            if (valid_utf8((const unsigned char *)b, bl))
                put_json_string(b, bl);
            else
                put_json_string(sl_tokenizer_piece(t, ids[i]), strlen(sl_tokenizer_piece(t, ids[i])));
            putchar(']');
        } else {
            printf("%d", ids[i]);
        }
    }
    puts("]");
    free(ids);
    sl_tokenizer_free(t);
    return fflush(stdout) ? 1 : 0;
}
