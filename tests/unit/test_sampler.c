#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/sampler.h"
#include "testutil.h"

/* A deterministic test-side generator so that the logits do not depend on libc's rand(). */
static uint64_t lcg_state = 12345;
static float rnd_logit(void) {
    lcg_state = lcg_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((lcg_state >> 40) & 0xffffff) / (float)0x1000000 * 20.0f - 10.0f;
}

static sl_sampler_params params_plain(void) {
    sl_sampler_params p;
    sl_sampler_params_default(&p);
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    return p;
}

Test(sampler, defaults) {
    sl_sampler_params p;
    sl_sampler_params_default(&p);
    cr_assert_float_eq(p.temperature, 0.8f, 1e-6);
    cr_assert_eq(p.top_k, 40);
    cr_assert_float_eq(p.top_p, 0.95f, 1e-6);
    cr_assert_float_eq(p.min_p, 0.05f, 1e-6);
    cr_assert_float_eq(p.repeat_penalty, 1.0f, 0);
    cr_assert_eq(p.repeat_last_n, 64);
    cr_assert_null(sl_sampler_create(&p, 0));
}

Test(sampler, greedy_picks_argmax) {
    sl_sampler_params p = params_plain();
    p.temperature = 0.0f;
    enum { V = 1000 };
    sl_sampler *s = sl_sampler_create(&p, V);
    float l[V];
    for (int rep = 0; rep < 50; rep++) {
        for (int i = 0; i < V; i++) l[i] = rnd_logit();
        cr_assert_eq(sl_sampler_sample(s, l), tu_argmax(l, V));
    }
    /* Ties go to the lowest id. */
    for (int i = 0; i < V; i++) l[i] = 1.0f;
    cr_assert_eq(sl_sampler_sample(s, l), 0);
    sl_sampler_free(s);
}

Test(sampler, tiny_temperature_and_top_k_1_equal_greedy) {
    enum { V = 500 };
    sl_sampler_params p = params_plain();
    p.temperature = 1e-4f;
    sl_sampler *cold = sl_sampler_create(&p, V);
    p = params_plain();
    p.top_k = 1;
    sl_sampler *k1 = sl_sampler_create(&p, V);
    float l[V];
    for (int rep = 0; rep < 100; rep++) {
        for (int i = 0; i < V; i++) l[i] = rnd_logit();
        int g = tu_argmax(l, V);
        cr_assert_eq(sl_sampler_sample(cold, l), g);
        cr_assert_eq(sl_sampler_sample(k1, l), g);
    }
    sl_sampler_free(cold);
    sl_sampler_free(k1);
}

Test(sampler, tiny_top_p_keeps_top_token) {
    enum { V = 300 };
    sl_sampler_params p = params_plain();
    p.top_p = 1e-6f;
    sl_sampler *s = sl_sampler_create(&p, V);
    p.top_p = 0.0f;
    sl_sampler *s0 = sl_sampler_create(&p, V);
    float l[V];
    for (int rep = 0; rep < 100; rep++) {
        for (int i = 0; i < V; i++) l[i] = rnd_logit() * 0.1f; /* flat: many plausible tokens */
        cr_assert_eq(sl_sampler_sample(s, l), tu_argmax(l, V));
        cr_assert_eq(sl_sampler_sample(s0, l), tu_argmax(l, V));
    }
    sl_sampler_free(s);
    sl_sampler_free(s0);
}

/* Draws n tokens and counts them per id. */
static void histogram(sl_sampler *s, const float *l, int v, int n, int *hist) {
    memset(hist, 0, (size_t)v * sizeof *hist);
    for (int i = 0; i < n; i++) {
        int t = sl_sampler_sample(s, l);
        cr_assert(t >= 0 && t < v);
        hist[t]++;
    }
}

Test(sampler, top_p_keeps_nucleus) {
    /* p = 0.5, 0.3, 0.15, 0.05: top_p 0.75 needs the first two tokens (0.5 < 0.75 <= 0.8). */
    float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    sl_sampler_params p = params_plain();
    p.top_p = 0.75f;
    sl_sampler *s = sl_sampler_create(&p, 4);
    int h[4];
    histogram(s, l, 4, 20000, h);
    cr_assert(h[0] > 0 && h[1] > 0);
    cr_assert_eq(h[2] + h[3], 0);
    /* Renormalised: 0.5 / 0.8 = 0.625. */
    cr_assert(fabs(h[0] / 20000.0 - 0.625) < 0.02, "got %d", h[0]);
    sl_sampler_free(s);
}

Test(sampler, top_p_with_ties_and_brute_force) {
    /* Ten equal logits: half the mass needs exactly five tokens, whichever they are. */
    float eq[10] = {0};
    sl_sampler_params p = params_plain();
    p.top_p = 0.5f;
    sl_sampler *s = sl_sampler_create(&p, 10);
    int h[10], distinct = 0;
    histogram(s, eq, 10, 5000, h);
    for (int i = 0; i < 10; i++) distinct += h[i] > 0;
    cr_assert_eq(distinct, 5);
    sl_sampler_free(s);

    /* Random logits: every draw lies inside the nucleus found by sorting. */
    enum { V = 400 };
    float l[V];
    int order[V];
    for (int rep = 0; rep < 20; rep++) {
        for (int i = 0; i < V; i++) l[i] = rnd_logit() * 0.5f, order[i] = i;
        double pr[V], sum = 0, mx = l[tu_argmax(l, V)];
        for (int i = 0; i < V; i++) sum += pr[i] = exp(l[i] - mx);
        for (int i = 0; i < V; i++) pr[i] /= sum;
        for (int i = 1; i < V; i++) /* insertion sort by probability, descending */
            for (int j = i; j > 0 && pr[order[j]] > pr[order[j - 1]]; j--) {
                int t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
        float top_p = 0.3f + 0.03f * (float)rep;
        int keep = 0;
        double cum = 0;
        while (keep < V && cum < top_p) cum += pr[order[keep++]];
        char in[V] = {0};
        for (int i = 0; i < keep + 1 && i < V; i++) in[order[i]] = 1; /* one spare for float rounding */
        p.top_p = top_p;
        p.seed = (uint64_t)rep;
        s = sl_sampler_create(&p, V);
        for (int d = 0; d < 500; d++) cr_assert(in[sl_sampler_sample(s, l)]);
        sl_sampler_free(s);
    }
}

Test(sampler, top_k_restricts) {
    float l[6] = {1.0f, 3.0f, 0.5f, 2.5f, 2.0f, -1.0f};
    sl_sampler_params p = params_plain();
    p.top_k = 3;
    sl_sampler *s = sl_sampler_create(&p, 6);
    int h[6];
    histogram(s, l, 6, 20000, h);
    cr_assert(h[1] > 0 && h[3] > 0 && h[4] > 0);
    cr_assert_eq(h[0] + h[2] + h[5], 0);
    sl_sampler_free(s);
}

Test(sampler, min_p_filters) {
    float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    sl_sampler_params p = params_plain();
    p.min_p = 0.2f; /* floor 0.1: drops only the last token */
    sl_sampler *s = sl_sampler_create(&p, 4);
    int h[4];
    histogram(s, l, 4, 20000, h);
    cr_assert(h[0] > 0 && h[1] > 0 && h[2] > 0);
    cr_assert_eq(h[3], 0);
    sl_sampler_free(s);

    p.min_p = 0.7f; /* floor 0.35: only the first token */
    s = sl_sampler_create(&p, 4);
    histogram(s, l, 4, 2000, h);
    cr_assert_eq(h[0], 2000);
    sl_sampler_free(s);
}

Test(sampler, penalty_values) {
    sl_sampler_params p = params_plain();
    p.repeat_penalty = 2.0f;
    p.frequency_penalty = 0.1f;
    p.presence_penalty = 0.5f;
    sl_sampler *s = sl_sampler_create(&p, 4);
    sl_sampler_accept(s, 0);
    sl_sampler_accept(s, 1);
    sl_sampler_accept(s, 1);
    sl_sampler_accept(s, 99); /* out of range: ignored */
    sl_sampler_accept(s, -3);
    float l[4] = {2.0f, -1.0f, 0.5f, 3.0f};
    sl_sampler_apply_penalties(s, l);
    cr_assert_float_eq(l[0], 2.0f / 2 - 0.1f - 0.5f, 1e-6);  /* positive logit: divided */
    cr_assert_float_eq(l[1], -1.0f * 2 - 0.2f - 0.5f, 1e-6); /* negative logit: multiplied */
    cr_assert_eq(l[2], 0.5f);
    cr_assert_eq(l[3], 3.0f);
    /* A new request forgets the history. */
    sl_sampler_reset(s, 1);
    float m[4] = {2.0f, -1.0f, 0.5f, 3.0f};
    sl_sampler_apply_penalties(s, m);
    cr_assert_eq(m[0], 2.0f);
    cr_assert_eq(m[1], -1.0f);
    sl_sampler_free(s);
}

Test(sampler, penalties_change_the_choice) {
    sl_sampler_params p = params_plain();
    p.temperature = 0.0f;
    p.repeat_penalty = 1.1f;
    sl_sampler *s = sl_sampler_create(&p, 3);
    const float l[3] = {3.0f, 2.9f, 1.0f};
    float copy[3];
    memcpy(copy, l, sizeof l);
    cr_assert_eq(sl_sampler_sample(s, l), 0);
    sl_sampler_accept(s, 0); /* 3 / 1.1 = 2.727 < 2.9 */
    cr_assert_eq(sl_sampler_sample(s, l), 1);
    cr_assert_eq(memcmp(copy, l, sizeof l), 0, "the caller's logits must not change");
    sl_sampler_free(s);

    /* Frequency penalty grows with the count: 3 - 0.3k; token 1 wins once 3 - 0.3k < 2.9 - 0.3. */
    p.repeat_penalty = 1.0f;
    p.frequency_penalty = 0.3f;
    s = sl_sampler_create(&p, 3);
    sl_sampler_accept(s, 0);
    sl_sampler_accept(s, 1);
    cr_assert_eq(sl_sampler_sample(s, l), 0); /* 2.7 vs 2.6 */
    sl_sampler_accept(s, 0);
    cr_assert_eq(sl_sampler_sample(s, l), 1); /* 2.4 vs 2.6 */
    sl_sampler_free(s);

    /* Presence: flat once present. */
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.2f;
    s = sl_sampler_create(&p, 3);
    for (int i = 0; i < 5; i++) sl_sampler_accept(s, 0);
    sl_sampler_accept(s, 1);
    cr_assert_eq(sl_sampler_sample(s, l), 0); /* 2.8 vs 2.7 */
    sl_sampler_free(s);
}

Test(sampler, penalty_window) {
    sl_sampler_params p = params_plain();
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 2;
    sl_sampler *s = sl_sampler_create(&p, 4);
    sl_sampler_accept(s, 0);
    sl_sampler_accept(s, 1);
    sl_sampler_accept(s, 2); /* pushes 0 out of the window */
    float l[4] = {2.0f, 2.0f, 2.0f, 2.0f};
    sl_sampler_apply_penalties(s, l);
    cr_assert_eq(l[0], 2.0f);
    cr_assert_eq(l[1], 1.0f);
    cr_assert_eq(l[2], 1.0f);
    cr_assert_eq(l[3], 2.0f);
    sl_sampler_free(s);

    /* Counts inside the window: 1,1,1 then 0 evicts the first 1. */
    p.repeat_penalty = 1.0f;
    p.frequency_penalty = 1.0f;
    p.repeat_last_n = 3;
    s = sl_sampler_create(&p, 4);
    int seq[] = {1, 1, 1, 0};
    for (int i = 0; i < 4; i++) sl_sampler_accept(s, seq[i]);
    float m[4] = {0};
    sl_sampler_apply_penalties(s, m);
    cr_assert_eq(m[0], -1.0f);
    cr_assert_eq(m[1], -2.0f);
    sl_sampler_free(s);

    /* -1: the whole history counts; 0: none does. */
    p.repeat_last_n = -1;
    s = sl_sampler_create(&p, 4);
    for (int i = 0; i < 1000; i++) sl_sampler_accept(s, 3);
    float w[4] = {0};
    sl_sampler_apply_penalties(s, w);
    cr_assert_eq(w[3], -1000.0f);
    sl_sampler_free(s);
    p.repeat_last_n = 0;
    s = sl_sampler_create(&p, 4);
    sl_sampler_accept(s, 3);
    float z[4] = {0};
    sl_sampler_apply_penalties(s, z);
    cr_assert_eq(z[3], 0.0f);
    sl_sampler_free(s);
}

static void draw_seq(uint64_t seed, int32_t *out, int n) {
    enum { V = 50 };
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)(i % 7) * 0.1f;
    sl_sampler_params p = params_plain();
    p.seed = seed;
    sl_sampler *s = sl_sampler_create(&p, V);
    for (int i = 0; i < n; i++) out[i] = sl_sampler_sample(s, l);
    sl_sampler_free(s);
}

Test(sampler, seeds) {
    int32_t a[200], b[200], c[200];
    draw_seq(42, a, 200);
    draw_seq(42, b, 200);
    draw_seq(43, c, 200);
    cr_assert_eq(memcmp(a, b, sizeof a), 0);
    cr_assert_neq(memcmp(a, c, sizeof a), 0);
    /* reset() with the same seed replays the sequence. */
    enum { V = 50 };
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)(i % 7) * 0.1f;
    sl_sampler_params p = params_plain();
    sl_sampler *s = sl_sampler_create(&p, V);
    sl_sampler_reset(s, 42);
    for (int i = 0; i < 200; i++) cr_assert_eq(sl_sampler_sample(s, l), a[i]);
    sl_sampler_free(s);
}

/* Pearson's statistic of the draws against the expected probabilities. */
static double chi_square(const int *h, const double *pr, int v, int n) {
    double x = 0;
    for (int i = 0; i < v; i++) {
        double e = pr[i] * n;
        if (e > 0) x += (h[i] - e) * (h[i] - e) / e;
    }
    return x;
}

Test(sampler, empirical_distribution_matches_softmax) {
    enum { V = 6, N = 200000 };
    float l[V] = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
    int h[V];
    double pr[V];
    /* Temperature 0.7, no filters: softmax(l / 0.7). df = 5; 0.1% critical value 20.5. */
    sl_sampler_params p = params_plain();
    p.temperature = 0.7f;
    p.seed = 7;
    sl_sampler *s = sl_sampler_create(&p, V);
    double sum = 0;
    for (int i = 0; i < V; i++) sum += pr[i] = exp(l[i] / 0.7);
    for (int i = 0; i < V; i++) pr[i] /= sum;
    histogram(s, l, V, N, h);
    double x = chi_square(h, pr, V, N);
    cr_assert(x < 20.5, "chi-square %.2f", x);
    sl_sampler_free(s);

    /* top_k 3 renormalises over tokens 2, 5, 1. df = 2; critical value 13.8. */
    p.temperature = 1.0f;
    p.top_k = 3;
    s = sl_sampler_create(&p, V);
    sum = 0;
    for (int i = 0; i < V; i++) pr[i] = (i == 1 || i == 2 || i == 5) ? exp(l[i]) : 0, sum += pr[i];
    for (int i = 0; i < V; i++) pr[i] /= sum;
    histogram(s, l, V, N, h);
    cr_assert_eq(h[0] + h[3] + h[4], 0);
    x = chi_square(h, pr, V, N);
    cr_assert(x < 13.8, "chi-square %.2f", x);
    sl_sampler_free(s);
}

Test(sampler, non_finite_logits) {
    sl_sampler_params p = params_plain();
    sl_sampler *s = sl_sampler_create(&p, 4);
    p.temperature = 0.0f;
    sl_sampler *g = sl_sampler_create(&p, 4);
    int h[4];

    float nan_mix[4] = {NAN, 1.0f, NAN, 0.5f}; /* NaN is -inf: never picked */
    histogram(s, nan_mix, 4, 2000, h);
    cr_assert_eq(h[0] + h[2], 0);
    cr_assert_eq(sl_sampler_sample(g, nan_mix), 1);

    float all_bad[4] = {NAN, -INFINITY, NAN, -INFINITY};
    cr_assert_eq(sl_sampler_sample(s, all_bad), -1);
    cr_assert_eq(sl_sampler_sample(g, all_bad), -1);

    float one_inf[4] = {1.0f, INFINITY, 2.0f, NAN};
    histogram(s, one_inf, 4, 1000, h);
    cr_assert_eq(h[1], 1000);
    cr_assert_eq(sl_sampler_sample(g, one_inf), 1);

    float two_inf[4] = {INFINITY, 5.0f, INFINITY, -INFINITY}; /* uniform between the two */
    histogram(s, two_inf, 4, 4000, h);
    cr_assert_eq(h[1] + h[3], 0);
    cr_assert(h[0] > 1600 && h[2] > 1600);
    cr_assert_eq(sl_sampler_sample(g, two_inf), 0);

    float one_finite[4] = {-INFINITY, -INFINITY, -3.0f, -INFINITY};
    histogram(s, one_finite, 4, 100, h);
    cr_assert_eq(h[2], 100);
    sl_sampler_free(s);
    sl_sampler_free(g);
}

Test(sampler, large_vocab_default_chain) {
    enum { V = 152064 };
    float *l = malloc(V * sizeof *l);
    for (int i = 0; i < V; i++) l[i] = rnd_logit();
    /* The 40 largest logits: any draw with top_k 40 must be at or above the 40th. */
    float *sorted = malloc(V * sizeof *sorted);
    memcpy(sorted, l, V * sizeof *l);
    for (int k = 0; k < 40; k++) { /* partial selection sort of the head */
        int b = k;
        for (int i = k + 1; i < V; i++)
            if (sorted[i] > sorted[b]) b = i;
        float t = sorted[k];
        sorted[k] = sorted[b];
        sorted[b] = t;
    }
    sl_sampler_params p;
    sl_sampler_params_default(&p);
    p.min_p = 0.0f;
    p.top_p = 1.0f;
    sl_sampler *s = sl_sampler_create(&p, V);
    for (int i = 0; i < 200; i++) {
        int t = sl_sampler_sample(s, l);
        cr_assert(t >= 0 && t < V && l[t] >= sorted[39]);
        sl_sampler_accept(s, t);
    }
    /* Without top_k the nucleus path handles the full vocabulary. */
    p.top_k = 0;
    p.top_p = 0.9f;
    sl_sampler *n = sl_sampler_create(&p, V);
    for (int i = 0; i < 20; i++) {
        int t = sl_sampler_sample(n, l);
        cr_assert(t >= 0 && t < V);
    }
    sl_sampler_free(s);
    sl_sampler_free(n);
    free(l);
    free(sorted);
}

Test(sampler, top_k_both_selection_paths) {
    /* k = 10 of 1000 takes the heap path, k = 200 quickselect; draws stay inside the top k either way. */
    enum { V = 1000 };
    float l[V], sorted[V];
    for (int rep = 0; rep < 10; rep++) {
        for (int i = 0; i < V; i++) l[i] = sorted[i] = (float)((i * 7919 + rep * 104729) % 997) * 0.01f;
        for (int i = 1; i < V; i++) /* descending insertion sort */
            for (int j = i; j > 0 && sorted[j] > sorted[j - 1]; j--) {
                float t = sorted[j];
                sorted[j] = sorted[j - 1];
                sorted[j - 1] = t;
            }
        int ks[2] = {10, 200};
        for (int q = 0; q < 2; q++) {
            sl_sampler_params p = params_plain();
            p.top_k = ks[q];
            p.temperature = 0.2f;
            sl_sampler *s = sl_sampler_create(&p, V);
            for (int d = 0; d < 300; d++) cr_assert(l[sl_sampler_sample(s, l)] >= sorted[ks[q] - 1]);
            sl_sampler_free(s);
        }
    }
}
