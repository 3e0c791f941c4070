// AUTO-GENERATED from templates/attention_decode_tiered.wgsl.j2 for variant attention_decode_tiered_int4_f16kv by doppler-gen - do not edit.
// Edit the template and variants.toml, then run `doppler-gen generate`.
// source-hash: sha256:dfdd0f4a1057acd6a8d213ac6e068e7b4081e5d8de3d09248010e8b06987ff67

// Tiered Decode Attention Kernel (int4 cold, f16 hot, f32 Q, f32 output)
//
// One workgroup per query head; one invocation per head-dim element. Scores for every key
// (cold first, then hot) are kept in workgroup memory, then softmax-normalised at once.
// Fully masked row: average of V over all keys (masked scores are -3.4e38).

enable f16;

const MAX_KV_LEN: u32 = 2048u;
const MAX_WORKGROUP_SIZE: u32 = 256u;
const PACK_FACTOR: u32 = 8u;
const MASKED_SCORE: f32 = -3.402823e+38;

override WORKGROUP_SIZE: u32 = 256u;

struct Uniforms {
    num_heads: u32,
    num_kv_heads: u32,
    head_dim: u32,
    cold_len: u32,        // Keys in the cold tier (absolute positions 0 .. cold_len-1)
    hot_len: u32,         // Keys in the hot tier (absolute positions hot_start ..)
    seq_len: u32,
    scale: f32,
    is_causal: u32,
    start_pos: u32,       // Absolute position of the query
    attn_softcap: f32,
    sliding_window: u32,
    hot_window: u32,      // Rows of the hot ring buffer
    hot_start: u32,       // Absolute position of hot key 0
    packed_stride: u32,   // u32 words per (token, kv_head) row of packed cold K/V
    _pad: u32,
}

@group(0) @binding(0) var<uniform> u: Uniforms;
@group(0) @binding(1) var<storage, read> Q: array<f32>;
@group(0) @binding(2) var<storage, read> K_hot: array<f16>;
@group(0) @binding(3) var<storage, read> V_hot: array<f16>;
@group(0) @binding(4) var<storage, read> K_cold: array<u32>;
@group(0) @binding(5) var<storage, read> V_cold: array<u32>;
@group(0) @binding(6) var<storage, read> scales_k: array<f16>;
@group(0) @binding(7) var<storage, read> scales_v: array<f16>;
@group(0) @binding(8) var<storage, read_write> output: array<f32>;

var<workgroup> shared_scores: array<f32, MAX_KV_LEN>;
var<workgroup> shared_partial: array<f32, MAX_WORKGROUP_SIZE>;
var<workgroup> shared_max: f32;
var<workgroup> shared_sum: f32;
var<workgroup> shared_acc: array<f32, MAX_WORKGROUP_SIZE>;

// Get KV head index for grouped query attention
fn get_kv_head_idx(query_head_idx: u32) -> u32 {
    // GQA: multiple query heads share one KV head
    let heads_per_kv = u.num_heads / u.num_kv_heads;
    return query_head_idx / heads_per_kv;
}

// Causal + sliding-window mask of a key at absolute position abs_key for the decode query
fn is_masked(abs_key: u32) -> bool {
    let abs_query = u.start_pos;
    // Causal mask
    if (u.is_causal != 0u && abs_key > abs_query) { return true; }
    // Sliding window mask
    if (u.sliding_window > 0u && abs_query >= u.sliding_window) {
        if (abs_key < abs_query - u.sliding_window + 1u) { return true; }
    }
    return false;
}

// Physical row of hot key hot_pos: a ring of hot_window rows starting at hot_start
fn get_hot_pos(hot_pos: u32) -> u32 {
    if (u.hot_window > 0u) {
        let abs_key = u.hot_start + hot_pos;
        return abs_key % u.hot_window;
    }
    return hot_pos;
}

// Dequantize element `tid` of cold K row (key_pos, kv_head_idx): int4 value * f16 scale
fn read_cold_k(
    key_pos: u32,
    kv_head_idx: u32,
    tid: u32
) -> f32 {
    let pack_idx = tid / PACK_FACTOR;
    if (pack_idx >= u.packed_stride) {
        return 0.0;
    }
    let lane = tid - pack_idx * PACK_FACTOR;
    let base = (key_pos * u.num_kv_heads + kv_head_idx) * u.packed_stride + pack_idx;
    let packed_val = K_cold[base];
    let raw = (packed_val >> (4u * lane)) & 0xfu;
    var q = i32(raw);
    if (q >= 8) { q -= 16; }
    let scale_idx = key_pos * u.num_kv_heads + kv_head_idx;
    let scale = f32(scales_k[scale_idx]);
    return f32(q) * scale;
}

// Dequantize element `tid` of cold V row (key_pos, kv_head_idx): int4 value * f16 scale
fn read_cold_v(
    key_pos: u32,
    kv_head_idx: u32,
    tid: u32
) -> f32 {
    let pack_idx = tid / PACK_FACTOR;
    if (pack_idx >= u.packed_stride) {
        return 0.0;
    }
    let lane = tid - pack_idx * PACK_FACTOR;
    let base = (key_pos * u.num_kv_heads + kv_head_idx) * u.packed_stride + pack_idx;
    let packed_val = V_cold[base];
    let raw = (packed_val >> (4u * lane)) & 0xfu;
    var q = i32(raw);
    if (q >= 8) { q -= 16; }
    let scale_idx = key_pos * u.num_kv_heads + kv_head_idx;
    let scale = f32(scales_v[scale_idx]);
    return f32(q) * scale;
}

// Element `tid` of hot {K,V} row hot_pos
fn read_hot_k(hot_pos: u32, kv_head_idx: u32, tid: u32) -> f32 {
    let offset = get_hot_pos(hot_pos) * u.num_kv_heads * u.head_dim + kv_head_idx * u.head_dim + tid;
    return f32(K_hot[offset]);
}

fn read_hot_v(hot_pos: u32, kv_head_idx: u32, tid: u32) -> f32 {
    let offset = get_hot_pos(hot_pos) * u.num_kv_heads * u.head_dim + kv_head_idx * u.head_dim + tid;
    return f32(V_hot[offset]);
}

// Reduce the per-invocation products in shared_partial to the key's score (invocation 0 only),
// apply scale, softcap and mask, and store it at score_idx
fn store_score(head_dim: u32, score_idx: u32, abs_key: u32) {
    var dot: f32 = 0.0;
    for (var d: u32 = 0u; d < head_dim; d++) {
        dot += shared_partial[d];
    }
    var s = dot * u.scale;
    if (u.attn_softcap > 0.0) {
        s = tanh(s / u.attn_softcap) * u.attn_softcap;
    }
    if (is_masked(abs_key)) {
        s = MASKED_SCORE;
    }
    shared_scores[score_idx] = s;
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn main(
    @builtin(local_invocation_id) local_id: vec3<u32>,
    @builtin(workgroup_id) workgroup_id: vec3<u32>,
) {
    let head_idx = workgroup_id.x;
    let tid = local_id.x;
    let head_dim = u.head_dim;
    let cold_len = u.cold_len;
    let hot_len = u.hot_len;
    let total_len = cold_len + hot_len;
    let kv_head_idx = get_kv_head_idx(head_idx);

    if (WORKGROUP_SIZE > MAX_WORKGROUP_SIZE || head_dim > WORKGROUP_SIZE || total_len > MAX_KV_LEN) {
        return;
    }

    let valid = tid < head_dim;

    var q_val: f32 = 0.0;
    if (valid) {
        q_val = Q[head_idx * head_dim + tid];
        shared_acc[tid] = 0.0;
    }

    // Scores of the cold keys (absolute positions 0 .. cold_len-1)
    for (var k_pos: u32 = 0u; k_pos < cold_len; k_pos++) {
        var k_val: f32 = 0.0;
        if (valid) {
            k_val = read_cold_k(k_pos, kv_head_idx, tid);
        }
        shared_partial[tid] = q_val * k_val;
        workgroupBarrier();
        if (tid == 0u) {
            store_score(head_dim, k_pos, k_pos);
        }
        workgroupBarrier();
    }

    // Scores of the hot keys (absolute positions hot_start ..), stored after the cold ones
    for (var k_pos: u32 = 0u; k_pos < hot_len; k_pos++) {
        var k_val: f32 = 0.0;
        if (valid) {
            k_val = read_hot_k(k_pos, kv_head_idx, tid);
        }
        shared_partial[tid] = q_val * k_val;
        workgroupBarrier();
        if (tid == 0u) {
            store_score(head_dim, cold_len + k_pos, u.hot_start + k_pos);
        }
        workgroupBarrier();
    }

    // Softmax over all scores: max, then exp and sum (invocation 0)
    if (tid == 0u) {
        var max_score: f32 = MASKED_SCORE;
        for (var k: u32 = 0u; k < total_len; k++) {
            max_score = max(max_score, shared_scores[k]);
        }
        var sum_exp: f32 = 0.0;
        for (var k: u32 = 0u; k < total_len; k++) {
            let w = exp(shared_scores[k] - max_score);
            shared_scores[k] = w;
            sum_exp += w;
        }
        shared_sum = sum_exp;
    }
    workgroupBarrier();

    let sum_exp = shared_sum;
    let inv_sum = select(0.0, 1.0 / sum_exp, sum_exp > 0.0);

    // Weighted sum of V, one head-dim element per invocation
    if (valid) {
        var acc: f32 = 0.0;
        for (var score_idx: u32 = 0u; score_idx < total_len; score_idx++) {
            var v_val: f32 = 0.0;
            if (score_idx < cold_len) {
                v_val = read_cold_v(score_idx, kv_head_idx, tid);
            } else {
                v_val = read_hot_v(score_idx - cold_len, kv_head_idx, tid);
            }
            acc += shared_scores[score_idx] * v_val;
        }
        shared_acc[tid] = acc * inv_sum;
    }
    workgroupBarrier();

    if (valid) {
        output[head_idx * head_dim + tid] = shared_acc[tid];
    }
}
