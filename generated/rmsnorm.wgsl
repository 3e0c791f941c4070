// AUTO-GENERATED from templates/rmsnorm.wgsl.j2 for variant rmsnorm by doppler-gen - do not edit.
// Edit the template and variants.toml, then run `doppler-gen generate`.
// source-hash: sha256:59c0e76f089676deb842aac9365b0b72fcac11b6c2cabc6b4c5a4ec65170aef4

// RMSNorm Kernel (f32 input, weight and output; f32 arithmetic)
//
// One workgroup per row: each invocation adds the squares of a strided slice of the row, the
// workgroup reduces them as a tree, then every invocation scales its slice by
// weight / sqrt(mean(x^2) + eps).

const MAX_WORKGROUP_SIZE: u32 = 256u;

override WORKGROUP_SIZE: u32 = 256u;

struct Uniforms {
    size: u32,        // Elements per row (the hidden size)
    num_rows: u32,    // Rows (tokens); one workgroup each
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> u: Uniforms;
@group(0) @binding(1) var<storage, read> input: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> output: array<f32>;

var<workgroup> partial_sums: array<f32, MAX_WORKGROUP_SIZE>;

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn main(
    @builtin(workgroup_id) wg_id: vec3<u32>,
    @builtin(local_invocation_id) local_id: vec3<u32>,
) {
    let row = wg_id.x;
    let tid = local_id.x;
    if (row >= u.num_rows) {
        return;
    }
    let base = row * u.size;

    var sum_sq = 0.0;
    for (var i = tid; i < u.size; i = i + WORKGROUP_SIZE) {
        let v = f32(input[base + i]);
        sum_sq = sum_sq + v * v;
    }
    partial_sums[tid] = sum_sq;
    workgroupBarrier();

    for (var stride = WORKGROUP_SIZE / 2u; stride > 0u; stride = stride / 2u) {
        if (tid < stride) {
            partial_sums[tid] = partial_sums[tid] + partial_sums[tid + stride];
        }
        workgroupBarrier();
    }

    let inv_rms = 1.0 / sqrt(partial_sums[0] / f32(u.size) + u.eps);
    for (var i = tid; i < u.size; i = i + WORKGROUP_SIZE) {
        let y = f32(input[base + i]) * inv_rms * f32(weight[i]);
        output[base + i] = y;
    }
}
