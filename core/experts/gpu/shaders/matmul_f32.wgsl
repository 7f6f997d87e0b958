// Dense f32 matmul, one binding's rows: Y[t, y_row0 + r] = sum_k X[t, k] * W[r, k].
//
// One workgroup per (weight row r, chunk of TC tokens; TC = 1, 2, 4 or 8, compiled per value). Its 64 invocations stride over the
// row's n columns (consecutive invocations read consecutive weights: coalesced), each
// keeping TC partial sums in registers, so every weight is read once per token chunk; the
// 64 partials per token are then summed in workgroup memory (a tree of 6 levels).
// Tokens past the last (t not a multiple of TC) compute on a clamped row and are not written.

// bindings 0, 1 (uniforms) and 3 (y) are in matmul_common.wgsl
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(4) var<storage, read> w: array<f32>;

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
    reduce_store(acc, lid, t0, r);
}
