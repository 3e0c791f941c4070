// AUTO-GENERATED from templates/attention_decode_split_reduce.wgsl.j2 for variant attention_decode_split_d256_f16kv pass reduce by doppler-gen - do not edit.
// Edit the template and variants.toml, then run `doppler-gen generate`.
// source-hash: sha256:4a35728767082dbd53976c3e5d67c302e92312bdcfdf8eedcd1ff01c0bb5ab1e

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

// Nonzero once any invocation read a NaN partial (zeroed by invocation 0 at the start: wgpu-native
// does not zero workgroup memory; the first barrier of every path orders that store before any
// atomicOr)
var<workgroup> read_nan_any: atomic<u32>;
// Each part's softmax state (max, sum, element) per invocation
var<workgroup> red_m: array<f32, MAX_REDUCE_WORKGROUP_SIZE>;
var<workgroup> red_l: array<f32, MAX_REDUCE_WORKGROUP_SIZE>;
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
    var read_nan = false;  // whether this invocation read a NaN partial
    if (lid == 0u) {
        atomicStore(&read_nan_any, 0u);
    }
    // A row wider than the workgroup is combined a chunk of elements at a time, each chunk
    // stored before the next is read: test the whole row's accumulators first, so that a NaN
    // in a later chunk spoils the elements stored before it too
    if (head_dim > REDUCE_WORKGROUP_SIZE) {
        for (var i: u32 = lid; i < num_splits * head_dim; i = i + REDUCE_WORKGROUP_SIZE) {
            let s = i / head_dim;
            let v = partial_acc[(s * slots + slot) * head_dim + i - s * head_dim];
            read_nan = read_nan | ((bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u);
        }
    }
    // Invocation lid takes element d0 + lid % width of splits part, part + parts, ... (part =
    // lid / width), four splits a batch: every load of a batch is issued before any is used
    let width = min(head_dim, REDUCE_WORKGROUP_SIZE);
    let parts = REDUCE_WORKGROUP_SIZE / width;
    let part = lid / width;
    let last = num_splits - 1u;
    for (var d0: u32 = 0u; d0 < head_dim; d0 = d0 + width) {
        let d = d0 + lid % width;
        let live = part < parts && d < head_dim;
        let dd = select(0u, d, live);
        var m_p: f32 = NEG_BIG;
        var l_p: f32 = 0.0;
        var a_p: f32 = 0.0;
        for (var s: u32 = part; s < num_splits; s = s + 4u * parts) {
            // splits past the last read the last one and weigh nothing
            let s1 = min(s + parts, last);
            let s2 = min(s + 2u * parts, last);
            let s3 = min(s + 3u * parts, last);
            let m4 = vec4<f32>(partial_ml[ml + 2u * s * slots], partial_ml[ml + 2u * s1 * slots], partial_ml[ml + 2u * s2 * slots], partial_ml[ml + 2u * s3 * slots]);
            let l4 = vec4<f32>(partial_ml[ml + 2u * s * slots + 1u], partial_ml[ml + 2u * s1 * slots + 1u], partial_ml[ml + 2u * s2 * slots + 1u], partial_ml[ml + 2u * s3 * slots + 1u]);
            let a4 = vec4<f32>(partial_acc[(s * slots + slot) * head_dim + dd], partial_acc[(s1 * slots + slot) * head_dim + dd], partial_acc[(s2 * slots + slot) * head_dim + dd], partial_acc[(s3 * slots + slot) * head_dim + dd]);
            read_nan = read_nan | any((bitcast<vec4<u32>>(m4) & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u));
            read_nan = read_nan | any((bitcast<vec4<u32>>(l4) & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u));
            read_nan = read_nan | any((bitcast<vec4<u32>>(a4) & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u));
            let real = vec4<bool>(true, s + parts < num_splits, s + 2u * parts < num_splits, s + 3u * parts < num_splits);
            let m_new = max(m_p, max(max(m4.x, m4.y), max(m4.z, m4.w)));
            let weight = select(vec4<f32>(0.0), exp(m4 - m_new), real);
            let keep = exp(m_p - m_new);
            l_p = l_p * keep + dot(weight, l4);
            a_p = a_p * keep + dot(weight, a4);
            m_p = m_new;
        }
        workgroupBarrier();  // the previous element's merge is done with red_*
        if (read_nan) {
            atomicOr(&read_nan_any, 1u);
        }
        red_m[lid] = m_p;
        red_l[lid] = l_p;
        red[lid] = a_p;
        workgroupBarrier();
        if (part == 0u && d < head_dim) {
            var m_all: f32 = NEG_BIG;
            for (var p: u32 = 0u; p < parts; p = p + 1u) {
                m_all = max(m_all, red_m[p * width + lid]);
            }
            var l_all: f32 = 0.0;
            var total: f32 = 0.0;
            for (var p: u32 = 0u; p < parts; p = p + 1u) {
                let weight = exp(red_m[p * width + lid] - m_all);
                l_all = l_all + weight * red_l[p * width + lid];
                total = total + weight * red[p * width + lid];
            }
            let spoiled = atomicLoad(&read_nan_any) != 0u;
            let inv_l = select(0.0, 1.0 / l_all, l_all > 0.0);
            output[slot * head_dim + d] = select(total * inv_l, bitcast<f32>(0x7fc00000u | (d & 0u)), spoiled);
        }
    }
}
