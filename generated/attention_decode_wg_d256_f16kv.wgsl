// AUTO-GENERATED from templates/attention_decode.wgsl.j2 for variant attention_decode_wg_d256_f16kv by doppler-gen - do not edit.
// Edit the template and variants.toml, then run `doppler-gen generate`.
// source-hash: sha256:8c10aad98da884694764c7d8f16498fae6dfb7d1ada3f861a507d36358912fd2

// Decode attention, one workgroup per query head, parallel over keys (workgroup-memory reductions)
//
// Q is f32, K/V are f16 (read 4 elements at a time), the output is f32.
// Computation is performed in f32; other dtypes appear only at loads and the store.
// Dispatch: num_heads workgroups. head_dim must be a multiple of 4 and at most MAX_HEAD_DIM.

enable f16;

const MAX_HEAD_DIM: u32 = 256u;
const MAX_WORKGROUP_SIZE: u32 = 256u;
const LANES_PER_KEY: u32 = 8u;
const VEC_PER_LANE: u32 = 8u;  // MAX_HEAD_DIM / 4 / LANES_PER_KEY
const KEYS_PER_ITER: u32 = 2u;
const MAX_KEY_GROUPS: u32 = 32u;  // MAX_WORKGROUP_SIZE / LANES_PER_KEY
// Rows of the merge buffer: 8 KiB of partial accumulators at most
const MERGE_ROWS: u32 = 8u;
const NEG_BIG: f32 = -3.402823e+38;
// vec4 slots of the merge buffer: MERGE_ROWS rows of MAX_HEAD_DIM / 4
const MERGE_VECS: u32 = 512u;

override WORKGROUP_SIZE: u32 = 256u;   // invocations; a multiple of LANES_PER_KEY, at most MAX_WORKGROUP_SIZE

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
@group(0) @binding(1) var<storage, read> Q: array<f32>;       // [query_len, num_heads, head_dim]
@group(0) @binding(2) var<storage, read> K: array<vec4<f16>>; // [seq_len, num_kv_heads, head_dim / 4]
@group(0) @binding(3) var<storage, read> V: array<vec4<f16>>; // [seq_len, num_kv_heads, head_dim / 4]
@group(0) @binding(4) var<storage, read_write> output: array<f32>; // [query_len, num_heads, head_dim]
@group(0) @binding(5) var<storage, read> kv_len_buffer: array<u32>;
@group(0) @binding(6) var<storage, read> page_table: array<u32>;

// Merge of the key groups' softmax states
var<workgroup> merge_m: array<f32, MAX_KEY_GROUPS>;
var<workgroup> merge_l: array<f32, MAX_KEY_GROUPS>;
var<workgroup> merge_acc: array<vec4<f32>, MERGE_VECS>;
// Partial dot products, double-buffered by iteration parity: [parity][invocation][key]
var<workgroup> partial_dots: array<f32, 2u * MAX_WORKGROUP_SIZE * KEYS_PER_ITER>;

// Get KV head index for grouped query attention
fn get_kv_head_idx(query_head_idx: u32) -> u32 {
    // GQA: multiple query heads share one KV head
    let heads_per_kv = u.num_heads / u.num_kv_heads;
    return query_head_idx / heads_per_kv;
}

// Physical KV row of logical key position key_pos: contiguous, ring (sliding window) or paged
fn get_kv_pos(key_pos: u32) -> u32 {
    let abs_key = u.kv_start + key_pos;
    if (u.kv_layout == 1u && u.sliding_window > 0u) {
        return abs_key % u.sliding_window;
    }
    if (u.kv_layout == 2u) {
        let page_idx = abs_key / u.page_size;
        let in_page = abs_key - (page_idx * u.page_size);
        let phys_page = page_table[page_idx];
        return phys_page * u.page_size + in_page;
    }
    return abs_key;
}

// True when get_kv_pos(key_pos) is kv_start + key_pos for every key: contiguous rows, or a ring
// without a window (get_kv_pos's first two branches not taken)
fn kv_rows_linear() -> bool {
    return !((u.kv_layout == 1u && u.sliding_window > 0u) || u.kv_layout == 2u);
}

// KV length: the uniform, or the first word of kv_len_buffer when kv_len_source != 0
fn get_kv_len() -> u32 {
    if (u.kv_len_source == 0u) {
        return u.seq_len;
    }
    return kv_len_buffer[0];
}

// The keys [x, y) query query_pos can attend: the causal and sliding-window masks as bounds on
// kv_start-relative positions (the key loops test nothing else, so no key pays for the masks)
fn key_range(query_pos: u32, kv_len: u32) -> vec2<u32> {
    let abs_query = query_pos + u.start_pos;
    var key_end: u32 = kv_len;
    if (u.is_causal != 0u) {
        key_end = select(0u, min(kv_len, abs_query - u.kv_start + 1u), abs_query >= u.kv_start);
    }
    var key_begin: u32 = 0u;
    if (u.sliding_window > 0u && abs_query >= u.sliding_window) {
        let first = abs_query - u.sliding_window + 1u;
        if (first > u.kv_start) {
            key_begin = min(first - u.kv_start, key_end);
        }
    }
    return vec2<u32>(key_begin, key_end);
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wg_id: vec3<u32>,
) {
    let head_idx = wg_id.x;
    let head_dim = u.head_dim;
    if (head_idx >= u.num_heads || head_dim > MAX_HEAD_DIM || head_dim % 4u != 0u) {
        return;
    }
    let kv_head_idx = get_kv_head_idx(head_idx);
    let hd4 = head_dim / 4u;
    let kv_len = get_kv_len();
    let scale = u.scale;
    let nkg = WORKGROUP_SIZE / LANES_PER_KEY;

    let kg = lid / LANES_PER_KEY;
    let lane = lid % LANES_PER_KEY;

    for (var query_pos: u32 = 0u; query_pos < u.query_len; query_pos = query_pos + 1u) {
        let q_offset = query_pos * u.num_heads * head_dim + head_idx * head_dim;
        let out_offset = q_offset;

        // This lane's slice of q: vec4s lane, lane + LANES_PER_KEY, ...
        var q = array<vec4<f32>, VEC_PER_LANE>();
        var acc = array<vec4<f32>, VEC_PER_LANE>();
        {
            let j = 0u;
            let v = lane + j * LANES_PER_KEY;
            if (v < hd4) {
                let o = q_offset + 4u * v;
                q[j] = vec4<f32>(Q[o], Q[o + 1u], Q[o + 2u], Q[o + 3u]);
            }
        }
        {
            let j = 1u;
            let v = lane + j * LANES_PER_KEY;
            if (v < hd4) {
                let o = q_offset + 4u * v;
                q[j] = vec4<f32>(Q[o], Q[o + 1u], Q[o + 2u], Q[o + 3u]);
            }
        }
        {
            let j = 2u;
            let v = lane + j * LANES_PER_KEY;
            if (v < hd4) {
                let o = q_offset + 4u * v;
                q[j] = vec4<f32>(Q[o], Q[o + 1u], Q[o + 2u], Q[o + 3u]);
            }
        }
        {
            let j = 3u;
            let v = lane + j * LANES_PER_KEY;
            if (v < hd4) {
                let o = q_offset + 4u * v;
                q[j] = vec4<f32>(Q[o], Q[o + 1u], Q[o + 2u], Q[o + 3u]);
            }
        }
        {
            let j = 4u;
            let v = lane + j * LANES_PER_KEY;
            if (v < hd4) {
                let o = q_offset + 4u * v;
                q[j] = vec4<f32>(Q[o], Q[o + 1u], Q[o + 2u], Q[o + 3u]);
            }
        }
        {
            let j = 5u;
            let v = lane + j * LANES_PER_KEY;
            if (v < hd4) {
                let o = q_offset + 4u * v;
                q[j] = vec4<f32>(Q[o], Q[o + 1u], Q[o + 2u], Q[o + 3u]);
            }
        }
        {
            let j = 6u;
            let v = lane + j * LANES_PER_KEY;
            if (v < hd4) {
                let o = q_offset + 4u * v;
                q[j] = vec4<f32>(Q[o], Q[o + 1u], Q[o + 2u], Q[o + 3u]);
            }
        }
        {
            let j = 7u;
            let v = lane + j * LANES_PER_KEY;
            if (v < hd4) {
                let o = q_offset + 4u * v;
                q[j] = vec4<f32>(Q[o], Q[o + 1u], Q[o + 2u], Q[o + 3u]);
            }
        }
        var m: f32 = NEG_BIG;
        var l: f32 = 0.0;

        // Keys [key_begin, key_end) of this query: key group kg takes keys key_begin + kg,
        // + nkg, + 2 nkg, ... (KEYS_PER_ITER of them per iteration)
        let keys = key_range(query_pos, kv_len);
        // The key loops for linear K/V rows (no per-key layout branch), and for any layout through
        // get_kv_pos (layout_loops)
        if (kv_rows_linear()) {
            let span = keys.y - min(keys.x, keys.y);
            let per_iter = nkg * KEYS_PER_ITER;
            let iterations = (span + per_iter - 1u) / per_iter;
            // The first iteration's K/V rows (each later iteration's are loaded one iteration ahead)
            var next_k_0 = array<vec4<f16>, VEC_PER_LANE>();
            var next_v_0 = array<vec4<f16>, VEC_PER_LANE>();
            var next_k_1 = array<vec4<f16>, VEC_PER_LANE>();
            var next_v_1 = array<vec4<f16>, VEC_PER_LANE>();
            if (iterations > 0u) {
                let next_row_0 = ((u.kv_start + min(keys.x + kg + 0u * nkg, keys.y - 1u)) * u.num_kv_heads + kv_head_idx) * hd4;
                {
                    let j = 0u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 1u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 2u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 3u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 4u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 5u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 6u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 7u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }

                let next_row_1 = ((u.kv_start + min(keys.x + kg + 1u * nkg, keys.y - 1u)) * u.num_kv_heads + kv_head_idx) * hd4;
                {
                    let j = 0u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 1u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 2u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 3u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 4u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 5u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 6u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 7u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
            }
            for (var it: u32 = 0u; it < iterations; it = it + 1u) {
                let base = keys.x + it * per_iter + kg;
                // key 0 of this iteration: its K and V rows came with the previous iteration's
                // (a key past the end read the last key's row, and its weight is 0)
                let key_0 = base + 0u * nkg;
                let valid_0 = key_0 < keys.y;
                let k_0 = next_k_0;
                let v_0 = next_v_0;
                // key 1 of this iteration: its K and V rows came with the previous iteration's
                // (a key past the end read the last key's row, and its weight is 0)
                let key_1 = base + 1u * nkg;
                let valid_1 = key_1 < keys.y;
                let k_1 = next_k_1;
                let v_1 = next_v_1;
                // The next iteration's rows, in flight while this one is scored (the last
                // iteration re-reads the last key's)
                let next_row_0 = ((u.kv_start + min(base + per_iter + 0u * nkg, keys.y - 1u)) * u.num_kv_heads + kv_head_idx) * hd4;
                {
                    let j = 0u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 1u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 2u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 3u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 4u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 5u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 6u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 7u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }

                let next_row_1 = ((u.kv_start + min(base + per_iter + 1u * nkg, keys.y - 1u)) * u.num_kv_heads + kv_head_idx) * hd4;
                {
                    let j = 0u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 1u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 2u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 3u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 4u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 5u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 6u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 7u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }

                // dot products of key 0 (an invalid key's score is never used)
                var dot_0: f32 = 0.0;
                {
                    let j = 0u;
                    dot_0 = dot_0 + dot(q[j], vec4<f32>(k_0[j]));
                }
                {
                    let j = 1u;
                    dot_0 = dot_0 + dot(q[j], vec4<f32>(k_0[j]));
                }
                {
                    let j = 2u;
                    dot_0 = dot_0 + dot(q[j], vec4<f32>(k_0[j]));
                }
                {
                    let j = 3u;
                    dot_0 = dot_0 + dot(q[j], vec4<f32>(k_0[j]));
                }
                {
                    let j = 4u;
                    dot_0 = dot_0 + dot(q[j], vec4<f32>(k_0[j]));
                }
                {
                    let j = 5u;
                    dot_0 = dot_0 + dot(q[j], vec4<f32>(k_0[j]));
                }
                {
                    let j = 6u;
                    dot_0 = dot_0 + dot(q[j], vec4<f32>(k_0[j]));
                }
                {
                    let j = 7u;
                    dot_0 = dot_0 + dot(q[j], vec4<f32>(k_0[j]));
                }
                // dot products of key 1 (an invalid key's score is never used)
                var dot_1: f32 = 0.0;
                {
                    let j = 0u;
                    dot_1 = dot_1 + dot(q[j], vec4<f32>(k_1[j]));
                }
                {
                    let j = 1u;
                    dot_1 = dot_1 + dot(q[j], vec4<f32>(k_1[j]));
                }
                {
                    let j = 2u;
                    dot_1 = dot_1 + dot(q[j], vec4<f32>(k_1[j]));
                }
                {
                    let j = 3u;
                    dot_1 = dot_1 + dot(q[j], vec4<f32>(k_1[j]));
                }
                {
                    let j = 4u;
                    dot_1 = dot_1 + dot(q[j], vec4<f32>(k_1[j]));
                }
                {
                    let j = 5u;
                    dot_1 = dot_1 + dot(q[j], vec4<f32>(k_1[j]));
                }
                {
                    let j = 6u;
                    dot_1 = dot_1 + dot(q[j], vec4<f32>(k_1[j]));
                }
                {
                    let j = 7u;
                    dot_1 = dot_1 + dot(q[j], vec4<f32>(k_1[j]));
                }
                // Sum the partial dot products of the LANES_PER_KEY lanes of each key group
                let parity = (it % 2u) * MAX_WORKGROUP_SIZE * KEYS_PER_ITER;
                partial_dots[parity + lid * KEYS_PER_ITER + 0u] = dot_0;
                partial_dots[parity + lid * KEYS_PER_ITER + 1u] = dot_1;
                workgroupBarrier();
                let group_first = parity + (kg * LANES_PER_KEY) * KEYS_PER_ITER;
                dot_0 = 0.0;
                dot_1 = 0.0;
                for (var i: u32 = 0u; i < LANES_PER_KEY; i = i + 1u) {
                    dot_0 = dot_0 + partial_dots[group_first + i * KEYS_PER_ITER + 0u];
                    dot_1 = dot_1 + partial_dots[group_first + i * KEYS_PER_ITER + 1u];
                }
                // Scores and the online softmax update of this key group
                var block_max: f32 = NEG_BIG;
                var score_0: f32 = dot_0 * scale;
                if (u.attn_softcap > 0.0) {
                    score_0 = tanh(score_0 / u.attn_softcap) * u.attn_softcap;
                }
                if (valid_0) {
                    block_max = max(block_max, score_0);
                }
                var score_1: f32 = dot_1 * scale;
                if (u.attn_softcap > 0.0) {
                    score_1 = tanh(score_1 / u.attn_softcap) * u.attn_softcap;
                }
                if (valid_1) {
                    block_max = max(block_max, score_1);
                }
                let m_new = max(m, block_max);
                let correction = exp(m - m_new);
                let p_0 = select(0.0, exp(score_0 - m_new), valid_0);
                let p_1 = select(0.0, exp(score_1 - m_new), valid_1);
                l = l * correction + p_0 + p_1;
                m = m_new;
                {
                    let j = 0u;
                    acc[j] = acc[j] * correction + p_0 * vec4<f32>(v_0[j]) + p_1 * vec4<f32>(v_1[j]);
                }
                {
                    let j = 1u;
                    acc[j] = acc[j] * correction + p_0 * vec4<f32>(v_0[j]) + p_1 * vec4<f32>(v_1[j]);
                }
                {
                    let j = 2u;
                    acc[j] = acc[j] * correction + p_0 * vec4<f32>(v_0[j]) + p_1 * vec4<f32>(v_1[j]);
                }
                {
                    let j = 3u;
                    acc[j] = acc[j] * correction + p_0 * vec4<f32>(v_0[j]) + p_1 * vec4<f32>(v_1[j]);
                }
                {
                    let j = 4u;
                    acc[j] = acc[j] * correction + p_0 * vec4<f32>(v_0[j]) + p_1 * vec4<f32>(v_1[j]);
                }
                {
                    let j = 5u;
                    acc[j] = acc[j] * correction + p_0 * vec4<f32>(v_0[j]) + p_1 * vec4<f32>(v_1[j]);
                }
                {
                    let j = 6u;
                    acc[j] = acc[j] * correction + p_0 * vec4<f32>(v_0[j]) + p_1 * vec4<f32>(v_1[j]);
                }
                {
                    let j = 7u;
                    acc[j] = acc[j] * correction + p_0 * vec4<f32>(v_0[j]) + p_1 * vec4<f32>(v_1[j]);
                }
            }
        } else {
            let span = keys.y - min(keys.x, keys.y);
            let per_iter = nkg * KEYS_PER_ITER;
            let iterations = (span + per_iter - 1u) / per_iter;
            // The first iteration's K/V rows (each later iteration's are loaded one iteration ahead)
            var next_k_0 = array<vec4<f16>, VEC_PER_LANE>();
            var next_v_0 = array<vec4<f16>, VEC_PER_LANE>();
            var next_k_1 = array<vec4<f16>, VEC_PER_LANE>();
            var next_v_1 = array<vec4<f16>, VEC_PER_LANE>();
            if (iterations > 0u) {
                let next_row_0 = (get_kv_pos(min(keys.x + kg + 0u * nkg, keys.y - 1u)) * u.num_kv_heads + kv_head_idx) * hd4;
                {
                    let j = 0u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 1u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 2u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 3u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 4u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 5u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 6u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 7u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }

                let next_row_1 = (get_kv_pos(min(keys.x + kg + 1u * nkg, keys.y - 1u)) * u.num_kv_heads + kv_head_idx) * hd4;
                {
                    let j = 0u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 1u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 2u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 3u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 4u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 5u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 6u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 7u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
            }
            for (var it: u32 = 0u; it < iterations; it = it + 1u) {
                let base = keys.x + it * per_iter + kg;
                // key 0 of this iteration: its K and V rows came with the previous iteration's
                // (a key past the end read the last key's row, and its weight is 0)
                let key_0 = base + 0u * nkg;
                let valid_0 = key_0 < keys.y;
                let k_0 = next_k_0;
                let v_0 = next_v_0;
                // key 1 of this iteration: its K and V rows came with the previous iteration's
                // (a key past the end read the last key's row, and its weight is 0)
                let key_1 = base + 1u * nkg;
                let valid_1 = key_1 < keys.y;
                let k_1 = next_k_1;
                let v_1 = next_v_1;
                // The next iteration's rows, in flight while this one is scored (the last
                // iteration re-reads the last key's)
                let next_row_0 = (get_kv_pos(min(base + per_iter + 0u * nkg, keys.y - 1u)) * u.num_kv_heads + kv_head_idx) * hd4;
                {
                    let j = 0u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 1u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 2u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 3u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 4u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 5u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 6u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }
                {
                    let j = 7u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_0[j] = K[next_row_0 + v];
                    next_v_0[j] = V[next_row_0 + v];
                }

                let next_row_1 = (get_kv_pos(min(base + per_iter + 1u * nkg, keys.y - 1u)) * u.num_kv_heads + kv_head_idx) * hd4;
                {
                    let j = 0u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 1u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 2u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 3u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 4u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 5u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 6u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }
                {
                    let j = 7u;
                    let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                    next_k_1[j] = K[next_row_1 + v];
                    next_v_1[j] = V[next_row_1 + v];
                }

                // dot products of key 0 (an invalid key's score is never used)
                var dot_0: f32 = 0.0;
                {
                    let j = 0u;
                    dot_0 = dot_0 + dot(q[j], vec4<f32>(k_0[j]));
                }
                {
                    let j = 1u;
                    dot_0 = dot_0 + dot(q[j], vec4<f32>(k_0[j]));
                }
                {
                    let j = 2u;
                    dot_0 = dot_0 + dot(q[j], vec4<f32>(k_0[j]));
                }
                {
                    let j = 3u;
                    dot_0 = dot_0 + dot(q[j], vec4<f32>(k_0[j]));
                }
                {
                    let j = 4u;
                    dot_0 = dot_0 + dot(q[j], vec4<f32>(k_0[j]));
                }
                {
                    let j = 5u;
                    dot_0 = dot_0 + dot(q[j], vec4<f32>(k_0[j]));
                }
                {
                    let j = 6u;
                    dot_0 = dot_0 + dot(q[j], vec4<f32>(k_0[j]));
                }
                {
                    let j = 7u;
                    dot_0 = dot_0 + dot(q[j], vec4<f32>(k_0[j]));
                }
                // dot products of key 1 (an invalid key's score is never used)
                var dot_1: f32 = 0.0;
                {
                    let j = 0u;
                    dot_1 = dot_1 + dot(q[j], vec4<f32>(k_1[j]));
                }
                {
                    let j = 1u;
                    dot_1 = dot_1 + dot(q[j], vec4<f32>(k_1[j]));
                }
                {
                    let j = 2u;
                    dot_1 = dot_1 + dot(q[j], vec4<f32>(k_1[j]));
                }
                {
                    let j = 3u;
                    dot_1 = dot_1 + dot(q[j], vec4<f32>(k_1[j]));
                }
                {
                    let j = 4u;
                    dot_1 = dot_1 + dot(q[j], vec4<f32>(k_1[j]));
                }
                {
                    let j = 5u;
                    dot_1 = dot_1 + dot(q[j], vec4<f32>(k_1[j]));
                }
                {
                    let j = 6u;
                    dot_1 = dot_1 + dot(q[j], vec4<f32>(k_1[j]));
                }
                {
                    let j = 7u;
                    dot_1 = dot_1 + dot(q[j], vec4<f32>(k_1[j]));
                }
                // Sum the partial dot products of the LANES_PER_KEY lanes of each key group
                let parity = (it % 2u) * MAX_WORKGROUP_SIZE * KEYS_PER_ITER;
                partial_dots[parity + lid * KEYS_PER_ITER + 0u] = dot_0;
                partial_dots[parity + lid * KEYS_PER_ITER + 1u] = dot_1;
                workgroupBarrier();
                let group_first = parity + (kg * LANES_PER_KEY) * KEYS_PER_ITER;
                dot_0 = 0.0;
                dot_1 = 0.0;
                for (var i: u32 = 0u; i < LANES_PER_KEY; i = i + 1u) {
                    dot_0 = dot_0 + partial_dots[group_first + i * KEYS_PER_ITER + 0u];
                    dot_1 = dot_1 + partial_dots[group_first + i * KEYS_PER_ITER + 1u];
                }
                // Scores and the online softmax update of this key group
                var block_max: f32 = NEG_BIG;
                var score_0: f32 = dot_0 * scale;
                if (u.attn_softcap > 0.0) {
                    score_0 = tanh(score_0 / u.attn_softcap) * u.attn_softcap;
                }
                if (valid_0) {
                    block_max = max(block_max, score_0);
                }
                var score_1: f32 = dot_1 * scale;
                if (u.attn_softcap > 0.0) {
                    score_1 = tanh(score_1 / u.attn_softcap) * u.attn_softcap;
                }
                if (valid_1) {
                    block_max = max(block_max, score_1);
                }
                let m_new = max(m, block_max);
                let correction = exp(m - m_new);
                let p_0 = select(0.0, exp(score_0 - m_new), valid_0);
                let p_1 = select(0.0, exp(score_1 - m_new), valid_1);
                l = l * correction + p_0 + p_1;
                m = m_new;
                {
                    let j = 0u;
                    acc[j] = acc[j] * correction + p_0 * vec4<f32>(v_0[j]) + p_1 * vec4<f32>(v_1[j]);
                }
                {
                    let j = 1u;
                    acc[j] = acc[j] * correction + p_0 * vec4<f32>(v_0[j]) + p_1 * vec4<f32>(v_1[j]);
                }
                {
                    let j = 2u;
                    acc[j] = acc[j] * correction + p_0 * vec4<f32>(v_0[j]) + p_1 * vec4<f32>(v_1[j]);
                }
                {
                    let j = 3u;
                    acc[j] = acc[j] * correction + p_0 * vec4<f32>(v_0[j]) + p_1 * vec4<f32>(v_1[j]);
                }
                {
                    let j = 4u;
                    acc[j] = acc[j] * correction + p_0 * vec4<f32>(v_0[j]) + p_1 * vec4<f32>(v_1[j]);
                }
                {
                    let j = 5u;
                    acc[j] = acc[j] * correction + p_0 * vec4<f32>(v_0[j]) + p_1 * vec4<f32>(v_1[j]);
                }
                {
                    let j = 6u;
                    acc[j] = acc[j] * correction + p_0 * vec4<f32>(v_0[j]) + p_1 * vec4<f32>(v_1[j]);
                }
                {
                    let j = 7u;
                    acc[j] = acc[j] * correction + p_0 * vec4<f32>(v_0[j]) + p_1 * vec4<f32>(v_1[j]);
                }
            }
        }

        // -- merge the key groups: common max, rescale, sum the acc slices row by row --
        if (lane == 0u) {
            merge_m[kg] = m;
        }
        workgroupBarrier();
        var m_all: f32 = NEG_BIG;
        {
            var m_all_1: f32 = NEG_BIG;
            var m_all_2: f32 = NEG_BIG;
            var m_all_3: f32 = NEG_BIG;
            for (var s: u32 = 0u; s < nkg; s = s + 4u) {
                m_all = max(m_all, merge_m[s]);
                m_all_1 = max(m_all_1, select(NEG_BIG, merge_m[min(s + 1u, nkg - 1u)], s + 1u < nkg));
                m_all_2 = max(m_all_2, select(NEG_BIG, merge_m[min(s + 2u, nkg - 1u)], s + 2u < nkg));
                m_all_3 = max(m_all_3, select(NEG_BIG, merge_m[min(s + 3u, nkg - 1u)], s + 3u < nkg));
            }
            m_all = max(max(m_all, m_all_1), max(m_all_2, m_all_3));
        }
        let rescale = exp(m - m_all);
        l = l * rescale;
        if (lane == 0u) {
            merge_l[kg] = l;
        }
        // Round r: key groups [r * rows, (r + 1) * rows) add their slices into the rows; round 0
        // writes every row, so no row keeps a value from an earlier query
        let rows = min(MERGE_ROWS, nkg);
        for (var r: u32 = 0u; r * rows < nkg; r = r + 1u) {
            if (kg / rows == r) {
                let row = (kg - r * rows) * (MAX_HEAD_DIM / 4u);
                {
                    let j = 0u;
                    let v = lane + j * LANES_PER_KEY;
                    if (v < hd4) {
                        let scaled = acc[j] * rescale;
                        if (r == 0u) {
                            merge_acc[row + v] = scaled;
                        } else {
                            merge_acc[row + v] = merge_acc[row + v] + scaled;
                        }
                    }
                }
                {
                    let j = 1u;
                    let v = lane + j * LANES_PER_KEY;
                    if (v < hd4) {
                        let scaled = acc[j] * rescale;
                        if (r == 0u) {
                            merge_acc[row + v] = scaled;
                        } else {
                            merge_acc[row + v] = merge_acc[row + v] + scaled;
                        }
                    }
                }
                {
                    let j = 2u;
                    let v = lane + j * LANES_PER_KEY;
                    if (v < hd4) {
                        let scaled = acc[j] * rescale;
                        if (r == 0u) {
                            merge_acc[row + v] = scaled;
                        } else {
                            merge_acc[row + v] = merge_acc[row + v] + scaled;
                        }
                    }
                }
                {
                    let j = 3u;
                    let v = lane + j * LANES_PER_KEY;
                    if (v < hd4) {
                        let scaled = acc[j] * rescale;
                        if (r == 0u) {
                            merge_acc[row + v] = scaled;
                        } else {
                            merge_acc[row + v] = merge_acc[row + v] + scaled;
                        }
                    }
                }
                {
                    let j = 4u;
                    let v = lane + j * LANES_PER_KEY;
                    if (v < hd4) {
                        let scaled = acc[j] * rescale;
                        if (r == 0u) {
                            merge_acc[row + v] = scaled;
                        } else {
                            merge_acc[row + v] = merge_acc[row + v] + scaled;
                        }
                    }
                }
                {
                    let j = 5u;
                    let v = lane + j * LANES_PER_KEY;
                    if (v < hd4) {
                        let scaled = acc[j] * rescale;
                        if (r == 0u) {
                            merge_acc[row + v] = scaled;
                        } else {
                            merge_acc[row + v] = merge_acc[row + v] + scaled;
                        }
                    }
                }
                {
                    let j = 6u;
                    let v = lane + j * LANES_PER_KEY;
                    if (v < hd4) {
                        let scaled = acc[j] * rescale;
                        if (r == 0u) {
                            merge_acc[row + v] = scaled;
                        } else {
                            merge_acc[row + v] = merge_acc[row + v] + scaled;
                        }
                    }
                }
                {
                    let j = 7u;
                    let v = lane + j * LANES_PER_KEY;
                    if (v < hd4) {
                        let scaled = acc[j] * rescale;
                        if (r == 0u) {
                            merge_acc[row + v] = scaled;
                        } else {
                            merge_acc[row + v] = merge_acc[row + v] + scaled;
                        }
                    }
                }
            }
            workgroupBarrier();
        }
        // A query whose every key is masked has l == 0 and writes zeros (masked_row = "zero")
        var l_all: f32 = 0.0;
        {
            var l_all_1: f32 = 0.0;
            var l_all_2: f32 = 0.0;
            var l_all_3: f32 = 0.0;
            for (var s: u32 = 0u; s < nkg; s = s + 4u) {
                l_all = (l_all + merge_l[s]);
                l_all_1 = (l_all_1 + select(0.0, merge_l[min(s + 1u, nkg - 1u)], s + 1u < nkg));
                l_all_2 = (l_all_2 + select(0.0, merge_l[min(s + 2u, nkg - 1u)], s + 2u < nkg));
                l_all_3 = (l_all_3 + select(0.0, merge_l[min(s + 3u, nkg - 1u)], s + 3u < nkg));
            }
            l_all = ((l_all + l_all_1) + (l_all_2 + l_all_3));
        }
        let inv_l = select(0.0, 1.0 / l_all, l_all > 0.0);
        if (true) {
            for (var d: u32 = lid; d < head_dim; d = d + WORKGROUP_SIZE) {
                var total: f32 = 0.0;
                for (var row: u32 = 0u; row < rows; row = row + 1u) {
                    total = total + merge_acc[row * (MAX_HEAD_DIM / 4u) + d / 4u][d % 4u];
                }
                output[out_offset + d] = total * inv_l;
            }
        }
        // merge_m, merge_l and merge_acc are rewritten by the next query
        workgroupBarrier();
    }
}
