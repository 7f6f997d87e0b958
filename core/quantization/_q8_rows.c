/* Q8_0 activation rows on the wire, encoded and decoded in one pass each (core/quantization/activations.py).
 *
 * A decode step sends one row to each holder and gets a row back per expert: there the numpy path's
 * layers of checks (finite input, the kernel, the f16 scales' overflow, each a pass of its own and
 * a few Python calls) cost more than the rows. This does the same work in one call per direction and
 * writes the same bytes and floats, so a receipt over either side's bytes is the same receipt:
 *
 *   encode: per block of 32, d = amax / 127 in f32, inv = 1 / d (0 when d is 0 or 1 / d overflows),
 *           q = roundf(x * inv) as int8, the scale stored as f16 rounded to nearest even. Rows whose
 *           width is not a multiple of 32 are padded with zeros (a zero never changes a block's amax).
 *   decode: x = (f32) q * (f32) f16 scale, the padding dropped.
 *
 * tests/quantization/test_q8_rows.py holds both to the numpy/numba path over random, padded, tiny,
 * huge and non-finite rows. No fast-math and no FMA contraction: every product is the IEEE one.
 * A decode step's rows are coded with the GIL held (releasing it would cost more than they do); a
 * prefill's, from RELEASE_GIL_VALUES values up, with it released, as the numba path did.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#pragma GCC optimize("fp-contract=off")

#define QK 32 /* values per block */
#define QB 34 /* bytes per block: f16 scale, 32 int8 */

enum { OK = 0, NON_FINITE_INPUT = 1, SCALE_OVERFLOW = 2, NON_FINITE_SCALE = 3 };

#define RELEASE_GIL_VALUES (1 << 16) /* 32 rows of 2,048: ~30 us of work */

#include "f16_bits.h"

/* One block of 32 values into out[34]; SCALE_OVERFLOW when d is not an f16.
 * Written so that GCC vectorizes each loop: the largest |x| as the largest of the finite values'
 * magnitude bits (ordered as the floats are), and roundf as integer truncations. */
static inline int encode_full_block(const float *restrict v, uint8_t *restrict out) {
    uint32_t top = 0;
    int32_t q[QK];
    for (int i = 0; i < QK; i++) {
        uint32_t a;
        memcpy(&a, v + i, sizeof a);
        a &= 0x7fffffffu;
        top = a > top ? a : top;
    }
    float amax;
    memcpy(&amax, &top, sizeof amax);
    float d = amax / 127.f, inv = d != 0.f ? 1.f / d : 0.f;
    if (isinf(inv)) inv = 0.f;
    uint16_t h = f32_to_f16(d);
    out[0] = (uint8_t)(h & 0xff);
    out[1] = (uint8_t)(h >> 8);
    for (int i = 0; i < QK; i++) {
        /* roundf without the libm call: |x * inv| <= 127 (a little more at worst), so truncating to int
         * is exact, the fraction is exact, and twice it truncates to +-1 from .5 up: half away from zero. */
        float s = v[i] * inv;
        int32_t t = (int32_t)s;
        q[i] = t + (int32_t)((s - (float)t) * 2.f);
    }
    for (int i = 0; i < QK; i++) out[2 + i] = (uint8_t)(int8_t)q[i];
    return (h & 0x7c00u) == 0x7c00u ? SCALE_OVERFLOW : OK;
}

/* A row's last block of n < 32 values, padded with zeros. */
static int encode_block(const float *x, Py_ssize_t n, uint8_t *out) {
    float v[QK] = {0};
    memcpy(v, x, (size_t)n * sizeof(float));
    return encode_full_block(v, out);
}

/* The rows' blocks into o: OK, NON_FINITE_INPUT (o untouched) or SCALE_OVERFLOW. One copy for AVX2 (eight
 * lanes, the unsigned max in one instruction) and one for any x86-64 (SSE2) or other CPU, picked when the
 * module loads (GCC's target_clones); both are the same IEEE operations, so the same bytes. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static int encode_rows(const float *x, Py_ssize_t rows, Py_ssize_t d, uint8_t *o) {
    const uint32_t *bits = (const uint32_t *)x;
    uint32_t non_finite = 0; /* an exponent of all ones: inf or NaN (a branch-free pass the compiler vectorizes) */
    for (Py_ssize_t i = 0; i < rows * d; i++) non_finite |= (bits[i] & 0x7f800000u) == 0x7f800000u;
    if (non_finite) return NON_FINITE_INPUT;
    Py_ssize_t blocks = (d + QK - 1) / QK;
    int status = OK;
    for (Py_ssize_t r = 0; r < rows; r++) {
        for (Py_ssize_t b = 0; b < blocks; b++) {
            Py_ssize_t start = b * QK, n = d - start < QK ? d - start : QK;
            uint8_t *block = o + (r * blocks + b) * QB;
            status |= n == QK ? encode_full_block(x + r * d + start, block) : encode_block(x + r * d + start, n, block);
        }
    }
    return status;
}

/* encode(src, rows, d) -> bytes or an int: src f32[rows * d] (C order); the rows' Q8_0 blocks, or
 * NON_FINITE_INPUT / SCALE_OVERFLOW (the caller names them). */
static PyObject *py_encode(PyObject *self, PyObject *args) {
    Py_buffer src;
    Py_ssize_t rows, d;
    if (!PyArg_ParseTuple(args, "y*nn", &src, &rows, &d)) return NULL;
    if (rows < 0 || d <= 0 || src.len != rows * d * (Py_ssize_t)sizeof(float)) {
        PyErr_Format(PyExc_ValueError, "q8_rows.encode: %zd bytes are not f32 rows [%zd, %zd]", src.len, rows, d);
        PyBuffer_Release(&src);
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, rows * ((d + QK - 1) / QK) * QB);
    if (out == NULL) {
        PyBuffer_Release(&src);
        return NULL;
    }
    int status;
    if (rows * d >= RELEASE_GIL_VALUES) {
        Py_BEGIN_ALLOW_THREADS
        status = encode_rows((const float *)src.buf, rows, d, (uint8_t *)PyBytes_AS_STRING(out));
        Py_END_ALLOW_THREADS
    } else {
        status = encode_rows((const float *)src.buf, rows, d, (uint8_t *)PyBytes_AS_STRING(out));
    }
    PyBuffer_Release(&src);
    if (status != OK) {
        Py_DECREF(out);
        return PyLong_FromLong(status);
    }
    return out;
}

/* variant() -> str: the encoder copy this CPU runs (for the benchmarks' tables). */
static PyObject *py_variant(PyObject *self, PyObject *args) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    __builtin_cpu_init();
    return PyUnicode_FromString(__builtin_cpu_supports("avx2") ? "avx2" : "sse2");
#else
    return PyUnicode_FromString("scalar");
#endif
}

/* The rows' blocks at s into x (f32 [rows, d]): OK, or NON_FINITE_SCALE (x then undefined). */
static int decode_rows(const uint8_t *s, Py_ssize_t rows, Py_ssize_t d, float *x) {
    Py_ssize_t blocks = (d + QK - 1) / QK;
    int status = OK;
    for (Py_ssize_t r = 0; r < rows; r++) {
        for (Py_ssize_t b = 0; b < blocks; b++) {
            const uint8_t *block = s + (r * blocks + b) * QB;
            float scale = f16_to_f32((uint16_t)(block[0] | (block[1] << 8)));
            if (!isfinite(scale)) status = NON_FINITE_SCALE;
            Py_ssize_t start = b * QK, n = d - start < QK ? d - start : QK;
            float *row = x + r * d + start;
            for (Py_ssize_t i = 0; i < n; i++) row[i] = (float)(int8_t)block[2 + i] * scale;
        }
    }
    return status;
}

/* decode(src, dst, rows, d) -> int: src the rows' Q8_0 blocks, dst f32[rows * d] written; OK, or
 * NON_FINITE_SCALE (dst then undefined). */
static PyObject *py_decode(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    Py_ssize_t rows, d;
    if (!PyArg_ParseTuple(args, "y*w*nn", &src, &dst, &rows, &d)) return NULL;
    Py_ssize_t blocks = d > 0 ? (d + QK - 1) / QK : 0;
    if (rows < 0 || d <= 0 || src.len != rows * blocks * QB || dst.len != rows * d * (Py_ssize_t)sizeof(float)) {
        PyErr_Format(PyExc_ValueError, "q8_rows.decode: %zd bytes into %zd are not Q8_0 rows [%zd, %zd]", src.len,
                     dst.len, rows, d);
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return NULL;
    }
    int status;
    if (rows * d >= RELEASE_GIL_VALUES) {
        Py_BEGIN_ALLOW_THREADS
        status = decode_rows((const uint8_t *)src.buf, rows, d, (float *)dst.buf);
        Py_END_ALLOW_THREADS
    } else {
        status = decode_rows((const uint8_t *)src.buf, rows, d, (float *)dst.buf);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return PyLong_FromLong(status);
}

static PyMethodDef methods[] = {
    {"encode", py_encode, METH_VARARGS,
     "encode(src, rows, d) -> bytes | int: f32 rows [rows, d] (C order) as Q8_0 blocks, rows padded to a\n"
     "multiple of 32 with zeros; 1 (a non-finite input) or 2 (a scale past f16) instead of bytes."},
    {"variant", py_variant, METH_NOARGS, "variant() -> the encoder copy this CPU runs: avx2, sse2 or scalar."},
    {"decode", py_decode, METH_VARARGS,
     "decode(src, dst, rows, d) -> int: Q8_0 rows into f32 dst [rows, d]; 0, or 3 for a non-finite scale."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_q8_rows", NULL, -1, methods};

PyMODINIT_FUNC PyInit__q8_rows(void) { return PyModule_Create(&module); }
