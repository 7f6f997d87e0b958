/* The receipt sketch of Q8_0 rows in C: per row the k values of largest |value| (ties to the lower
 * index), their indices ascending, then the values' f32 bits. The same rule and the same float
 * products as apps/receipts/topk_kernel.py's numba kernel, so the bytes are the same
 * (tests/receipts/test_sketch_kernel.py compares every variant with the numpy reference over random,
 * tied, saturated and non-finite rows). The scalar variant takes the numba kernel's passes:
 *
 *   1. each block's scale |f16 -> f32| (a table from the caller, the one every decoder uses);
 *   2. each block's largest |value|: |scale| times its largest |int8|;
 *   3. the floor: the k-th largest block maximum (k values reach it, so a block below holds none
 *      of the top k);
 *   4. the blocks at or above the floor, and in them only the int8s that can reach it, go through
 *      the selection in index order (a value replaces the weakest kept one only when strictly
 *      greater).
 *
 * The AVX2 variant (sketch_row_avx2) keeps 1-3 but without the branches that scalar loops mispredict
 * on every new row: eight scales and eight blocks' maxima at a time, the floor found by counting, and
 * for step 4 the values at or above the floor gathered by a bit mask a block, then the k-th largest
 * of those found by counting too. Chosen at run time with __builtin_cpu_supports; the scalar variant
 * runs everywhere else and can be forced by name (the tests run both). One call sketches several
 * answers (a multi-expert request's batches) and says per answer whether its scales were all finite.
 * The GIL is released while a call computes. No fast-math: the products and compares must be the
 * IEEE ones.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

#define QK 32   /* values per Q8_0 block */
#define QB 34   /* bytes per block: f16 scale, 32 int8 */

/* Insert feature j of magnitude m into the kept set (|value| descending, index ascending); the new
 * fill count. Called only when the set is not full or m beats its weakest. */
static inline int keep(float *mags, int32_t *idx, int filled, int k, float m, int32_t j) {
    int p = filled < k ? filled : k - 1;
    while (p > 0 && mags[p - 1] < m) {
        mags[p] = mags[p - 1];
        idx[p] = idx[p - 1];
        p--;
    }
    mags[p] = m;
    idx[p] = j;
    return filled < k ? filled + 1 : k;
}

static inline uint16_t u16_at(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void sort_indices(int32_t *idx, int k) {
    if (k > 32) {
        qsort(idx, (size_t)k, sizeof(int32_t), cmp_i32);
        return;
    }
    for (int i = 1; i < k; i++) {
        int32_t v = idx[i];
        int p = i;
        while (p > 0 && idx[p - 1] > v) {
            idx[p] = idx[p - 1];
            p--;
        }
        idx[p] = v;
    }
}

typedef struct {
    float *scales, *block_max, *mags, *cand_m, *tmp;  /* nb, nb, k, d, max(nb, d) + 8 */
    int32_t *idx, *cand_j;  /* k, d */
} scratch_t;

/* The largest |int8| of q[0:stop] (128 for -128). */
static inline int max_abs_scalar(const int8_t *q, int stop) {
    int hi = -128, lo = 127;
    for (int i = 0; i < stop; i++) {
        if (q[i] > hi) hi = q[i];
        if (q[i] < lo) lo = q[i];
    }
    return hi > -lo ? hi : -lo;
}

/* Values of block q[0:stop] whose |int8| >= need, through the selection in index order. */
static inline int scan_scalar(const int8_t *q, int stop, int need, float scale, int32_t first, float *mags,
                              int32_t *idx, int filled, int k) {
    for (int i = 0; i < stop; i++) {
        int a = q[i] < 0 ? -q[i] : q[i];
        if (a >= need) {
            float m = scale * (float)a;
            if (filled < k || m > mags[k - 1]) filled = keep(mags, idx, filled, k, m, first + i);
        }
    }
    return filled;
}

/* The row's tail after the selection: indices (ascending already), then the f32 bits of the values. */
static void write_sorted(const uint8_t *row, const float *lut, const int32_t *idx, int k, uint32_t *out) {
    for (int c = 0; c < k; c++) {  /* the values as the decoder computes them: the table's scale times the int8 */
        int32_t j = idx[c];
        const uint8_t *blk = row + (size_t)(j / QK) * QB;
        float value = lut[u16_at(blk)] * (float)((const int8_t *)blk)[2 + j % QK];
        out[c] = (uint32_t)j;
        memcpy(&out[k + c], &value, sizeof(float));
    }
}

static void write_row(const uint8_t *row, const float *lut, int32_t *idx, int k, uint32_t *out) {
    sort_indices(idx, k);
    write_sorted(row, lut, idx, k, out);
}

/* Passes 1 and 3 (the floor), shared by both variants; block_max must be filled when it returns
 * >= 0. Returns the floor, or -1 when every block must be scanned (a non-finite scale, or fewer
 * blocks than k). */
static inline float floor_of(const scratch_t *s, int nb, int k, int finite) {
    if (!finite || nb < k) return -1.0f;
    int held = 0;
    for (int b = 0; b < nb; b++)
        if (held < k || s->block_max[b] > s->mags[k - 1]) held = keep(s->mags, s->idx, held, k, s->block_max[b], b);
    return s->mags[k - 1];
}

static inline int need_of(float floor, float scale) {
    if (!(floor > 0 && scale > 0)) return 0;
    float x = floor / scale;
    if (!(x <= 256.0f)) x = 256.0f;  /* min(x, 256) */
    return (int32_t)x - 1;  /* one less for the product's rounding */
}

static int scales_of(const uint8_t *row, int nb, const float *lut, float *scales) {
    int finite = 1;
    for (int b = 0; b < nb; b++) {
        scales[b] = fabsf(lut[u16_at(row + (size_t)b * QB)]);
        finite = finite && isfinite(scales[b]);
    }
    return finite;
}

static int sketch_row_scalar(const uint8_t *row, int d, int k, const float *lut, scratch_t *s, uint32_t *out) {
    int nb = (d + QK - 1) / QK;
    int finite = scales_of(row, nb, lut, s->scales);
    if (finite && nb >= k)
        for (int b = 0; b < nb; b++) {
            int stop = d - b * QK < QK ? d - b * QK : QK;
            s->block_max[b] = s->scales[b] * (float)max_abs_scalar((const int8_t *)row + (size_t)b * QB + 2, stop);
        }
    float floor = floor_of(s, nb, k, finite);
    int filled = 0;
    for (int b = 0; b < nb; b++) {
        if (floor >= 0 && s->block_max[b] < floor) continue;
        float scale = s->scales[b];
        if (filled == k && scale * 128.0f <= s->mags[k - 1]) continue;  /* no value here beats the weakest */
        int stop = d - b * QK < QK ? d - b * QK : QK;
        filled = scan_scalar((const int8_t *)row + (size_t)b * QB + 2, stop, need_of(floor, scale), scale, b * QK,
                             s->mags, s->idx, filled, k);
    }
    write_row(row, lut, s->idx, k, out);
    return finite;
}

#if HAVE_X86
#pragma GCC push_options
#pragma GCC target("avx2,f16c")

static inline __m256i abs_block(const uint8_t *blk) {
    return _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *)(blk + 2)));  /* -128 stays 0x80: 128 unsigned */
}

static inline int hmax_u8(__m256i v) {
    __m128i m = _mm_max_epu8(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 8));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 4));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 2));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 1));
    return _mm_cvtsi128_si32(m) & 0xff;
}

/* scales_of with the CPU's f16 conversion: the table is 256 KB, and 64 lookups a row into it missed
 * L1 often enough to cost half the row (more rows, more misses). The conversion is exact; only a NaN's
 * payload can differ from the table's, and a NaN scale only takes part in compares (the values
 * written come from the table). */
static inline int scales_f16c(const uint8_t *row, int nb, float *scales) {
    const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(INFINITY);
    int b = 0, finite = 1;
    for (; b + 8 <= nb; b += 8) {  /* eight scales at a time: one conversion, one finiteness test */
        const uint8_t *p = row + (size_t)b * QB;
        __m128i h = _mm_setr_epi16((short)u16_at(p), (short)u16_at(p + QB), (short)u16_at(p + 2 * QB),
                                   (short)u16_at(p + 3 * QB), (short)u16_at(p + 4 * QB), (short)u16_at(p + 5 * QB),
                                   (short)u16_at(p + 6 * QB), (short)u16_at(p + 7 * QB));
        __m256 x = _mm256_andnot_ps(sign, _mm256_cvtph_ps(h));
        _mm256_storeu_ps(scales + b, x);
        finite &= _mm256_movemask_ps(_mm256_cmp_ps(x, inf, _CMP_LT_OQ)) == 0xff;  /* NaN compares false */
    }
    for (; b < nb; b++) {
        scales[b] = fabsf(_cvtsh_ss(u16_at(row + (size_t)b * QB)));
        finite &= isfinite(scales[b]) != 0;
    }
    return finite;
}

/* The largest |int8| of eight consecutive blocks, as f32 [8]: the 8 x 32 bytes reduced together by a
 * transpose (interleave two vectors, keep the larger of each pair), a third of the instructions of
 * eight hmax_u8. After the three rounds each byte belongs to one block, in the order 0..7 per 8 bytes. */
static inline __m256 max_abs_8_blocks(const uint8_t *blk) {
    __m256i a[8];
    for (int i = 0; i < 8; i++) a[i] = abs_block(blk + (size_t)i * QB);
    __m256i t[4], u[2];
    for (int i = 0; i < 4; i++)
        t[i] = _mm256_max_epu8(_mm256_unpacklo_epi8(a[2 * i], a[2 * i + 1]),
                               _mm256_unpackhi_epi8(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        u[i] = _mm256_max_epu8(_mm256_unpacklo_epi16(t[2 * i], t[2 * i + 1]),
                               _mm256_unpackhi_epi16(t[2 * i], t[2 * i + 1]));
    __m256i v = _mm256_max_epu8(_mm256_unpacklo_epi32(u[0], u[1]), _mm256_unpackhi_epi32(u[0], u[1]));
    v = _mm256_max_epu8(v, _mm256_srli_si256(v, 8));
    __m128i m = _mm_max_epu8(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m));
}

/* A lower bound of the k-th largest of v[0:n] (all >= 0, none NaN) that k of them reach. Up to k = 32:
 * each of 8 lanes keeps its j = ceil(k/8) largest of the values v[i], i = lane mod 8, and the least of
 * the lanes' j-th is reached by j values in each lane (8j >= k); a lane with fewer than j values has
 * -inf there, and so does the bound (still a bound: every value passes it). Above 32, the least of the
 * maxima of k disjoint groups. */
static inline float lower_bound(const float *v, int n, int k) {
    if (k > 32) {
        int width = n / k;
        float bound = INFINITY;
        for (int g = 0; g < k; g++) {
            float top = v[g * width];
            for (int i = g * width + 1; i < (g + 1) * width; i++) top = v[i] > top ? v[i] : top;
            bound = top < bound ? top : bound;
        }
        return bound;
    }
    int j = (k + 7) / 8;
    __m256 top[4];
    for (int t = 0; t < 4; t++) top[t] = _mm256_set1_ps(-INFINITY);
    for (int i = 0; i < n; i += 8) {
        __m256 x;
        if (i + 8 <= n) {
            x = _mm256_loadu_ps(v + i);
        } else {
            float tail[8];
            for (int q = 0; q < 8; q++) tail[q] = i + q < n ? v[i + q] : -INFINITY;
            x = _mm256_loadu_ps(tail);
        }
        for (int t = 0; t < j; t++) {  /* insert x into each lane's sorted top j */
            __m256 hi = _mm256_max_ps(top[t], x);
            x = _mm256_min_ps(top[t], x);
            top[t] = hi;
        }
    }
    __m256 least = top[j - 1];
    __m128 h = _mm_min_ps(_mm256_castps256_ps128(least), _mm256_extractf128_ps(least, 1));
    h = _mm_min_ps(h, _mm_movehl_ps(h, h));
    h = _mm_min_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

/* The k-th largest of v[0:n] (n >= k, all >= 0, none NaN), without data-dependent branches: it is the
 * least v_i that fewer than k values exceed. The lower bound keeps only the v_i that can be it, then
 * each kept v_i counts the kept values above it (eight v_i at a time). tmp: n + 8 floats. */
static float kth_largest(const float *v, int n, int k, float *tmp) {
    float bound = lower_bound(v, n, k);
    int m = 0;
    for (int i = 0; i < n; i++) {
        tmp[m] = v[i];
        m += v[i] >= bound;
    }
    for (int i = m; i < ((m + 7) & ~7); i++) tmp[i] = -INFINITY;  /* exceeds nothing, and m >= k values exceed it */
    __m256 kth = _mm256_set1_ps(INFINITY);
    __m256i fewer = _mm256_set1_epi32(k);
    for (int i = 0; i < m; i += 8) {  /* eight v_i at a time, each against every kept v_j */
        __m256 x = _mm256_loadu_ps(tmp + i);
        __m256i above = _mm256_setzero_si256();
        for (int j = 0; j < m; j++)
            above = _mm256_sub_epi32(above, _mm256_castps_si256(_mm256_cmp_ps(_mm256_broadcast_ss(tmp + j), x,
                                                                                _CMP_GT_OQ)));
        __m256 it = _mm256_castsi256_ps(_mm256_cmpgt_epi32(fewer, above));
        kth = _mm256_min_ps(kth, _mm256_blendv_ps(_mm256_set1_ps(INFINITY), x, it));
    }
    __m128 h = _mm_min_ps(_mm256_castps256_ps128(kth), _mm256_extractf128_ps(kth, 1));
    h = _mm_min_ps(h, _mm_movehl_ps(h, h));
    h = _mm_min_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

/* Rows whose scales are all finite (the others go the scalar way, whose compares NaN takes part in):
 *   1. scales (the CPU's f16 conversion) and block maxima, eight blocks at a time;
 *   2. the floor: the k-th largest block maximum, by kth_largest;
 *   3. the candidates: every value >= floor (at least k: each of k blocks' largest), in index order;
 *   4. t, the k-th largest candidate: the sketch is every candidate above t and the first of those at
 *      t, already in index order. topk_reference's rule, with a branch per block and per candidate
 *      instead of per value and per insertion (a rare row with more than CANDIDATES_COUNTED candidates,
 *      as a row of equal values, goes through the insertion rule instead). */
#define CANDIDATES_COUNTED 256

static int sketch_row_avx2(const uint8_t *row, int d, int k, const float *lut, scratch_t *s, uint32_t *out) {
    int nb = (d + QK - 1) / QK;
    int full = d / QK;  /* a last partial block: padding is not a feature, so it is read by the scalar loops */
    if (!scales_f16c(row, nb, s->scales) || nb < k) return sketch_row_scalar(row, d, k, lut, s, out);
    int b = 0;
    for (; b + 8 <= full; b += 8)
        _mm256_storeu_ps(s->block_max + b, _mm256_mul_ps(_mm256_loadu_ps(s->scales + b),
                                                         max_abs_8_blocks(row + (size_t)b * QB)));
    for (; b < full; b++)
        s->block_max[b] = s->scales[b] * (float)hmax_u8(abs_block(row + (size_t)b * QB));
    if (full < nb)
        s->block_max[full] = s->scales[full] * (float)max_abs_scalar((const int8_t *)row + (size_t)full * QB + 2,
                                                                    d - full * QK);
    float floor = kth_largest(s->block_max, nb, k, s->tmp);
    int c = 0;
    for (int b = 0; b < nb; b++) {
        if (s->block_max[b] < floor) continue;
        float scale = s->scales[b];
        int need = need_of(floor, scale);
        const uint8_t *blk = row + (size_t)b * QB;
        __m256i n = _mm256_set1_epi8((char)(uint8_t)(need > 0 ? need : 0));
        __m256i a = abs_block(blk);  /* the partial block's padding is masked off below */
        uint32_t mask = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_max_epu8(a, n), a));  /* a >= need */
        if (b == full) mask &= (1u << (d - full * QK)) - 1;
        const int8_t *q = (const int8_t *)blk + 2;
        while (mask) {
            int i = __builtin_ctz(mask);
            mask &= mask - 1;
            float m = scale * (float)(q[i] < 0 ? -q[i] : q[i]);
            s->cand_m[c] = m;
            s->cand_j[c] = b * QK + i;
            c += m >= floor;
        }
    }
    if (c > CANDIDATES_COUNTED) {
        int filled = 0;
        for (int i = 0; i < c; i++)
            if (filled < k || s->cand_m[i] > s->mags[k - 1])
                filled = keep(s->mags, s->idx, filled, k, s->cand_m[i], s->cand_j[i]);
        write_row(row, lut, s->idx, k, out);
        return 1;
    }
    float t = kth_largest(s->cand_m, c, k, s->tmp);
    int above = 0;
    for (int i = 0; i < c; i++) above += s->cand_m[i] > t;
    int room = k - above, ties = 0, pos = 0;
    for (int i = 0; i < c; i++) {
        int at = s->cand_m[i] == t;
        s->idx[pos] = s->cand_j[i];
        pos += (s->cand_m[i] > t) | (at & (ties < room));
        ties += at;
    }
    write_sorted(row, lut, s->idx, k, out);  /* gathered in index order: already sorted */
    return 1;
}

#pragma GCC pop_options

static int has_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"); }
#else
static int has_avx2(void) { return 0; }
#endif

typedef int (*row_fn)(const uint8_t *, int, int, const float *, scratch_t *, uint32_t *);

static const char *best_variant(void) { return has_avx2() ? "avx2" : "scalar"; }

static PyObject *variants(PyObject *self, PyObject *noargs) {
    return has_avx2() ? Py_BuildValue("[ss]", "avx2", "scalar") : Py_BuildValue("[s]", "scalar");
}

static row_fn variant_named(const char *name) {
    if (!*name) name = best_variant();
    if (strcmp(name, "scalar") == 0) return sketch_row_scalar;
#if HAVE_X86
    if (strcmp(name, "avx2") == 0 && has_avx2()) return sketch_row_avx2;
#endif
    return NULL;
}

/* sketch_q8_0(parts, d_model, k, lut, out, variant="") -> tuple[bool, ...]
 * parts: buffers of whole Q8_0 rows (ceil(d/32) * 34 bytes each), sketched in one call, their rows
 * one after another into out (writable uint32 [all rows, 2k]); lut: f32[65536]. Returns, per part,
 * whether every block scale is finite (so are its rows: a Q8_0 value is its scale times an int8). */
static PyObject *sketch_q8_0(PyObject *self, PyObject *args) {
    PyObject *parts_arg;
    Py_buffer lut, out;
    Py_ssize_t d, k;
    const char *name = "";
    if (!PyArg_ParseTuple(args, "Onny*w*|s", &parts_arg, &d, &k, &lut, &out, &name)) return NULL;
    PyObject *result = NULL, *parts = PySequence_Fast(parts_arg, "parts must be a sequence of buffers");
    Py_ssize_t n = parts ? PySequence_Fast_GET_SIZE(parts) : 0, got = 0, rows = 0;
    Py_buffer *views = parts ? PyMem_Calloc((size_t)n + 1, sizeof(Py_buffer)) : NULL;
    char *finite = parts ? PyMem_Calloc((size_t)n + 1, 1) : NULL;
    Py_ssize_t nb = d > 0 ? (d + QK - 1) / QK : 0;
    row_fn fn = variant_named(name);
    if (!parts) {
        goto done;
    } else if (!views || !finite) {
        PyErr_NoMemory();
        goto done;
    } else if (d < 1 || k < 1 || k > d || d > INT32_MAX / 2) {
        PyErr_Format(PyExc_ValueError, "need 1 <= k <= d_model, got d_model %zd, k %zd", d, k);
        goto done;
    } else if (lut.len != 65536 * (Py_ssize_t)sizeof(float)) {
        PyErr_SetString(PyExc_ValueError, "the f16 table must be f32[65536]");
        goto done;
    } else if (!fn) {
        PyErr_Format(PyExc_ValueError, "no sketch variant %s on this CPU", name);
        goto done;
    }
    for (; got < n; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(parts, got), &views[got], PyBUF_SIMPLE) < 0) goto done;
        if (views[got].len % (nb * QB)) {
            PyErr_Format(PyExc_ValueError, "part %zd has %zd bytes, not whole Q8_0 rows of %zd", got, views[got].len,
                         nb * QB);
            got++;
            goto done;
        }
        rows += views[got].len / (nb * QB);
    }
    if (out.len != rows * 2 * k * (Py_ssize_t)sizeof(uint32_t)) {
        PyErr_Format(PyExc_ValueError, "out must be uint32 [%zd, %zd]", rows, 2 * k);
        goto done;
    }
    size_t floats = (size_t)(2 * nb + k + 2 * d + 8), ints = (size_t)(k + d);
    float *buf = malloc(sizeof(float) * floats + sizeof(int32_t) * ints);
    if (!buf) {
        PyErr_NoMemory();
        goto done;
    }
    int32_t *ibuf = (int32_t *)(buf + floats);
    scratch_t s = {buf, buf + nb, buf + 2 * nb, buf + 2 * nb + k, buf + 2 * nb + k + d, ibuf, ibuf + k};
    Py_BEGIN_ALLOW_THREADS
    uint32_t *dst = (uint32_t *)out.buf;
    for (Py_ssize_t p = 0; p < n; p++) {
        finite[p] = 1;
        for (Py_ssize_t r = 0; r < views[p].len / (nb * QB); r++, dst += 2 * k)
            finite[p] &= (char)fn((const uint8_t *)views[p].buf + r * nb * QB, (int)d, (int)k, (const float *)lut.buf,
                                  &s, dst);
    }
    Py_END_ALLOW_THREADS
    free(buf);
    result = PyTuple_New(n);
    for (Py_ssize_t p = 0; result && p < n; p++) PyTuple_SET_ITEM(result, p, PyBool_FromLong(finite[p]));
done:
    for (Py_ssize_t p = 0; p < got; p++) PyBuffer_Release(&views[p]);
    PyMem_Free(views);
    PyMem_Free(finite);
    Py_XDECREF(parts);
    PyBuffer_Release(&lut);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"sketch_q8_0", sketch_q8_0, METH_VARARGS, "Q8_0 answers -> their receipt sketches, into out (uint32 [rows, 2k]); per answer, scales all finite."},
    {"variants", variants, METH_NOARGS, "The variants this CPU runs, best first."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_q8_sketch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__q8_sketch(void) { return PyModule_Create(&module); }
