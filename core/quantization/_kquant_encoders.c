/* Q4_K and Q6_K encoders: llama.cpp's reference quantizers (quantize_row_q4_K_ref,
 * quantize_row_q6_K_ref in ggml/src/ggml-quants.c), written for this project.
 *
 * Bit-identity.  Every float operation of the reference is done in f32, in the same order,
 * with the same rounding helpers:
 *   - nearest_int: the (x + 1.5*2^23) bit trick, including its result for NaN, inf and
 *     |x| > 2^22 (where it is garbage, but deterministic garbage that is then clamped);
 *   - f32 -> f16 round to nearest even (as GGML_FP32_TO_FP16, F16C or software);
 *   - the sums accumulate element by element from 0 (no reassociation), the scalars keep
 *     the reference's operator grouping, and the build disables FMA contraction
 *     (-ffp-contract=off in setup.py; also forced below), so products round as in C.
 * The only freedom taken is to run independent sub-blocks side by side in SIMD lanes (GCC
 * vector extensions): lane j does exactly the scalar loop of sub-block j, so each lane's
 * result is the reference's.  Quirks kept on purpose, since they decide the bytes:
 *   - make_qkx2_quants updates `min` when a candidate wins, and later candidates use the
 *     new min both in the range (max - min) and in x - min;
 *   - a sub-block whose stored scale is 0 keeps the quants of the search (L is not reset);
 *   - make_qx_quants stores L = 0 (not 32) for an all-zero sub-block.
 *
 * Layout of the blocks: core/quantization/q4_k.py and q6_k.py (ggml-common.h byte for byte).
 *
 * Threads: pure functions of their arguments (no globals, no heap allocation); the GIL is
 * released while encoding, so callers may encode different tensors concurrently, and a
 * large input is split over per-call worker threads (see encode_parallel).
 */

#ifndef KQUANT_BODY

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#pragma GCC optimize("fp-contract=off")

#define QK_K 256
#define Q4_K_BYTES 144
#define Q6_K_BYTES 210
#define GROUP_MAX_EPS 1e-15f

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

/* Lane-wise select (m is a vector comparison result: -1 or 0 per lane). */
#define SELI(m, a, b) (((a) & (m)) | ((b) & ~(m)))
#define SELF(VI, VF, m, a, b) ((VF)SELI((m), (VI)(a), (VI)(b)))
/* nearest_int on every lane: round half to even for |x| <= 2^22 (see scalar version). */
#define NEAREST(VI, v) ((((VI)((v) + 12582912.f)) & 0x007fffff) - 0x00400000)
#define CLAMP(VI, l, lo, hi) SELI((l) < (lo), ((VI){0} + (lo)), SELI((l) > (hi), ((VI){0} + (hi)), (l)))
#define FABS(VI, VF, v) ((VF)((VI)(v) & 0x7fffffff))

#include "f16_bits.h"

#else /* KQUANT_BODY: compiled once per ISA */

/* ---------------------------------------------------------------- Q4_K (lane = sub-block) */

static inline __attribute__((always_inline)) void SFX(q4_k_block)(const float *x, uint8_t *y) {
    v8f X[32], W[32];
    v8i L[32], La[32];
    float xt[256]; /* transposed through plain memory: lane inserts into vectors are slow */
    for (int j = 0; j < 8; ++j)
        for (int i = 0; i < 32; ++i) xt[8 * i + j] = x[32 * j + i];
    memcpy(X, xt, sizeof X);

    /* weights: av_x + |x|, av_x = sqrt(mean x^2) of the sub-block */
    v8f sum_x2 = {0};
    for (int i = 0; i < 32; ++i) sum_x2 += X[i] * X[i];
    float av[8];
    v8f av_x = sum_x2 / 32.f;
    memcpy(av, &av_x, sizeof av);
    for (int j = 0; j < 8; ++j) av[j] = sqrtf(av[j]);
    memcpy(&av_x, av, sizeof av);
    for (int i = 0; i < 32; ++i) W[i] = av_x + FABS(v8i, v8f, X[i]);

    /* make_qkx2_quants(32, nmax 15, rmin -1, rdelta 0.1, nstep 20, squared error) */
    v8f mn = X[0], mx = X[0], sum_w = W[0], sum_x = W[0] * X[0];
    for (int i = 1; i < 32; ++i) {
        mn = SELF(v8i, v8f, X[i] < mn, X[i], mn);
        mx = SELF(v8i, v8f, X[i] > mx, X[i], mx);
        sum_w += W[i];
        sum_x += W[i] * X[i];
    }
    mn = SELF(v8i, v8f, mn > 0.f, (v8f){0}, mn);
    const v8i flat = mx == mn; /* the reference returns scale 0, L 0, the_min -min here */
    v8f iscale = 15.f / (mx - mn);
    v8f scale = 1.f / iscale;
    v8f best = {0};
    for (int i = 0; i < 32; ++i) {
        L[i] = CLAMP(v8i, NEAREST(v8i, iscale * (X[i] - mn)), 0, 15);
        v8f diff = scale * __builtin_convertvector(L[i], v8f) + mn - X[i];
        best += W[i] * (diff * diff);
    }
    for (int is = 0; is <= 20; ++is) {
        /* (rmin + rdelta*is + nmax) / (max - min), with min as updated by earlier winners */
        iscale = (-1.f + 0.1f * (float)is + 15.f) / (mx - mn);
        v8f sum_l = {0}, sum_l2 = {0}, sum_xl = {0};
        for (int i = 0; i < 32; ++i) {
            La[i] = CLAMP(v8i, NEAREST(v8i, iscale * (X[i] - mn)), 0, 15);
            v8f wl = W[i] * __builtin_convertvector(La[i], v8f);
            sum_l += wl;
            sum_l2 += wl * __builtin_convertvector(La[i], v8f);
            sum_xl += wl * X[i];
        }
        v8f D = sum_w * sum_l2 - sum_l * sum_l;
        v8i ok = (D > 0.f) & ~flat;
        v8f this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        v8f this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        v8i pos = this_min > 0.f;
        this_min = SELF(v8i, v8f, pos, (v8f){0}, this_min);
        this_scale = SELF(v8i, v8f, pos, sum_xl / sum_l2, this_scale);
        v8f cur = {0};
        for (int i = 0; i < 32; ++i) {
            v8f diff = this_scale * __builtin_convertvector(La[i], v8f) + this_min - X[i];
            cur += W[i] * (diff * diff);
        }
        v8i better = ok & (cur < best);
        for (int i = 0; i < 32; ++i) L[i] = SELI(better, La[i], L[i]);
        best = SELF(v8i, v8f, better, cur, best);
        scale = SELF(v8i, v8f, better, this_scale, scale);
        mn = SELF(v8i, v8f, better, this_min, mn);
    }
    for (int i = 0; i < 32; ++i) L[i] = SELI(flat, (v8i){0}, L[i]);
    scale = SELF(v8i, v8f, flat, (v8f){0}, scale);

    /* 6-bit scales and mins against the super-block maxima (scalar, reference order) */
    float scales[8], mins[8], max_scale = 0, max_min = 0;
    v8f neg_mn = -mn;
    memcpy(scales, &scale, sizeof scales);
    memcpy(mins, &neg_mn, sizeof mins);
    for (int j = 0; j < 8; ++j) {
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t ls[8], lm[8], *sc = y + 4;
    for (int j = 0; j < 8; ++j) {
        uint8_t a = (uint8_t)nearest_int(inv_scale * scales[j]); /* int -> u8 wraps, then MIN */
        uint8_t b = (uint8_t)nearest_int(inv_min * mins[j]);
        ls[j] = a < 63 ? a : 63;
        lm[j] = b < 63 ? b : 63;
    }
    for (int j = 0; j < 4; ++j) {
        sc[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
        sc[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
        sc[j + 8] = (uint8_t)((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4));
    }
    uint16_t d16 = f32_to_f16(max_scale / 63.f), dmin16 = f32_to_f16(max_min / 63.f);
    memcpy(y, &d16, 2); /* little-endian host (x86-64, aarch64) */
    memcpy(y + 2, &dmin16, 2);

    /* quants from the stored (f16 x 6-bit) scales; a zero scale keeps the search's quants */
    const float d = f16_to_f32(d16), dmin = f16_to_f32(dmin16);
    float ds[8], ms[8];
    for (int j = 0; j < 8; ++j) {
        ds[j] = d * (float)ls[j];
        ms[j] = dmin * (float)lm[j];
    }
    v8f dsub, msub;
    memcpy(&dsub, ds, sizeof ds);
    memcpy(&msub, ms, sizeof ms);
    const v8i nz = dsub != 0.f;
    for (int i = 0; i < 32; ++i)
        L[i] = SELI(nz, CLAMP(v8i, NEAREST(v8i, (X[i] + msub) / dsub), 0, 15), L[i]);

    int32_t Lt[256]; /* Lt[8*i + j] = quant i of sub-block j */
    memcpy(Lt, L, sizeof Lt);
    uint8_t *q = y + 16; /* byte 32*c + l = q[64c + l] | q[64c + 32 + l] << 4 */
    for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 32; ++l) q[32 * c + l] = (uint8_t)(Lt[8 * l + 2 * c] | (Lt[8 * l + 2 * c + 1] << 4));
}

/* ---------------------------------------------------------------- Q6_K (lane = sub-block) */

/* make_qx_quants(16, nmax 32, rmse_type 1: weights x^2) on Q6_LANES sub-blocks side by side
 * (16 with AVX-512, 8 otherwise: a 64-byte vector without AVX-512 registers is lowered by GCC
 * into scalar code for the comparisons and conversions, which ran the AVX2 copy ~8x slower
 * than its Q4_K). xs: Q6_LANES sub-blocks of 16 values, contiguous; lane j = sub-block j.
 * Writes scale[j] and the quants L[16*j + i] (l + 32, or 0 for an all-zero sub-block). */
static inline __attribute__((always_inline)) void SFX(q6_k_search)(const float *xs, float *scale_out,
                                                                  int32_t *L_out) {
    Q6F X[16];
    Q6I L[16], La[16];
    float xt[16 * Q6_LANES]; /* transposed through plain memory: lane inserts into vectors are slow */
    for (int j = 0; j < Q6_LANES; ++j)
        for (int i = 0; i < 16; ++i) xt[Q6_LANES * i + j] = xs[16 * j + i];
    memcpy(X, xt, sizeof X);

    Q6F amax = {0}, mx = {0};
    for (int i = 0; i < 16; ++i) {
        Q6F ax = FABS(Q6I, Q6F, X[i]);
        Q6I m = ax > amax;
        amax = SELF(Q6I, Q6F, m, ax, amax);
        mx = SELF(Q6I, Q6F, m, X[i], mx);
    }
    const Q6I zero = amax < GROUP_MAX_EPS; /* the reference returns scale 0 and L 0 */
    Q6F iscale = -32.f / mx;
    Q6F sumlx = {0}, suml2 = {0};
    for (int i = 0; i < 16; ++i) {
        Q6I l = CLAMP(Q6I, NEAREST(Q6I, iscale * X[i]), -32, 31);
        L[i] = l + 32;
        Q6F lf = __builtin_convertvector(l, Q6F), w = X[i] * X[i];
        sumlx += w * X[i] * lf;
        suml2 += w * lf * lf;
    }
    Q6F scale = SELF(Q6I, Q6F, suml2 != 0.f, sumlx / suml2, (Q6F){0});
    Q6F best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(32.f + 0.1f * (float)is) / mx;
        sumlx = (Q6F){0};
        suml2 = (Q6F){0};
        for (int i = 0; i < 16; ++i) {
            Q6I l = CLAMP(Q6I, NEAREST(Q6I, iscale * X[i]), -32, 31);
            La[i] = l + 32;
            Q6F lf = __builtin_convertvector(l, Q6F), w = X[i] * X[i];
            sumlx += w * X[i] * lf;
            suml2 += w * lf * lf;
        }
        Q6I better = (suml2 > 0.f) & (sumlx * sumlx > best * suml2);
        for (int i = 0; i < 16; ++i) L[i] = SELI(better, La[i], L[i]);
        scale = SELF(Q6I, Q6F, better, sumlx / suml2, scale);
        best = SELF(Q6I, Q6F, better, scale * sumlx, best);
    }
    for (int i = 0; i < 16; ++i) L[i] = SELI(zero, (Q6I){0}, L[i]);
    scale = SELF(Q6I, Q6F, zero, (Q6F){0}, scale);
    memcpy(scale_out, &scale, sizeof scale);
    int32_t Lt[16 * Q6_LANES];
    memcpy(Lt, L, sizeof Lt);
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < Q6_LANES; ++j) L_out[16 * j + i] = Lt[Q6_LANES * i + j];
}

static inline __attribute__((always_inline)) void SFX(q6_k_block)(const float *x, uint8_t *y) {
    float scales[16];
    int32_t L[QK_K]; /* element order: L[16*j + i] */
    for (int g = 0; g < 16; g += Q6_LANES) SFX(q6_k_search)(x + 16 * g, scales + g, L + 16 * g);

    /* int8 sub-block scales against the one of largest magnitude (scalar, reference order) */
    float max_scale = 0, max_abs_scale = 0;
    for (int j = 0; j < 16; ++j) {
        float a = fabsf(scales[j]);
        if (a > max_abs_scale) {
            max_abs_scale = a;
            max_scale = scales[j];
        }
    }
    if (max_abs_scale < GROUP_MAX_EPS) {
        memset(y, 0, Q6_K_BYTES); /* d = +0.0 in f16 is all zero bits too */
        return;
    }
    float isc = -128.f / max_scale;
    uint16_t d16 = f32_to_f16(1 / isc);
    int8_t *sc = (int8_t *)(y + 192);
    for (int j = 0; j < 16; ++j) {
        int l = nearest_int(isc * scales[j]);
        sc[j] = (int8_t)(l < 127 ? l : 127);
    }
    memcpy(y + 208, &d16, 2);

    /* quants from the stored (f16 x int8) scales, a sub-block per 16 values in element order;
     * a zero scale keeps the search's quants */
    const float d = f16_to_f32(d16);
    for (int j = 0; j < 16; ++j) {
        const float dl = d * (float)sc[j];
        if (dl == 0.f) continue;
        for (int i = 0; i < 16; i += 8) {
            v8f v;
            v8i l;
            memcpy(&v, x + 16 * j + i, sizeof v);
            l = CLAMP(v8i, NEAREST(v8i, v / dl), -32, 31) + 32;
            memcpy(L + 16 * j + i, &l, sizeof l);
        }
    }

    uint8_t *ql = y, *qh = y + 128;
    for (int h = 0; h < 2; ++h) {
        const int32_t *Lh = L + 128 * h;
        for (int l = 0; l < 32; ++l) {
            ql[64 * h + l] = (uint8_t)((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
            ql[64 * h + 32 + l] = (uint8_t)((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
            qh[32 * h + l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                                       ((Lh[l + 96] >> 4) << 6));
        }
    }
}

static void SFX(q4_k_rows)(const float *x, uint8_t *y, Py_ssize_t nb) {
    for (Py_ssize_t b = 0; b < nb; ++b) SFX(q4_k_block)(x + QK_K * b, y + Q4_K_BYTES * b);
}

static void SFX(q6_k_rows)(const float *x, uint8_t *y, Py_ssize_t nb) {
    for (Py_ssize_t b = 0; b < nb; ++b) SFX(q6_k_block)(x + QK_K * b, y + Q6_K_BYTES * b);
}

#endif /* KQUANT_BODY */

#ifndef KQUANT_BODY
/* ISA copies of the kernels: the body below is compiled once per `#pragma GCC target`
 * region by including this file into itself (a function-level target attribute gave GCC
 * much worse code for the 64-byte vector types).  The arithmetic is the same IEEE f32 in
 * every copy (no FMA: contraction is off), so all copies produce the same bytes; the tests
 * compare them.  The copy is chosen per call from __builtin_cpu_supports. */
typedef void (*rows_fn)(const float *, uint8_t *, Py_ssize_t);

#define KQUANT_BODY
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KQUANT_X86 1
#define SFX(name) name##_avx512
#define Q6_LANES 16
#define Q6F v16f
#define Q6I v16i
#pragma GCC push_options
#pragma GCC target("avx512f")
#include "_kquant_encoders.c"
#pragma GCC pop_options
#undef SFX
#undef Q6_LANES
#undef Q6F
#undef Q6I
#define SFX(name) name##_avx2
#define Q6_LANES 8
#define Q6F v8f
#define Q6I v8i
#pragma GCC push_options
#pragma GCC target("avx2")
#include "_kquant_encoders.c"
#pragma GCC pop_options
#undef SFX
#undef Q6_LANES
#undef Q6F
#undef Q6I
#endif
#define SFX(name) name##_scalar
#define Q6_LANES 8
#define Q6F v8f
#define Q6I v8i
#include "_kquant_encoders.c"
#undef SFX
#undef Q6_LANES
#undef Q6F
#undef Q6I
#undef KQUANT_BODY

/* The kernels of `variant` ("avx512", "avx2", "scalar"; NULL: the best this CPU runs), or -1
 * (with ValueError set) when the name is unknown or the CPU lacks it. "scalar" is the
 * portable copy (no target pragma: SSE2 on x86-64, the compiler's baseline elsewhere). */
static int pick_variant(const char *variant, rows_fn *q4, rows_fn *q6) {
#ifdef KQUANT_X86
    __builtin_cpu_init();
    int has512 = __builtin_cpu_supports("avx512f"), has2 = __builtin_cpu_supports("avx2");
    if ((variant == NULL && has512) || (variant && strcmp(variant, "avx512") == 0 && has512)) {
        *q4 = q4_k_rows_avx512;
        *q6 = q6_k_rows_avx512;
        return 0;
    }
    if ((variant == NULL && has2) || (variant && strcmp(variant, "avx2") == 0 && has2)) {
        *q4 = q4_k_rows_avx2;
        *q6 = q6_k_rows_avx2;
        return 0;
    }
#endif
    if (variant == NULL || strcmp(variant, "scalar") == 0) {
        *q4 = q4_k_rows_scalar;
        *q6 = q6_k_rows_scalar;
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "encoder variant '%s' is unknown or not supported by this CPU", variant);
    return -1;
}

/* ---------------------------------------------------------------- threads */

/* Large inputs are split into contiguous runs of blocks, one per online CPU (at most
 * MAX_THREADS), each encoded by its own short-lived thread: blocks are independent, so the
 * bytes do not depend on the split.  Threads are created per call and joined before
 * returning (no pool, no global state); small inputs stay on the calling thread. */
#define MAX_THREADS 8
#define BLOCKS_PER_THREAD 64 /* below this a thread costs more than it saves */

typedef struct {
    rows_fn rows;
    const float *x;
    uint8_t *y;
    Py_ssize_t nb;
} job_t;

static void *run_job(void *arg) {
    job_t *job = arg;
    job->rows(job->x, job->y, job->nb);
    return NULL;
}

static void encode_parallel(rows_fn rows, const float *x, uint8_t *y, Py_ssize_t nb, Py_ssize_t type_size) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    Py_ssize_t nt = cpus < 1 ? 1 : (cpus > MAX_THREADS ? MAX_THREADS : cpus);
    if (nt > nb / BLOCKS_PER_THREAD) nt = nb / BLOCKS_PER_THREAD;
    if (nt <= 1) {
        rows(x, y, nb);
        return;
    }
    job_t jobs[MAX_THREADS];
    pthread_t tids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    Py_ssize_t per = (nb + nt - 1) / nt, b0 = 0;
    for (Py_ssize_t t = 0; t < nt; ++t) {
        Py_ssize_t n = nb - b0 < per ? nb - b0 : per;
        jobs[t] = (job_t){rows, x + QK_K * b0, y + type_size * b0, n};
        b0 += n;
    }
    for (Py_ssize_t t = 1; t < nt; ++t) started[t] = pthread_create(&tids[t], NULL, run_job, &jobs[t]) == 0;
    run_job(&jobs[0]);
    for (Py_ssize_t t = 1; t < nt; ++t) {
        if (started[t])
            pthread_join(tids[t], NULL);
        else
            run_job(&jobs[t]); /* no thread available: do that run here */
    }
}

/* ---------------------------------------------------------------- Python bindings */

/* src: C-contiguous f32 buffer; dst: writable C-contiguous buffer.  ValueError otherwise. */
static int get_buffers(PyObject *src_obj, PyObject *dst_obj, Py_buffer *src, Py_buffer *dst) {
    if (PyObject_GetBuffer(src_obj, src, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "src must be a C-contiguous float32 buffer");
        return -1;
    }
    if (src->itemsize != 4 || src->format == NULL || strcmp(src->format, "f") != 0) {
        if (!(src->itemsize == 4 && src->format && (strcmp(src->format, "<f") == 0 || strcmp(src->format, "=f") == 0))) {
            PyErr_Format(PyExc_ValueError, "src must be float32, got format '%s'", src->format ? src->format : "B");
            PyBuffer_Release(src);
            return -1;
        }
    }
    if (PyObject_GetBuffer(dst_obj, dst, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "dst must be a writable C-contiguous buffer");
        PyBuffer_Release(src);
        return -1;
    }
    const char *s = src->buf, *d = dst->buf;
    if (src->len > 0 && dst->len > 0 && s < d + dst->len && d < s + src->len) {
        PyErr_SetString(PyExc_ValueError, "src and dst overlap");
        PyBuffer_Release(src);
        PyBuffer_Release(dst);
        return -1;
    }
    return 0;
}

static PyObject *encode(PyObject *args, const char *name, Py_ssize_t type_size, int six) {
    PyObject *src_obj, *dst_obj;
    const char *variant = NULL;
    Py_buffer src, dst;
    rows_fn q4, q6;
    if (!PyArg_ParseTuple(args, "OO|z", &src_obj, &dst_obj, &variant)) return NULL;
    if (pick_variant(variant, &q4, &q6) < 0) return NULL;
    if (get_buffers(src_obj, dst_obj, &src, &dst) < 0) return NULL;
    Py_ssize_t n = src.len / 4;
    if (n % QK_K != 0) {
        PyErr_Format(PyExc_ValueError, "%s: %zd values is not a multiple of %d", name, n, QK_K);
        goto fail;
    }
    Py_ssize_t nb = n / QK_K;
    if (dst.len != nb * type_size) {
        PyErr_Format(PyExc_ValueError, "%s: %zd blocks need %zd dst bytes, got %zd", name, nb, nb * type_size,
                     dst.len);
        goto fail;
    }
    rows_fn rows = six ? q6 : q4;
    Py_BEGIN_ALLOW_THREADS
    encode_parallel(rows, (const float *)src.buf, (uint8_t *)dst.buf, nb, type_size);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return NULL;
}

static PyObject *py_quantize_q4_k(PyObject *self, PyObject *args) {
    (void)self;
    return encode(args, "quantize_q4_k", Q4_K_BYTES, 0);
}

static PyObject *py_quantize_q6_k(PyObject *self, PyObject *args) {
    (void)self;
    return encode(args, "quantize_q6_k", Q6_K_BYTES, 1);
}

static PyObject *py_variants(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    rows_fn q4, q6;
    const char *names[] = {"avx512", "avx2", "scalar"};
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (int i = 0; i < 3; ++i) {
        if (pick_variant(names[i], &q4, &q6) < 0) {
            PyErr_Clear();
            continue;
        }
        PyObject *item = PyUnicode_FromString(names[i]);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    return out;
}

static PyObject *py_f32_to_f16(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *src_obj, *dst_obj;
    Py_buffer src, dst;
    if (!PyArg_ParseTuple(args, "OO", &src_obj, &dst_obj)) return NULL;
    if (get_buffers(src_obj, dst_obj, &src, &dst) < 0) return NULL;
    Py_ssize_t n = src.len / 4;
    if (dst.len != 2 * n) {
        PyErr_Format(PyExc_ValueError, "f32_to_f16: %zd values need %zd dst bytes, got %zd", n, 2 * n, dst.len);
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return NULL;
    }
    const float *s = src.buf;
    uint8_t *d = dst.buf;
    for (Py_ssize_t i = 0; i < n; ++i) {
        uint16_t h = f32_to_f16(s[i]);
        memcpy(d + 2 * i, &h, 2);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"quantize_q4_k", py_quantize_q4_k, METH_VARARGS,
     "quantize_q4_k(src, dst, variant=None): f32 buffer (n % 256 == 0) -> n/256 block_q4_K (144 bytes each) in\n"
     "dst, as llama.cpp's quantize_row_q4_K_ref.  variant picks a kernel copy (None: the best).  Releases the GIL.\n"
     "ValueError on a bad buffer, size or variant."},
    {"quantize_q6_k", py_quantize_q6_k, METH_VARARGS,
     "quantize_q6_k(src, dst, variant=None): f32 buffer (n % 256 == 0) -> n/256 block_q6_K (210 bytes each) in\n"
     "dst, as llama.cpp's quantize_row_q6_K_ref.  variant picks a kernel copy (None: the best).  Releases the GIL.\n"
     "ValueError on a bad buffer, size or variant."},
    {"variants", py_variants, METH_NOARGS,
     "variants() -> the kernel copies this CPU runs, best first (the default is the first): avx512, avx2, scalar."},
    {"f32_to_f16", py_f32_to_f16, METH_VARARGS,
     "f32_to_f16(src, dst): the f16 rounding the encoders use (nearest even), for tests."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kquant_encoders", "llama.cpp reference Q4_K / Q6_K encoders (C).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kquant_encoders(void) { return PyModule_Create(&module); }

#endif /* !KQUANT_BODY */
