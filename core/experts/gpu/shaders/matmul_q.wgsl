// Block-quantized matmul over the device layout (core/experts/gpu/wgsl_layout.py), one
// binding's rows: Y[t, y_row0 + r] = sum_k X[t, k] * (a[r, s(k)] * q[r, k] - b[r, s(k)]).
//
// Compiled per format: WPS = u32 words (4 quants each) per sub-block of G values (8 for
// G = 32, 4 for G = 16); OFFSET is "- m.y * (xv.x + xv.y + xv.z + xv.w)" for formats with an
// offset b (scales = vec2 (a, b)), empty otherwise (scales = a).
//
// One workgroup per (weight row r, chunk of TC tokens; TC = 1, 2, 4 or 8, compiled per value); its 64 invocations stride over the
// row's u32 words (consecutive invocations read consecutive words: coalesced), so each weight
// is read once per token chunk. Per word and token: a * dot(q, x) - b * sum(x) over the
// word's 4 values, accumulated in registers; the 64 partials per token are then summed in
// workgroup memory. x is read as vec4 (n is a multiple of 32 for every block format).

// bindings 0, 1 (uniforms) and 3 (y) are in matmul_common.wgsl
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> q: array<u32>;
@group(0) @binding(5) var<storage, read> scales: array<$META>;

const WPS: u32 = $WPSu;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.x;
    let t0 = wid.y * TC;
    let last = tk.t - 1u;
    let nw = p.n / 4u;
    var acc: array<f32, $TCu>;
    let qbase = r * nw;
    let mbase = r * (nw / WPS);
    for (var k = lid; k < nw; k += WG) {
        let word = bitcast<i32>(q[qbase + k]);
        // sign-extending byte extraction: int8 quants in two's complement
        let qv = vec4<f32>(vec4<i32>(extractBits(word, 0u, 8u), extractBits(word, 8u, 8u),
                                     extractBits(word, 16u, 8u), extractBits(word, 24u, 8u)));
        let m = scales[mbase + k / WPS];
        for (var j = 0u; j < TC; j++) {
            let xv = x[min(t0 + j, last) * nw + k];
            acc[j] += $SCALE * dot(qv, xv) $OFFSET;
        }
    }
    reduce_store(acc, lid, t0, r);
}
