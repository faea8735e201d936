#include "models/rope.h"

#include <math.h>

static double yarn_mscale(double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

static double yarn_corr_dim(double rot, int dim, double base, int max_pos) {
    return (dim * log(max_pos / (rot * 2 * M_PI))) / (2 * log(base));
}

void sl_rope_inv_freq(const sl_rope_cfg *r, int dim, float *inv, float *attn_factor) {
    int half = dim / 2;
    float base = (float)r->theta;
    *attn_factor = 1.0f;
    for (int i = 0; i < half; i++) inv[i] = 1.0f / powf(base, (float)(2 * i) / (float)dim);
    switch (r->type) {
    case SL_ROPE_DEFAULT: break;
    case SL_ROPE_LINEAR:
        for (int i = 0; i < half; i++) inv[i] = inv[i] / (float)r->factor;
        break;
    case SL_ROPE_LLAMA3: {
        float factor = (float)r->factor, lo = (float)r->low_freq_factor, hi = (float)r->high_freq_factor;
        float old = (float)r->original_max_pos;
        float lo_wl = old / lo, hi_wl = old / hi;
        for (int i = 0; i < half; i++) {
            float wl = 2.0f * (float)M_PI / inv[i];
            float f = wl > lo_wl ? inv[i] / factor : inv[i];
            if (!(wl < hi_wl) && !(wl > lo_wl)) { /* medium frequencies: interpolate */
                float smooth = (old / wl - lo) / (hi - lo);
                f = (1.0f - smooth) * f / factor + smooth * f;
            }
            inv[i] = f;
        }
        break;
    }
    case SL_ROPE_YARN: {
        double factor = r->factor;
        double af = r->attention_factor;
        if (af <= 0)
            af = (r->mscale > 0 && r->mscale_all_dim > 0)
                     ? yarn_mscale(factor, r->mscale) / yarn_mscale(factor, r->mscale_all_dim)
                     : yarn_mscale(factor, 1.0);
        *attn_factor = (float)af;
        double low = yarn_corr_dim(r->beta_fast, dim, r->theta, r->original_max_pos);
        double high = yarn_corr_dim(r->beta_slow, dim, r->theta, r->original_max_pos);
        if (r->truncate) {
            low = floor(low);
            high = ceil(high);
        }
        if (low < 0) low = 0;
        if (high > dim - 1) high = dim - 1;
        if (low == high) high += 0.001;
        for (int i = 0; i < half; i++) {
            float pos_freq = powf(base, (float)(2 * i) / (float)dim);
            float extra = 1.0f / pos_freq, inter = 1.0f / ((float)factor * pos_freq);
            float ramp = (float)((i - low) / (high - low));
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float ext_factor = 1.0f - ramp;
            inv[i] = inter * (1.0f - ext_factor) + extra * ext_factor;
        }
        break;
    }
    }
}
