#include <criterion/criterion.h>
#include <math.h>

#include "runtime/sampler.h"

Test(logprobs, log_softmax_and_sorted_top) {
    const float l[6] = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f, 2.0f};
    double z = 0;
    for (int i = 0; i < 6; i++) z += exp((double)l[i]);
    sl_logprobs lp;
    sl_logprobs_compute(l, 6, 4, 4, &lp);
    cr_assert_eq(lp.id, 4);
    cr_assert_float_eq(lp.logprob, 0.5 - log(z), 1e-6);
    cr_assert_eq(lp.n_top, 4);
    const int want[4] = {1, 3, 5, 0}; /* equal logits: the lower id first */
    double mass = 0;
    for (int k = 0; k < 4; k++) {
        cr_assert_eq(lp.top_ids[k], want[k], "top %d: %d", k, lp.top_ids[k]);
        cr_assert_float_eq(lp.top_logprobs[k], l[want[k]] - log(z), 1e-6);
        mass += exp(lp.top_logprobs[k]);
    }
    cr_assert(mass <= 1.0);
}

Test(logprobs, non_finite_and_clamped_count) {
    const float l[4] = {NAN, -INFINITY, 0.0f, 0.0f};
    sl_logprobs lp;
    sl_logprobs_compute(l, 4, 0, 100, &lp); /* more than the vocabulary: clamped */
    cr_assert(isinf(lp.logprob) && lp.logprob < 0, "NaN counts as -inf");
    cr_assert_eq(lp.n_top, 4);
    cr_assert_eq(lp.top_ids[0], 2);
    cr_assert_eq(lp.top_ids[1], 3);
    cr_assert_float_eq(lp.top_logprobs[0], -log(2.0), 1e-6);
    cr_assert(isinf(lp.top_logprobs[3]));
    const float inf[3] = {INFINITY, 1.0f, INFINITY};
    sl_logprobs_compute(inf, 3, 2, 0, &lp);
    cr_assert_eq(lp.n_top, 0);
    cr_assert_float_eq(lp.logprob, -log(2.0), 1e-6, "+inf logits share the mass");
}
