/* f16 <-> f32 conversions shared by the C codecs of core/quantization (_kquant_encoders.c, _q8_rows.c):
 * the rounding GGML_FP32_TO_FP16 and numpy's astype("<f2") use (to nearest, ties to even; past 65504
 * to infinity), in software, so every build and CPU writes the same bits. Include it after the file's
 * `#pragma GCC optimize("fp-contract=off")`. */

#ifndef TENZRO_F16_BITS_H
#define TENZRO_F16_BITS_H

#include <stdint.h>
#include <string.h>

static inline int nearest_int(float f) {
    float v = f + 12582912.f; /* 1.5 * 2^23: the integer lands in the low mantissa bits */
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

static inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); /* NaN stays NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                                     /* below 2^-14: f16 subnormal */
        float a;
        memcpy(&a, &ax, sizeof a);
        return (uint16_t)(sign | (uint32_t)nearest_int(a * 16777216.f)); /* units of 2^-24, exact */
    }
    /* Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even;
     * a carry out of the mantissa correctly bumps the exponent. */
    return (uint16_t)(sign | ((ax + 0x0fffu + ((ax >> 13) & 1u) - 0x38000000u) >> 13));
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
    if (e == 0x1f) {
        bits = sign | 0x7f800000u | (m << 13);
    } else if (e == 0) { /* zero or subnormal: m * 2^-24, exact in f32 */
        float v = (float)m * (1.f / 16777216.f);
        memcpy(&bits, &v, sizeof bits);
        bits |= sign;
    } else {
        bits = sign | ((e + 112u) << 23) | (m << 13);
    }
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

#endif /* TENZRO_F16_BITS_H */
