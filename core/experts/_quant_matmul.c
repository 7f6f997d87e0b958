/* Integer dot-product kernels for block-quantized expert matmuls: y[t, m] = x[t, n] · W[m, n]ᵀ.
 *
 * The scheme llama.cpp uses on CPUs: the activation rows are quantized once per call to int8
 * blocks, then every weight block is dotted with them in integer SIMD and the integer block
 * sums are scaled and accumulated in f32.
 *
 *   Q8_0 weights  x  "A8_32" activations: per 32 values an f32 scale d_a and int8 q_a, exactly
 *                     llama.cpp's Q8_0 x Q8_0 (and what the wire carries between nodes):
 *                     y += d_w·d_a · Σ q_w·q_a                          (one term per block)
 *   Q4_K weights  x  "A8_256" activations: per 256 values an f32 d_a, int8 q_a[256] and the
 *                     sums of q_a over each 16 values (bsums), so with w = d·sc_j·q − dmin·m_j
 *                     y += d_a·(d·Σ_j sc_j·Σ q·q_a − dmin·Σ_j m_j·bsum32_j)
 *   Q6_K weights  x  A8_256:  w = d·sc_k·(q − 32), q in [0, 63] (unsigned, so it can be the u8
 *                     operand of maddubs/dpbusd directly), k = 16-value group
 *                     y += d_a·d·Σ_k sc_k·(Σ q·q_a − 32·bsum16_k)
 *   MXFP4 weights x  A8_32:  w = d·k, d = 2^(e−128) (E8M0, ggml_e8m0_to_fp32_half), k one of the
 *                     16 int8 KVALUES (E2M1 doubled: 0, ±1, ±2, ±3, ±4, ±6, ±8, ±12) picked by a
 *                     4-bit code; the codes become int8 weights through a 16-entry byte table
 *                     (pshufb), then the block is Q8_0's:  y += d·d_a · Σ k·q_a
 *
 * Error bounds for these activation roundings are derived in tests/experts/test_ffn.py.
 *
 * Activation quantization is symmetric (d_a = amax/127, q_a in [-127, 127]) and rounds half to
 * even, so tests can rebuild it bit for bit in numpy. −128 never occurs, which keeps the
 * sign trick below exact.
 *
 * Overflow bounds (all exact, no saturation): maddubs of |q_w| <= 128 (Q8_0 and MXFP4, whose
 * |k| <= 12, via the sign trick: |w|·sign(a, w)) or q <= 63 with |q_a| <= 127 gives pairs
 * <= 2·128·127 = 32512 < 2^15;
 * madd by a 6-bit (Q4_K) or int8 (Q6_K) scale then stays far below 2^31 over 256 values.
 *
 * ISA variants: the SIMD kernels below the QDOT_BODY guard are compiled several times by
 * including this file into itself under different `#pragma GCC target` regions (avx2+fma,
 * AVX-VNNI, AVX-512 VNNI, where EVEX gives 32 registers and so 8 token accumulators, and Q8_0
 * runs on 512-bit vectors: two 32-value blocks per dpbusd); the variant is picked at import
 * with __builtin_cpu_supports, or forced by name. A portable scalar C kernel is always present
 * and computes the same integer sums.
 *
 * Entry points: matmul (one projection), expert (the whole SwiGLU forward in one call:
 * x quantized once for the stacked gate|up weights, one tile loop over both, silu·up in C,
 * that quantized for down; no Python between the three matmuls), experts (several experts' forwards
 * in one call: every expert's gate|up tiles as one pool job, every down tile as a second, each y bit
 * for bit expert's), and dequantize (rows of W
 * to f32, bit-identical to gguf's decoder, for the large-batch path: tile, then BLAS sgemm).
 *
 * Weight layouts: core/quantization/q8_0.py, q4_k.py, q6_k.py, mxfp4.py (ggml-common.h byte for byte).
 * Threads: the compute runs with the GIL released. Row tiles are handed out to a persistent
 * pool of worker threads (created once, parked on a condition variable between calls, never
 * spinning); one caller drives the pool at a time, a concurrent caller runs on its own thread.
 * The activations and intermediates live in a per-calling-thread scratch buffer, grown as
 * needed and reused, so a steady state call does no malloc and no thread creation.
 */

#ifndef QDOT_BODY

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <pthread.h>

#define Q8_0_BYTES 34
#define Q4_K_BYTES 144
#define Q6_K_BYTES 210
#define MXFP4_BYTES 17
#define ROW_TILE 32 /* weight rows per tile: re-read from L1/L2 for each chunk of tokens */

enum { FMT_Q8_0 = 0, FMT_Q4_K = 1, FMT_Q6_K = 2, FMT_MXFP4 = 3, N_FORMATS = 4 };

/* Activations quantized for one call. A8_32: qs [t][n], d [t][n/32]. A8_256: qs [t][n],
 * d [t][n/256], bsums [t][n/256][16]. */
typedef struct {
    int8_t *qs;
    float *d;
    int16_t *bsums;
    int t, n;
} acts_t;

/* f16 bits -> f32, exact for every finite value (subnormals included): put the 15 magnitude
 * bits where an f32's exponent and mantissa sit, then rescale by 2^(127-15) = 2^112, which
 * also turns f16 subnormals into the right f32 normals. inf/NaN are mapped back explicitly. */
static inline float f16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v, scale, infnan;
    scale.u = (uint32_t)(127 + 127 - 15) << 23;  /* 2^112 */
    infnan.u = (uint32_t)(127 + 16) << 23;       /* 2^16: the smallest rescaled inf/NaN */
    v.u = (uint32_t)(h & 0x7fff) << 13;
    v.f *= scale.f;
    if (v.f >= infnan.f) v.u |= 255u << 23;
    v.u |= (uint32_t)(h & 0x8000) << 16;
    return v.f;
}

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* MXFP4's code -> int8 value table (ggml's kvalues_mxfp4), 16 bytes: also the pshufb table. */
static const int8_t MXFP4_KVALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* E8M0 exponent -> f32 2^(e − 128), exactly ggml_e8m0_to_fp32_half: e 0 and 1 have no normal
 * f32 (2^-128, 2^-127), so they are built as subnormals (mantissa bit 21 or 22); e 255 is 2^127. */
static inline float e8m0_half(uint8_t e) {
    union { uint32_t u; float f; } v;
    v.u = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return v.f;
}

/* One row of activations to int8 blocks of `block` values: d = amax/127, q = rint(x/d).
 * The scale and its inverse are f32 exactly as numpy computes them (tests rebuild this). */
static void quantize_row(const float *x, int n, int block, int8_t *qs, float *d, int16_t *bsums) {
    for (int b = 0; b < n / block; b++) {
        const float *xb = x + (size_t)b * block;
        float amax = 0.0f;
        for (int i = 0; i < block; i++) {
            float a = xb[i] < 0 ? -xb[i] : xb[i];
            amax = a > amax ? a : amax;
        }
        float db = amax / 127.0f;
        float id = db > 0.0f ? 1.0f / db : 0.0f;
        d[b] = db;
        int8_t *qb = qs + (size_t)b * block;
        /* round half to even without a libm call: adding and subtracting 1.5·2^23 leaves the
         * integer part for |v| < 2^22 (here |v| <= 127); -O3 without -ffast-math keeps both ops */
        const float big = 12582912.0f;
        for (int i = 0; i < block; i++) {
            float v = xb[i] * id;
            int32_t q = (int32_t)((v + big) - big);
            q = q > 127 ? 127 : (q < -127 ? -127 : q);
            qb[i] = (int8_t)q;
        }
        if (bsums) {
            for (int g = 0; g < block / 16; g++) {
                int s = 0;
                for (int i = 0; i < 16; i++) s += qb[16 * g + i];
                bsums[(size_t)b * (block / 16) + g] = (int16_t)s;
            }
        }
    }
}

/* Q4_K's 12 packed bytes -> 8 six-bit scales and 8 six-bit mins (diagram in core/quantization/q4_k.py):
 * bytes 0-3 hold scale j (low 6 bits) and the top bits of scale j+4, bytes 4-7 min j and the
 * top bits of min j+4, bytes 8-11 the low nibbles of scale j+4 | min j+4. Done on 32-bit
 * words, four sub-blocks at a time. */
static inline void q4_k_scales(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t a, b, c, w[4];
    memcpy(&a, s, 4);
    memcpy(&b, s + 4, 4);
    memcpy(&c, s + 8, 4);
    w[0] = a & 0x3f3f3f3fu;                                    /* scales 0-3 */
    w[1] = (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u);       /* scales 4-7 */
    w[2] = b & 0x3f3f3f3fu;                                    /* mins 0-3 */
    w[3] = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u); /* mins 4-7 */
    memcpy(sc, w, 8);
    memcpy(mn, w + 2, 8);
}

/* --- portable scalar kernels (same integer sums as the SIMD ones) --------------------------- */

/* One 32-weight block dotted with 32 int8 activations: the integer sum, and the weights' scale in *dw. */
typedef int32_t (*block32_dot_fn)(const uint8_t *blk, const int8_t *q8, float *dw);

static int32_t q8_0_block_scalar(const uint8_t *blk, const int8_t *q8, float *dw) {
    const int8_t *qw = (const int8_t *)(blk + 2);
    int32_t s = 0;
    for (int i = 0; i < 32; i++) s += qw[i] * q8[i];
    *dw = f16_to_f32(rd16(blk));
    return s;
}

static int32_t mxfp4_block_scalar(const uint8_t *blk, const int8_t *q8, float *dw) {
    int32_t s = 0;
    for (int i = 0; i < 16; i++)  /* byte i: value i (low nibble) and i + 16 (high) */
        s += MXFP4_KVALUES[blk[1 + i] & 15] * q8[i] + MXFP4_KVALUES[blk[1 + i] >> 4] * q8[16 + i];
    *dw = e8m0_half(blk[0]);
    return s;
}

/* The formats with 32-weight blocks and A8_32 activations (Q8_0, MXFP4): y += d_w·d_a·Σ q_w·q_a. */
static void block32_rows_scalar(block32_dot_fn dot, size_t block_bytes, const uint8_t *w, size_t rb, int r0, int r1,
                                const acts_t *a, float *y, int m) {
    int nb = a->n / 32;
    for (int o = r0; o < r1; o++) {
        const uint8_t *wr = w + (size_t)o * rb;
        for (int tt = 0; tt < a->t; tt++) {
            const int8_t *qa = a->qs + (size_t)tt * a->n;
            const float *da = a->d + (size_t)tt * nb;
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                float dw;
                const int32_t s = dot(wr + (size_t)b * block_bytes, qa + 32 * b, &dw);
                acc += dw * da[b] * (float)s;
            }
            y[(size_t)tt * m + o] = acc;
        }
    }
}

static void q8_0_rows_scalar(const uint8_t *w, size_t rb, int r0, int r1, const acts_t *a, float *y, int m) {
    block32_rows_scalar(q8_0_block_scalar, Q8_0_BYTES, w, rb, r0, r1, a, y, m);
}

static void q4_k_rows_scalar(const uint8_t *w, size_t rb, int r0, int r1, const acts_t *a, float *y, int m) {
    int nb = a->n / 256;
    for (int o = r0; o < r1; o++) {
        const uint8_t *wr = w + (size_t)o * rb;
        for (int tt = 0; tt < a->t; tt++) {
            const int8_t *qa = a->qs + (size_t)tt * a->n;
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = wr + (size_t)b * Q4_K_BYTES;
                const int8_t *q8 = qa + 256 * b;
                const int16_t *bs = a->bsums + ((size_t)tt * nb + b) * 16;
                uint8_t sc[8], mn[8];
                q4_k_scales(blk + 4, sc, mn);
                int32_t sumi = 0, summ = 0;
                for (int j = 0; j < 4; j++) {
                    const uint8_t *qs = blk + 16 + 32 * j;
                    int32_t lo = 0, hi = 0;
                    for (int i = 0; i < 32; i++) {
                        lo += (qs[i] & 15) * q8[64 * j + i];
                        hi += (qs[i] >> 4) * q8[64 * j + 32 + i];
                    }
                    sumi += sc[2 * j] * lo + sc[2 * j + 1] * hi;
                }
                for (int j = 0; j < 8; j++) summ += mn[j] * (bs[2 * j] + bs[2 * j + 1]);
                float da = a->d[(size_t)tt * nb + b];
                acc += da * (f16_to_f32(rd16(blk)) * (float)sumi - f16_to_f32(rd16(blk + 2)) * (float)summ);
            }
            y[(size_t)tt * m + o] = acc;
        }
    }
}

static void q6_k_rows_scalar(const uint8_t *w, size_t rb, int r0, int r1, const acts_t *a, float *y, int m) {
    int nb = a->n / 256;
    for (int o = r0; o < r1; o++) {
        const uint8_t *wr = w + (size_t)o * rb;
        for (int tt = 0; tt < a->t; tt++) {
            const int8_t *qa = a->qs + (size_t)tt * a->n;
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = wr + (size_t)b * Q6_K_BYTES;
                const int8_t *sc = (const int8_t *)(blk + 192);
                const int16_t *bs = a->bsums + ((size_t)tt * nb + b) * 16;
                int32_t sumi = 0;
                for (int h = 0; h < 2; h++) {
                    const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
                    const int8_t *q8 = qa + 256 * b + 128 * h;
                    int32_t part[8] = {0};
                    for (int l = 0; l < 32; l++) {
                        int g = l / 16;
                        part[0 + g] += ((ql[l] & 15) | ((qh[l] & 3) << 4)) * q8[l];
                        part[2 + g] += ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) * q8[l + 32];
                        part[4 + g] += ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) * q8[l + 64];
                        part[6 + g] += ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) * q8[l + 96];
                    }
                    for (int k = 0; k < 8; k++) sumi += sc[8 * h + k] * (part[k] - 32 * bs[8 * h + k]);
                }
                acc += a->d[(size_t)tt * nb + b] * f16_to_f32(rd16(blk + 208)) * (float)sumi;
            }
            y[(size_t)tt * m + o] = acc;
        }
    }
}

static void mxfp4_rows_scalar(const uint8_t *w, size_t rb, int r0, int r1, const acts_t *a, float *y, int m) {
    block32_rows_scalar(mxfp4_block_scalar, MXFP4_BYTES, w, rb, r0, r1, a, y, m);
}

/* --- dequantizers: rows r0..r1 of W to f32, for the large-batch path (tile, then BLAS sgemm) ---
 *
 * Bit-identical to gguf-py's dequantize_blocks (ggml's dequantize_row_*), which computes in f32
 * with one rounding per numpy operation:
 *   Q8_0: w = q·d                      Q6_K: w = (d·sc)·(q − 32)
 *   Q4_K: w = (d·sc)·q − dmin·m        two roundings: an FMA would round once and differ
 *   MXFP4: w = d·k                     one rounding (d a power of two: exact unless it under- or
 *                                      overflows, where f32's subnormals and ±inf are the answer)
 * so these functions are compiled with fp-contract off (GCC otherwise fuses a·q − c into an FMA
 * wherever the target has one, intrinsics included: GCC's _mm256_mul_ps is a plain vector `*`).
 * `out` is row r0's output; rows are n values apart. */
#define NO_CONTRACT __attribute__((optimize("fp-contract=off")))

typedef void (*dequant_fn)(const uint8_t *w, size_t rb, int r0, int r1, int n, float *out);

static NO_CONTRACT void q8_0_dequant_scalar(const uint8_t *w, size_t rb, int r0, int r1, int n, float *out) {
    for (int r = r0; r < r1; r++) {
        const uint8_t *wr = w + (size_t)r * rb;
        float *o = out + (size_t)(r - r0) * n;
        for (int b = 0; b < n / 32; b++) {
            const uint8_t *blk = wr + (size_t)b * Q8_0_BYTES;
            const float d = f16_to_f32(rd16(blk));
            for (int i = 0; i < 32; i++) o[32 * b + i] = (float)(int8_t)blk[2 + i] * d;
        }
    }
}

static NO_CONTRACT void q4_k_dequant_scalar(const uint8_t *w, size_t rb, int r0, int r1, int n, float *out) {
    for (int r = r0; r < r1; r++) {
        const uint8_t *wr = w + (size_t)r * rb;
        float *o = out + (size_t)(r - r0) * n;
        for (int b = 0; b < n / 256; b++, o += 256) {
            const uint8_t *blk = wr + (size_t)b * Q4_K_BYTES;
            const float d = f16_to_f32(rd16(blk)), dmin = f16_to_f32(rd16(blk + 2));
            uint8_t sc[8], mn[8];
            q4_k_scales(blk + 4, sc, mn);
            for (int j = 0; j < 4; j++) {
                const uint8_t *qs = blk + 16 + 32 * j;
                const float a0 = d * (float)sc[2 * j], c0 = dmin * (float)mn[2 * j];
                const float a1 = d * (float)sc[2 * j + 1], c1 = dmin * (float)mn[2 * j + 1];
                for (int i = 0; i < 32; i++) {
                    o[64 * j + i] = a0 * (float)(qs[i] & 15) - c0;
                    o[64 * j + 32 + i] = a1 * (float)(qs[i] >> 4) - c1;
                }
            }
        }
    }
}

static NO_CONTRACT void q6_k_dequant_scalar(const uint8_t *w, size_t rb, int r0, int r1, int n, float *out) {
    for (int r = r0; r < r1; r++) {
        const uint8_t *wr = w + (size_t)r * rb;
        float *o = out + (size_t)(r - r0) * n;
        for (int b = 0; b < n / 256; b++, o += 256) {
            const uint8_t *blk = wr + (size_t)b * Q6_K_BYTES;
            const float d = f16_to_f32(rd16(blk + 208));
            const int8_t *sc = (const int8_t *)(blk + 192);
            for (int e = 0; e < 256; e++) {
                /* element e: half h, quarter k of the half, lane l (diagram in core/quantization/q6_k.py) */
                const int h = e / 128, k = (e % 128) / 32, l = e % 32;
                const int lo = (blk[64 * h + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15;
                const int hi = (blk[128 + 32 * h + l] >> (2 * k)) & 3;
                o[e] = (d * (float)sc[e / 16]) * (float)((lo | (hi << 4)) - 32);
            }
        }
    }
}

static NO_CONTRACT void mxfp4_dequant_scalar(const uint8_t *w, size_t rb, int r0, int r1, int n, float *out) {
    for (int r = r0; r < r1; r++) {
        const uint8_t *wr = w + (size_t)r * rb;
        float *o = out + (size_t)(r - r0) * n;
        for (int b = 0; b < n / 32; b++, o += 32) {
            const uint8_t *blk = wr + (size_t)b * MXFP4_BYTES;
            const float d = e8m0_half(blk[0]);
            for (int i = 0; i < 16; i++) {
                o[i] = d * (float)MXFP4_KVALUES[blk[1 + i] & 15];
                o[16 + i] = d * (float)MXFP4_KVALUES[blk[1 + i] >> 4];
            }
        }
    }
}

/* --- SIMD variants ------------------------------------------------------------------------- */

typedef void (*rows_fn)(const uint8_t *w, size_t rb, int r0, int r1, const acts_t *a, float *y, int m);

typedef void (*quant_fn)(const float *x, int n, int block, int8_t *qs, float *d, int16_t *bsums);

typedef struct {
    const char *name;
    int (*supported)(void);
    quant_fn quantize;
    rows_fn fns[N_FORMATS];          /* by FMT_* */
    dequant_fn dequant[N_FORMATS];   /* by FMT_* */
} variant_t;

static int always(void) { return 1; }

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

static int has_avx2(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
static int has_avxvnni(void) { return has_avx2() && __builtin_cpu_supports("avxvnni"); }
static int has_avx512vnni(void) {
    return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
}

#define QDOT_BODY

/* AVX2: u8·s8 pairs -> i16 (maddubs), then i16 pairs -> i32 (madd). */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define SFX(name) name##_avx2
#define MAXT 4
#define DOT_U8S8(acc, u, s) _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(1)))
#define DOT_I16(acc, p, s) _mm256_add_epi32((acc), _mm256_madd_epi16((p), (s)))
#include "_quant_matmul.c"
#undef SFX
#undef MAXT
#undef DOT_U8S8
#undef DOT_I16
#pragma GCC pop_options

/* AVX-VNNI (VEX): u8·s8 quads accumulated into i32 in one instruction (dpbusd); i16 pairs
 * likewise (dpwssd). Still 16 vector registers, so 4 tokens per pass. */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#define SFX(name) name##_avxvnni
#define MAXT 4
#define DOT_U8S8(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#define DOT_I16(acc, p, s) _mm256_dpwssd_avx_epi32((acc), (p), (s))
#include "_quant_matmul.c"
#undef SFX
#undef MAXT
#undef DOT_U8S8
#undef DOT_I16
#pragma GCC pop_options

/* AVX-512 VNNI (EVEX, 32 registers: 8 tokens per pass); Q8_0 on 512-bit vectors (QDOT_512),
 * the K-quants on 256-bit ones (their 32-byte sub-block layout). */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#define SFX(name) name##_avx512vnni
#define MAXT 8
#define QDOT_512
#define DOT_U8S8(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#define DOT_I16(acc, p, s) _mm256_dpwssd_epi32((acc), (p), (s))
#include "_quant_matmul.c"
#undef SFX
#undef MAXT
#undef QDOT_512
#undef DOT_U8S8
#undef DOT_I16
#pragma GCC pop_options

#undef QDOT_BODY

/* best first */
static const variant_t VARIANTS[] = {
    {"avx512vnni", has_avx512vnni, quantize_row_avx512vnni,
     {q8_0_rows_avx512vnni, q4_k_rows_avx512vnni, q6_k_rows_avx512vnni, mxfp4_rows_avx512vnni},
     {q8_0_dequant_avx512vnni, q4_k_dequant_avx512vnni, q6_k_dequant_avx512vnni, mxfp4_dequant_avx512vnni}},
    {"avxvnni", has_avxvnni, quantize_row_avxvnni,
     {q8_0_rows_avxvnni, q4_k_rows_avxvnni, q6_k_rows_avxvnni, mxfp4_rows_avxvnni},
     {q8_0_dequant_avxvnni, q4_k_dequant_avxvnni, q6_k_dequant_avxvnni, mxfp4_dequant_avxvnni}},
    {"avx2", has_avx2, quantize_row_avx2, {q8_0_rows_avx2, q4_k_rows_avx2, q6_k_rows_avx2, mxfp4_rows_avx2},
     {q8_0_dequant_avx2, q4_k_dequant_avx2, q6_k_dequant_avx2, mxfp4_dequant_avx2}},
    {"scalar", always, quantize_row, {q8_0_rows_scalar, q4_k_rows_scalar, q6_k_rows_scalar, mxfp4_rows_scalar},
     {q8_0_dequant_scalar, q4_k_dequant_scalar, q6_k_dequant_scalar, mxfp4_dequant_scalar}},
};
#else
static const variant_t VARIANTS[] = {
    {"scalar", always, quantize_row, {q8_0_rows_scalar, q4_k_rows_scalar, q6_k_rows_scalar, mxfp4_rows_scalar},
     {q8_0_dequant_scalar, q4_k_dequant_scalar, q6_k_dequant_scalar, mxfp4_dequant_scalar}},
};
#endif

#define N_VARIANTS ((int)(sizeof(VARIANTS) / sizeof(VARIANTS[0])))

/* --- Python binding ------------------------------------------------------------------------ */

static const struct {
    const char *name;
    int block, bytes, act_block;
} FORMATS[N_FORMATS] = {{"Q8_0", 32, Q8_0_BYTES, 32}, {"Q4_K", 256, Q4_K_BYTES, 256}, {"Q6_K", 256, Q6_K_BYTES, 256},
                        {"MXFP4", 32, MXFP4_BYTES, 32}};

static PyObject *qdot_variants(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (int i = 0; i < N_VARIANTS; i++) {
        if (!VARIANTS[i].supported()) continue;
        PyObject *s = PyUnicode_FromString(VARIANTS[i].name);
        if (!s || PyList_Append(out, s) < 0) {
            Py_XDECREF(s);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(s);
    }
    return out;
}

/* --- persistent worker pool ------------------------------------------------------------------
 *
 * A job is a number of tasks (row tiles) handed out by an atomic counter; the caller takes
 * part, so `threads` threads run a job with threads − 1 pool workers. A worker joins a job
 * only while it is open: once the caller has run out of tasks it closes the job and waits only
 * for the workers that joined, never for one still waking up (on a loaded machine a woken
 * worker can wait milliseconds for a core, longer than the whole job took). Workers sleep on
 * pool.wake between jobs (no spinning: on a 2-core VM a spinning worker steals the core that
 * BLAS or the next Python call needs). `user` lets one caller at a time drive the pool; a
 * second concurrent caller (another Python thread, GIL released) does not wait for it but
 * runs its job on its own thread, since the cores are busy anyway. */
#define MAX_THREADS 64

typedef struct {
    void (*fn)(void *ctx, int task);
    void *ctx;
    int ntasks;
    int next; /* next task, taken with __atomic_fetch_add */
} pjob_t;

static void pjob_run(pjob_t *job) {
    int i;
    while ((i = __atomic_fetch_add(&job->next, 1, __ATOMIC_RELAXED)) < job->ntasks) job->fn(job->ctx, i);
}

typedef struct {
    int index;
    unsigned long gen; /* the generation when it was created: it takes part from the next one */
} worker_arg_t;

static struct {
    pthread_mutex_t user; /* held by the caller driving the pool */
    pthread_mutex_t mu;   /* guards the fields below */
    pthread_cond_t wake;  /* gen changed */
    pthread_cond_t done;  /* busy reached 0 */
    int started;          /* workers alive */
    int want;             /* workers 0..want-1 may join the current job (0 once it is closed) */
    int busy;             /* workers that joined it and have not finished */
    unsigned long gen;    /* bumped once per job */
    pjob_t *job;
    worker_arg_t args[MAX_THREADS];
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
            0, 0, 0, 0, NULL, {{0, 0}}};

static void *pool_worker(void *arg) {
    const worker_arg_t *me = (const worker_arg_t *)arg;
    pthread_mutex_lock(&pool.mu);
    unsigned long seen = me->gen;
    for (;;) {
        while (pool.gen == seen) pthread_cond_wait(&pool.wake, &pool.mu);
        seen = pool.gen;
        if (me->index >= pool.want) continue; /* not asked, or the job closed before this woke */
        pool.busy++;
        pjob_t *job = pool.job;
        pthread_mutex_unlock(&pool.mu);
        pjob_run(job);
        pthread_mutex_lock(&pool.mu);
        if (--pool.busy == 0) pthread_cond_signal(&pool.done);
    }
    return NULL;
}

/* A forked child (Celery prefork) has none of the parent's workers and may inherit locked
 * mutexes: start over with an empty pool. */
static void pool_after_fork(void) {
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    pool.user = m;
    pool.mu = m;
    pool.wake = c;
    pool.done = c;
    pool.started = pool.want = pool.busy = 0;
    pool.job = NULL;
}

/* Run tasks 0..ntasks-1 of fn on up to `threads` threads (this one included). Call without
 * the GIL. */
static void parallel_for(void (*fn)(void *, int), void *ctx, int ntasks, int threads) {
    pjob_t job = {fn, ctx, ntasks, 0};
    int helpers = threads - 1;
    if (helpers > ntasks - 1) helpers = ntasks - 1;
    if (helpers > MAX_THREADS - 1) helpers = MAX_THREADS - 1;
    if (helpers <= 0 || pthread_mutex_trylock(&pool.user) != 0) {
        pjob_run(&job);
        return;
    }
    pthread_mutex_lock(&pool.mu);
    while (pool.started < helpers) {
        pthread_attr_t attr;
        pthread_t tid;
        worker_arg_t *arg = &pool.args[pool.started];
        *arg = (worker_arg_t){pool.started, pool.gen};
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&tid, &attr, pool_worker, arg);
        pthread_attr_destroy(&attr);
        if (rc != 0) break; /* fewer helpers; this thread does the rest */
        pool.started++;
    }
    if (helpers > pool.started) helpers = pool.started;
    pool.job = &job;
    pool.want = helpers;
    pool.busy = 0;
    pool.gen++;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    pjob_run(&job);
    pthread_mutex_lock(&pool.mu);
    pool.want = 0; /* closed: a worker waking from now on stays out, so none reads `job` (on this stack) later */
    while (pool.busy > 0) pthread_cond_wait(&pool.done, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.user);
}

/* --- per-thread scratch ----------------------------------------------------------------------
 * One 64-byte aligned buffer per calling thread, grown on demand and kept for the next call
 * (freed when the thread exits). Only the calling thread allocates; pool workers only read and
 * write through pointers the caller hands them. */
typedef struct {
    void *p;
    size_t size;
} scratch_t;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok;

static void scratch_free(void *arg) {
    scratch_t *s = (scratch_t *)arg;
    free(s->p);
    free(s);
}

static void scratch_init(void) { scratch_key_ok = pthread_key_create(&scratch_key, scratch_free) == 0; }

static void *scratch_get(size_t bytes) {
    pthread_once(&scratch_once, scratch_init);
    if (!scratch_key_ok) return NULL;
    scratch_t *s = (scratch_t *)pthread_getspecific(scratch_key);
    if (!s) {
        s = (scratch_t *)calloc(1, sizeof *s);
        if (!s) return NULL;
        if (pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->size < bytes) {
        free(s->p);
        s->p = NULL;
        s->size = 0;
        size_t size = (bytes + 4095) & ~(size_t)4095;
        if (posix_memalign(&s->p, 64, size) != 0) {
            s->p = NULL;
            return NULL;
        }
        s->size = size;
    }
    return s->p;
}

/* Bytes of an acts_t for t rows of n values in activation blocks of `ab` (each array padded
 * to 64 bytes, so SIMD loads of a last partial vector stay inside the buffer). */
static size_t pad64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

static size_t acts_bytes(int t, int n, int ab) {
    size_t nb = (size_t)t * (n / ab);
    return pad64((size_t)t * n + 64) + pad64(nb * sizeof(float)) + (ab == 256 ? pad64(nb * 16 * sizeof(int16_t)) : 0);
}

static uint8_t *acts_carve(acts_t *a, uint8_t *p, int t, int n, int ab) {
    size_t nb = (size_t)t * (n / ab);
    a->t = t;
    a->n = n;
    a->qs = (int8_t *)p;
    p += pad64((size_t)t * n + 64);
    a->d = (float *)p;
    p += pad64(nb * sizeof(float));
    a->bsums = NULL;
    if (ab == 256) {
        a->bsums = (int16_t *)p;
        p += pad64(nb * 16 * sizeof(int16_t));
    }
    return p;
}

static void acts_fill(const variant_t *var, const float *x, int ab, acts_t *a) {
    const int nb = a->n / ab;
    for (int tt = 0; tt < a->t; tt++)
        var->quantize(x + (size_t)tt * a->n, a->n, ab, a->qs + (size_t)tt * a->n, a->d + (size_t)tt * nb,
                      a->bsums ? a->bsums + (size_t)tt * nb * 16 : NULL);
}

/* One projection as a pool job: task i = weight rows [i·ROW_TILE, (i+1)·ROW_TILE); each task
 * writes only its own columns y[:, rows], and the activations are read-only by then. */
typedef struct {
    rows_fn fn;
    const uint8_t *w;
    size_t rb;
    int m;
    const acts_t *a;
    float *y;
} rows_job_t;

static void rows_task(void *ctx, int i) {
    const rows_job_t *j = (const rows_job_t *)ctx;
    int r0 = i * ROW_TILE, r1 = r0 + ROW_TILE < j->m ? r0 + ROW_TILE : j->m;
    j->fn(j->w, j->rb, r0, r1, j->a, j->y, j->m);
}

static void run_rows(rows_fn fn, const uint8_t *w, size_t rb, int m, const acts_t *a, float *y, int threads) {
    rows_job_t job = {fn, w, rb, m, a, y};
    parallel_for(rows_task, &job, (m + ROW_TILE - 1) / ROW_TILE, threads);
}

static int find_format(const char *name) {
    for (int i = 0; i < N_FORMATS; i++)
        if (strcmp(name, FORMATS[i].name) == 0) return i;
    PyErr_Format(PyExc_ValueError, "unknown format %s (Q8_0, Q4_K, Q6_K, MXFP4)", name);
    return -1;
}

static const variant_t *find_variant(const char *name) {
    for (int i = 0; i < N_VARIANTS; i++)
        if (strcmp(name, VARIANTS[i].name) == 0 && VARIANTS[i].supported()) return &VARIANTS[i];
    PyErr_Format(PyExc_ValueError, "kernel variant %s is unknown or unsupported by this CPU", name);
    return NULL;
}

/* Threads for a projection of `macs` multiply-adds: one per min_macs, at most `threads`. */
static int threads_for(double macs, long long min_macs, int threads) {
    double k = min_macs > 0 ? macs / (double)min_macs : (double)threads;
    return k < 1.0 ? 1 : (k < threads ? (int)k : threads);
}

static PyObject *qdot_matmul(PyObject *self, PyObject *args) {
    (void)self;
    const char *fmt_name, *variant_name;
    Py_buffer wb, xb, yb;
    int m, n, t, threads;
    if (!PyArg_ParseTuple(args, "sy*iiy*iw*si", &fmt_name, &wb, &m, &n, &xb, &t, &yb, &variant_name, &threads))
        return NULL;
    PyObject *result = NULL;
    const int fmt = find_format(fmt_name);
    if (fmt < 0) goto done;
    const variant_t *var = find_variant(variant_name);
    if (!var) goto done;
    if (m < 0 || t < 0 || n <= 0 || n % FORMATS[fmt].block != 0 || threads < 1) {
        PyErr_Format(PyExc_ValueError, "bad shape m=%d n=%d t=%d threads=%d for %s", m, n, t, threads, fmt_name);
        goto done;
    }
    size_t rb = (size_t)(n / FORMATS[fmt].block) * FORMATS[fmt].bytes;
    if ((size_t)wb.len != (size_t)m * rb || (size_t)xb.len != (size_t)t * n * sizeof(float) ||
        (size_t)yb.len != (size_t)t * m * sizeof(float)) {
        PyErr_Format(PyExc_ValueError, "buffer sizes do not match %s m=%d n=%d t=%d", fmt_name, m, n, t);
        goto done;
    }
    const int ab = FORMATS[fmt].act_block;
    uint8_t *buf = scratch_get(acts_bytes(t, n, ab));
    if (!buf) {
        PyErr_NoMemory();
        goto done;
    }
    acts_t a;
    acts_carve(&a, buf, t, n, ab);
    Py_BEGIN_ALLOW_THREADS
    acts_fill(var, (const float *)xb.buf, ab, &a);
    run_rows(var->fns[fmt], (const uint8_t *)wb.buf, rb, m, &a, (float *)yb.buf, threads);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&wb);
    PyBuffer_Release(&xb);
    PyBuffer_Release(&yb);
    return result;
}

/* Dequantize as a pool job: task i = rows r0 + [i·rows_per_task, (i+1)·rows_per_task); each
 * task writes only its own rows of out. */
typedef struct {
    dequant_fn fn;
    const uint8_t *w;
    size_t rb;
    int r0, r1, n, rows_per_task;
    float *out;
} dequant_job_t;

static void dequant_task(void *ctx, int i) {
    const dequant_job_t *j = (const dequant_job_t *)ctx;
    const int a = j->r0 + i * j->rows_per_task, b = a + j->rows_per_task < j->r1 ? a + j->rows_per_task : j->r1;
    j->fn(j->w, j->rb, a, b, j->n, j->out + (size_t)(a - j->r0) * j->n);
}

#define DEQUANT_TASK_VALUES 65536 /* ~256 KiB of f32 per task: enough to amortize the hand-out */

static PyObject *qdot_dequantize(PyObject *self, PyObject *args) {
    (void)self;
    const char *fmt_name, *variant_name;
    Py_buffer wb, ob;
    int m, n, r0, r1, threads;
    if (!PyArg_ParseTuple(args, "sy*iiiiw*si", &fmt_name, &wb, &m, &n, &r0, &r1, &ob, &variant_name, &threads))
        return NULL;
    PyObject *result = NULL;
    const int fmt = find_format(fmt_name);
    if (fmt < 0) goto done;
    const variant_t *var = find_variant(variant_name);
    if (!var) goto done;
    if (m < 0 || n <= 0 || n % FORMATS[fmt].block != 0 || r0 < 0 || r1 < r0 || r1 > m || threads < 1) {
        PyErr_Format(PyExc_ValueError, "bad shape m=%d n=%d rows %d..%d threads=%d for %s", m, n, r0, r1, threads,
                     fmt_name);
        goto done;
    }
    const size_t rb = (size_t)(n / FORMATS[fmt].block) * FORMATS[fmt].bytes;
    size_t w_len, out_len;
    if (__builtin_mul_overflow((size_t)m, rb, &w_len) ||
        __builtin_mul_overflow((size_t)(r1 - r0), (size_t)n * sizeof(float), &out_len) ||
        (size_t)wb.len != w_len || (size_t)ob.len != out_len) {
        PyErr_Format(PyExc_ValueError, "buffer sizes do not match %s m=%d n=%d rows %d..%d", fmt_name, m, n, r0, r1);
        goto done;
    }
    int per_task = DEQUANT_TASK_VALUES / n;
    if (per_task < 1) per_task = 1;
    const int ntasks = (r1 - r0 + per_task - 1) / per_task;
    dequant_job_t job = {var->dequant[fmt], (const uint8_t *)wb.buf, rb, r0, r1, n, per_task, (float *)ob.buf};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(dequant_task, &job, ntasks, threads);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&wb);
    PyBuffer_Release(&ob);
    return result;
}

/* silu(g)·u = g·u / (1 + e^−g) over row tt of gu = [g | u] (each d_ff wide), written over g.
 * e^−g -> inf for g << 0 gives −0.0, the right limit. */
static void silu_mul(float *gu, int d_ff) {
    const float *u = gu + d_ff;
    for (int j = 0; j < d_ff; j++) gu[j] = gu[j] / (1.0f + expf(-gu[j])) * u[j];
}

/* The GLU of one row gu = [g | u] (d_ff each) into its first half, after the biases b = [b_g | b_u]
 * (NULL: none): GLU_SILU silu(g)·u, GLU_CLAMPED gpt-oss's g'·sigmoid(alpha·g')·(u' + 1) with
 * g' = min(g, limit), u' = clip(u, ±limit). expf(-alpha·g') overflows to inf for g' << 0: g'/inf = -0. */
enum { GLU_SILU = 0, GLU_CLAMPED = 1 };
static void glu_row(float *gu, int d_ff, const float *b, int glu, float alpha, float limit) {
    float *u = gu + d_ff;
    if (b)
        for (int j = 0; j < 2 * d_ff; j++) gu[j] += b[j];
    if (glu == GLU_SILU) {
        silu_mul(gu, d_ff);
        return;
    }
    for (int j = 0; j < d_ff; j++) {
        const float g = fminf(gu[j], limit), up = fminf(fmaxf(u[j], -limit), limit);
        gu[j] = g / (1.0f + expf(-alpha * g)) * (up + 1.0f);
    }
}

/* One expert's forward in an `expert` or `experts` call: its buffers (held until the call ends), its
 * shapes, and where its activations and intermediates sit in the caller's scratch. */
typedef struct {
    Py_buffer gub, downb, xb, yb, gu_bias, down_bias;
    const char *gu_name, *down_name;
    int d_model, d_ff, t, glu, fg, fd;
    float alpha, limit;
    size_t rb_gu, rb_down;
    acts_t xa, ha;
    float *gu; /* [t][2·d_ff] f32: g | u, then h over g */
} item_t;

static void item_release(item_t *it) {
    PyBuffer_Release(&it->gu_bias);
    PyBuffer_Release(&it->down_bias);
    PyBuffer_Release(&it->gub);
    PyBuffer_Release(&it->downb);
    PyBuffer_Release(&it->xb);
    PyBuffer_Release(&it->yb);
}

/* Its formats and shapes checked against its buffers; 0, or -1 with an exception set. */
static int item_check(item_t *it) {
    if ((it->glu != GLU_SILU && it->glu != GLU_CLAMPED) ||
        (it->gu_bias.buf && (size_t)it->gu_bias.len != 2 * (size_t)it->d_ff * 4) ||
        (it->down_bias.buf && (size_t)it->down_bias.len != (size_t)it->d_model * 4)) {
        PyErr_Format(PyExc_ValueError, "bad glu %d or bias sizes for d_model=%d d_ff=%d", it->glu, it->d_model,
                     it->d_ff);
        return -1;
    }
    if ((it->fg = find_format(it->gu_name)) < 0 || (it->fd = find_format(it->down_name)) < 0) return -1;
    if (it->t < 0 || it->d_model <= 0 || it->d_ff <= 0 || it->d_ff > (1 << 28) ||
        it->d_model % FORMATS[it->fg].block != 0 || it->d_ff % FORMATS[it->fd].block != 0) {
        PyErr_Format(PyExc_ValueError, "bad shape d_model=%d d_ff=%d t=%d for %s/%s", it->d_model, it->d_ff, it->t,
                     it->gu_name, it->down_name);
        return -1;
    }
    it->rb_gu = (size_t)(it->d_model / FORMATS[it->fg].block) * FORMATS[it->fg].bytes;
    it->rb_down = (size_t)(it->d_ff / FORMATS[it->fd].block) * FORMATS[it->fd].bytes;
    const size_t xy = (size_t)it->t * it->d_model * sizeof(float);
    if ((size_t)it->gub.len != 2 * (size_t)it->d_ff * it->rb_gu || (size_t)it->downb.len != (size_t)it->d_model * it->rb_down ||
        (size_t)it->xb.len != xy || (size_t)it->yb.len != xy) {
        PyErr_Format(PyExc_ValueError, "buffer sizes do not match %s/%s d_model=%d d_ff=%d t=%d", it->gu_name,
                     it->down_name, it->d_model, it->d_ff, it->t);
        return -1;
    }
    return 0;
}

/* scratch of one item: x quantized | gu f32 [t][2·d_ff] (h over its first half) | h quantized */
static size_t item_scratch(const item_t *it) {
    return acts_bytes(it->t, it->d_model, FORMATS[it->fg].act_block) + pad64((size_t)it->t * 2 * it->d_ff * sizeof(float)) +
           acts_bytes(it->t, it->d_ff, FORMATS[it->fd].act_block);
}

static uint8_t *item_carve(item_t *it, uint8_t *p) {
    p = acts_carve(&it->xa, p, it->t, it->d_model, FORMATS[it->fg].act_block);
    it->gu = (float *)p;
    p += pad64((size_t)it->t * 2 * it->d_ff * sizeof(float));
    return acts_carve(&it->ha, p, it->t, it->d_ff, FORMATS[it->fd].act_block);
}

/* Several projections as one pool job: their row tiles numbered one after another (tile0: a
 * projection's first task), so the workers wake once for all of them. */
typedef struct {
    rows_job_t job;
    int tile0;
} proj_t;

typedef struct {
    const proj_t *p;
    int n;
} projs_t;

static void projs_task(void *ctx, int i) {
    const projs_t *j = (const projs_t *)ctx;
    int lo = 0, hi = j->n - 1;
    while (lo < hi) { /* the last projection whose first tile is <= i */
        int mid = (lo + hi + 1) / 2;
        if (j->p[mid].tile0 <= i) lo = mid;
        else hi = mid - 1;
    }
    rows_task((void *)&j->p[lo].job, i - j->p[lo].tile0);
}

static void run_projs(proj_t *p, int n, double macs, long long min_macs, int threads) {
    int tiles = 0;
    for (int k = 0; k < n; k++) {
        p[k].tile0 = tiles;
        tiles += (p[k].job.m + ROW_TILE - 1) / ROW_TILE;
    }
    projs_t job = {p, n};
    parallel_for(projs_task, &job, tiles, threads_for(macs, min_macs, threads));
}

/* The items' forwards (scratch carved, GIL released): every item's gate|up tiles in one pool job,
 * their GLUs, every down tile in a second job. A tile computes the same values on any thread, so
 * each item's y is what a call of its own gives, bit for bit. `p`: room for n projections. */
static void run_items(const variant_t *var, item_t *items, int n, proj_t *p, int threads, long long min_macs) {
    double macs = 0.0;
    for (int k = 0; k < n; k++) {
        item_t *it = &items[k];
        acts_fill(var, (const float *)it->xb.buf, FORMATS[it->fg].act_block, &it->xa);
        p[k].job = (rows_job_t){var->fns[it->fg], (const uint8_t *)it->gub.buf, it->rb_gu, 2 * it->d_ff, &it->xa, it->gu};
        macs += (double)it->t * it->d_ff * it->d_model;
    }
    run_projs(p, n, 2 * macs, min_macs, threads);
    for (int k = 0; k < n; k++) {
        item_t *it = &items[k];
        const int ab = FORMATS[it->fd].act_block;
        for (int tt = 0; tt < it->t; tt++) { /* h row tt sits at gu + tt·2·d_ff */
            float *row = it->gu + (size_t)tt * 2 * it->d_ff;
            glu_row(row, it->d_ff, (const float *)it->gu_bias.buf, it->glu, it->alpha, it->limit);
            var->quantize(row, it->d_ff, ab, it->ha.qs + (size_t)tt * it->d_ff, it->ha.d + (size_t)tt * (it->d_ff / ab),
                          it->ha.bsums ? it->ha.bsums + (size_t)tt * (it->d_ff / ab) * 16 : NULL);
        }
        p[k].job = (rows_job_t){var->fns[it->fd], (const uint8_t *)it->downb.buf, it->rb_down, it->d_model, &it->ha,
                                (float *)it->yb.buf};
    }
    run_projs(p, n, macs, min_macs, threads);
    for (int k = 0; k < n; k++) {
        const item_t *it = &items[k];
        if (!it->down_bias.buf) continue;
        const float *bd = (const float *)it->down_bias.buf;
        for (int tt = 0; tt < it->t; tt++) {
            float *yr = (float *)it->yb.buf + (size_t)tt * it->d_model;
            for (int i = 0; i < it->d_model; i++) yr[i] += bd[i];
        }
    }
}

/* Check, carve scratch for and run n parsed items; Py_None, or NULL with an exception set. */
static PyObject *forward_items(item_t *items, int n, const char *variant_name, int threads, long long min_macs) {
    const variant_t *var = find_variant(variant_name);
    if (!var) return NULL;
    if (threads < 1 || min_macs < 0) {
        PyErr_Format(PyExc_ValueError, "bad shape of the call: threads=%d, min_macs=%lld", threads, min_macs);
        return NULL;
    }
    size_t bytes = 0;
    for (int k = 0; k < n; k++) {
        if (item_check(&items[k]) < 0) return NULL;
        bytes += item_scratch(&items[k]);
    }
    proj_t *p = PyMem_Malloc(sizeof(proj_t) * (size_t)(n ? n : 1));
    uint8_t *buf = scratch_get(bytes ? bytes : 64);
    if (!p || !buf) {
        PyMem_Free(p);
        return PyErr_NoMemory();
    }
    for (int k = 0; k < n; k++) buf = item_carve(&items[k], buf);
    Py_BEGIN_ALLOW_THREADS
    run_items(var, items, n, p, threads, min_macs);
    Py_END_ALLOW_THREADS
    PyMem_Free(p);
    Py_RETURN_NONE;
}

#define ITEM_FORMAT "sy*sy*iiy*iw*"

static PyObject *qdot_expert(PyObject *self, PyObject *args) {
    (void)self;
    item_t it = {.glu = GLU_SILU, .alpha = 1.0f, .limit = 0.0f};
    const char *variant_name;
    int threads;
    long long min_macs;
    if (!PyArg_ParseTuple(args, ITEM_FORMAT "siL|iffz*z*", &it.gu_name, &it.gub, &it.down_name, &it.downb, &it.d_model,
                          &it.d_ff, &it.xb, &it.t, &it.yb, &variant_name, &threads, &min_macs, &it.glu, &it.alpha,
                          &it.limit, &it.gu_bias, &it.down_bias))
        return NULL;
    PyObject *result = forward_items(&it, 1, variant_name, threads, min_macs);
    item_release(&it);
    return result;
}

static PyObject *qdot_experts(PyObject *self, PyObject *args) {
    (void)self;
    const char *variant_name;
    int threads;
    long long min_macs;
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "siLO", &variant_name, &threads, &min_macs, &seq)) return NULL;
    PyObject *fast = PySequence_Fast(seq, "experts() takes a sequence of expert tuples");
    if (!fast) return NULL;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > 4096) {
        Py_DECREF(fast);
        return PyErr_Format(PyExc_ValueError, "at most 4096 experts per call, got %zd", n);
    }
    item_t *items = PyMem_Calloc((size_t)(n ? n : 1), sizeof(item_t));
    if (!items) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    PyObject *result = NULL;
    Py_ssize_t parsed = 0;
    for (; parsed < n; parsed++) {
        item_t *it = &items[parsed];
        it->glu = GLU_SILU;
        it->alpha = 1.0f;
        PyObject *tuple = PySequence_Fast_GET_ITEM(fast, parsed);
        if (!PyTuple_Check(tuple)) {
            PyErr_Format(PyExc_TypeError, "expert %zd is not a tuple", parsed);
            goto done;
        }
        if (!PyArg_ParseTuple(tuple, ITEM_FORMAT "|iffz*z*", &it->gu_name, &it->gub, &it->down_name, &it->downb,
                              &it->d_model, &it->d_ff, &it->xb, &it->t, &it->yb, &it->glu, &it->alpha, &it->limit,
                              &it->gu_bias, &it->down_bias))
            goto done;
    }
    result = forward_items(items, (int)n, variant_name, threads, min_macs);
done:
    for (Py_ssize_t k = 0; k < parsed; k++) item_release(&items[k]);
    PyMem_Free(items);
    Py_DECREF(fast);
    return result;
}

static PyMethodDef qdot_methods[] = {
    {"variants", qdot_variants, METH_NOARGS, "variants() -> list of kernel variants this CPU runs, best first."},
    {"matmul", qdot_matmul, METH_VARARGS,
     "matmul(fmt, w, m, n, x, t, y, variant, threads) -> None\n\n"
     "y[t, m] = quantize_int8(x[t, n]) · W[m, n]ᵀ. w: the raw blocks, m·row_bytes bytes; x: f32 t·n;\n"
     "y: writable f32 t·m; all C-contiguous. Splits the rows over `threads` threads (this one\n"
     "included). Releases the GIL while computing."},
    {"dequantize", qdot_dequantize, METH_VARARGS,
     "dequantize(fmt, w, m, n, r0, r1, out, variant, threads) -> None\n\n"
     "out[r1 - r0, n] = rows r0..r1 of W[m, n] as f32, bit-identical to gguf's dequantize. w: the raw\n"
     "blocks, m·row_bytes bytes; out: writable f32 (r1 - r0)·n, C-contiguous. Splits the rows over\n"
     "`threads` threads (this one included). Releases the GIL while computing."},
    {"expert", qdot_expert, METH_VARARGS,
     "expert(gu_fmt, w_gu, down_fmt, w_down, d_model, d_ff, x, t, y, variant, threads, min_macs\n"
     "       [, glu, alpha, limit, gu_bias, down_bias]) -> None\n\n"
     "y[t, d_model] = down(glu(gate·x + b_g, up·x + b_u)) + b_d with int8 activations. w_gu: gate and\n"
     "up stacked, [2·d_ff, d_model] blocks of gu_fmt; w_down: [d_model, d_ff] blocks of down_fmt; x, y:\n"
     "f32 t·d_model, C-contiguous. glu 0: silu(g)·u; 1: gpt-oss's clamped SwiGLU (alpha, limit).\n"
     "gu_bias: f32 [2·d_ff] (b_g | b_u) or None; down_bias: f32 [d_model] or None. Each projection\n"
     "runs on one thread per min_macs multiply-adds, at most `threads` (0: always `threads`).\n"
     "Releases the GIL while computing."},
    {"experts", qdot_experts, METH_VARARGS,
     "experts(variant, threads, min_macs, items) -> None\n\n"
     "Several experts' forwards in one call: items is a sequence of (gu_fmt, w_gu, down_fmt, w_down,\n"
     "d_model, d_ff, x, t, y[, glu, alpha, limit, gu_bias, down_bias]), each as `expert` takes them. Every\n"
     "expert's gate|up row tiles run as one pool job and every down tile as a second, so the workers wake\n"
     "twice for the whole call; each y is bit for bit what `expert` writes. Releases the GIL while computing."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef qdot_module = {PyModuleDef_HEAD_INIT, "_quant_matmul", "Integer SIMD kernels for GGML blocks.", -1,
                                         qdot_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__quant_matmul(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
#endif
    static int atfork_done;
    if (!atfork_done) {
        if (pthread_atfork(NULL, NULL, pool_after_fork) != 0) return PyErr_NoMemory();
        atfork_done = 1;
    }
    return PyModule_Create(&qdot_module);
}

#else /* QDOT_BODY: the SIMD kernels, compiled once per ISA (SFX, MAXT, DOT_U8S8, DOT_I16) */

/* quantize_row with SIMD; the same f32 operations, so the same bytes (tests compare variants). */
static void SFX(quantize_row)(const float *x, int n, int block, int8_t *qs, float *d, int16_t *bsums) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < n / block; b++) {
        const float *xb = x + (size_t)b * block;
        __m256 mx = _mm256_setzero_ps();
        for (int i = 0; i < block; i += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(xb + i), absmask));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float db = _mm_cvtss_f32(m4) / 127.0f;
        const float idf = db > 0.0f ? 1.0f / db : 0.0f;
        const __m256 id = _mm256_set1_ps(idf);
        d[b] = db;
        int8_t *qb = qs + (size_t)b * block;
        for (int i = 0; i < block; i += 32) {
            /* cvtps rounds half to even (default MXCSR); |x·id| <= 127 so no clamping needed */
            __m256i v[4];
            for (int k = 0; k < 4; k++) v[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 8 * k), id));
            if (bsums) {
                for (int g = 0; g < 2; g++) {
                    const __m256i s8 = _mm256_add_epi32(v[2 * g], v[2 * g + 1]);
                    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
                    s4 = _mm_hadd_epi32(s4, s4);
                    s4 = _mm_hadd_epi32(s4, s4);
                    bsums[(size_t)b * (block / 16) + i / 16 + g] = (int16_t)_mm_cvtsi128_si32(s4);
                }
            }
            /* packs interleaves 128-bit lanes: dwords come out as v0[0:4] v1[0:4] v2[0:4] v3[0:4]
             * v0[4:8] ..., put back in order */
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            _mm256_storeu_si256((__m256i *)(qb + i), _mm256_permutevar8x32_epi32(p, order));
        }
    }
}

static inline float SFX(hsum)(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* acc[tt] += d_w·d_a[tt] · Σ q·q_a[tt] for 32 int8 weights q of block b (Q8_0's as stored, MXFP4's
 * looked up). The sign trick makes the weights the unsigned operand: |q| · (q_a with q's sign). */
static inline __attribute__((always_inline)) void SFX(i8_block)(__m256i q, float dw, int b, const int8_t *qa,
                                                               const float *da, int n, int nb, __m256 *acc,
                                                               const int T) {
    const __m256i aq = _mm256_sign_epi8(q, q);
    for (int tt = 0; tt < T; tt++) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(qa + (size_t)tt * n + 32 * b));
        const __m256i p = DOT_U8S8(_mm256_setzero_si256(), aq, _mm256_sign_epi8(x, q));
        acc[tt] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * da[(size_t)tt * nb + b]), acc[tt]);
    }
}

#ifdef QDOT_512
/* Q8_0 on 512-bit vectors: blocks b and b+1 (34 bytes apart, so two 256-bit loads) in one
 * dpbusd; lanes 0-7 hold block b's partial sums, lanes 8-15 block b+1's, each scaled by its
 * own d_w·d_a. Weights are the unsigned operand: |q_w|, and the activations take q_w's sign
 * (negated where q_w < 0; AVX-512 has no sign_epi8). |q_w| <= 128, |q_a| <= 127: each i32
 * lane sums 4 products <= 4·128·127, exact. */
static inline __attribute__((always_inline)) void SFX(q8_0_tile)(const uint8_t *w, size_t rb, int r0, int r1,
                                                                const int8_t *qa, const float *da, int n,
                                                                float *y, int m, const int T) {
    const int nb = n / 32;
    const __m512i pair = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i zero = _mm512_setzero_si512();
    for (int o = r0; o < r1; o++) {
        const uint8_t *wr = w + (size_t)o * rb;
        __m512 acc[MAXT];
        for (int tt = 0; tt < T; tt++) acc[tt] = _mm512_setzero_ps();
        int b = 0;
        for (; b + 1 < nb; b += 2) {
            const uint8_t *blk = wr + (size_t)b * Q8_0_BYTES;
            /* the same spot one row ahead: rows are contiguous, so this runs ahead of the
             * hardware prefetcher, which stops at 4 KiB page boundaries (cold weights) */
            _mm_prefetch((const char *)(blk + rb), _MM_HINT_T0);
            _mm_prefetch((const char *)(blk + rb + 64), _MM_HINT_T0);
            const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 2))),
                                                 _mm256_loadu_si256((const __m256i *)(blk + Q8_0_BYTES + 2)), 1);
            const __m512i aq = _mm512_abs_epi8(q);
            const __mmask64 neg = _mm512_movepi8_mask(q);
            /* the two f16 scales side by side -> 2 x f32 */
            const __m128 dw = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)rd16(blk) | ((uint32_t)rd16(blk + Q8_0_BYTES) << 16))));
            for (int tt = 0; tt < T; tt++) {
                __m512i x = _mm512_loadu_si512((const void *)(qa + (size_t)tt * n + 32 * b));
                x = _mm512_mask_sub_epi8(x, neg, zero, x);
                const __m512i p = _mm512_dpbusd_epi32(zero, aq, x);
                const __m128 s2 = _mm_mul_ps(dw, _mm_castpd_ps(_mm_load_sd((const double *)(da + (size_t)tt * nb + b))));
                const __m512 s = _mm512_permutexvar_ps(pair, _mm512_castps128_ps512(s2));
                acc[tt] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[tt]);
            }
        }
        if (b < nb) { /* odd block count: the last block alone on a 256-bit vector */
            const uint8_t *blk = wr + (size_t)b * Q8_0_BYTES;
            const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 2));
            const __m256i aq = _mm256_sign_epi8(q, q);
            const float dw = _cvtsh_ss(rd16(blk));
            for (int tt = 0; tt < T; tt++) {
                const __m256i x = _mm256_loadu_si256((const __m256i *)(qa + (size_t)tt * n + 32 * b));
                const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aq, _mm256_sign_epi8(x, q));
                const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * da[(size_t)tt * nb + b]));
                acc[tt] = _mm512_add_ps(acc[tt], _mm512_zextps256_ps512(f));
            }
        }
        for (int tt = 0; tt < T; tt++) y[(size_t)tt * m + o] = _mm512_reduce_add_ps(acc[tt]);
    }
}
#else
/* Q8_0 block b of row `wr`: its int8 weights as stored, its f16 scale. */
static inline __attribute__((always_inline)) void SFX(q8_0_block)(const uint8_t *wr, int b, const int8_t *qa,
                                                                 const float *da, int n, int nb, __m256 *acc,
                                                                 const int T) {
    const uint8_t *blk = wr + (size_t)b * Q8_0_BYTES;
    SFX(i8_block)(_mm256_loadu_si256((const __m256i *)(blk + 2)), _cvtsh_ss(rd16(blk)), b, qa, da, n, nb, acc, T);
}

/* T tokens (a compile-time constant after inlining, so the per-token accumulators live in
 * registers) for weight rows r0..r1; `qa`, `da`, `bs` point at the chunk's first token. */
static inline __attribute__((always_inline)) void SFX(q8_0_tile)(const uint8_t *w, size_t rb, int r0, int r1,
                                                                const int8_t *qa, const float *da, int n,
                                                                float *y, int m, const int T) {
    const int nb = n / 32;
    for (int o = r0; o < r1; o++) {
        const uint8_t *wr = w + (size_t)o * rb;
        /* two blocks per step into two accumulator sets: one set alone waits on the FMA latency */
        __m256 acc[2][MAXT];
        for (int tt = 0; tt < T; tt++) acc[0][tt] = acc[1][tt] = _mm256_setzero_ps();
        int b = 0;
        for (; b + 1 < nb; b += 2) {
            SFX(q8_0_block)(wr, b, qa, da, n, nb, acc[0], T);
            SFX(q8_0_block)(wr, b + 1, qa, da, n, nb, acc[1], T);
        }
        if (b < nb) SFX(q8_0_block)(wr, b, qa, da, n, nb, acc[0], T);
        for (int tt = 0; tt < T; tt++) y[(size_t)tt * m + o] = SFX(hsum)(_mm256_add_ps(acc[0][tt], acc[1][tt]));
    }
}
#endif

static inline __attribute__((always_inline)) void SFX(q4_k_tile)(const uint8_t *w, size_t rb, int r0, int r1,
                                                                const int8_t *qa, const float *da,
                                                                const int16_t *bs, int n, float *y, int m,
                                                                const int T) {
    const int nb = n / 256;
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    for (int o = r0; o < r1; o++) {
        const uint8_t *wr = w + (size_t)o * rb;
        __m256 acc[MAXT];
        for (int tt = 0; tt < T; tt++) acc[tt] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = wr + (size_t)b * Q4_K_BYTES;
            for (int c = 0; c < Q4_K_BYTES; c += 64) _mm_prefetch((const char *)(blk + rb + c), _MM_HINT_T0); /* row ahead, as Q8_0 */
            const float d = _cvtsh_ss(rd16(blk)), dmin = _cvtsh_ss(rd16(blk + 2));
            uint8_t sc[8], mn[8];
            q4_k_scales(blk + 4, sc, mn);
            const __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn)); /* 8 x i16 */
            __m256i sumi[MAXT];
            for (int tt = 0; tt < T; tt++) sumi[tt] = _mm256_setzero_si256();
            for (int j = 0; j < 4; j++) {
                /* qs[32j .. 32j+32]: low nibbles are sub-block 2j, high nibbles sub-block 2j+1 */
                const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * j));
                const __m256i lo = _mm256_and_si256(q, low4);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
                const __m256i s_lo = _mm256_set1_epi16(sc[2 * j]), s_hi = _mm256_set1_epi16(sc[2 * j + 1]);
                for (int tt = 0; tt < T; tt++) {
                    const int8_t *x = qa + (size_t)tt * n + 256 * b + 64 * j;
                    const __m256i x_lo = _mm256_loadu_si256((const __m256i *)x);
                    const __m256i x_hi = _mm256_loadu_si256((const __m256i *)(x + 32));
                    sumi[tt] = DOT_I16(sumi[tt], _mm256_maddubs_epi16(lo, x_lo), s_lo);
                    sumi[tt] = DOT_I16(sumi[tt], _mm256_maddubs_epi16(hi, x_hi), s_hi);
                }
            }
            for (int tt = 0; tt < T; tt++) {
                const float a = da[(size_t)tt * nb + b];
                const int16_t *g = bs + ((size_t)tt * nb + b) * 16;
                /* per-32 sums of the activations from the per-16 bsums, times the 8 mins */
                const __m128i b32 = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)g),
                                                   _mm_loadu_si128((const __m128i *)(g + 8)));
                const __m128i pm = _mm_madd_epi16(mins, b32); /* 4 x i32 */
                acc[tt] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[tt]), _mm256_set1_ps(d * a), acc[tt]);
                acc[tt] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_zextsi128_si256(pm)), _mm256_set1_ps(-dmin * a),
                                          acc[tt]);
            }
        }
        for (int tt = 0; tt < T; tt++) y[(size_t)tt * m + o] = SFX(hsum)(acc[tt]);
    }
}

static inline __attribute__((always_inline)) void SFX(q6_k_tile)(const uint8_t *w, size_t rb, int r0, int r1,
                                                                const int8_t *qa, const float *da,
                                                                const int16_t *bs, int n, float *y, int m,
                                                                const int T) {
    const int nb = n / 256;
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    const __m256i m2 = _mm256_set1_epi8(0x03), m4 = _mm256_set1_epi8(0x0c);
    const __m256i m5 = _mm256_set1_epi8(0x30), m7 = _mm256_set1_epi8((char)0xc0);
    for (int o = r0; o < r1; o++) {
        const uint8_t *wr = w + (size_t)o * rb;
        __m256 acc[MAXT];
        for (int tt = 0; tt < T; tt++) acc[tt] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = wr + (size_t)b * Q6_K_BYTES;
            for (int c = 0; c < Q6_K_BYTES; c += 64) _mm_prefetch((const char *)(blk + rb + c), _MM_HINT_T0); /* row ahead, as Q8_0 */
            const float d = _cvtsh_ss(rd16(blk + 208));
            const int8_t *sc = (const int8_t *)(blk + 192);
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)); /* 16 x i16 */
            __m256i sumi[MAXT];
            for (int tt = 0; tt < T; tt++) {
                /* the −32 offset: Σ_k sc_k·32·bsum_k, subtracted up front */
                const __m256i g = _mm256_loadu_si256((const __m256i *)(bs + ((size_t)tt * nb + b) * 16));
                sumi[tt] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, g), 5));
            }
            for (int h = 0; h < 2; h++) {
                const __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
                const __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
                /* quarter k of the half: 32 six-bit values = 4 low bits | 2 high bits << 4 */
                __m256i q[4];
                q[0] = _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
                q[1] = _mm256_or_si256(_mm256_and_si256(l1, low4), _mm256_slli_epi16(_mm256_and_si256(qh, m4), 2));
                q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(qh, m5));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                       _mm256_srli_epi16(_mm256_and_si256(qh, m7), 2));
                for (int k = 0; k < 4; k++) {
                    /* values 0-15 of the quarter use scale 2k, values 16-31 scale 2k+1; maddubs
                     * keeps them in the low / high 128-bit lane */
                    const int s = 8 * h + 2 * k;
                    const __m256i s16 = _mm256_setr_m128i(_mm_set1_epi16(sc[s]), _mm_set1_epi16(sc[s + 1]));
                    for (int tt = 0; tt < T; tt++) {
                        const __m256i x = _mm256_loadu_si256(
                            (const __m256i *)(qa + (size_t)tt * n + 256 * b + 128 * h + 32 * k));
                        sumi[tt] = DOT_I16(sumi[tt], _mm256_maddubs_epi16(q[k], x), s16);
                    }
                }
            }
            for (int tt = 0; tt < T; tt++)
                acc[tt] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[tt]), _mm256_set1_ps(d * da[(size_t)tt * nb + b]),
                                          acc[tt]);
        }
        for (int tt = 0; tt < T; tt++) y[(size_t)tt * m + o] = SFX(hsum)(acc[tt]);
    }
}

/* MXFP4 block b of row `wr` as 32 int8 weights in activation order: the 16 code bytes in both
 * 128-bit lanes, low nibbles kept in the low lane (values 0-15) and high nibbles in the high lane
 * (values 16-31), then one pshufb through the KVALUES table (the same 16 bytes in each lane). */
static inline __attribute__((always_inline)) __m256i SFX(mxfp4_weights)(const uint8_t *blk, __m256i lut) {
    const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 1)));
    const __m256i nib = _mm256_blend_epi32(q, _mm256_srli_epi16(q, 4), 0xf0);
    return _mm256_shuffle_epi8(lut, _mm256_and_si256(nib, _mm256_set1_epi8(0x0f)));
}

/* MXFP4 block b: its codes looked up as int8 weights k (|k| <= 12), its E8M0 scale. */
static inline __attribute__((always_inline)) void SFX(mxfp4_block)(const uint8_t *wr, int b, const int8_t *qa,
                                                                  const float *da, int n, int nb, __m256i lut,
                                                                  __m256 *acc, const int T) {
    const uint8_t *blk = wr + (size_t)b * MXFP4_BYTES;
    SFX(i8_block)(SFX(mxfp4_weights)(blk, lut), e8m0_half(blk[0]), b, qa, da, n, nb, acc, T);
}

/* Q8_0's 256-bit tile with MXFP4 blocks (every variant; AVX-512 gets its 8 token accumulators
 * from MAXT): two blocks a step into two accumulator sets, the same spot one row ahead
 * prefetched (34 bytes a step, so every cache line of the next row). */
static inline __attribute__((always_inline)) void SFX(mxfp4_tile)(const uint8_t *w, size_t rb, int r0, int r1,
                                                                 const int8_t *qa, const float *da, int n,
                                                                 float *y, int m, const int T) {
    const int nb = n / 32;
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)MXFP4_KVALUES));
    for (int o = r0; o < r1; o++) {
        const uint8_t *wr = w + (size_t)o * rb;
        __m256 acc[2][MAXT];
        for (int tt = 0; tt < T; tt++) acc[0][tt] = acc[1][tt] = _mm256_setzero_ps();
        int b = 0;
        for (; b + 1 < nb; b += 2) {
            _mm_prefetch((const char *)(wr + (size_t)b * MXFP4_BYTES + rb), _MM_HINT_T0);
            SFX(mxfp4_block)(wr, b, qa, da, n, nb, lut, acc[0], T);
            SFX(mxfp4_block)(wr, b + 1, qa, da, n, nb, lut, acc[1], T);
        }
        if (b < nb) SFX(mxfp4_block)(wr, b, qa, da, n, nb, lut, acc[0], T);
        for (int tt = 0; tt < T; tt++) y[(size_t)tt * m + o] = SFX(hsum)(_mm256_add_ps(acc[0][tt], acc[1][tt]));
    }
}

/* Rows r0..r1 for every token: row tiles outermost, so a tile's weights are read from memory
 * once and re-read from cache for each further chunk of MAXT tokens. */
#define QDOT_CHUNKS(TILE, ...)                                                         \
    for (int rt = r0; rt < r1; rt += ROW_TILE) {                                       \
        const int re = rt + ROW_TILE < r1 ? rt + ROW_TILE : r1;                        \
        for (int t0 = 0; t0 < a->t; t0 += MAXT) {                                      \
            const int T = a->t - t0 < MAXT ? a->t - t0 : MAXT;                         \
            float *yc = y + (size_t)t0 * m;                                            \
            switch (T) {                                                               \
            case 1: TILE(__VA_ARGS__, 1); break;                                       \
            case 2: TILE(__VA_ARGS__, 2); break;                                       \
            case 3: TILE(__VA_ARGS__, 3); break;                                       \
            case 4: TILE(__VA_ARGS__, 4); break;                                       \
            case 5: if (MAXT >= 5) TILE(__VA_ARGS__, 5); break;                        \
            case 6: if (MAXT >= 6) TILE(__VA_ARGS__, 6); break;                        \
            case 7: if (MAXT >= 7) TILE(__VA_ARGS__, 7); break;                        \
            default: if (MAXT >= 8) TILE(__VA_ARGS__, 8); break;                       \
            }                                                                          \
        }                                                                              \
    }

static void SFX(q8_0_rows)(const uint8_t *w, size_t rb, int r0, int r1, const acts_t *a, float *y, int m) {
    const int nb = a->n / 32;
    QDOT_CHUNKS(SFX(q8_0_tile), w, rb, rt, re, a->qs + (size_t)t0 * a->n, a->d + (size_t)t0 * nb, a->n, yc, m)
}

static void SFX(q4_k_rows)(const uint8_t *w, size_t rb, int r0, int r1, const acts_t *a, float *y, int m) {
    const int nb = a->n / 256;
    QDOT_CHUNKS(SFX(q4_k_tile), w, rb, rt, re, a->qs + (size_t)t0 * a->n, a->d + (size_t)t0 * nb,
                a->bsums + (size_t)t0 * nb * 16, a->n, yc, m)
}

static void SFX(q6_k_rows)(const uint8_t *w, size_t rb, int r0, int r1, const acts_t *a, float *y, int m) {
    const int nb = a->n / 256;
    QDOT_CHUNKS(SFX(q6_k_tile), w, rb, rt, re, a->qs + (size_t)t0 * a->n, a->d + (size_t)t0 * nb,
                a->bsums + (size_t)t0 * nb * 16, a->n, yc, m)
}

static void SFX(mxfp4_rows)(const uint8_t *w, size_t rb, int r0, int r1, const acts_t *a, float *y, int m) {
    const int nb = a->n / 32;
    QDOT_CHUNKS(SFX(mxfp4_tile), w, rb, rt, re, a->qs + (size_t)t0 * a->n, a->d + (size_t)t0 * nb, a->n, yc, m)
}

#undef QDOT_CHUNKS

/* Dequantizers (the scalar ones above, 8 values per 256-bit vector; the same f32 operations in
 * the same order, so the same bits). Bytes widen to i32 lanes 8 at a time (cvtepu8/cvtepi8),
 * where the nibble and 2-bit fields are cut out with shifts and masks. */

static NO_CONTRACT void SFX(q8_0_dequant)(const uint8_t *w, size_t rb, int r0, int r1, int n, float *out) {
    for (int r = r0; r < r1; r++) {
        const uint8_t *wr = w + (size_t)r * rb;
        float *o = out + (size_t)(r - r0) * n;
        for (int b = 0; b < n / 32; b++, o += 32) {
            const uint8_t *blk = wr + (size_t)b * Q8_0_BYTES;
            const __m256 d = _mm256_set1_ps(_cvtsh_ss(rd16(blk)));
            for (int k = 0; k < 4; k++) {
                const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * k)));
                _mm256_storeu_ps(o + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
            }
        }
    }
}

static NO_CONTRACT void SFX(q4_k_dequant)(const uint8_t *w, size_t rb, int r0, int r1, int n, float *out) {
    const __m256i low4 = _mm256_set1_epi32(15);
    for (int r = r0; r < r1; r++) {
        const uint8_t *wr = w + (size_t)r * rb;
        float *o = out + (size_t)(r - r0) * n;
        for (int b = 0; b < n / 256; b++, o += 256) {
            const uint8_t *blk = wr + (size_t)b * Q4_K_BYTES;
            const float d = _cvtsh_ss(rd16(blk)), dmin = _cvtsh_ss(rd16(blk + 2));
            uint8_t sc[8], mn[8];
            q4_k_scales(blk + 4, sc, mn);
            for (int j = 0; j < 4; j++) {
                /* sub-block 2j: low nibbles of qs[32j .. 32j+32]; sub-block 2j+1: high nibbles */
                const __m256 a0 = _mm256_set1_ps(d * (float)sc[2 * j]), c0 = _mm256_set1_ps(dmin * (float)mn[2 * j]);
                const __m256 a1 = _mm256_set1_ps(d * (float)sc[2 * j + 1]);
                const __m256 c1 = _mm256_set1_ps(dmin * (float)mn[2 * j + 1]);
                for (int k = 0; k < 4; k++) {
                    const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 16 + 32 * j + 8 * k)));
                    const __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(q, low4));
                    const __m256 hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4));
                    _mm256_storeu_ps(o + 64 * j + 8 * k, _mm256_sub_ps(_mm256_mul_ps(a0, lo), c0));
                    _mm256_storeu_ps(o + 64 * j + 32 + 8 * k, _mm256_sub_ps(_mm256_mul_ps(a1, hi), c1));
                }
            }
        }
    }
}

static NO_CONTRACT void SFX(q6_k_dequant)(const uint8_t *w, size_t rb, int r0, int r1, int n, float *out) {
    const __m256i low4 = _mm256_set1_epi32(15), two = _mm256_set1_epi32(3), off = _mm256_set1_epi32(32);
    for (int r = r0; r < r1; r++) {
        const uint8_t *wr = w + (size_t)r * rb;
        float *o = out + (size_t)(r - r0) * n;
        for (int b = 0; b < n / 256; b++, o += 256) {
            const uint8_t *blk = wr + (size_t)b * Q6_K_BYTES;
            const float d = _cvtsh_ss(rd16(blk + 208));
            const int8_t *sc = (const int8_t *)(blk + 192);
            for (int h = 0; h < 2; h++) {
                for (int k8 = 0; k8 < 4; k8++) { /* lanes l = 8·k8 .. 8·k8+8 of every quarter */
                    const int l = 8 * k8;
                    const __m256i l0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 64 * h + l)));
                    const __m256i l1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 64 * h + 32 + l)));
                    const __m256i qh = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 128 + 32 * h + l)));
                    /* quarter k: 4 low bits | 2 high bits << 4, minus 32 */
                    __m256i q[4];
                    q[0] = _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_slli_epi32(_mm256_and_si256(qh, two), 4));
                    q[1] = _mm256_or_si256(_mm256_and_si256(l1, low4),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(qh, 2), two), 4));
                    q[2] = _mm256_or_si256(_mm256_srli_epi32(l0, 4),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(qh, 4), two), 4));
                    q[3] = _mm256_or_si256(_mm256_srli_epi32(l1, 4), _mm256_slli_epi32(_mm256_srli_epi32(qh, 6), 4));
                    for (int k = 0; k < 4; k++) {
                        /* element 128h + 32k + l: scale group (32k + l) / 16 of the half */
                        const __m256 s = _mm256_set1_ps(d * (float)sc[8 * h + 2 * k + l / 16]);
                        const __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(q[k], off));
                        _mm256_storeu_ps(o + 128 * h + 32 * k + l, _mm256_mul_ps(s, v));
                    }
                }
            }
        }
    }
}

/* MXFP4: both nibble halves through the KVALUES table (pshufb), then int8 -> f32, times d. */
static NO_CONTRACT void SFX(mxfp4_dequant)(const uint8_t *w, size_t rb, int r0, int r1, int n, float *out) {
    const __m128i lut = _mm_loadu_si128((const __m128i *)MXFP4_KVALUES), low4 = _mm_set1_epi8(0x0f);
    for (int r = r0; r < r1; r++) {
        const uint8_t *wr = w + (size_t)r * rb;
        float *o = out + (size_t)(r - r0) * n;
        for (int b = 0; b < n / 32; b++, o += 32) {
            const uint8_t *blk = wr + (size_t)b * MXFP4_BYTES;
            const __m256 d = _mm256_set1_ps(e8m0_half(blk[0]));
            const __m128i q = _mm_loadu_si128((const __m128i *)(blk + 1));
            const __m128i k[2] = {_mm_shuffle_epi8(lut, _mm_and_si128(q, low4)),                      /* 0-15 */
                                  _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), low4))}; /* 16-31 */
            for (int h = 0; h < 2; h++) {
                const __m256 v0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(k[h]));
                const __m256 v1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(k[h], 8)));
                _mm256_storeu_ps(o + 16 * h, _mm256_mul_ps(v0, d));
                _mm256_storeu_ps(o + 16 * h + 8, _mm256_mul_ps(v1, d));
            }
        }
    }
}

#endif /* QDOT_BODY */
