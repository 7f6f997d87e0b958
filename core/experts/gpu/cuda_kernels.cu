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
//      dequant-mat-vec for batches up to TZ_MAX_T tokens (one warp per output row, shuffle
//      reduction, each weight block read once), and silu(g)*u.
//
// Bit-exactness: the decoders use the products in gguf-py's order, (d*sc)*q - dmin*m, and on
// the device through __fmul_rn/__fsub_rn, which the compiler never contracts into an FMA (an
// FMA would round once where numpy rounds twice). Host builds must pass -ffp-contract=off.
//
// Activation layout (all kernels): column-major per token, x[k*t + tok] for k < n, tok < t:
// the device keeps activations transposed ([n, t] C-contiguous) so that each matmul is
// W[m, n] . X[n, t] -> Y[m, t], a plain row-major cuBLAS product and a contiguous row tile.

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

#define TZ_MAX_T 8  // largest batch of the fused mat-vec kernels (cuda.py: SMALL_BATCH)

// Sum of v over the warp's 32 lanes (every lane gets it).
__device__ __forceinline__ float tz_warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// y[row*t + tok] = sum_k W[row, k] * x[k*t + tok], one warp per row; lanes of a warp cover
// 32/GROUPS blocks per step, so each block is read once, and x (t <= 8 columns) stays in cache.
template <class F>
__device__ __forceinline__ void tz_mv(const tz_u8* __restrict__ w, long long row_bytes, int m, int n,
                                      const float* __restrict__ x, int t, float* __restrict__ y) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= m) return;  // row is uniform over the warp: whole warps leave, shuffles stay full
    const tz_u8* wr = w + (long long)row * row_bytes;
    const int nb = n / F::BLOCK;
    const int per_step = 32 / F::GROUPS;
    float acc[TZ_MAX_T];
#pragma unroll
    for (int i = 0; i < TZ_MAX_T; ++i) acc[i] = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += per_step) {
        const int b = b0 + lane / F::GROUPS;
        if (b < nb) {
            float v[F::VALS];
            int p[F::VALS];
            F::group(wr + (long long)b * F::BYTES, lane % F::GROUPS, v, p);
#pragma unroll
            for (int k = 0; k < F::VALS; ++k) {
                const float* xk = x + (long long)(b * F::BLOCK + p[k]) * t;
#pragma unroll
                for (int tok = 0; tok < TZ_MAX_T; ++tok)
                    if (tok < t) acc[tok] = fmaf(v[k], __ldg(xk + tok), acc[tok]);
            }
        }
    }
#pragma unroll
    for (int tok = 0; tok < TZ_MAX_T; ++tok) {
        const float s = tz_warp_sum(acc[tok]);
        if (lane == 0 && tok < t) y[(long long)row * t + tok] = s;
    }
}

// The same for dense 16-bit rows (F16 / BF16, any n): lane k reads elements k, k+32, ...
template <bool BF16>
__device__ __forceinline__ void tz_mv16(const tz_u8* __restrict__ w8, int m, int n, const float* __restrict__ x,
                                        int t, float* __restrict__ y) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= m) return;
    const tz_u16* wr = (const tz_u16*)w8 + (long long)row * n;
    float acc[TZ_MAX_T];
#pragma unroll
    for (int i = 0; i < TZ_MAX_T; ++i) acc[i] = 0.0f;
    for (int k = lane; k < n; k += 32) {
        const tz_u16 bits = wr[k];
        const float v = BF16 ? tz_bf16_to_f32(bits) : tz_f16_to_f32(bits);
        const float* xk = x + (long long)k * t;
#pragma unroll
        for (int tok = 0; tok < TZ_MAX_T; ++tok)
            if (tok < t) acc[tok] = fmaf(v, __ldg(xk + tok), acc[tok]);
    }
#pragma unroll
    for (int tok = 0; tok < TZ_MAX_T; ++tok) {
        const float s = tz_warp_sum(acc[tok]);
        if (lane == 0 && tok < t) y[(long long)row * t + tok] = s;
    }
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

// Entry points (extern "C": cupy.RawModule.get_function finds them by these names).
// mv:  (w, row_bytes, m, n, x [n, t], t, y [m, t])     grid ceil(m / 4), block 128
// dq:  (w, row_bytes, n, r0, rows, out [rows, n])     grid-stride, block 256
extern "C" {
__global__ void tz_mv_q8_0(const tz_u8* w, long long rb, int m, int n, const float* x, int t, float* y) {
    tz_mv<TzQ8_0>(w, rb, m, n, x, t, y);
}
__global__ void tz_mv_q4_k(const tz_u8* w, long long rb, int m, int n, const float* x, int t, float* y) {
    tz_mv<TzQ4_K>(w, rb, m, n, x, t, y);
}
__global__ void tz_mv_q6_k(const tz_u8* w, long long rb, int m, int n, const float* x, int t, float* y) {
    tz_mv<TzQ6_K>(w, rb, m, n, x, t, y);
}
__global__ void tz_mv_f16(const tz_u8* w, long long rb, int m, int n, const float* x, int t, float* y) {
    tz_mv16<false>(w, m, n, x, t, y);
}
__global__ void tz_mv_bf16(const tz_u8* w, long long rb, int m, int n, const float* x, int t, float* y) {
    tz_mv16<true>(w, m, n, x, t, y);
}
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
}  // extern "C"
#endif  // TZ_CUDA
