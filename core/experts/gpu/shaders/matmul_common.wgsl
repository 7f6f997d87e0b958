// What both matmul shaders share (wgsl.py puts this file in front of each): the uniforms, the
// output binding, the workgroup's partial sums, and their reduction into Y.

struct Params { n: u32, m_out: u32, y_row0: u32, pad: u32 }
struct Tokens { t: u32, p1: u32, p2: u32, p3: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> tk: Tokens;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const WG: u32 = 64u;
const TC: u32 = $TCu;
var<workgroup> red: array<f32, $REDu>;  // [TC][WG]

// Sum the workgroup's 64 partials per token (a tree of 6 levels in workgroup memory) and write
// Y[t0 + j, y_row0 + r] for the chunk's tokens that exist. Called by every invocation (barriers).
fn reduce_store(acc: array<f32, TC>, lid: u32, t0: u32, r: u32) {
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
