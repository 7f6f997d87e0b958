// Dense f32 matmul, one binding's rows: Y[t, y_row0 + r] = sum_k X[t, k] * W[r, k].
//
// One workgroup per (weight row r, chunk of TC tokens; TC = 1, 2, 4 or 8, compiled per value). Its 64 invocations stride over the
// row's n columns (consecutive invocations read consecutive weights: coalesced), each
// keeping TC partial sums in registers, so every weight is read once per token chunk; the
// 64 partials per token are then summed in workgroup memory (a tree of 6 levels).
// Tokens past the last (t not a multiple of TC) compute on a clamped row and are not written.

struct Params { n: u32, m_out: u32, y_row0: u32, pad: u32 }
struct Tokens { t: u32, p1: u32, p2: u32, p3: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> tk: Tokens;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> w: array<f32>;

const WG: u32 = 64u;
const TC: u32 = $TCu;
var<workgroup> red: array<f32, $REDu>;  // [TC][WG]

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.x;
    let t0 = wid.y * TC;
    let last = tk.t - 1u;
    var acc: array<f32, $TCu>;
    let wbase = r * p.n;
    for (var k = lid; k < p.n; k += WG) {
        let wk = w[wbase + k];
        for (var j = 0u; j < TC; j++) {
            acc[j] = fma(wk, x[min(t0 + j, last) * p.n + k], acc[j]);
        }
    }
    for (var j = 0u; j < TC; j++) {
        red[j * WG + lid] = acc[j];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            for (var j = 0u; j < TC; j++) {
                red[j * WG + lid] += red[j * WG + lid + s];
            }
        }
        workgroupBarrier();
    }
    if (lid < TC && t0 + lid < tk.t) {
        y[(t0 + lid) * p.m_out + p.y_row0 + r] = red[lid * WG];
    }
}
