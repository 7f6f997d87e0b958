// CUDA kernels of the CUDA device (core/experts/gpu/cuda.py), compiled at run time by NVRTC
// through cupy.RawModule. No #include: NVRTC sees no system headers, and the half-float decode
// is written out below so that the same source also compiles for the host.
//
// Two halves:
//   1. Block decoders, __host__ __device__: for each GGML format one "group" function that
//      decodes the values one lane owns in one block (the unit both kernels below work in).
//      tests/experts/test_gpu_cuda.py compiles this file for the HOST (g++, no __CUDACC__)
//      and compares every decoded value bit for bit with gguf-py's decoder.
//   2. Kernels (only under a CUDA compiler): dequantize row tiles to f32 for cuBLAS, the fused
//      dequant-mat-vec for batches up to 8 tokens (a warp per 1-4 output rows, shuffle
//      reduction, each weight block read once), and silu(g)*u.
//
// Bit-exactness: the decoders use the products in gguf-py's order, (d*sc)*q - dmin*m, and on
// the device through __fmul_rn/__fsub_rn, which the compiler never contracts into an FMA (an
// FMA would round once where numpy rounds twice). Host builds must pass -ffp-contract=off.
//
// Activation layouts: the mat-vec kernels (batches up to 8) read x token-major, x[tok*n + k],
// and write y token-major, as the host sends and receives them: a small batch needs no
// transpose on the device. Larger batches go through cuBLAS with the activations transposed
// ([n, t] C-contiguous), so that each product is W[m, n] . X[n, t] -> Y[m, t], a plain
// row-major product into a contiguous row tile.

typedef unsigned char tz_u8;
typedef signed char tz_i8;
typedef unsigned short tz_u16;
typedef unsigned int tz_u32;

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define TZ_CUDA 1
#define TZ_HD __host__ __device__ __forceinline__
#else
#define TZ_HD inline
#endif

#if defined(__CUDA_ARCH__)
#define TZ_MUL(a, b) __fmul_rn((a), (b))
#define TZ_SUB(a, b) __fsub_rn((a), (b))
#else
#define TZ_MUL(a, b) ((a) * (b))
#define TZ_SUB(a, b) ((a) - (b))
#endif

// ---- scalar formats --------------------------------------------------------------------

// IEEE binary16 bits -> f32 (exact). Device: the hardware conversion; host: the same widening
// in integers (numpy's npy_halfbits_to_floatbits, inf/NaN payloads kept).
TZ_HD float tz_f16_to_f32(tz_u16 h) {
#if defined(__CUDA_ARCH__)
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    tz_u32 sign = (tz_u32)(h & 0x8000u) << 16;
    tz_u32 exp = (h >> 10) & 0x1Fu;
    tz_u32 man = h & 0x3FFu;
    tz_u32 bits;
    if (exp == 0x1Fu) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {  // subnormal man * 2^-24: normalize so that bit 10 is the implicit one
        tz_u32 s = 0;
        while ((man & 0x400u) == 0) {
            man <<= 1;
            s++;
        }
        bits = sign | ((113u - s) << 23) | ((man & 0x3FFu) << 13);
    }
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
#endif
}

// bfloat16 bits -> f32 (exact: bf16 is the top half of an f32).
TZ_HD float tz_bf16_to_f32(tz_u16 h) {
    tz_u32 bits = (tz_u32)h << 16;
#if defined(__CUDA_ARCH__)
    return __uint_as_float(bits);
#else
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
#endif
}

TZ_HD tz_u16 tz_le16(const tz_u8* p) { return (tz_u16)(p[0] | (p[1] << 8)); }

// ---- block formats ---------------------------------------------------------------------
// Each format: BLOCK values in BYTES bytes, decoded as GROUPS groups of VALS values;
// group(blk, g, v, p) writes value v[k] of block position p[k], k < VALS.

// Q8_0 (34 bytes): f16 d, int8 qs[32]; x[i] = d * qs[i]. Group g: values 4g .. 4g+3.
struct TzQ8_0 {
    enum { BLOCK = 32, BYTES = 34, GROUPS = 8, VALS = 4 };
    static TZ_HD void group(const tz_u8* blk, int g, float* v, int* p) {
        const float d = tz_f16_to_f32(tz_le16(blk));
        for (int k = 0; k < 4; ++k) {
            p[k] = 4 * g + k;
            v[k] = TZ_MUL(d, (float)(tz_i8)blk[2 + 4 * g + k]);
        }
    }
};

// Q4_K (144 bytes): f16 d, f16 dmin, scales[12] (6-bit sc/m, get_scale_min_k4), qs[128].
// x[32j + i] = (d*sc[j]) * q - (dmin*m[j]); qs byte 32c + l = q[64c + l] | q[64c + 32 + l] << 4.
// Group g (0..31): chunk c = g/8, bytes 32c + 4(g%8) .. +3: 4 low nibbles (sub-block 2c) and
// 4 high nibbles (sub-block 2c+1).
TZ_HD void tz_q4_k_scale_min(const tz_u8* q, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

struct TzQ4_K {
    enum { BLOCK = 256, BYTES = 144, GROUPS = 32, VALS = 8 };
    static TZ_HD void group(const tz_u8* blk, int g, float* v, int* p) {
        const float d = tz_f16_to_f32(tz_le16(blk));
        const float dmin = tz_f16_to_f32(tz_le16(blk + 2));
        const int c = g >> 3, s = g & 7;
        int sc0, m0, sc1, m1;
        tz_q4_k_scale_min(blk + 4, 2 * c, &sc0, &m0);
        tz_q4_k_scale_min(blk + 4, 2 * c + 1, &sc1, &m1);
        const float d0 = TZ_MUL(d, (float)sc0), mm0 = TZ_MUL(dmin, (float)m0);
        const float d1 = TZ_MUL(d, (float)sc1), mm1 = TZ_MUL(dmin, (float)m1);
        const tz_u8* qs = blk + 16 + 32 * c + 4 * s;
        for (int k = 0; k < 4; ++k) {
            p[k] = 64 * c + 4 * s + k;
            v[k] = TZ_SUB(TZ_MUL(d0, (float)(qs[k] & 0xF)), mm0);
            p[4 + k] = 64 * c + 32 + 4 * s + k;
            v[4 + k] = TZ_SUB(TZ_MUL(d1, (float)(qs[k] >> 4)), mm1);
        }
    }
};

// Q6_K (210 bytes): ql[128], qh[64], int8 scales[16], f16 d.
// x[16j + i] = (d*scales[j]) * (q - 32); for half h and l < 32, q[128h + 32k + l] has low
// nibble from ql[64h + l] (k=0: low, k=2: high) or ql[64h + 32 + l] (k=1: low, k=3: high) and
// high bits (qh[32h + l] >> 2k) & 3. Group g (0..31): half h = g/16, l = 2(g%16) + {0, 1}.
struct TzQ6_K {
    enum { BLOCK = 256, BYTES = 210, GROUPS = 32, VALS = 8 };
    static TZ_HD void group(const tz_u8* blk, int g, float* v, int* p) {
        const float d = tz_f16_to_f32(tz_le16(blk + 208));
        const int h = g >> 4;
        const tz_u8* ql = blk + 64 * h;
        const tz_u8* qh = blk + 128 + 32 * h;
        const tz_u8* sc = blk + 192;
        for (int j = 0; j < 2; ++j) {
            const int l = 2 * (g & 15) + j;
            for (int k = 0; k < 4; ++k) {
                const int lo = (ql[l + 32 * (k & 1)] >> (4 * (k >> 1))) & 0xF;
                const int q = (lo | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
                const int pos = 128 * h + 32 * k + l;
                p[4 * j + k] = pos;
                v[4 * j + k] = TZ_MUL(TZ_MUL(d, (float)(tz_i8)sc[pos >> 4]), (float)q);
            }
        }
    }
};

#if defined(TZ_CUDA)
// ---- kernels -----------------------------------------------------------------------------

// Fused mat-vec shapes: a kernel for at most T tokens computes R output rows per warp, so the
// x values a lane loads for one group serve R rows; the block loop is unrolled TZ_MV_UNROLL
// times so that a warp has several blocks' loads in flight (a mat-vec is bound by the bytes
// in flight per multiprocessor, not by arithmetic). cuda.py passes its MV_ROWS and MV_UNROLL
// as -D options; the defaults here are the same.
#ifndef TZ_MV_ROWS_1
#define TZ_MV_ROWS_1 1
#endif
#ifndef TZ_MV_ROWS_2
#define TZ_MV_ROWS_2 2
#endif
#ifndef TZ_MV_ROWS_4
#define TZ_MV_ROWS_4 2
#endif
#ifndef TZ_MV_ROWS_8
#define TZ_MV_ROWS_8 4
#endif
#ifndef TZ_MV_UNROLL
#define TZ_MV_UNROLL 4
#endif
constexpr int tz_mv_unroll = TZ_MV_UNROLL;  // #pragma unroll takes a constant, not a macro

// Sum of v over the warp's 32 lanes (every lane gets it).
__device__ __forceinline__ float tz_warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// Each accumulator summed over the warp; lane 0 stores those of real tokens and rows into y,
// token-major (y[tok*m + row]).
template <int T, int R>
__device__ __forceinline__ void tz_store_rows(const float (&acc)[R][T], int lane, int t, int m, int row0,
                                              float* __restrict__ y) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int tok = 0; tok < T; ++tok) {
            const float s = tz_warp_sum(acc[r][tok]);
            if (lane == 0 && tok < t && row0 + r < m) y[(long long)tok * m + row0 + r] = s;
        }
}

// y[tok*m + row] = sum_k W[row, k] * x[tok*n + k] for tok < t <= T (token-major, as the host
// sends x and wants y back). Warp w computes rows R*w .. R*w + R-1; its lanes cover
// 32/GROUPS blocks per step, each lane one group, so each weight block is read once, and the
// group's x values (VALS x T) are loaded once for the R rows. The positions a group decodes
// do not depend on the row, so the first row's tell where x is read.
template <class F, int T, int R>
__device__ __forceinline__ void tz_mv(const tz_u8* __restrict__ w, long long row_bytes, int m, int n,
                                      const float* __restrict__ x, int t, float* __restrict__ y) {
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
    if (row0 >= m) return;  // row0 is uniform over the warp: whole warps leave, shuffles stay full
    const int nb = n / F::BLOCK;
    const int g = lane % F::GROUPS;
    float acc[R][T] = {};
#pragma unroll tz_mv_unroll
    for (int b = lane / F::GROUPS; b < nb; b += 32 / F::GROUPS) {
        float v[F::VALS], xv[F::VALS][T];
        int p[F::VALS];
        F::group(w + (long long)row0 * row_bytes + (long long)b * F::BYTES, g, v, p);
#pragma unroll
        for (int k = 0; k < F::VALS; ++k)
#pragma unroll
            for (int tok = 0; tok < T; ++tok)  // tokens >= t read token t-1: no branch, never stored
                xv[k][tok] = __ldg(x + (long long)min(tok, t - 1) * n + b * F::BLOCK + p[k]);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (r > 0)  // rows >= m read row m-1: no branch, never stored
                F::group(w + (long long)min(row0 + r, m - 1) * row_bytes + (long long)b * F::BYTES, g, v, p);
#pragma unroll
            for (int k = 0; k < F::VALS; ++k)
#pragma unroll
                for (int tok = 0; tok < T; ++tok) acc[r][tok] = fmaf(v[k], xv[k][tok], acc[r][tok]);
        }
    }
    tz_store_rows<T, R>(acc, lane, t, m, row0, y);
}

// The same for dense 16-bit rows (F16 / BF16, any n): lane k reads elements k, k+32, ...
template <bool BF16, int T, int R>
__device__ __forceinline__ void tz_mv16(const tz_u8* __restrict__ w8, int m, int n, const float* __restrict__ x,
                                        int t, float* __restrict__ y) {
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
    if (row0 >= m) return;
    const tz_u16* w = (const tz_u16*)w8;
    float acc[R][T] = {};
#pragma unroll tz_mv_unroll
    for (int k = lane; k < n; k += 32) {
        float xv[T];
#pragma unroll
        for (int tok = 0; tok < T; ++tok) xv[tok] = __ldg(x + (long long)min(tok, t - 1) * n + k);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const tz_u16 bits = __ldg(w + (long long)min(row0 + r, m - 1) * n + k);
            const float v = BF16 ? tz_bf16_to_f32(bits) : tz_f16_to_f32(bits);
#pragma unroll
            for (int tok = 0; tok < T; ++tok) acc[r][tok] = fmaf(v, xv[tok], acc[r][tok]);
        }
    }
    tz_store_rows<T, R>(acc, lane, t, m, row0, y);
}

// out[r*n + i] = W[r0 + r, i] for r < rows (f32 tile for cuBLAS): one thread per group.
template <class F>
__device__ __forceinline__ void tz_dq(const tz_u8* __restrict__ w, long long row_bytes, int n, int r0, int rows,
                                      float* __restrict__ out) {
    const long long nb = n / F::BLOCK;
    const long long total = (long long)rows * nb * F::GROUPS;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int g = (int)(i % F::GROUPS);
        const long long rb = i / F::GROUPS;
        const long long b = rb % nb, r = rb / nb;
        float v[F::VALS];
        int p[F::VALS];
        F::group(w + (r0 + r) * row_bytes + b * F::BYTES, g, v, p);
        float* o = out + r * n + b * F::BLOCK;
#pragma unroll
        for (int k = 0; k < F::VALS; ++k) o[p[k]] = v[k];
    }
}

template <bool BF16>
__device__ __forceinline__ void tz_dq16(const tz_u8* __restrict__ w8, int n, int r0, int rows,
                                        float* __restrict__ out) {
    const tz_u16* w = (const tz_u16*)w8 + (long long)r0 * n;
    const long long total = (long long)rows * n;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = BF16 ? tz_bf16_to_f32(w[i]) : tz_f16_to_f32(w[i]);
}

// One mat-vec of any format: KIND 0 Q8_0, 1 Q4_K, 2 Q6_K, 3 F16, 4 BF16 (cuda.py: MV_KINDS).
template <int KIND, int T, int R>
__device__ __forceinline__ void tz_mv_any(const tz_u8* w, long long rb, int m, int n, const float* x, int t,
                                          float* y) {
    if constexpr (KIND == 0) tz_mv<TzQ8_0, T, R>(w, rb, m, n, x, t, y);
    else if constexpr (KIND == 1) tz_mv<TzQ4_K, T, R>(w, rb, m, n, x, t, y);
    else if constexpr (KIND == 2) tz_mv<TzQ6_K, T, R>(w, rb, m, n, x, t, y);
    else tz_mv16<KIND == 4, T, R>(w, m, n, x, t, y);
}

// Entry points (extern "C": cupy.RawModule.get_function finds them by these names).
// mv<T>:  (w, row_bytes, m, n, x [t, n], t <= T, y [t, m])      grid ceil(m / (4 R)), block 128
// gmv<T>: (ws [k], row_bytes, m, n, x [sum t, n], offs [k + 1], y [sum t, m])
//         grid (ceil(m / (4 R)), k), block 128: a group of k experts of one format and shape,
//         expert e (blockIdx.y) over rows offs[e] .. offs[e+1] of x and y (at most T of them),
//         its weights at address ws[e]. Each expert's products are those mv<T> computes for it.
// dq:     (w, row_bytes, n, r0, rows, out [rows, n])           grid-stride, block 256
#define TZ_MV_ENTRY(T, R, SUFFIX, KIND)                                                                      \
    __global__ void tz_mv##T##_##SUFFIX(const tz_u8* w, long long rb, int m, int n, const float* x, int t,  \
                                        float* y) {                                                         \
        tz_mv_any<KIND, T, R>(w, rb, m, n, x, t, y);                                                        \
    }                                                                                                       \
    __global__ void tz_gmv##T##_##SUFFIX(const long long* __restrict__ ws, long long rb, int m, int n,      \
                                         const float* x, const long long* __restrict__ offs, float* y) {    \
        const long long r0 = offs[blockIdx.y];                                                              \
        const int t = (int)(offs[blockIdx.y + 1] - r0);                                                     \
        if (t > 0) tz_mv_any<KIND, T, R>((const tz_u8*)ws[blockIdx.y], rb, m, n, x + r0 * n, t, y + r0 * m); \
    }
#define TZ_MV_ENTRIES(T, R)                                                                                  \
    TZ_MV_ENTRY(T, R, q8_0, 0)                                                                              \
    TZ_MV_ENTRY(T, R, q4_k, 1)                                                                              \
    TZ_MV_ENTRY(T, R, q6_k, 2)                                                                              \
    TZ_MV_ENTRY(T, R, f16, 3)                                                                               \
    TZ_MV_ENTRY(T, R, bf16, 4)
extern "C" {
TZ_MV_ENTRIES(1, TZ_MV_ROWS_1)
TZ_MV_ENTRIES(2, TZ_MV_ROWS_2)
TZ_MV_ENTRIES(4, TZ_MV_ROWS_4)
TZ_MV_ENTRIES(8, TZ_MV_ROWS_8)
__global__ void tz_dq_q8_0(const tz_u8* w, long long rb, int n, int r0, int rows, float* out) {
    tz_dq<TzQ8_0>(w, rb, n, r0, rows, out);
}
__global__ void tz_dq_q4_k(const tz_u8* w, long long rb, int n, int r0, int rows, float* out) {
    tz_dq<TzQ4_K>(w, rb, n, r0, rows, out);
}
__global__ void tz_dq_q6_k(const tz_u8* w, long long rb, int n, int r0, int rows, float* out) {
    tz_dq<TzQ6_K>(w, rb, n, r0, rows, out);
}
__global__ void tz_dq_f16(const tz_u8* w, long long rb, int n, int r0, int rows, float* out) {
    tz_dq16<false>(w, n, r0, rows, out);
}
__global__ void tz_dq_bf16(const tz_u8* w, long long rb, int n, int r0, int rows, float* out) {
    tz_dq16<true>(w, n, r0, rows, out);
}

// h[i] = silu(g[i]) * u[i] = g / (1 + e^-g) * u, i < count. e^-g overflows to inf for
// g < -88 and g/inf is -0, the limit; expf and the division are the accurate ones (NVRTC's
// defaults: no fast math), so h is within a few ulp of the exact silu(g)*u.
__global__ void tz_silu_mul(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ h,
                            long long count) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (long long)gridDim.x * blockDim.x) {
        const float gi = g[i];
        h[i] = gi / (1.0f + expf(-gi)) * u[i];
    }
}
// The same over rows: h[r*cols + i] = silu(g[r*ld + i]) * u[r*ld + i] for r < rows, i < cols
// (token-major gate and up, which may be the two halves of one stacked [rows, 2*cols] product).
__global__ void tz_silu_mul_rows(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ h,
                                 int cols, int rows, long long ld) {
    const long long count = (long long)rows * cols;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (long long)gridDim.x * blockDim.x) {
        const long long at = (i / cols) * ld + i % cols;
        const float gi = g[at];
        h[i] = gi / (1.0f + expf(-gi)) * u[at];
    }
}
}  // extern "C"
#endif  // TZ_CUDA
