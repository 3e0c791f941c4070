// AUTO-GENERATED from templates/attention_decode_split_partials.wgsl.j2 for variant attention_decode_split_d64 pass partials by doppler-gen - do not edit.
// Edit the template and variants.toml, then run `doppler-gen generate`.
// source-hash: sha256:5359f178323f876eb711a3d31aa1da05281c2cda99c50de4980436ea720340e1

// Split-KV decode attention, pass 1: partial (max, sum, accumulator) of one KV split for every
// query head of one KV head (subgroup reductions)
//
// Q is f32, K/V are f32 (read 4 elements at a time); partials are f32.
// Dispatch: KV_SPLITS * num_kv_heads workgroups (those past the used splits return at once).
// Key groups reduce by subgroup shuffles, or through workgroup memory on adapters whose
// subgroups are narrower than LANES_PER_KEY.

enable subgroups;

const MAX_HEAD_DIM: u32 = 64u;
const MAX_WORKGROUP_SIZE: u32 = 256u;
const LANES_PER_KEY: u32 = 8u;
const VEC_PER_LANE: u32 = 2u;  // MAX_HEAD_DIM / 4 / LANES_PER_KEY
const KEYS_PER_ITER: u32 = 2u;
const HEADS_PER_GROUP: u32 = 2u;  // query heads each key group serves
const HEAD_SLOTS: u32 = 2u;       // key-group slots: HEAD_SLOTS * HEADS_PER_GROUP heads at once
const MAX_KEY_GROUPS: u32 = 32u;  // MAX_WORKGROUP_SIZE / LANES_PER_KEY
// Rows of the merge buffer: 8 KiB of partial accumulators at most
const MERGE_ROWS: u32 = 32u;
const NEG_BIG: f32 = -3.402823e+38;
// vec4 slots of the merge buffer: MERGE_ROWS rows of MAX_HEAD_DIM / 4
const MERGE_VECS: u32 = 512u;

override WORKGROUP_SIZE: u32 = 256u;   // invocations; a multiple of LANES_PER_KEY, at most MAX_WORKGROUP_SIZE
override KV_SPLITS: u32 = 32u;          // splits (same value in the reduce pass)
override MIN_SPLIT_KEYS: u32 = 64u;     // fewest keys per split (same value in the reduce pass)

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
@group(0) @binding(2) var<storage, read> K: array<vec4<f32>>; // [seq_len, num_kv_heads, head_dim / 4]
@group(0) @binding(3) var<storage, read> V: array<vec4<f32>>; // [seq_len, num_kv_heads, head_dim / 4]
@group(0) @binding(5) var<storage, read> kv_len_buffer: array<u32>;
@group(0) @binding(6) var<storage, read> page_table: array<u32>;
@group(0) @binding(7) var<storage, read_write> partial_acc: array<f32>; // [split, query_len, num_heads, head_dim]
@group(0) @binding(8) var<storage, read_write> partial_ml: array<f32>;  // [split, query_len, num_heads, 2]: max, sum

// Merge of the key groups' softmax states, per head
var<workgroup> merge_m: array<f32, MAX_KEY_GROUPS * HEADS_PER_GROUP>;
var<workgroup> merge_head_m: array<f32, MERGE_ROWS>;   // [head of the chunk]: its max over the streams
var<workgroup> merge_l: array<f32, MERGE_ROWS>;        // [head of the chunk][row]: rescaled sums, as merge_acc
var<workgroup> merge_acc: array<vec4<f32>, MERGE_VECS>;
// Hands out subgroup indices (the subgroup layout of a workgroup is not specified)
var<workgroup> subgroup_counter: atomic<u32>;
// Partial dot products: [invocation][key][head] (used only when subgroups are narrower than a key group)
var<workgroup> partial_dots: array<f32, MAX_WORKGROUP_SIZE * KEYS_PER_ITER * HEADS_PER_GROUP>;

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

// Keys per split: seq_len over KV_SPLITS splits, at least MIN_SPLIT_KEYS
fn split_keys() -> u32 {
    return max(max(MIN_SPLIT_KEYS, 1u), (u.seq_len + KV_SPLITS - 1u) / KV_SPLITS);
}

// Splits that hold keys (at most KV_SPLITS)
fn used_splits() -> u32 {
    let keys = split_keys();
    return min(KV_SPLITS, (u.seq_len + keys - 1u) / keys);
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wg_id: vec3<u32>,
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
) {
    let kv_head_idx = wg_id.x % u.num_kv_heads;
    let split = wg_id.x / u.num_kv_heads;
    let num_splits = used_splits();
    let split_len = split_keys();
    let head_dim = u.head_dim;
    if (split >= num_splits || head_dim > MAX_HEAD_DIM || head_dim % 4u != 0u) {
        return;
    }
    let hd4 = head_dim / 4u;
    let kv_len = get_kv_len();
    let scale = u.scale;
    let nkg = WORKGROUP_SIZE / LANES_PER_KEY;
    let group = u.num_heads / u.num_kv_heads;
    // Key group kg serves slot kg % slots (HEADS_PER_GROUP consecutive heads of the current chunk
    // of heads) and walks key stream kg / slots of the split; groups beyond slots * streams idle.
    // Each head of a chunk has rows_per_head rows of the merge buffer. slots is fixed when the
    // pipeline is made (not derived from the GQA group at run time), so the key loop's stride
    // is a constant (README, "Where the decode time went"). A group wider than the chunk takes
    // several chunks in turn; slots whose heads are past the group compute nothing that is stored.
    let slots = min(HEAD_SLOTS, nkg);
    let heads_at_once = slots * HEADS_PER_GROUP;
    let streams = nkg / slots;
    let rows_per_head = max(1u, min(MERGE_ROWS / heads_at_once, streams));
    let split_begin = split * split_len;

    // Key group = LANES_PER_KEY consecutive lanes of one subgroup; when subgroups are narrower
    // than that (subgroup_ok false), LANES_PER_KEY consecutive invocations that reduce through
    // workgroup memory instead
    // Each subgroup takes the next run of as many invocation slots as it has invocations (a
    // subgroup of a WORKGROUP_SIZE that is not a multiple of sg_size has fewer than sg_size),
    // in whatever order the atomic serves the subgroups: the runs tile 0 .. WORKGROUP_SIZE - 1
    // and, every run being a multiple of LANES_PER_KEY long, start on a key group's first lane
    if (lid == 0u) {
        atomicStore(&subgroup_counter, 0u);
    }
    workgroupBarrier();
    let subgroup_invocations = subgroupAdd(1u);
    var first_lane_slot: u32 = 0u;
    if (sg_lane == 0u) {
        first_lane_slot = atomicAdd(&subgroup_counter, subgroup_invocations);
    }
    let slot_in_workgroup = subgroupBroadcast(first_lane_slot, 0u) + sg_lane;
    let subgroup_ok = sg_size >= LANES_PER_KEY;
    let kg = select(lid / LANES_PER_KEY, slot_in_workgroup / LANES_PER_KEY, subgroup_ok);
    let lane = select(lid % LANES_PER_KEY, slot_in_workgroup % LANES_PER_KEY, subgroup_ok);

    let slot = kg % slots;
    let stream = kg / slots;
    let in_stream = stream < streams;

    for (var query_pos: u32 = 0u; query_pos < u.query_len; query_pos = query_pos + 1u) {
        // This split's part of the query's keys
        let attended = key_range(query_pos, kv_len);
        let keys = vec2<u32>(max(attended.x, split_begin), min(attended.y, split_begin + split_len));
        for (var first_head: u32 = 0u; first_head < group; first_head = first_head + heads_at_once) {
            let slot_head = first_head + slot * HEADS_PER_GROUP;
            let group_ok = in_stream && slot_head < group;
            // a head past the group reads the chunk's first head, so every load stays in bounds
            let q_offset_h0 = query_pos * u.num_heads * head_dim + (kv_head_idx * group + select(first_head, slot_head + 0u, group_ok && slot_head + 0u < group)) * head_dim;
            let q_offset_h1 = query_pos * u.num_heads * head_dim + (kv_head_idx * group + select(first_head, slot_head + 1u, group_ok && slot_head + 1u < group)) * head_dim;

        // This lane's slice of q: vec4s lane, lane + LANES_PER_KEY, ...
        var q_h0 = array<vec4<f32>, VEC_PER_LANE>();
        var acc_h0 = array<vec4<f32>, VEC_PER_LANE>();
        var q_h1 = array<vec4<f32>, VEC_PER_LANE>();
        var acc_h1 = array<vec4<f32>, VEC_PER_LANE>();
        {
            let j = 0u;
            let v = lane + j * LANES_PER_KEY;
            if (v < hd4) {
                let o_h0 = q_offset_h0 + 4u * v;
                q_h0[j] = vec4<f32>(Q[o_h0], Q[o_h0 + 1u], Q[o_h0 + 2u], Q[o_h0 + 3u]);
                let o_h1 = q_offset_h1 + 4u * v;
                q_h1[j] = vec4<f32>(Q[o_h1], Q[o_h1 + 1u], Q[o_h1 + 2u], Q[o_h1 + 3u]);
            }
        }
        {
            let j = 1u;
            let v = lane + j * LANES_PER_KEY;
            if (v < hd4) {
                let o_h0 = q_offset_h0 + 4u * v;
                q_h0[j] = vec4<f32>(Q[o_h0], Q[o_h0 + 1u], Q[o_h0 + 2u], Q[o_h0 + 3u]);
                let o_h1 = q_offset_h1 + 4u * v;
                q_h1[j] = vec4<f32>(Q[o_h1], Q[o_h1 + 1u], Q[o_h1 + 2u], Q[o_h1 + 3u]);
            }
        }
        var m_h0: f32 = NEG_BIG;
        var l_h0: f32 = 0.0;
        var m_h1: f32 = NEG_BIG;
        var l_h1: f32 = 0.0;

        // The key loops for linear K/V rows (no per-key layout branch), and for any layout through
        // get_kv_pos (layout_loops)
        if (kv_rows_linear()) {
            // The key loop twice, with and without the softcap, so that neither copy branches on it
            // per key (softcap_loops; on the H200 the branch cost the split kernel 10 %)
            if (u.attn_softcap > 0.0) {
                let span = keys.y - min(keys.x, keys.y);
                let per_iter = streams * KEYS_PER_ITER;
                let iterations = (span + per_iter - 1u) / per_iter;
                for (var it: u32 = 0u; it < iterations; it = it + 1u) {
                    let base = keys.x + it * per_iter + stream;
                    // key 0 of this iteration: K and V rows loaded whether it counts or not (a key
                    // past the end reads the last key's row), so no load waits behind a branch
                    let key_0 = base + 0u * streams;
                    let valid_0 = group_ok && key_0 < keys.y;
                    let row_0 = ((u.kv_start + min(key_0, keys.y - 1u)) * u.num_kv_heads + kv_head_idx) * hd4;
                    var k_0 = array<vec4<f32>, VEC_PER_LANE>();
                    var v_0 = array<vec4<f32>, VEC_PER_LANE>();
                    {
                        let j = 0u;
                        let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                        k_0[j] = K[row_0 + v];
                        v_0[j] = V[row_0 + v];
                    }
                    {
                        let j = 1u;
                        let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                        k_0[j] = K[row_0 + v];
                        v_0[j] = V[row_0 + v];
                    }

                    // key 1 of this iteration: K and V rows loaded whether it counts or not (a key
                    // past the end reads the last key's row), so no load waits behind a branch
                    let key_1 = base + 1u * streams;
                    let valid_1 = group_ok && key_1 < keys.y;
                    let row_1 = ((u.kv_start + min(key_1, keys.y - 1u)) * u.num_kv_heads + kv_head_idx) * hd4;
                    var k_1 = array<vec4<f32>, VEC_PER_LANE>();
                    var v_1 = array<vec4<f32>, VEC_PER_LANE>();
                    {
                        let j = 0u;
                        let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                        k_1[j] = K[row_1 + v];
                        v_1[j] = V[row_1 + v];
                    }
                    {
                        let j = 1u;
                        let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                        k_1[j] = K[row_1 + v];
                        v_1[j] = V[row_1 + v];
                    }

                    // dot products of key 0 (an invalid key's score is never used)
                    var dot_0_h0: f32 = 0.0;
                    var dot_0_h1: f32 = 0.0;
                    {
                        let j = 0u;
                        let kf = vec4<f32>(k_0[j]);
                        dot_0_h0 = dot_0_h0 + dot(q_h0[j], kf);
                        dot_0_h1 = dot_0_h1 + dot(q_h1[j], kf);
                    }
                    {
                        let j = 1u;
                        let kf = vec4<f32>(k_0[j]);
                        dot_0_h0 = dot_0_h0 + dot(q_h0[j], kf);
                        dot_0_h1 = dot_0_h1 + dot(q_h1[j], kf);
                    }
                    // dot products of key 1 (an invalid key's score is never used)
                    var dot_1_h0: f32 = 0.0;
                    var dot_1_h1: f32 = 0.0;
                    {
                        let j = 0u;
                        let kf = vec4<f32>(k_1[j]);
                        dot_1_h0 = dot_1_h0 + dot(q_h0[j], kf);
                        dot_1_h1 = dot_1_h1 + dot(q_h1[j], kf);
                    }
                    {
                        let j = 1u;
                        let kf = vec4<f32>(k_1[j]);
                        dot_1_h0 = dot_1_h0 + dot(q_h0[j], kf);
                        dot_1_h1 = dot_1_h1 + dot(q_h1[j], kf);
                    }
                    // Sum the partial dot products of the LANES_PER_KEY lanes of each key group
                    if (subgroup_ok) {
                        dot_0_h0 = dot_0_h0 + subgroupShuffleXor(dot_0_h0, 1u);
                        dot_0_h0 = dot_0_h0 + subgroupShuffleXor(dot_0_h0, 2u);
                        dot_0_h0 = dot_0_h0 + subgroupShuffleXor(dot_0_h0, 4u);
                        dot_0_h1 = dot_0_h1 + subgroupShuffleXor(dot_0_h1, 1u);
                        dot_0_h1 = dot_0_h1 + subgroupShuffleXor(dot_0_h1, 2u);
                        dot_0_h1 = dot_0_h1 + subgroupShuffleXor(dot_0_h1, 4u);
                        dot_1_h0 = dot_1_h0 + subgroupShuffleXor(dot_1_h0, 1u);
                        dot_1_h0 = dot_1_h0 + subgroupShuffleXor(dot_1_h0, 2u);
                        dot_1_h0 = dot_1_h0 + subgroupShuffleXor(dot_1_h0, 4u);
                        dot_1_h1 = dot_1_h1 + subgroupShuffleXor(dot_1_h1, 1u);
                        dot_1_h1 = dot_1_h1 + subgroupShuffleXor(dot_1_h1, 2u);
                        dot_1_h1 = dot_1_h1 + subgroupShuffleXor(dot_1_h1, 4u);
                    } else {
                        // subgroups narrower than a key group: through workgroup memory (uniform branch)
                        let parity = 0u;
                        workgroupBarrier();  // the previous iteration's reads are done
                        partial_dots[parity + (lid * KEYS_PER_ITER + 0u) * 2u + 0u] = dot_0_h0;
                        partial_dots[parity + (lid * KEYS_PER_ITER + 0u) * 2u + 1u] = dot_0_h1;
                        partial_dots[parity + (lid * KEYS_PER_ITER + 1u) * 2u + 0u] = dot_1_h0;
                        partial_dots[parity + (lid * KEYS_PER_ITER + 1u) * 2u + 1u] = dot_1_h1;
                        workgroupBarrier();
                        let group_first = parity + (kg * LANES_PER_KEY) * KEYS_PER_ITER * 2u;
                        dot_0_h0 = 0.0;
                        dot_0_h1 = 0.0;
                        dot_1_h0 = 0.0;
                        dot_1_h1 = 0.0;
                        for (var i: u32 = 0u; i < LANES_PER_KEY; i = i + 1u) {
                            dot_0_h0 = dot_0_h0 + partial_dots[group_first + (i * KEYS_PER_ITER + 0u) * 2u + 0u];
                            dot_0_h1 = dot_0_h1 + partial_dots[group_first + (i * KEYS_PER_ITER + 0u) * 2u + 1u];
                            dot_1_h0 = dot_1_h0 + partial_dots[group_first + (i * KEYS_PER_ITER + 1u) * 2u + 0u];
                            dot_1_h1 = dot_1_h1 + partial_dots[group_first + (i * KEYS_PER_ITER + 1u) * 2u + 1u];
                        }
                    }
                    // Scores and the online softmax update of this key group for head 0 of its 2
                    var block_max_h0: f32 = NEG_BIG;
                    let score_0_h0 = tanh(dot_0_h0 * scale / u.attn_softcap) * u.attn_softcap;
                    if (valid_0) {
                        block_max_h0 = max(block_max_h0, score_0_h0);
                    }
                    let score_1_h0 = tanh(dot_1_h0 * scale / u.attn_softcap) * u.attn_softcap;
                    if (valid_1) {
                        block_max_h0 = max(block_max_h0, score_1_h0);
                    }
                    let m_new_h0 = max(m_h0, block_max_h0);
                    let correction_h0 = exp(m_h0 - m_new_h0);
                    let p_0_h0 = select(0.0, exp(score_0_h0 - m_new_h0), valid_0);
                    let p_1_h0 = select(0.0, exp(score_1_h0 - m_new_h0), valid_1);
                    l_h0 = l_h0 * correction_h0 + p_0_h0 + p_1_h0;
                    m_h0 = m_new_h0;
                    // Scores and the online softmax update of this key group for head 1 of its 2
                    var block_max_h1: f32 = NEG_BIG;
                    let score_0_h1 = tanh(dot_0_h1 * scale / u.attn_softcap) * u.attn_softcap;
                    if (valid_0) {
                        block_max_h1 = max(block_max_h1, score_0_h1);
                    }
                    let score_1_h1 = tanh(dot_1_h1 * scale / u.attn_softcap) * u.attn_softcap;
                    if (valid_1) {
                        block_max_h1 = max(block_max_h1, score_1_h1);
                    }
                    let m_new_h1 = max(m_h1, block_max_h1);
                    let correction_h1 = exp(m_h1 - m_new_h1);
                    let p_0_h1 = select(0.0, exp(score_0_h1 - m_new_h1), valid_0);
                    let p_1_h1 = select(0.0, exp(score_1_h1 - m_new_h1), valid_1);
                    l_h1 = l_h1 * correction_h1 + p_0_h1 + p_1_h1;
                    m_h1 = m_new_h1;
                    {
                        let j = 0u;
                        let vf_0 = vec4<f32>(v_0[j]);
                        let vf_1 = vec4<f32>(v_1[j]);
                        acc_h0[j] = acc_h0[j] * correction_h0 + p_0_h0 * vf_0 + p_1_h0 * vf_1;
                        acc_h1[j] = acc_h1[j] * correction_h1 + p_0_h1 * vf_0 + p_1_h1 * vf_1;
                    }
                    {
                        let j = 1u;
                        let vf_0 = vec4<f32>(v_0[j]);
                        let vf_1 = vec4<f32>(v_1[j]);
                        acc_h0[j] = acc_h0[j] * correction_h0 + p_0_h0 * vf_0 + p_1_h0 * vf_1;
                        acc_h1[j] = acc_h1[j] * correction_h1 + p_0_h1 * vf_0 + p_1_h1 * vf_1;
                    }
                }
            } else {
                let span = keys.y - min(keys.x, keys.y);
                let per_iter = streams * KEYS_PER_ITER;
                let iterations = (span + per_iter - 1u) / per_iter;
                for (var it: u32 = 0u; it < iterations; it = it + 1u) {
                    let base = keys.x + it * per_iter + stream;
                    // key 0 of this iteration: K and V rows loaded whether it counts or not (a key
                    // past the end reads the last key's row), so no load waits behind a branch
                    let key_0 = base + 0u * streams;
                    let valid_0 = group_ok && key_0 < keys.y;
                    let row_0 = ((u.kv_start + min(key_0, keys.y - 1u)) * u.num_kv_heads + kv_head_idx) * hd4;
                    var k_0 = array<vec4<f32>, VEC_PER_LANE>();
                    var v_0 = array<vec4<f32>, VEC_PER_LANE>();
                    {
                        let j = 0u;
                        let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                        k_0[j] = K[row_0 + v];
                        v_0[j] = V[row_0 + v];
                    }
                    {
                        let j = 1u;
                        let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                        k_0[j] = K[row_0 + v];
                        v_0[j] = V[row_0 + v];
                    }

                    // key 1 of this iteration: K and V rows loaded whether it counts or not (a key
                    // past the end reads the last key's row), so no load waits behind a branch
                    let key_1 = base + 1u * streams;
                    let valid_1 = group_ok && key_1 < keys.y;
                    let row_1 = ((u.kv_start + min(key_1, keys.y - 1u)) * u.num_kv_heads + kv_head_idx) * hd4;
                    var k_1 = array<vec4<f32>, VEC_PER_LANE>();
                    var v_1 = array<vec4<f32>, VEC_PER_LANE>();
                    {
                        let j = 0u;
                        let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                        k_1[j] = K[row_1 + v];
                        v_1[j] = V[row_1 + v];
                    }
                    {
                        let j = 1u;
                        let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                        k_1[j] = K[row_1 + v];
                        v_1[j] = V[row_1 + v];
                    }

                    // dot products of key 0 (an invalid key's score is never used)
                    var dot_0_h0: f32 = 0.0;
                    var dot_0_h1: f32 = 0.0;
                    {
                        let j = 0u;
                        let kf = vec4<f32>(k_0[j]);
                        dot_0_h0 = dot_0_h0 + dot(q_h0[j], kf);
                        dot_0_h1 = dot_0_h1 + dot(q_h1[j], kf);
                    }
                    {
                        let j = 1u;
                        let kf = vec4<f32>(k_0[j]);
                        dot_0_h0 = dot_0_h0 + dot(q_h0[j], kf);
                        dot_0_h1 = dot_0_h1 + dot(q_h1[j], kf);
                    }
                    // dot products of key 1 (an invalid key's score is never used)
                    var dot_1_h0: f32 = 0.0;
                    var dot_1_h1: f32 = 0.0;
                    {
                        let j = 0u;
                        let kf = vec4<f32>(k_1[j]);
                        dot_1_h0 = dot_1_h0 + dot(q_h0[j], kf);
                        dot_1_h1 = dot_1_h1 + dot(q_h1[j], kf);
                    }
                    {
                        let j = 1u;
                        let kf = vec4<f32>(k_1[j]);
                        dot_1_h0 = dot_1_h0 + dot(q_h0[j], kf);
                        dot_1_h1 = dot_1_h1 + dot(q_h1[j], kf);
                    }
                    // Sum the partial dot products of the LANES_PER_KEY lanes of each key group
                    if (subgroup_ok) {
                        dot_0_h0 = dot_0_h0 + subgroupShuffleXor(dot_0_h0, 1u);
                        dot_0_h0 = dot_0_h0 + subgroupShuffleXor(dot_0_h0, 2u);
                        dot_0_h0 = dot_0_h0 + subgroupShuffleXor(dot_0_h0, 4u);
                        dot_0_h1 = dot_0_h1 + subgroupShuffleXor(dot_0_h1, 1u);
                        dot_0_h1 = dot_0_h1 + subgroupShuffleXor(dot_0_h1, 2u);
                        dot_0_h1 = dot_0_h1 + subgroupShuffleXor(dot_0_h1, 4u);
                        dot_1_h0 = dot_1_h0 + subgroupShuffleXor(dot_1_h0, 1u);
                        dot_1_h0 = dot_1_h0 + subgroupShuffleXor(dot_1_h0, 2u);
                        dot_1_h0 = dot_1_h0 + subgroupShuffleXor(dot_1_h0, 4u);
                        dot_1_h1 = dot_1_h1 + subgroupShuffleXor(dot_1_h1, 1u);
                        dot_1_h1 = dot_1_h1 + subgroupShuffleXor(dot_1_h1, 2u);
                        dot_1_h1 = dot_1_h1 + subgroupShuffleXor(dot_1_h1, 4u);
                    } else {
                        // subgroups narrower than a key group: through workgroup memory (uniform branch)
                        let parity = 0u;
                        workgroupBarrier();  // the previous iteration's reads are done
                        partial_dots[parity + (lid * KEYS_PER_ITER + 0u) * 2u + 0u] = dot_0_h0;
                        partial_dots[parity + (lid * KEYS_PER_ITER + 0u) * 2u + 1u] = dot_0_h1;
                        partial_dots[parity + (lid * KEYS_PER_ITER + 1u) * 2u + 0u] = dot_1_h0;
                        partial_dots[parity + (lid * KEYS_PER_ITER + 1u) * 2u + 1u] = dot_1_h1;
                        workgroupBarrier();
                        let group_first = parity + (kg * LANES_PER_KEY) * KEYS_PER_ITER * 2u;
                        dot_0_h0 = 0.0;
                        dot_0_h1 = 0.0;
                        dot_1_h0 = 0.0;
                        dot_1_h1 = 0.0;
                        for (var i: u32 = 0u; i < LANES_PER_KEY; i = i + 1u) {
                            dot_0_h0 = dot_0_h0 + partial_dots[group_first + (i * KEYS_PER_ITER + 0u) * 2u + 0u];
                            dot_0_h1 = dot_0_h1 + partial_dots[group_first + (i * KEYS_PER_ITER + 0u) * 2u + 1u];
                            dot_1_h0 = dot_1_h0 + partial_dots[group_first + (i * KEYS_PER_ITER + 1u) * 2u + 0u];
                            dot_1_h1 = dot_1_h1 + partial_dots[group_first + (i * KEYS_PER_ITER + 1u) * 2u + 1u];
                        }
                    }
                    // Scores and the online softmax update of this key group for head 0 of its 2
                    var block_max_h0: f32 = NEG_BIG;
                    let score_0_h0 = dot_0_h0 * scale;
                    if (valid_0) {
                        block_max_h0 = max(block_max_h0, score_0_h0);
                    }
                    let score_1_h0 = dot_1_h0 * scale;
                    if (valid_1) {
                        block_max_h0 = max(block_max_h0, score_1_h0);
                    }
                    let m_new_h0 = max(m_h0, block_max_h0);
                    let correction_h0 = exp(m_h0 - m_new_h0);
                    let p_0_h0 = select(0.0, exp(score_0_h0 - m_new_h0), valid_0);
                    let p_1_h0 = select(0.0, exp(score_1_h0 - m_new_h0), valid_1);
                    l_h0 = l_h0 * correction_h0 + p_0_h0 + p_1_h0;
                    m_h0 = m_new_h0;
                    // Scores and the online softmax update of this key group for head 1 of its 2
                    var block_max_h1: f32 = NEG_BIG;
                    let score_0_h1 = dot_0_h1 * scale;
                    if (valid_0) {
                        block_max_h1 = max(block_max_h1, score_0_h1);
                    }
                    let score_1_h1 = dot_1_h1 * scale;
                    if (valid_1) {
                        block_max_h1 = max(block_max_h1, score_1_h1);
                    }
                    let m_new_h1 = max(m_h1, block_max_h1);
                    let correction_h1 = exp(m_h1 - m_new_h1);
                    let p_0_h1 = select(0.0, exp(score_0_h1 - m_new_h1), valid_0);
                    let p_1_h1 = select(0.0, exp(score_1_h1 - m_new_h1), valid_1);
                    l_h1 = l_h1 * correction_h1 + p_0_h1 + p_1_h1;
                    m_h1 = m_new_h1;
                    {
                        let j = 0u;
                        let vf_0 = vec4<f32>(v_0[j]);
                        let vf_1 = vec4<f32>(v_1[j]);
                        acc_h0[j] = acc_h0[j] * correction_h0 + p_0_h0 * vf_0 + p_1_h0 * vf_1;
                        acc_h1[j] = acc_h1[j] * correction_h1 + p_0_h1 * vf_0 + p_1_h1 * vf_1;
                    }
                    {
                        let j = 1u;
                        let vf_0 = vec4<f32>(v_0[j]);
                        let vf_1 = vec4<f32>(v_1[j]);
                        acc_h0[j] = acc_h0[j] * correction_h0 + p_0_h0 * vf_0 + p_1_h0 * vf_1;
                        acc_h1[j] = acc_h1[j] * correction_h1 + p_0_h1 * vf_0 + p_1_h1 * vf_1;
                    }
                }
            }
        } else {
            // The key loop twice, with and without the softcap, so that neither copy branches on it
            // per key (softcap_loops; on the H200 the branch cost the split kernel 10 %)
            if (u.attn_softcap > 0.0) {
                let span = keys.y - min(keys.x, keys.y);
                let per_iter = streams * KEYS_PER_ITER;
                let iterations = (span + per_iter - 1u) / per_iter;
                for (var it: u32 = 0u; it < iterations; it = it + 1u) {
                    let base = keys.x + it * per_iter + stream;
                    // key 0 of this iteration: K and V rows loaded whether it counts or not (a key
                    // past the end reads the last key's row), so no load waits behind a branch
                    let key_0 = base + 0u * streams;
                    let valid_0 = group_ok && key_0 < keys.y;
                    let row_0 = (get_kv_pos(min(key_0, keys.y - 1u)) * u.num_kv_heads + kv_head_idx) * hd4;
                    var k_0 = array<vec4<f32>, VEC_PER_LANE>();
                    var v_0 = array<vec4<f32>, VEC_PER_LANE>();
                    {
                        let j = 0u;
                        let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                        k_0[j] = K[row_0 + v];
                        v_0[j] = V[row_0 + v];
                    }
                    {
                        let j = 1u;
                        let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                        k_0[j] = K[row_0 + v];
                        v_0[j] = V[row_0 + v];
                    }

                    // key 1 of this iteration: K and V rows loaded whether it counts or not (a key
                    // past the end reads the last key's row), so no load waits behind a branch
                    let key_1 = base + 1u * streams;
                    let valid_1 = group_ok && key_1 < keys.y;
                    let row_1 = (get_kv_pos(min(key_1, keys.y - 1u)) * u.num_kv_heads + kv_head_idx) * hd4;
                    var k_1 = array<vec4<f32>, VEC_PER_LANE>();
                    var v_1 = array<vec4<f32>, VEC_PER_LANE>();
                    {
                        let j = 0u;
                        let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                        k_1[j] = K[row_1 + v];
                        v_1[j] = V[row_1 + v];
                    }
                    {
                        let j = 1u;
                        let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                        k_1[j] = K[row_1 + v];
                        v_1[j] = V[row_1 + v];
                    }

                    // dot products of key 0 (an invalid key's score is never used)
                    var dot_0_h0: f32 = 0.0;
                    var dot_0_h1: f32 = 0.0;
                    {
                        let j = 0u;
                        let kf = vec4<f32>(k_0[j]);
                        dot_0_h0 = dot_0_h0 + dot(q_h0[j], kf);
                        dot_0_h1 = dot_0_h1 + dot(q_h1[j], kf);
                    }
                    {
                        let j = 1u;
                        let kf = vec4<f32>(k_0[j]);
                        dot_0_h0 = dot_0_h0 + dot(q_h0[j], kf);
                        dot_0_h1 = dot_0_h1 + dot(q_h1[j], kf);
                    }
                    // dot products of key 1 (an invalid key's score is never used)
                    var dot_1_h0: f32 = 0.0;
                    var dot_1_h1: f32 = 0.0;
                    {
                        let j = 0u;
                        let kf = vec4<f32>(k_1[j]);
                        dot_1_h0 = dot_1_h0 + dot(q_h0[j], kf);
                        dot_1_h1 = dot_1_h1 + dot(q_h1[j], kf);
                    }
                    {
                        let j = 1u;
                        let kf = vec4<f32>(k_1[j]);
                        dot_1_h0 = dot_1_h0 + dot(q_h0[j], kf);
                        dot_1_h1 = dot_1_h1 + dot(q_h1[j], kf);
                    }
                    // Sum the partial dot products of the LANES_PER_KEY lanes of each key group
                    if (subgroup_ok) {
                        dot_0_h0 = dot_0_h0 + subgroupShuffleXor(dot_0_h0, 1u);
                        dot_0_h0 = dot_0_h0 + subgroupShuffleXor(dot_0_h0, 2u);
                        dot_0_h0 = dot_0_h0 + subgroupShuffleXor(dot_0_h0, 4u);
                        dot_0_h1 = dot_0_h1 + subgroupShuffleXor(dot_0_h1, 1u);
                        dot_0_h1 = dot_0_h1 + subgroupShuffleXor(dot_0_h1, 2u);
                        dot_0_h1 = dot_0_h1 + subgroupShuffleXor(dot_0_h1, 4u);
                        dot_1_h0 = dot_1_h0 + subgroupShuffleXor(dot_1_h0, 1u);
                        dot_1_h0 = dot_1_h0 + subgroupShuffleXor(dot_1_h0, 2u);
                        dot_1_h0 = dot_1_h0 + subgroupShuffleXor(dot_1_h0, 4u);
                        dot_1_h1 = dot_1_h1 + subgroupShuffleXor(dot_1_h1, 1u);
                        dot_1_h1 = dot_1_h1 + subgroupShuffleXor(dot_1_h1, 2u);
                        dot_1_h1 = dot_1_h1 + subgroupShuffleXor(dot_1_h1, 4u);
                    } else {
                        // subgroups narrower than a key group: through workgroup memory (uniform branch)
                        let parity = 0u;
                        workgroupBarrier();  // the previous iteration's reads are done
                        partial_dots[parity + (lid * KEYS_PER_ITER + 0u) * 2u + 0u] = dot_0_h0;
                        partial_dots[parity + (lid * KEYS_PER_ITER + 0u) * 2u + 1u] = dot_0_h1;
                        partial_dots[parity + (lid * KEYS_PER_ITER + 1u) * 2u + 0u] = dot_1_h0;
                        partial_dots[parity + (lid * KEYS_PER_ITER + 1u) * 2u + 1u] = dot_1_h1;
                        workgroupBarrier();
                        let group_first = parity + (kg * LANES_PER_KEY) * KEYS_PER_ITER * 2u;
                        dot_0_h0 = 0.0;
                        dot_0_h1 = 0.0;
                        dot_1_h0 = 0.0;
                        dot_1_h1 = 0.0;
                        for (var i: u32 = 0u; i < LANES_PER_KEY; i = i + 1u) {
                            dot_0_h0 = dot_0_h0 + partial_dots[group_first + (i * KEYS_PER_ITER + 0u) * 2u + 0u];
                            dot_0_h1 = dot_0_h1 + partial_dots[group_first + (i * KEYS_PER_ITER + 0u) * 2u + 1u];
                            dot_1_h0 = dot_1_h0 + partial_dots[group_first + (i * KEYS_PER_ITER + 1u) * 2u + 0u];
                            dot_1_h1 = dot_1_h1 + partial_dots[group_first + (i * KEYS_PER_ITER + 1u) * 2u + 1u];
                        }
                    }
                    // Scores and the online softmax update of this key group for head 0 of its 2
                    var block_max_h0: f32 = NEG_BIG;
                    let score_0_h0 = tanh(dot_0_h0 * scale / u.attn_softcap) * u.attn_softcap;
                    if (valid_0) {
                        block_max_h0 = max(block_max_h0, score_0_h0);
                    }
                    let score_1_h0 = tanh(dot_1_h0 * scale / u.attn_softcap) * u.attn_softcap;
                    if (valid_1) {
                        block_max_h0 = max(block_max_h0, score_1_h0);
                    }
                    let m_new_h0 = max(m_h0, block_max_h0);
                    let correction_h0 = exp(m_h0 - m_new_h0);
                    let p_0_h0 = select(0.0, exp(score_0_h0 - m_new_h0), valid_0);
                    let p_1_h0 = select(0.0, exp(score_1_h0 - m_new_h0), valid_1);
                    l_h0 = l_h0 * correction_h0 + p_0_h0 + p_1_h0;
                    m_h0 = m_new_h0;
                    // Scores and the online softmax update of this key group for head 1 of its 2
                    var block_max_h1: f32 = NEG_BIG;
                    let score_0_h1 = tanh(dot_0_h1 * scale / u.attn_softcap) * u.attn_softcap;
                    if (valid_0) {
                        block_max_h1 = max(block_max_h1, score_0_h1);
                    }
                    let score_1_h1 = tanh(dot_1_h1 * scale / u.attn_softcap) * u.attn_softcap;
                    if (valid_1) {
                        block_max_h1 = max(block_max_h1, score_1_h1);
                    }
                    let m_new_h1 = max(m_h1, block_max_h1);
                    let correction_h1 = exp(m_h1 - m_new_h1);
                    let p_0_h1 = select(0.0, exp(score_0_h1 - m_new_h1), valid_0);
                    let p_1_h1 = select(0.0, exp(score_1_h1 - m_new_h1), valid_1);
                    l_h1 = l_h1 * correction_h1 + p_0_h1 + p_1_h1;
                    m_h1 = m_new_h1;
                    {
                        let j = 0u;
                        let vf_0 = vec4<f32>(v_0[j]);
                        let vf_1 = vec4<f32>(v_1[j]);
                        acc_h0[j] = acc_h0[j] * correction_h0 + p_0_h0 * vf_0 + p_1_h0 * vf_1;
                        acc_h1[j] = acc_h1[j] * correction_h1 + p_0_h1 * vf_0 + p_1_h1 * vf_1;
                    }
                    {
                        let j = 1u;
                        let vf_0 = vec4<f32>(v_0[j]);
                        let vf_1 = vec4<f32>(v_1[j]);
                        acc_h0[j] = acc_h0[j] * correction_h0 + p_0_h0 * vf_0 + p_1_h0 * vf_1;
                        acc_h1[j] = acc_h1[j] * correction_h1 + p_0_h1 * vf_0 + p_1_h1 * vf_1;
                    }
                }
            } else {
                let span = keys.y - min(keys.x, keys.y);
                let per_iter = streams * KEYS_PER_ITER;
                let iterations = (span + per_iter - 1u) / per_iter;
                for (var it: u32 = 0u; it < iterations; it = it + 1u) {
                    let base = keys.x + it * per_iter + stream;
                    // key 0 of this iteration: K and V rows loaded whether it counts or not (a key
                    // past the end reads the last key's row), so no load waits behind a branch
                    let key_0 = base + 0u * streams;
                    let valid_0 = group_ok && key_0 < keys.y;
                    let row_0 = (get_kv_pos(min(key_0, keys.y - 1u)) * u.num_kv_heads + kv_head_idx) * hd4;
                    var k_0 = array<vec4<f32>, VEC_PER_LANE>();
                    var v_0 = array<vec4<f32>, VEC_PER_LANE>();
                    {
                        let j = 0u;
                        let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                        k_0[j] = K[row_0 + v];
                        v_0[j] = V[row_0 + v];
                    }
                    {
                        let j = 1u;
                        let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                        k_0[j] = K[row_0 + v];
                        v_0[j] = V[row_0 + v];
                    }

                    // key 1 of this iteration: K and V rows loaded whether it counts or not (a key
                    // past the end reads the last key's row), so no load waits behind a branch
                    let key_1 = base + 1u * streams;
                    let valid_1 = group_ok && key_1 < keys.y;
                    let row_1 = (get_kv_pos(min(key_1, keys.y - 1u)) * u.num_kv_heads + kv_head_idx) * hd4;
                    var k_1 = array<vec4<f32>, VEC_PER_LANE>();
                    var v_1 = array<vec4<f32>, VEC_PER_LANE>();
                    {
                        let j = 0u;
                        let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                        k_1[j] = K[row_1 + v];
                        v_1[j] = V[row_1 + v];
                    }
                    {
                        let j = 1u;
                        let v = min(lane + j * LANES_PER_KEY, hd4 - 1u);
                        k_1[j] = K[row_1 + v];
                        v_1[j] = V[row_1 + v];
                    }

                    // dot products of key 0 (an invalid key's score is never used)
                    var dot_0_h0: f32 = 0.0;
                    var dot_0_h1: f32 = 0.0;
                    {
                        let j = 0u;
                        let kf = vec4<f32>(k_0[j]);
                        dot_0_h0 = dot_0_h0 + dot(q_h0[j], kf);
                        dot_0_h1 = dot_0_h1 + dot(q_h1[j], kf);
                    }
                    {
                        let j = 1u;
                        let kf = vec4<f32>(k_0[j]);
                        dot_0_h0 = dot_0_h0 + dot(q_h0[j], kf);
                        dot_0_h1 = dot_0_h1 + dot(q_h1[j], kf);
                    }
                    // dot products of key 1 (an invalid key's score is never used)
                    var dot_1_h0: f32 = 0.0;
                    var dot_1_h1: f32 = 0.0;
                    {
                        let j = 0u;
                        let kf = vec4<f32>(k_1[j]);
                        dot_1_h0 = dot_1_h0 + dot(q_h0[j], kf);
                        dot_1_h1 = dot_1_h1 + dot(q_h1[j], kf);
                    }
                    {
                        let j = 1u;
                        let kf = vec4<f32>(k_1[j]);
                        dot_1_h0 = dot_1_h0 + dot(q_h0[j], kf);
                        dot_1_h1 = dot_1_h1 + dot(q_h1[j], kf);
                    }
                    // Sum the partial dot products of the LANES_PER_KEY lanes of each key group
                    if (subgroup_ok) {
                        dot_0_h0 = dot_0_h0 + subgroupShuffleXor(dot_0_h0, 1u);
                        dot_0_h0 = dot_0_h0 + subgroupShuffleXor(dot_0_h0, 2u);
                        dot_0_h0 = dot_0_h0 + subgroupShuffleXor(dot_0_h0, 4u);
                        dot_0_h1 = dot_0_h1 + subgroupShuffleXor(dot_0_h1, 1u);
                        dot_0_h1 = dot_0_h1 + subgroupShuffleXor(dot_0_h1, 2u);
                        dot_0_h1 = dot_0_h1 + subgroupShuffleXor(dot_0_h1, 4u);
                        dot_1_h0 = dot_1_h0 + subgroupShuffleXor(dot_1_h0, 1u);
                        dot_1_h0 = dot_1_h0 + subgroupShuffleXor(dot_1_h0, 2u);
                        dot_1_h0 = dot_1_h0 + subgroupShuffleXor(dot_1_h0, 4u);
                        dot_1_h1 = dot_1_h1 + subgroupShuffleXor(dot_1_h1, 1u);
                        dot_1_h1 = dot_1_h1 + subgroupShuffleXor(dot_1_h1, 2u);
                        dot_1_h1 = dot_1_h1 + subgroupShuffleXor(dot_1_h1, 4u);
                    } else {
                        // subgroups narrower than a key group: through workgroup memory (uniform branch)
                        let parity = 0u;
                        workgroupBarrier();  // the previous iteration's reads are done
                        partial_dots[parity + (lid * KEYS_PER_ITER + 0u) * 2u + 0u] = dot_0_h0;
                        partial_dots[parity + (lid * KEYS_PER_ITER + 0u) * 2u + 1u] = dot_0_h1;
                        partial_dots[parity + (lid * KEYS_PER_ITER + 1u) * 2u + 0u] = dot_1_h0;
                        partial_dots[parity + (lid * KEYS_PER_ITER + 1u) * 2u + 1u] = dot_1_h1;
                        workgroupBarrier();
                        let group_first = parity + (kg * LANES_PER_KEY) * KEYS_PER_ITER * 2u;
                        dot_0_h0 = 0.0;
                        dot_0_h1 = 0.0;
                        dot_1_h0 = 0.0;
                        dot_1_h1 = 0.0;
                        for (var i: u32 = 0u; i < LANES_PER_KEY; i = i + 1u) {
                            dot_0_h0 = dot_0_h0 + partial_dots[group_first + (i * KEYS_PER_ITER + 0u) * 2u + 0u];
                            dot_0_h1 = dot_0_h1 + partial_dots[group_first + (i * KEYS_PER_ITER + 0u) * 2u + 1u];
                            dot_1_h0 = dot_1_h0 + partial_dots[group_first + (i * KEYS_PER_ITER + 1u) * 2u + 0u];
                            dot_1_h1 = dot_1_h1 + partial_dots[group_first + (i * KEYS_PER_ITER + 1u) * 2u + 1u];
                        }
                    }
                    // Scores and the online softmax update of this key group for head 0 of its 2
                    var block_max_h0: f32 = NEG_BIG;
                    let score_0_h0 = dot_0_h0 * scale;
                    if (valid_0) {
                        block_max_h0 = max(block_max_h0, score_0_h0);
                    }
                    let score_1_h0 = dot_1_h0 * scale;
                    if (valid_1) {
                        block_max_h0 = max(block_max_h0, score_1_h0);
                    }
                    let m_new_h0 = max(m_h0, block_max_h0);
                    let correction_h0 = exp(m_h0 - m_new_h0);
                    let p_0_h0 = select(0.0, exp(score_0_h0 - m_new_h0), valid_0);
                    let p_1_h0 = select(0.0, exp(score_1_h0 - m_new_h0), valid_1);
                    l_h0 = l_h0 * correction_h0 + p_0_h0 + p_1_h0;
                    m_h0 = m_new_h0;
                    // Scores and the online softmax update of this key group for head 1 of its 2
                    var block_max_h1: f32 = NEG_BIG;
                    let score_0_h1 = dot_0_h1 * scale;
                    if (valid_0) {
                        block_max_h1 = max(block_max_h1, score_0_h1);
                    }
                    let score_1_h1 = dot_1_h1 * scale;
                    if (valid_1) {
                        block_max_h1 = max(block_max_h1, score_1_h1);
                    }
                    let m_new_h1 = max(m_h1, block_max_h1);
                    let correction_h1 = exp(m_h1 - m_new_h1);
                    let p_0_h1 = select(0.0, exp(score_0_h1 - m_new_h1), valid_0);
                    let p_1_h1 = select(0.0, exp(score_1_h1 - m_new_h1), valid_1);
                    l_h1 = l_h1 * correction_h1 + p_0_h1 + p_1_h1;
                    m_h1 = m_new_h1;
                    {
                        let j = 0u;
                        let vf_0 = vec4<f32>(v_0[j]);
                        let vf_1 = vec4<f32>(v_1[j]);
                        acc_h0[j] = acc_h0[j] * correction_h0 + p_0_h0 * vf_0 + p_1_h0 * vf_1;
                        acc_h1[j] = acc_h1[j] * correction_h1 + p_0_h1 * vf_0 + p_1_h1 * vf_1;
                    }
                    {
                        let j = 1u;
                        let vf_0 = vec4<f32>(v_0[j]);
                        let vf_1 = vec4<f32>(v_1[j]);
                        acc_h0[j] = acc_h0[j] * correction_h0 + p_0_h0 * vf_0 + p_1_h0 * vf_1;
                        acc_h1[j] = acc_h1[j] * correction_h1 + p_0_h1 * vf_0 + p_1_h1 * vf_1;
                    }
                }
            }
        }

            // -- merge the streams of each head: the head's max, rescale, sum the slices --
            // merge_m entry of (key group, head h of its slot): kg * HEADS_PER_GROUP + h
            if (lane == 0u) {
                merge_m[kg * HEADS_PER_GROUP + 0u] = m_h0;
                merge_m[kg * HEADS_PER_GROUP + 1u] = m_h1;
            }
            workgroupBarrier();
            var m_head_h0: f32 = NEG_BIG;
            {
                var m_head_h0_1: f32 = NEG_BIG;
                var m_head_h0_2: f32 = NEG_BIG;
                var m_head_h0_3: f32 = NEG_BIG;
                for (var s: u32 = 0u; s < streams; s = s + 4u) {
                    m_head_h0 = max(m_head_h0, merge_m[(slot + s * slots) * HEADS_PER_GROUP + 0u]);
                    m_head_h0_1 = max(m_head_h0_1, select(NEG_BIG, merge_m[(slot + min(s + 1u, streams - 1u) * slots) * HEADS_PER_GROUP + 0u], s + 1u < streams));
                    m_head_h0_2 = max(m_head_h0_2, select(NEG_BIG, merge_m[(slot + min(s + 2u, streams - 1u) * slots) * HEADS_PER_GROUP + 0u], s + 2u < streams));
                    m_head_h0_3 = max(m_head_h0_3, select(NEG_BIG, merge_m[(slot + min(s + 3u, streams - 1u) * slots) * HEADS_PER_GROUP + 0u], s + 3u < streams));
                }
                m_head_h0 = max(max(m_head_h0, m_head_h0_1), max(m_head_h0_2, m_head_h0_3));
            }
            let rescale_h0 = exp(m_h0 - m_head_h0);
            l_h0 = l_h0 * rescale_h0;
            var m_head_h1: f32 = NEG_BIG;
            {
                var m_head_h1_1: f32 = NEG_BIG;
                var m_head_h1_2: f32 = NEG_BIG;
                var m_head_h1_3: f32 = NEG_BIG;
                for (var s: u32 = 0u; s < streams; s = s + 4u) {
                    m_head_h1 = max(m_head_h1, merge_m[(slot + s * slots) * HEADS_PER_GROUP + 1u]);
                    m_head_h1_1 = max(m_head_h1_1, select(NEG_BIG, merge_m[(slot + min(s + 1u, streams - 1u) * slots) * HEADS_PER_GROUP + 1u], s + 1u < streams));
                    m_head_h1_2 = max(m_head_h1_2, select(NEG_BIG, merge_m[(slot + min(s + 2u, streams - 1u) * slots) * HEADS_PER_GROUP + 1u], s + 2u < streams));
                    m_head_h1_3 = max(m_head_h1_3, select(NEG_BIG, merge_m[(slot + min(s + 3u, streams - 1u) * slots) * HEADS_PER_GROUP + 1u], s + 3u < streams));
                }
                m_head_h1 = max(max(m_head_h1, m_head_h1_1), max(m_head_h1_2, m_head_h1_3));
            }
            let rescale_h1 = exp(m_h1 - m_head_h1);
            l_h1 = l_h1 * rescale_h1;
            // (one max and one sum per head for the store below, not a scan of the streams)
            if (in_stream && stream == 0u && lane == 0u) {
                merge_head_m[slot * HEADS_PER_GROUP + 0u] = m_head_h0;
                merge_head_m[slot * HEADS_PER_GROUP + 1u] = m_head_h1;
            }
            // Round r: streams [r * rows_per_head, (r + 1) * rows_per_head) add their slices (and
            // their rescaled sums) into their heads' rows; round 0 writes every row
            for (var r: u32 = 0u; r * rows_per_head < streams; r = r + 1u) {
                if (in_stream && stream / rows_per_head == r) {
                    let head_row_h0 = (slot * HEADS_PER_GROUP + 0u) * rows_per_head + stream % rows_per_head;
                    let row_h0 = head_row_h0 * (MAX_HEAD_DIM / 4u);
                    let head_row_h1 = (slot * HEADS_PER_GROUP + 1u) * rows_per_head + stream % rows_per_head;
                    let row_h1 = head_row_h1 * (MAX_HEAD_DIM / 4u);
                    if (lane == 0u) {
                        merge_l[head_row_h0] = select(merge_l[head_row_h0], 0.0, r == 0u) + l_h0;
                        merge_l[head_row_h1] = select(merge_l[head_row_h1], 0.0, r == 0u) + l_h1;
                    }
                    {
                        let j = 0u;
                        let v = lane + j * LANES_PER_KEY;
                        if (v < hd4) {
                            let scaled_h0 = acc_h0[j] * rescale_h0;
                            if (r == 0u) {
                                merge_acc[row_h0 + v] = scaled_h0;
                            } else {
                                merge_acc[row_h0 + v] = merge_acc[row_h0 + v] + scaled_h0;
                            }
                            let scaled_h1 = acc_h1[j] * rescale_h1;
                            if (r == 0u) {
                                merge_acc[row_h1 + v] = scaled_h1;
                            } else {
                                merge_acc[row_h1 + v] = merge_acc[row_h1 + v] + scaled_h1;
                            }
                        }
                    }
                    {
                        let j = 1u;
                        let v = lane + j * LANES_PER_KEY;
                        if (v < hd4) {
                            let scaled_h0 = acc_h0[j] * rescale_h0;
                            if (r == 0u) {
                                merge_acc[row_h0 + v] = scaled_h0;
                            } else {
                                merge_acc[row_h0 + v] = merge_acc[row_h0 + v] + scaled_h0;
                            }
                            let scaled_h1 = acc_h1[j] * rescale_h1;
                            if (r == 0u) {
                                merge_acc[row_h1 + v] = scaled_h1;
                            } else {
                                merge_acc[row_h1 + v] = merge_acc[row_h1 + v] + scaled_h1;
                            }
                        }
                    }
                }
                workgroupBarrier();
            }
            // Each (head of the chunk, d): the unnormalised accumulator, and (max, sum) at d = 0
            for (var i: u32 = lid; i < heads_at_once * head_dim; i = i + WORKGROUP_SIZE) {
                let h = i / head_dim;
                let d = i - h * head_dim;
                if (first_head + h < group) {
                    let slot_out = (split * u.query_len + query_pos) * u.num_heads + kv_head_idx * group + first_head + h;
                    var total: f32 = 0.0;
                    for (var row: u32 = 0u; row < rows_per_head; row = row + 1u) {
                        total = total + merge_acc[(h * rows_per_head + row) * (MAX_HEAD_DIM / 4u) + d / 4u][d % 4u];
                    }
                    partial_acc[slot_out * head_dim + d] = total;
                    if (d == 0u) {
                        // head h is entry h % HEADS_PER_GROUP of slot h / HEADS_PER_GROUP
                        var l_h: f32 = 0.0;
                        for (var row: u32 = 0u; row < rows_per_head; row = row + 1u) {
                            l_h = l_h + merge_l[h * rows_per_head + row];
                        }
                        partial_ml[2u * slot_out] = merge_head_m[h];
                        partial_ml[2u * slot_out + 1u] = l_h;
                    }
                }
            }
            // merge_m, merge_l and merge_acc are rewritten by the next chunk or query
            workgroupBarrier();
        }
    }
}
