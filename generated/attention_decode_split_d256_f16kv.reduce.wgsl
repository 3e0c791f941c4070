// AUTO-GENERATED from templates/attention_decode_split_reduce.wgsl.j2 for variant attention_decode_split_d256_f16kv pass reduce by doppler-gen - do not edit.
// Edit the template and variants.toml, then run `doppler-gen generate`.
// source-hash: sha256:b1002c6268b9994eb63e3067db9e2d4383f1f45940e3a6fb903f5ad00360fdca

// Split-KV decode attention, pass 2: combine the per-split partials into the output
//
// The output is f32; partials and arithmetic are f32.
// Dispatch: query_len * num_heads workgroups.

const MAX_HEAD_DIM: u32 = 256u;
const NEG_BIG: f32 = -3.402823e+38;
const MAX_REDUCE_WORKGROUP_SIZE: u32 = 256u;

override REDUCE_WORKGROUP_SIZE: u32 = 256u;   // invocations: a power of two, at most MAX_REDUCE_WORKGROUP_SIZE
override KV_SPLITS: u32 = 32u;          // splits (as in the partials pass)
override MIN_SPLIT_KEYS: u32 = 64u;     // fewest keys per split (as in the partials pass)

struct Uniforms {
    num_heads: u32,       // Number of query heads
    num_kv_heads: u32,    // Number of KV heads (for GQA)
    head_dim: u32,        // Dimension per head
    seq_len: u32,         // Current sequence length (for KV)
    query_len: u32,       // Query length (1 for decode, seq_len for prefill)
    scale: f32,           // 1/sqrt(head_dim)
    is_causal: u32,       // Apply causal mask (1 = yes)
    start_pos: u32,       // Absolute position offset for causal masking
    attn_softcap: f32,    // Gemma 2: 50.0, 0 = disabled
    sliding_window: u32,  // Sliding window size (0 = disabled, >0 = window size)
    kv_len_source: u32,   // 0 = use uniform seq_len, 1 = use buffer
    kv_start: u32,        // Absolute position of the first KV row
    page_size: u32,       // Rows per page when kv_layout == 2
    kv_layout: u32,       // 0 = contiguous, 1 = ring (sliding window), 2 = paged
    _pad: u32,
}

@group(0) @binding(0) var<uniform> u: Uniforms;
@group(0) @binding(4) var<storage, read_write> output: array<f32>; // [query_len, num_heads, head_dim]
@group(0) @binding(7) var<storage, read_write> partial_acc: array<f32>; // [split, query_len, num_heads, head_dim]
@group(0) @binding(8) var<storage, read_write> partial_ml: array<f32>;  // [split, query_len, num_heads, 2]: max, sum

// Tree reductions and the per-part accumulator sums
var<workgroup> red: array<f32, MAX_REDUCE_WORKGROUP_SIZE>;

// Keys per split: seq_len over KV_SPLITS splits, at least MIN_SPLIT_KEYS
fn split_keys() -> u32 {
    return max(max(MIN_SPLIT_KEYS, 1u), (u.seq_len + KV_SPLITS - 1u) / KV_SPLITS);
}

// Splits that hold keys (at most KV_SPLITS)
fn used_splits() -> u32 {
    let keys = split_keys();
    return min(KV_SPLITS, (u.seq_len + keys - 1u) / keys);
}

// red[0] = max (is_max) or sum of red[0 .. REDUCE_WORKGROUP_SIZE); every invocation must call it
fn tree_reduce(lid: u32, is_max: bool) {
    workgroupBarrier();
    for (var stride: u32 = REDUCE_WORKGROUP_SIZE / 2u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            let other = red[lid + stride];
            red[lid] = select(red[lid] + other, max(red[lid], other), is_max);
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(REDUCE_WORKGROUP_SIZE, 1, 1)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wg_id: vec3<u32>,
) {
    let slot = wg_id.x;  // query_pos * num_heads + head
    let slots = u.query_len * u.num_heads;
    let head_dim = u.head_dim;
    if (slot >= slots || head_dim > MAX_HEAD_DIM) {
        return;
    }
    let num_splits = used_splits();
    let ml = 2u * slot;  // partial_ml of split s at ml + 2 * s * slots

    // M = max over the splits of their max
    var mine: f32 = NEG_BIG;
    for (var s: u32 = lid; s < num_splits; s = s + REDUCE_WORKGROUP_SIZE) {
        mine = max(mine, partial_ml[ml + 2u * s * slots]);
    }
    red[lid] = mine;
    tree_reduce(lid, true);
    let m_all = red[0];
    workgroupBarrier();

    // L = sum over the splits of exp(m_s - M) l_s
    var sum: f32 = 0.0;
    for (var s: u32 = lid; s < num_splits; s = s + REDUCE_WORKGROUP_SIZE) {
        let at = ml + 2u * s * slots;
        sum = sum + exp(partial_ml[at] - m_all) * partial_ml[at + 1u];
    }
    red[lid] = sum;
    tree_reduce(lid, false);
    let l_all = red[0];
    let inv_l = select(0.0, 1.0 / l_all, l_all > 0.0);
    // Invocation lid takes element d0 + lid % width and every parts-th split from lid / width
    let width = min(head_dim, REDUCE_WORKGROUP_SIZE);
    let parts = REDUCE_WORKGROUP_SIZE / width;
    let part = lid / width;
    for (var d0: u32 = 0u; d0 < head_dim; d0 = d0 + width) {
        let d = d0 + lid % width;
        var a0: f32 = 0.0;
        var a1: f32 = 0.0;
        var a2: f32 = 0.0;
        var a3: f32 = 0.0;
        if (part < parts && d < head_dim) {
            var s: u32 = part;
            while (s + 3u * parts < num_splits) {
                let s1 = s + parts;
                let s2 = s1 + parts;
                let s3 = s2 + parts;
                a0 = a0 + exp(partial_ml[ml + 2u * s * slots] - m_all) * partial_acc[(s * slots + slot) * head_dim + d];
                a1 = a1 + exp(partial_ml[ml + 2u * s1 * slots] - m_all) * partial_acc[(s1 * slots + slot) * head_dim + d];
                a2 = a2 + exp(partial_ml[ml + 2u * s2 * slots] - m_all) * partial_acc[(s2 * slots + slot) * head_dim + d];
                a3 = a3 + exp(partial_ml[ml + 2u * s3 * slots] - m_all) * partial_acc[(s3 * slots + slot) * head_dim + d];
                s = s + 4u * parts;
            }
            while (s < num_splits) {
                a0 = a0 + exp(partial_ml[ml + 2u * s * slots] - m_all) * partial_acc[(s * slots + slot) * head_dim + d];
                s = s + parts;
            }
        }
        workgroupBarrier();
        red[lid] = (a0 + a1) + (a2 + a3);
        workgroupBarrier();
        if (part == 0u && d < head_dim) {
            var total: f32 = 0.0;
            for (var p: u32 = 0u; p < parts; p = p + 1u) {
                total = total + red[p * width + lid];
            }
            output[slot * head_dim + d] = total * inv_l;
        }
    }
}
