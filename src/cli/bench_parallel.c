#include "cli/bench_parallel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "experts/store.h"
#include "runtime/session.h"

/* The prompts: pseudo-random ids, different for every sequence and the same on every run. */
static void fill_prompt(int32_t *p, int n, int V, uint64_t seed) {
    uint64_t st = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 0; i < n; i++) {
        st ^= st << 13;
        st ^= st >> 7;
        st ^= st << 17;
        p[i] = (int32_t)(st % (uint64_t)V);
    }
}

/* One run at n sequences: every prompt read (prompts packed into batches of up to max_batch tokens), then
 * gen steps, each one token of every sequence (the greedy argmax of its last logits). */
static int run_at(sl_model *m, int n, int prompt, int gen, sl_bench_par *out, sl_err *e) {
    int V = m->cfg.vocab_size, rc = -1;
    sl_session *s = NULL;
    sl_session_opts so = {.max_ctx = prompt + gen + 1, .n_seqs = n};
    if (sl_session_create_opts(m, &so, &s, e)) return -1;
    int B = s->max_batch;
    int32_t *ids = malloc((size_t)B * sizeof *ids), *seq = malloc((size_t)B * sizeof *seq);
    int32_t *p = malloc((size_t)prompt * sizeof *p), *next = malloc((size_t)n * sizeof *next);
    uint8_t *want = malloc((size_t)B);
    if (!ids || !seq || !p || !next || !want) {
        sl_fail(e, "out of memory");
        goto done;
    }
    for (int q = 0; q < n; q++) sl_session_seq_set_idle(s, q, 0);
    sl_store_stats x0 = {0}, x1 = {0}, x2 = {0};
    if (m->store) sl_store_stats_get(m->store, &x0);
    double t0 = sl_now();
    /* prompts, packed: a batch takes what is left of one prompt and goes on with the next */
    int q = 0, off = 0, rows = 0;
    fill_prompt(p, prompt, V, 1);
    while (q < n) {
        int nb = 0;
        rows = 0;
        while (q < n && nb < B) {
            int len = prompt - off < B - nb ? prompt - off : B - nb;
            for (int i = 0; i < len; i++) {
                ids[nb + i] = p[off + i];
                seq[nb + i] = q;
                want[nb + i] = off + i == prompt - 1;
            }
            nb += len;
            off += len;
            if (off == prompt) {
                rows++;
                off = 0;
                if (++q < n) fill_prompt(p, prompt, V, (uint64_t)q + 1);
            }
        }
        sl_batch b = {.n = nb, .ids = ids, .seq = seq, .want = want};
        int first_q = q - rows; /* the sequences whose prompts ended in this batch, in order */
        if (sl_session_decode(s, &b, e) || (rows && sl_session_rows_argmax(s, rows, next + first_q, e))) goto done;
    }
    double t1 = sl_now();
    if (m->store) sl_store_stats_get(m->store, &x1);
    for (int i = 0; i < n; i++) {
        seq[i] = i;
        want[i] = 1;
    }
    for (int t = 0; t < gen; t++) {
        sl_batch b = {.n = n, .ids = next, .seq = seq, .want = want};
        if (sl_session_decode(s, &b, e) || sl_session_rows_argmax(s, n, next, e)) goto done;
        for (int i = 0; i < n; i++)
            if (next[i] < 0) {
                sl_fail(e, "no logit above -inf at decode step %d of sequence %d", t + 1, i);
                goto done;
            }
    }
    double t2 = sl_now();
    if (m->store) sl_store_stats_get(m->store, &x2);
    out->n = n;
    out->prefill_s = t1 - t0;
    out->decode_s = t2 - t1;
    out->prefill_tps = (double)n * prompt / (t1 - t0);
    out->decode_tps = gen > 0 ? (double)n * gen / (t2 - t1) : 0;
    if (m->store && gen > 0) {
        sl_store_stats d = sl_store_stats_since(&x1, &x2);
        out->bytes_per_token = (double)d.bytes_read / ((double)n * gen);
    }
    rc = 0;
done:
    free(ids);
    free(seq);
    free(p);
    free(next);
    free(want);
    sl_session_free(s);
    return rc;
}

int sl_bench_parallel(sl_model *m, const int *ns, int count, int prompt, int gen, int runs, int warmup,
                      sl_bench_par *out, sl_err *e) {
    for (int k = 0; k < count; k++) {
        sl_bench_par best = {0}, w;
        if (warmup && run_at(m, ns[k], prompt, gen < 2 ? gen : 2, &w, e)) return -1;
        for (int r = 0; r < runs; r++) {
            sl_bench_par x = {0};
            if (run_at(m, ns[k], prompt, gen, &x, e)) return -1;
            if (r == 0 || x.decode_s < best.decode_s) best.decode_s = x.decode_s, best.decode_tps = x.decode_tps;
            if (r == 0 || x.prefill_s < best.prefill_s) best.prefill_s = x.prefill_s, best.prefill_tps = x.prefill_tps;
            best.n = x.n;
            best.bytes_per_token = x.bytes_per_token;
        }
        out[k] = best;
    }
    return 0;
}

void sl_bench_parallel_print(const sl_model *m, const sl_bench_par *r, int count, int prompt, int gen) {
    printf("%d sequences at once: each reads a %d-token prompt (packed into batches), then decodes %d tokens,\n"
           "one token of every sequence per step (greedy, picked on the backend); KV cache %s\n\n",
           r[count - 1].n, prompt, gen, sl_kv_type_name(sl_model_kv_type(m, SL_KV_AUTO)));
    printf("| sequences | prefill tok/s | decode tok/s (all) | per sequence | vs 1 sequence |%s\n",
           m->store ? " expert bytes read / token |" : "");
    printf("|---:|---:|---:|---:|---:|%s\n", m->store ? "---:|" : "");
    double one = 0;
    for (int k = 0; k < count; k++)
        if (r[k].n == 1) one = r[k].decode_tps;
    for (int k = 0; k < count; k++) {
        char ratio[32] = "-", bytes[32] = "";
        if (one > 0) snprintf(ratio, sizeof ratio, "%.2fx", r[k].decode_tps / one);
        if (m->store) {
            char h[32];
            snprintf(bytes, sizeof bytes, " %s |", sl_human_bytes(r[k].bytes_per_token, h, sizeof h));
        }
        printf("| %d | %.1f | %.1f | %.1f | %s |%s\n", r[k].n, r[k].prefill_tps, r[k].decode_tps,
               r[k].decode_tps / r[k].n, ratio, bytes);
    }
}
