// AUTO-GENERATED from templates/attention_decode_split_reduce.wgsl.j2 for variant attention_decode_split_d256_f16kv pass reduce by doppler-gen - do not edit.
// Edit the template and variants.toml, then run `doppler-gen generate`.
// source-hash: sha256:2ee26b8a783778a9b262a8790863f5fefce5bf7b2dacc5496fcc336548097e2b

// Split-KV decode attention, pass 2: combine the per-split partials into the output
//
// The output is f32; partials and arithmetic are f32.
// Dispatch: query_len * num_heads workgroups.

const MAX_HEAD_DIM: u32 = 256u;
const NEG_BIG: f32 = -3.402823e+38;

override REDUCE_WORKGROUP_SIZE: u32 = 64u;   // invocations, strided over head_dim
override KV_SPLITS: u32 = 64u;          // splits (as in the partials pass)
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

// Keys per split: seq_len over KV_SPLITS splits, at least MIN_SPLIT_KEYS
fn split_keys() -> u32 {
    return max(max(MIN_SPLIT_KEYS, 1u), (u.seq_len + KV_SPLITS - 1u) / KV_SPLITS);
}

// Splits that hold keys (at most KV_SPLITS)
fn used_splits() -> u32 {
    let keys = split_keys();
    return min(KV_SPLITS, (u.seq_len + keys - 1u) / keys);
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
    var m_all: f32 = NEG_BIG;
    for (var s: u32 = 0u; s < num_splits; s = s + 1u) {
        m_all = max(m_all, partial_ml[2u * (s * slots + slot)]);
    }
    var l_all: f32 = 0.0;
    for (var s: u32 = 0u; s < num_splits; s = s + 1u) {
        let at = 2u * (s * slots + slot);
        l_all = l_all + exp(partial_ml[at] - m_all) * partial_ml[at + 1u];
    }
    let inv_l = select(0.0, 1.0 / l_all, l_all > 0.0);
    for (var d: u32 = lid; d < head_dim; d = d + REDUCE_WORKGROUP_SIZE) {
        var total: f32 = 0.0;
        for (var s: u32 = 0u; s < num_splits; s = s + 1u) {
            let weight = exp(partial_ml[2u * (s * slots + slot)] - m_all);
            total = total + weight * partial_acc[(s * slots + slot) * head_dim + d];
        }
        output[slot * head_dim + d] = total * inv_l;
    }
}
