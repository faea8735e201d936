#include "runtime/sampler.h"
#include "core/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t id;
    float v; /* logit until the softmax, probability after it */
} cand;

struct sl_sampler {
    sl_sampler_params p;
    int vocab;
    uint64_t rng[4]; /* xoshiro256** state */
    cand *cands;     /* vocab entries of scratch */
    /* Penalty history: occurrence counts in the window, and the distinct tokens with a non-zero count
     * (pos[t] is t's index in distinct) so that sampling only visits tokens that occurred. */
    int32_t *counts, *pos, *distinct;
    int n_distinct;
    int32_t *ring; /* the last repeat_last_n tokens when the window is bounded */
    int ring_len, ring_head;
};

void sl_sampler_params_default(sl_sampler_params *p) {
    *p = (sl_sampler_params){
        .temperature = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .repeat_last_n = 64,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .seed = 0,
    };
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(uint64_t s[4]) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4]) {
    return (double)(xoshiro_next(s) >> 11) * 0x1.0p-53;
}

sl_sampler *sl_sampler_create(const sl_sampler_params *p, int vocab_size) {
    if (!p || vocab_size <= 0) return NULL;
    sl_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = *p;
    if (s->p.repeat_last_n < -1) s->p.repeat_last_n = -1;
    s->vocab = vocab_size;
    size_t n = (size_t)vocab_size;
    s->cands = malloc(n * sizeof *s->cands);
    s->counts = calloc(n, sizeof *s->counts);
    s->pos = malloc(n * sizeof *s->pos);
    s->distinct = malloc(n * sizeof *s->distinct);
    if (s->p.repeat_last_n > 0) s->ring = malloc((size_t)s->p.repeat_last_n * sizeof *s->ring);
    if (!s->cands || !s->counts || !s->pos || !s->distinct || (s->p.repeat_last_n > 0 && !s->ring)) {
        sl_sampler_free(s);
        return NULL;
    }
    sl_sampler_reset(s, p->seed);
    return s;
}

void sl_sampler_free(sl_sampler *s) {
    if (!s) return;
    free(s->cands);
    free(s->counts);
    free(s->pos);
    free(s->distinct);
    free(s->ring);
    free(s);
}

void sl_sampler_reset(sl_sampler *s, uint64_t seed) {
    for (int i = 0; i < s->n_distinct; i++) s->counts[s->distinct[i]] = 0;
    s->n_distinct = 0;
    s->ring_len = s->ring_head = 0;
    s->p.seed = seed;
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s->rng[i] = sl_splitmix64(&x);
}

static void count_add(sl_sampler *s, int32_t t) {
    if (s->counts[t]++ == 0) {
        s->pos[t] = s->n_distinct;
        s->distinct[s->n_distinct++] = t;
    }
}

static void count_remove(sl_sampler *s, int32_t t) {
    if (--s->counts[t] == 0) {
        int32_t last = s->distinct[--s->n_distinct];
        s->distinct[s->pos[t]] = last;
        s->pos[last] = s->pos[t];
    }
}

void sl_sampler_accept(sl_sampler *s, int32_t token) {
    if (token < 0 || token >= s->vocab || s->p.repeat_last_n == 0) return;
    if (s->p.repeat_last_n > 0) {
        int cap = s->p.repeat_last_n;
        if (s->ring_len == cap) {
            count_remove(s, s->ring[s->ring_head]);
        } else {
            s->ring_len++;
        }
        s->ring[s->ring_head] = token;
        s->ring_head = (s->ring_head + 1) % cap;
    }
    count_add(s, token);
}

static float penalize(const sl_sampler_params *p, float l, int count) {
    if (p->repeat_penalty != 1.0f && p->repeat_penalty > 0.0f)
        l = l > 0.0f ? l / p->repeat_penalty : l * p->repeat_penalty;
    return l - (float)count * p->frequency_penalty - p->presence_penalty;
}

void sl_sampler_apply_penalties(const sl_sampler *s, float *logits) {
    for (int i = 0; i < s->n_distinct; i++) {
        int32_t t = s->distinct[i];
        logits[t] = penalize(&s->p, logits[t], s->counts[t]);
    }
}

static void swap_c(cand *a, cand *b) {
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Median of the first, middle and last values: keeps sorted and reversed inputs linear on average. */
static float median3(const cand *c, int lo, int hi) {
    float a = c[lo].v, b = c[lo + (hi - lo) / 2].v, d = c[hi - 1].v;
    if (a > b) {
        float t = a;
        a = b;
        b = t;
    }
    if (b > d) b = d;
    return a > b ? a : b;
}

/* Three-way partition of c[lo, hi) in descending order: [lo, *lt) > pivot, [*lt, *gt) == pivot,
 * [*gt, hi) < pivot. Equal runs (common with quantised models) then cost nothing extra. */
static void partition3(cand *c, int lo, int hi, float pivot, int *lt, int *gt) {
    int a = lo, i = lo, b = hi;
    while (i < b) {
        if (c[i].v > pivot) {
            swap_c(&c[a++], &c[i++]);
        } else if (c[i].v < pivot) {
            swap_c(&c[i], &c[--b]);
        } else {
            i++;
        }
    }
    *lt = a;
    *gt = b;
}

static void sift_down(cand *h, int k, int i) {
    for (;;) {
        int m = i, l = 2 * i + 1, r = l + 1;
        if (l < k && h[l].v < h[m].v) m = l;
        if (r < k && h[r].v < h[m].v) m = r;
        if (m == i) return;
        swap_c(&h[i], &h[m]);
        i = m;
    }
}

/* Moves the k largest values into c[0, k) (in no particular order). A small k (the usual top_k of
 * 20-100) uses an in-place min-heap, where nearly every token costs one comparison; a large k uses
 * quickselect, expected O(n). */
static void select_top(cand *c, int n, int k) {
    if ((int64_t)k * 16 <= n) {
        for (int i = k / 2 - 1; i >= 0; i--) sift_down(c, k, i);
        for (int i = k; i < n; i++)
            if (c[i].v > c[0].v) {
                c[0] = c[i];
                sift_down(c, k, 0);
            }
        return;
    }
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        int lt, gt;
        partition3(c, lo, hi, median3(c, lo, hi), &lt, &gt);
        if (k <= lt) {
            hi = lt;
        } else if (k <= gt) {
            return;
        } else {
            lo = gt;
        }
    }
}

/* With c[0, n) holding probabilities that sum to 1, moves the fewest most likely tokens whose mass
 * reaches p to the front and returns their count. Selection instead of a full sort: expected O(n). */
static int nucleus(cand *c, int n, double p) {
    int lo = 0, hi = n;
    double acc = 0.0; /* mass of c[0, lo), all of which is kept; always < p */
    while (lo < hi) {
        int lt, gt;
        float pivot = median3(c, lo, hi);
        partition3(c, lo, hi, pivot, &lt, &gt);
        double greater = 0.0;
        for (int i = lo; i < lt; i++) greater += c[i].v;
        if (acc + greater >= p) {
            hi = lt;
            continue;
        }
        acc += greater;
        for (int i = lt; i < gt; i++) {
            acc += c[i].v;
            if (acc >= p) return i + 1;
        }
        lo = gt;
    }
    return n; /* rounding kept the total just under p: keep everything */
}

int sl_sampler_plain_greedy(const sl_sampler *s) {
    const sl_sampler_params *p = &s->p;
    int repeat = p->repeat_penalty != 1.0f && p->repeat_penalty > 0.0f;
    return p->temperature <= 0.0f &&
           (p->repeat_last_n == 0 || (!repeat && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f));
}

int32_t sl_sampler_sample(sl_sampler *s, const float *logits) {
    const sl_sampler_params *p = &s->p;
    cand *c = s->cands;
    /* One pass: sanitise, penalise, drop impossible tokens and track the argmax (lowest id on ties). */
    int n = 0;
    int32_t best = -1;
    float bv = -INFINITY;
    for (int i = 0; i < s->vocab; i++) {
        float v = isnan(logits[i]) ? -INFINITY : logits[i];
        if (s->n_distinct && s->counts[i]) v = penalize(p, v, s->counts[i]);
        if (v > bv) bv = v, best = i;
        if (v > -INFINITY) c[n++] = (cand){i, v};
    }
    if (p->temperature <= 0.0f) return best;
    if (n == 0) return -1;

    if (p->top_k > 0 && p->top_k < n) {
        select_top(c, n, p->top_k);
        n = p->top_k;
    }

    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = c[i].v > mx ? c[i].v : mx;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        c[i].v = isinf(mx) ? (c[i].v == mx ? 1.0f : 0.0f) : expf((c[i].v - mx) / p->temperature);
        sum += c[i].v;
    }
    for (int i = 0; i < n; i++) c[i].v = (float)(c[i].v / sum);

    if (p->top_p <= 0.0f) {
        select_top(c, n, 1);
        n = 1;
    } else if (p->top_p < 1.0f) {
        n = nucleus(c, n, p->top_p);
    }

    if (p->min_p > 0.0f) {
        float pmax = 0.0f;
        for (int i = 0; i < n; i++) pmax = c[i].v > pmax ? c[i].v : pmax;
        float floor_p = (p->min_p < 1.0f ? p->min_p : 1.0f) * pmax;
        int m = 0;
        for (int i = 0; i < n; i++)
            if (c[i].v >= floor_p) c[m++] = c[i];
        n = m; /* the most likely token always survives, so n >= 1 */
    }

    double total = 0.0;
    for (int i = 0; i < n; i++) total += c[i].v;
    double u = rng_uniform(s->rng) * total;
    int32_t last = -1;
    for (int i = 0; i < n; i++) {
        if (c[i].v <= 0.0f) continue;
        last = c[i].id;
        u -= c[i].v;
        if (u < 0.0) return c[i].id;
    }
    return last;
}

void sl_logprobs_compute(const float *logits, int V, int32_t chosen, int top_n, sl_logprobs *out) {
    if (top_n < 0) top_n = 0;
    if (top_n > SL_MAX_TOP_LOGPROBS) top_n = SL_MAX_TOP_LOGPROBS;
    if (top_n > V) top_n = V;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++)
        if (logits[i] > mx) mx = logits[i]; /* NaN never compares greater */
    double sum = 0;
    if (mx > -INFINITY)
        for (int i = 0; i < V; i++)
            if (!isnan(logits[i])) sum += exp((double)logits[i] - mx);
    /* +inf logits: the mass is uniform over them (as the draw is), so normalise by their count */
    int n_inf = 0;
    if (mx == INFINITY)
        for (int i = 0; i < V; i++) n_inf += logits[i] == INFINITY;
    double lse = mx == INFINITY ? 0 : mx + log(sum);
#define LP(i)                                                                                                          \
    (isnan(logits[i]) || logits[i] == -INFINITY ? -INFINITY                                                            \
     : mx == INFINITY                           ? (logits[i] == INFINITY ? (float)-log((double)n_inf) : -INFINITY)     \
                                                : (float)((double)logits[i] - lse))
    out->id = chosen;
    out->logprob = chosen >= 0 && chosen < V ? LP(chosen) : -INFINITY;
    /* insertion into a short sorted list: top_n <= 20 */
    int n = 0;
    for (int i = 0; i < V && top_n > 0; i++) {
        float v = isnan(logits[i]) ? -INFINITY : logits[i];
        if (n == top_n && !(v > (isnan(logits[out->top_ids[n - 1]]) ? -INFINITY : logits[out->top_ids[n - 1]])))
            continue;
        int k = n < top_n ? n++ : n - 1;
        while (k > 0) {
            float u = isnan(logits[out->top_ids[k - 1]]) ? -INFINITY : logits[out->top_ids[k - 1]];
            if (!(v > u)) break;
            out->top_ids[k] = out->top_ids[k - 1];
            k--;
        }
        out->top_ids[k] = i;
    }
    out->n_top = n;
    for (int k = 0; k < n; k++) out->top_logprobs[k] = LP(out->top_ids[k]);
#undef LP
}
