/* RoPE frequency tables against values computed in double precision from the formulas transformers
 * uses (default, linear, yarn, llama3). The float32 tables agree to float rounding. */
#include <criterion/criterion.h>
#include <math.h>

#include "models/rope.h"

static void expect_table(const sl_rope_cfg *r, const int *idx, const double *want, int n) {
    float inv[32], af;
    sl_rope_inv_freq(r, 64, inv, &af);
    for (int k = 0; k < n; k++)
        cr_expect(fabs(inv[idx[k]] - want[k]) <= 2e-6 * want[k], "inv_freq[%d] = %.9g, expected %.9g", idx[k],
                  (double)inv[idx[k]], want[k]);
}

static const int idx[4] = {0, 5, 17, 31};

Test(rope, linear_divides_by_factor) {
    sl_rope_cfg r = {.type = SL_ROPE_LINEAR, .theta = 10000, .factor = 4};
    const double want[4] = {0.25, 0.059284342641541386, 0.0018747355233311397, 3.33380358040831e-05};
    expect_table(&r, idx, want, 4);
}

Test(rope, yarn_ramps_between_correction_dims) {
    sl_rope_cfg r = {.type = SL_ROPE_YARN,
                     .theta = 10000,
                     .factor = 4,
                     .original_max_pos = 2048,
                     .beta_fast = 32,
                     .beta_slow = 1,
                     .truncate = 1};
    const double want[4] = {1.0, 0.23713737056616555, 0.0036052606217906536, 3.33380358040831e-05};
    expect_table(&r, idx, want, 4);
    float inv[32], af;
    sl_rope_inv_freq(&r, 64, inv, &af);
    cr_expect(fabsf(af - 1.138629436f) < 1e-6f, "yarn attention factor %.9g", (double)af);
}

Test(rope, llama3_smooths_medium_frequencies) {
    sl_rope_cfg r = {.type = SL_ROPE_LLAMA3,
                     .theta = 500000,
                     .factor = 8,
                     .low_freq_factor = 1,
                     .high_freq_factor = 4,
                     .original_max_pos = 64};
    const double want[4] = {1.0, 0.027751387869683307, 0.00011730923379467252, 3.7673226901739635e-07};
    expect_table(&r, idx, want, 4);
}
