/* Conversions between float32 and the 16-bit float formats checkpoints store. */
#ifndef SLUICE_CORE_HALF_H
#define SLUICE_CORE_HALF_H

#include <stdint.h>
#include <string.h>

static inline float sl_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as torch does. NaN stays NaN. */
static inline uint16_t sl_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float sl_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t sl_f32_to_f16(float f);

/* float8 e4m3fn (the OCP "fn" variant DeepSeek ships): 4 exponent bits of bias 7, 3 mantissa bits, no
 * infinities; S.1111.111 is NaN, so the largest value is 448. */
static inline float sl_fp8_e4m3_to_f32(uint8_t v) {
    uint32_t sign = (uint32_t)(v & 0x80u) << 24, exp = (v >> 3) & 15u, man = v & 7u, u;
    if (exp == 15 && man == 7) {
        u = sign | 0x7fc00000u;
    } else if (exp == 0) { /* subnormal: man * 2^-9, exact in float32 */
        float f = (float)man * 0x1p-9f;
        return sign ? -f : f;
    } else {
        u = sign | ((exp + 127u - 7u) << 23) | (man << 20);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
