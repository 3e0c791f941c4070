// AUTO-GENERATED from templates/attention_decode_tiered.wgsl.j2 for variant attention_decode_tiered_split_int4_f16kv pass partials by doppler-gen - do not edit.
// Edit the template and variants.toml, then run `doppler-gen generate`.
// source-hash: sha256:61d929af2a7b6a5be6e7bdb7a7f9b8310775d87f6d02ce98acd4c9feb6547e97

// Tiered Decode Attention Kernel (int4 cold, f16 hot, f32 Q, f32 output): split-KV pass 1, partials
//
// One workgroup per (split, KV head, chunk of HEADS_PER_WORKGROUP of its query heads): dispatch
// KV_SPLITS * num_kv_heads * ceil(num_heads / num_kv_heads / HEADS_PER_WORKGROUP), the chunks of
// one split adjacent so that they share the KV head's rows through L2. Each K/V slice is loaded
// and unpacked once for the chunk's heads. The cold-then-hot keys are cut into at most KV_SPLITS
// splits of max(MIN_SPLIT_KEYS, ceil(keys / KV_SPLITS)) keys; the workgroup walks its split as
// below and writes the split's (max, sum, unnormalised accumulator) of each head to scratch;
// attention_decode_split_reduce combines the splits.
//
// One workgroup per query head. The workgroup is split into lane groups of LANES_PER_KEY
// invocations (the smallest power of two with LANES_PER_KEY * DIMS_PER_LANE >= head_dim); a
// group scores 2 key(s) per step, each lane owning DIMS_PER_LANE head-dim elements of
// q, K, V and the output. The q.k dot is reduced across the group
// by subgroup shuffles (through workgroup memory where a group is wider than the subgroup),
// and every group keeps its own online-softmax state (running max, running sum, accumulator
// slice) over the keys it visits, cold tier first, then hot. The groups' states are merged at
// the end. Nothing is stored per key, so the KV length is bounded only by buffer sizes.
// Requires head_dim <= MAX_HEAD_DIM and LANES_PER_KEY <= WORKGROUP_SIZE <= MAX_WORKGROUP_SIZE,
// else the kernel returns without writing.
// Fully masked row: average of V over all keys (masked scores are -3.4e38).

enable f16;
enable subgroups;

const MAX_KV_LEN: u32 = 131072u;
const MAX_HEAD_DIM: u32 = 256u;
const MAX_WORKGROUP_SIZE: u32 = 1024u;
const DIMS_PER_LANE: u32 = 8u;
const PACK_FACTOR: u32 = 8u;
const MASKED_SCORE: f32 = -3.402823e+38;

override WORKGROUP_SIZE: u32 = 256u;
const HEADS_PER_WORKGROUP: u32 = 4u;  // query heads each workgroup serves
override KV_SPLITS: u32 = 33u;          // splits (same value in the reduce pass)
override MIN_SPLIT_KEYS: u32 = 128u;     // fewest keys per split (same value in the reduce pass)

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

@group(0) @binding(9) var<storage, read_write> partial_acc: array<f32>; // [split, num_heads, head_dim]
@group(0) @binding(10) var<storage, read_write> partial_ml: array<f32>;  // [split, num_heads, 2]: max, sum

// Four f32 per invocation: its partial dots (elements 0-1 and 2-3 alternate between steps, so
// one barrier a step suffices), then the merge of the groups' softmax states
var<workgroup> exchange: array<f32, 4u * MAX_WORKGROUP_SIZE>;

fn get4(i: u32) -> vec4<f32> {
    return vec4<f32>(exchange[4u * i], exchange[4u * i + 1u], exchange[4u * i + 2u], exchange[4u * i + 3u]);
}

fn set4(i: u32, value: vec4<f32>) {
    exchange[4u * i] = value.x;
    exchange[4u * i + 1u] = value.y;
    exchange[4u * i + 2u] = value.z;
    exchange[4u * i + 3u] = value.w;
}
// Per-invocation state: which lane group (key slot) and head-dim slice this invocation owns,
// its slice of q, and its group's online-softmax state (running max and sum, accumulator slice)
var<private> tid: u32;
var<private> lanes: u32;           // lanes per key (a power of two)
var<private> num_groups: u32;      // lane groups in the workgroup
var<private> key_group: u32;       // this lane's group
var<private> group_lane: u32;      // this lane's index within its group
var<private> in_group: bool;       // false for the WORKGROUP_SIZE % lanes leftover invocations
var<private> dim0: u32;            // first head-dim element this lane owns
var<private> lane_live: bool;      // in a group and dim0 < head_dim
var<private> kv_head: u32;
var<private> exchange_half: u32;   // which half of the lane's `exchange` elements the next reduction uses
var<private> open_first: u32;      // absolute positions of the first and last key the query
var<private> open_last: u32;       // attends (the masks as bounds); the others score MASKED_SCORE
var<private> hot_base: u32;        // hot_start % hot_window, for get_hot_pos
var<private> run_max_h0: f32;
var<private> run_sum_h0: f32;
var<private> q_0_h0: vec4<f32>;
var<private> q_1_h0: vec4<f32>;
var<private> acc_0_h0: vec4<f32>;
var<private> acc_1_h0: vec4<f32>;
var<private> run_max_h1: f32;
var<private> run_sum_h1: f32;
var<private> q_0_h1: vec4<f32>;
var<private> q_1_h1: vec4<f32>;
var<private> acc_0_h1: vec4<f32>;
var<private> acc_1_h1: vec4<f32>;
var<private> run_max_h2: f32;
var<private> run_sum_h2: f32;
var<private> q_0_h2: vec4<f32>;
var<private> q_1_h2: vec4<f32>;
var<private> acc_0_h2: vec4<f32>;
var<private> acc_1_h2: vec4<f32>;
var<private> run_max_h3: f32;
var<private> run_sum_h3: f32;
var<private> q_0_h3: vec4<f32>;
var<private> q_1_h3: vec4<f32>;
var<private> acc_0_h3: vec4<f32>;
var<private> acc_1_h3: vec4<f32>;

// The split's ends (tier indices) for the step functions' key checks; main's loops use its own
// `let` copies, which stay workgroup-uniform (barriers run inside the steps)
var<private> cold_end: u32;
var<private> hot_end: u32;

// Keys per split: (cold_len + hot_len) over KV_SPLITS splits, at least MIN_SPLIT_KEYS
fn split_keys() -> u32 {
    return max(max(MIN_SPLIT_KEYS, 1u), ((u.cold_len + u.hot_len) + KV_SPLITS - 1u) / KV_SPLITS);
}

// Splits that hold keys (at most KV_SPLITS)
fn used_splits() -> u32 {
    let keys = split_keys();
    return min(KV_SPLITS, ((u.cold_len + u.hot_len) + keys - 1u) / keys);
}

// Get KV head index for grouped query attention
fn get_kv_head_idx(query_head_idx: u32) -> u32 {
    // GQA: multiple query heads share one KV head
    let heads_per_kv = u.num_heads / u.num_kv_heads;
    return query_head_idx / heads_per_kv;
}

// The absolute key positions [x, y] the decode query attends (causal and sliding-window masks
// as bounds, computed once per invocation into open_first / open_last)
fn open_keys() -> vec2<u32> {
    var first: u32 = 0u;
    var last: u32 = 0xffffffffu;
    // Causal mask: no key after the query
    if (u.is_causal != 0u) { last = u.start_pos; }
    // Sliding window mask: no key before the window
    if (u.sliding_window > 0u && u.start_pos >= u.sliding_window) {
        first = u.start_pos - u.sliding_window + 1u;
    }
    return vec2<u32>(first, last);
}

// hot_start % hot_window (0 without a ring), divided once per invocation into hot_base
fn hot_ring_base() -> u32 {
    if (u.hot_window > 0u) {
        return u.hot_start % u.hot_window;
    }
    return 0u;
}

// Physical row of hot key hot_pos: a ring of hot_window rows starting at hot_start, so row
// (hot_start + hot_pos) % hot_window. A ring holds hot_window keys: with hot_len <= hot_window,
// hot_base + hot_pos is below 2 * hot_window and one subtraction replaces the division (4 % of
// the long split kernel's time on the H200)
fn get_hot_pos(hot_pos: u32) -> u32 {
    if (u.hot_window > 0u) {
        let p = hot_base + hot_pos;
        if (p >= 2u * u.hot_window) {
            return p % u.hot_window;  // hot_len > hot_window: keys share rows
        }
        return select(p, p - u.hot_window, p >= u.hot_window);
    }
    return hot_pos;
}

// Values 0 .. 3 of a packed int4 word, as signed integers in f32
fn unpack_quant_0(packed_val: u32) -> vec4<f32> {
    let lo = packed_val ^ 0x88888888u;  // offset binary
    let bits = (vec4<u32>(lo, lo, lo, lo) & vec4<u32>(0xfu, 0xf0u, 0xf00u, 0xf000u)) | vec4<u32>(0x4b000000u);
    return fma(bitcast<vec4<f32>>(bits), vec4<f32>(1.0, 0.0625, 0.00390625, 0.000244140625), vec4<f32>(-8388616.0, -524296.0, -32776.0, -2056.0));
}

// Values 4 .. 7 of a packed int4 word, as signed integers in f32
fn unpack_quant_4(packed_val: u32) -> vec4<f32> {
    let lo = packed_val ^ 0x88888888u;  // offset binary
    let hi = lo >> 16u;
    let bits = (vec4<u32>(hi, hi, hi, hi) & vec4<u32>(0xfu, 0xf0u, 0xf00u, 0xf000u)) | vec4<u32>(0x4b000000u);
    return fma(bitcast<vec4<f32>>(bits), vec4<f32>(1.0, 0.0625, 0.00390625, 0.000244140625), vec4<f32>(-8388616.0, -524296.0, -32776.0, -2056.0));
}

// Scale a key's q.k dot into its score (the loops without softcap); a masked key (not `open`)
// scores MASKED_SCORE
fn finish_score(dot: f32, open: bool) -> f32 {
    return select(MASKED_SCORE, dot * u.scale, open);
}

// The same with the softcap (the loops that run when u.attn_softcap > 0)
fn finish_score_capped(dot: f32, open: bool) -> f32 {
    let s = dot * u.scale;
    return select(MASKED_SCORE, tanh(s / u.attn_softcap) * u.attn_softcap, open);
}

// Sum two key slots' partial q.k dots over each lane group
fn group_reduce(partial: vec2<f32>, width: u32) -> vec2<f32> {
    if (width > 0u) {
        var total = partial;
        total += select(vec2<f32>(0.0), subgroupShuffleXor(total, 16u), 16u < width);
        total += select(vec2<f32>(0.0), subgroupShuffleXor(total, 8u), 8u < width);
        total += select(vec2<f32>(0.0), subgroupShuffleXor(total, 4u), 4u < width);
        total += select(vec2<f32>(0.0), subgroupShuffleXor(total, 2u), 2u < width);
        total += select(vec2<f32>(0.0), subgroupShuffleXor(total, 1u), 1u < width);
        return total;
    }
    let pick = 2u * exchange_half;
    exchange_half = exchange_half ^ 1u;
    exchange[4u * tid + pick] = partial.x;
    exchange[4u * tid + pick + 1u] = partial.y;
    workgroupBarrier();
    var sum = vec2<f32>(0.0);
    if (in_group) {
        let base = 4u * key_group * lanes + pick;
        for (var i: u32 = 0u; i < lanes; i++) {
            sum += vec2<f32>(exchange[base + 4u * i], exchange[base + 4u * i + 1u]);
        }
    }
    return sum;
}

// cold_step's rows for the next step, loaded by cold_step_fetch one step ahead
var<private> cold_step_ks0: f32;
var<private> cold_step_vs0: f32;
var<private> cold_step_kw0_0: u32;
var<private> cold_step_vw0_0: u32;
var<private> cold_step_ks1: f32;
var<private> cold_step_vs1: f32;
var<private> cold_step_kw1_0: u32;
var<private> cold_step_vw1_0: u32;

// Load the rows of the step starting at `first` into cold_step's private registers
fn cold_step_fetch(first: u32) {
    let key0 = first + 0u * num_groups + key_group;
    let at0 = min(key0, cold_end - 1u);
    let key1 = first + 1u * num_groups + key_group;
    let at1 = min(key1, cold_end - 1u);
    let scale_idx0 = at0 * u.num_kv_heads + kv_head;
    let base0 = scale_idx0 * u.packed_stride;
    let word0_0 = base0 + min(dim0 / PACK_FACTOR + 0u, u.packed_stride - 1u);
    let scale_idx1 = at1 * u.num_kv_heads + kv_head;
    let base1 = scale_idx1 * u.packed_stride;
    let word1_0 = base1 + min(dim0 / PACK_FACTOR + 0u, u.packed_stride - 1u);

    cold_step_ks0 = f32(scales_k[scale_idx0]);
    cold_step_vs0 = f32(scales_v[scale_idx0]);
    cold_step_kw0_0 = K_cold[word0_0];
    cold_step_vw0_0 = V_cold[word0_0];
    cold_step_ks1 = f32(scales_k[scale_idx1]);
    cold_step_vs1 = f32(scales_v[scale_idx1]);
    cold_step_kw1_0 = K_cold[word1_0];
    cold_step_vw1_0 = V_cold[word1_0];
}

// One step over the cold tier: slot s scores key first + s * num_groups + key_group, s < 2
fn cold_step(first: u32, width: u32) {
    // This step's rows were loaded by the previous step (or before the loop); the next step's
    // are requested now, so that their loads are in flight while this step computes
    let key0 = first + 0u * num_groups + key_group;
    let live0 = in_group && key0 < cold_end;
    let key1 = first + 1u * num_groups + key_group;
    let live1 = in_group && key1 < cold_end;

    let ks0 = cold_step_ks0;
    let vs0 = select(0.0, cold_step_vs0, live0);
    let kw0_0 = cold_step_kw0_0;
    let vw0_0 = cold_step_vw0_0;
    let ks1 = cold_step_ks1;
    let vs1 = select(0.0, cold_step_vs1, live1);
    let kw1_0 = cold_step_kw1_0;
    let vw1_0 = cold_step_vw1_0;
    cold_step_fetch(first + 2u * num_groups);
    // Each slice converted (unpacked, V scaled) once, for all 4 heads
    let kf0_0 = unpack_quant_0(kw0_0);
    let kf0_1 = unpack_quant_4(kw0_0);
    let vf0_0 = unpack_quant_0(vw0_0) * vs0;
    let vf0_1 = unpack_quant_4(vw0_0) * vs0;
    let kf1_0 = unpack_quant_0(kw1_0);
    let kf1_1 = unpack_quant_4(kw1_0);
    let vf1_0 = unpack_quant_0(vw1_0) * vs1;
    let vf1_1 = unpack_quant_4(vw1_0) * vs1;
    let part0_h0 = (dot(q_0_h0, kf0_0) + dot(q_1_h0, kf0_1)) * ks0;
    let part0_h1 = (dot(q_0_h1, kf0_0) + dot(q_1_h1, kf0_1)) * ks0;
    let part0_h2 = (dot(q_0_h2, kf0_0) + dot(q_1_h2, kf0_1)) * ks0;
    let part0_h3 = (dot(q_0_h3, kf0_0) + dot(q_1_h3, kf0_1)) * ks0;
    let part1_h0 = (dot(q_0_h0, kf1_0) + dot(q_1_h0, kf1_1)) * ks1;
    let part1_h1 = (dot(q_0_h1, kf1_0) + dot(q_1_h1, kf1_1)) * ks1;
    let part1_h2 = (dot(q_0_h2, kf1_0) + dot(q_1_h2, kf1_1)) * ks1;
    let part1_h3 = (dot(q_0_h3, kf1_0) + dot(q_1_h3, kf1_1)) * ks1;
    let dots0 = group_reduce(vec2<f32>(part0_h0, part0_h1), width);
    let dots2 = group_reduce(vec2<f32>(part0_h2, part0_h3), width);
    let dots4 = group_reduce(vec2<f32>(part1_h0, part1_h1), width);
    let dots6 = group_reduce(vec2<f32>(part1_h2, part1_h3), width);
    let abs0 = key0;
    let open0 = abs0 >= open_first && abs0 <= open_last;
    let abs1 = key1;
    let open1 = abs1 >= open_first && abs1 <= open_last;
    let score0_h0 = finish_score(dots0[0], open0);
    let score0_h1 = finish_score(dots0[1], open0);
    let score0_h2 = finish_score(dots2[0], open0);
    let score0_h3 = finish_score(dots2[1], open0);
    let score1_h0 = finish_score(dots4[0], open1);
    let score1_h1 = finish_score(dots4[1], open1);
    let score1_h2 = finish_score(dots6[0], open1);
    let score1_h3 = finish_score(dots6[1], open1);

    // Online softmax of head 0: fold the step's keys into the group's running max, sum and accumulator
    var m_h0 = run_max_h0;
    if (live0) { m_h0 = max(m_h0, score0_h0); }
    if (live1) { m_h0 = max(m_h0, score1_h0); }
    let correction_h0 = exp(run_max_h0 - m_h0);
    let w0_h0 = select(0.0, exp(score0_h0 - m_h0), live0);
    let w1_h0 = select(0.0, exp(score1_h0 - m_h0), live1);
    run_sum_h0 = run_sum_h0 * correction_h0 + w0_h0 + w1_h0;
    acc_0_h0 = acc_0_h0 * correction_h0 + w0_h0 * vf0_0 + w1_h0 * vf1_0;
    acc_1_h0 = acc_1_h0 * correction_h0 + w0_h0 * vf0_1 + w1_h0 * vf1_1;
    run_max_h0 = m_h0;

    // Online softmax of head 1: fold the step's keys into the group's running max, sum and accumulator
    var m_h1 = run_max_h1;
    if (live0) { m_h1 = max(m_h1, score0_h1); }
    if (live1) { m_h1 = max(m_h1, score1_h1); }
    let correction_h1 = exp(run_max_h1 - m_h1);
    let w0_h1 = select(0.0, exp(score0_h1 - m_h1), live0);
    let w1_h1 = select(0.0, exp(score1_h1 - m_h1), live1);
    run_sum_h1 = run_sum_h1 * correction_h1 + w0_h1 + w1_h1;
    acc_0_h1 = acc_0_h1 * correction_h1 + w0_h1 * vf0_0 + w1_h1 * vf1_0;
    acc_1_h1 = acc_1_h1 * correction_h1 + w0_h1 * vf0_1 + w1_h1 * vf1_1;
    run_max_h1 = m_h1;

    // Online softmax of head 2: fold the step's keys into the group's running max, sum and accumulator
    var m_h2 = run_max_h2;
    if (live0) { m_h2 = max(m_h2, score0_h2); }
    if (live1) { m_h2 = max(m_h2, score1_h2); }
    let correction_h2 = exp(run_max_h2 - m_h2);
    let w0_h2 = select(0.0, exp(score0_h2 - m_h2), live0);
    let w1_h2 = select(0.0, exp(score1_h2 - m_h2), live1);
    run_sum_h2 = run_sum_h2 * correction_h2 + w0_h2 + w1_h2;
    acc_0_h2 = acc_0_h2 * correction_h2 + w0_h2 * vf0_0 + w1_h2 * vf1_0;
    acc_1_h2 = acc_1_h2 * correction_h2 + w0_h2 * vf0_1 + w1_h2 * vf1_1;
    run_max_h2 = m_h2;

    // Online softmax of head 3: fold the step's keys into the group's running max, sum and accumulator
    var m_h3 = run_max_h3;
    if (live0) { m_h3 = max(m_h3, score0_h3); }
    if (live1) { m_h3 = max(m_h3, score1_h3); }
    let correction_h3 = exp(run_max_h3 - m_h3);
    let w0_h3 = select(0.0, exp(score0_h3 - m_h3), live0);
    let w1_h3 = select(0.0, exp(score1_h3 - m_h3), live1);
    run_sum_h3 = run_sum_h3 * correction_h3 + w0_h3 + w1_h3;
    acc_0_h3 = acc_0_h3 * correction_h3 + w0_h3 * vf0_0 + w1_h3 * vf1_0;
    acc_1_h3 = acc_1_h3 * correction_h3 + w0_h3 * vf0_1 + w1_h3 * vf1_1;
    run_max_h3 = m_h3;
}

// hot_step's rows for the next step, loaded by hot_step_fetch one step ahead
var<private> hot_step_kh0_0: vec4<f16>;
var<private> hot_step_kh0_1: vec4<f16>;
var<private> hot_step_vh0_0: vec4<f16>;
var<private> hot_step_vh0_1: vec4<f16>;
var<private> hot_step_kh1_0: vec4<f16>;
var<private> hot_step_kh1_1: vec4<f16>;
var<private> hot_step_vh1_0: vec4<f16>;
var<private> hot_step_vh1_1: vec4<f16>;

// Load the rows of the step starting at `first` into hot_step's private registers
fn hot_step_fetch(first: u32) {
    let key0 = first + 0u * num_groups + key_group;
    let at0 = min(key0, hot_end - 1u);
    let key1 = first + 1u * num_groups + key_group;
    let at1 = min(key1, hot_end - 1u);
    let row0 = (get_hot_pos(at0) * u.num_kv_heads + kv_head) * u.head_dim;
    let row1 = (get_hot_pos(at1) * u.num_kv_heads + kv_head) * u.head_dim;

    hot_step_kh0_0 = vec4<f16>(K_hot[row0 + min(dim0 + 0u, u.head_dim - 1u)], K_hot[row0 + min(dim0 + 1u, u.head_dim - 1u)], K_hot[row0 + min(dim0 + 2u, u.head_dim - 1u)], K_hot[row0 + min(dim0 + 3u, u.head_dim - 1u)]);
    hot_step_kh0_1 = vec4<f16>(K_hot[row0 + min(dim0 + 4u, u.head_dim - 1u)], K_hot[row0 + min(dim0 + 5u, u.head_dim - 1u)], K_hot[row0 + min(dim0 + 6u, u.head_dim - 1u)], K_hot[row0 + min(dim0 + 7u, u.head_dim - 1u)]);
    hot_step_vh0_0 = vec4<f16>(V_hot[row0 + min(dim0 + 0u, u.head_dim - 1u)], V_hot[row0 + min(dim0 + 1u, u.head_dim - 1u)], V_hot[row0 + min(dim0 + 2u, u.head_dim - 1u)], V_hot[row0 + min(dim0 + 3u, u.head_dim - 1u)]);
    hot_step_vh0_1 = vec4<f16>(V_hot[row0 + min(dim0 + 4u, u.head_dim - 1u)], V_hot[row0 + min(dim0 + 5u, u.head_dim - 1u)], V_hot[row0 + min(dim0 + 6u, u.head_dim - 1u)], V_hot[row0 + min(dim0 + 7u, u.head_dim - 1u)]);
    hot_step_kh1_0 = vec4<f16>(K_hot[row1 + min(dim0 + 0u, u.head_dim - 1u)], K_hot[row1 + min(dim0 + 1u, u.head_dim - 1u)], K_hot[row1 + min(dim0 + 2u, u.head_dim - 1u)], K_hot[row1 + min(dim0 + 3u, u.head_dim - 1u)]);
    hot_step_kh1_1 = vec4<f16>(K_hot[row1 + min(dim0 + 4u, u.head_dim - 1u)], K_hot[row1 + min(dim0 + 5u, u.head_dim - 1u)], K_hot[row1 + min(dim0 + 6u, u.head_dim - 1u)], K_hot[row1 + min(dim0 + 7u, u.head_dim - 1u)]);
    hot_step_vh1_0 = vec4<f16>(V_hot[row1 + min(dim0 + 0u, u.head_dim - 1u)], V_hot[row1 + min(dim0 + 1u, u.head_dim - 1u)], V_hot[row1 + min(dim0 + 2u, u.head_dim - 1u)], V_hot[row1 + min(dim0 + 3u, u.head_dim - 1u)]);
    hot_step_vh1_1 = vec4<f16>(V_hot[row1 + min(dim0 + 4u, u.head_dim - 1u)], V_hot[row1 + min(dim0 + 5u, u.head_dim - 1u)], V_hot[row1 + min(dim0 + 6u, u.head_dim - 1u)], V_hot[row1 + min(dim0 + 7u, u.head_dim - 1u)]);
}

// One step over the hot tier: slot s scores key first + s * num_groups + key_group, s < 2
fn hot_step(first: u32, width: u32) {
    // This step's rows were loaded by the previous step (or before the loop); the next step's
    // are requested now, so that their loads are in flight while this step computes
    let key0 = first + 0u * num_groups + key_group;
    let live0 = in_group && key0 < hot_end;
    let key1 = first + 1u * num_groups + key_group;
    let live1 = in_group && key1 < hot_end;

    let kh0_0 = hot_step_kh0_0;
    let kh0_1 = hot_step_kh0_1;
    let vh0_0 = select(vec4<f16>(), hot_step_vh0_0, live0);
    let vh0_1 = select(vec4<f16>(), hot_step_vh0_1, live0);
    let kh1_0 = hot_step_kh1_0;
    let kh1_1 = hot_step_kh1_1;
    let vh1_0 = select(vec4<f16>(), hot_step_vh1_0, live1);
    let vh1_1 = select(vec4<f16>(), hot_step_vh1_1, live1);
    hot_step_fetch(first + 2u * num_groups);
    // Each slice converted (unpacked) once, for all 4 heads
    let kf0_0 = vec4<f32>(kh0_0);
    let kf0_1 = vec4<f32>(kh0_1);
    let vf0_0 = vec4<f32>(vh0_0);
    let vf0_1 = vec4<f32>(vh0_1);
    let kf1_0 = vec4<f32>(kh1_0);
    let kf1_1 = vec4<f32>(kh1_1);
    let vf1_0 = vec4<f32>(vh1_0);
    let vf1_1 = vec4<f32>(vh1_1);
    let part0_h0 = dot(q_0_h0, kf0_0) + dot(q_1_h0, kf0_1);
    let part0_h1 = dot(q_0_h1, kf0_0) + dot(q_1_h1, kf0_1);
    let part0_h2 = dot(q_0_h2, kf0_0) + dot(q_1_h2, kf0_1);
    let part0_h3 = dot(q_0_h3, kf0_0) + dot(q_1_h3, kf0_1);
    let part1_h0 = dot(q_0_h0, kf1_0) + dot(q_1_h0, kf1_1);
    let part1_h1 = dot(q_0_h1, kf1_0) + dot(q_1_h1, kf1_1);
    let part1_h2 = dot(q_0_h2, kf1_0) + dot(q_1_h2, kf1_1);
    let part1_h3 = dot(q_0_h3, kf1_0) + dot(q_1_h3, kf1_1);
    let dots0 = group_reduce(vec2<f32>(part0_h0, part0_h1), width);
    let dots2 = group_reduce(vec2<f32>(part0_h2, part0_h3), width);
    let dots4 = group_reduce(vec2<f32>(part1_h0, part1_h1), width);
    let dots6 = group_reduce(vec2<f32>(part1_h2, part1_h3), width);
    let abs0 = u.hot_start + key0;
    let open0 = abs0 >= open_first && abs0 <= open_last;
    let abs1 = u.hot_start + key1;
    let open1 = abs1 >= open_first && abs1 <= open_last;
    let score0_h0 = finish_score(dots0[0], open0);
    let score0_h1 = finish_score(dots0[1], open0);
    let score0_h2 = finish_score(dots2[0], open0);
    let score0_h3 = finish_score(dots2[1], open0);
    let score1_h0 = finish_score(dots4[0], open1);
    let score1_h1 = finish_score(dots4[1], open1);
    let score1_h2 = finish_score(dots6[0], open1);
    let score1_h3 = finish_score(dots6[1], open1);

    // Online softmax of head 0: fold the step's keys into the group's running max, sum and accumulator
    var m_h0 = run_max_h0;
    if (live0) { m_h0 = max(m_h0, score0_h0); }
    if (live1) { m_h0 = max(m_h0, score1_h0); }
    let correction_h0 = exp(run_max_h0 - m_h0);
    let w0_h0 = select(0.0, exp(score0_h0 - m_h0), live0);
    let w1_h0 = select(0.0, exp(score1_h0 - m_h0), live1);
    run_sum_h0 = run_sum_h0 * correction_h0 + w0_h0 + w1_h0;
    acc_0_h0 = acc_0_h0 * correction_h0 + w0_h0 * vf0_0 + w1_h0 * vf1_0;
    acc_1_h0 = acc_1_h0 * correction_h0 + w0_h0 * vf0_1 + w1_h0 * vf1_1;
    run_max_h0 = m_h0;

    // Online softmax of head 1: fold the step's keys into the group's running max, sum and accumulator
    var m_h1 = run_max_h1;
    if (live0) { m_h1 = max(m_h1, score0_h1); }
    if (live1) { m_h1 = max(m_h1, score1_h1); }
    let correction_h1 = exp(run_max_h1 - m_h1);
    let w0_h1 = select(0.0, exp(score0_h1 - m_h1), live0);
    let w1_h1 = select(0.0, exp(score1_h1 - m_h1), live1);
    run_sum_h1 = run_sum_h1 * correction_h1 + w0_h1 + w1_h1;
    acc_0_h1 = acc_0_h1 * correction_h1 + w0_h1 * vf0_0 + w1_h1 * vf1_0;
    acc_1_h1 = acc_1_h1 * correction_h1 + w0_h1 * vf0_1 + w1_h1 * vf1_1;
    run_max_h1 = m_h1;

    // Online softmax of head 2: fold the step's keys into the group's running max, sum and accumulator
    var m_h2 = run_max_h2;
    if (live0) { m_h2 = max(m_h2, score0_h2); }
    if (live1) { m_h2 = max(m_h2, score1_h2); }
    let correction_h2 = exp(run_max_h2 - m_h2);
    let w0_h2 = select(0.0, exp(score0_h2 - m_h2), live0);
    let w1_h2 = select(0.0, exp(score1_h2 - m_h2), live1);
    run_sum_h2 = run_sum_h2 * correction_h2 + w0_h2 + w1_h2;
    acc_0_h2 = acc_0_h2 * correction_h2 + w0_h2 * vf0_0 + w1_h2 * vf1_0;
    acc_1_h2 = acc_1_h2 * correction_h2 + w0_h2 * vf0_1 + w1_h2 * vf1_1;
    run_max_h2 = m_h2;

    // Online softmax of head 3: fold the step's keys into the group's running max, sum and accumulator
    var m_h3 = run_max_h3;
    if (live0) { m_h3 = max(m_h3, score0_h3); }
    if (live1) { m_h3 = max(m_h3, score1_h3); }
    let correction_h3 = exp(run_max_h3 - m_h3);
    let w0_h3 = select(0.0, exp(score0_h3 - m_h3), live0);
    let w1_h3 = select(0.0, exp(score1_h3 - m_h3), live1);
    run_sum_h3 = run_sum_h3 * correction_h3 + w0_h3 + w1_h3;
    acc_0_h3 = acc_0_h3 * correction_h3 + w0_h3 * vf0_0 + w1_h3 * vf1_0;
    acc_1_h3 = acc_1_h3 * correction_h3 + w0_h3 * vf0_1 + w1_h3 * vf1_1;
    run_max_h3 = m_h3;
}

// hot_step_aligned's rows for the next step, loaded by hot_step_aligned_fetch one step ahead
var<private> hot_step_aligned_kh0_0: vec4<f16>;
var<private> hot_step_aligned_kh0_1: vec4<f16>;
var<private> hot_step_aligned_vh0_0: vec4<f16>;
var<private> hot_step_aligned_vh0_1: vec4<f16>;
var<private> hot_step_aligned_kh1_0: vec4<f16>;
var<private> hot_step_aligned_kh1_1: vec4<f16>;
var<private> hot_step_aligned_vh1_0: vec4<f16>;
var<private> hot_step_aligned_vh1_1: vec4<f16>;

// Load the rows of the step starting at `first` into hot_step_aligned's private registers
fn hot_step_aligned_fetch(first: u32) {
    let key0 = first + 0u * num_groups + key_group;
    let at0 = min(key0, hot_end - 1u);
    let key1 = first + 1u * num_groups + key_group;
    let at1 = min(key1, hot_end - 1u);
    let row0 = ((get_hot_pos(at0) * u.num_kv_heads + kv_head) * (u.head_dim / DIMS_PER_LANE) + min(group_lane, u.head_dim / DIMS_PER_LANE - 1u)) * DIMS_PER_LANE;
    let row1 = ((get_hot_pos(at1) * u.num_kv_heads + kv_head) * (u.head_dim / DIMS_PER_LANE) + min(group_lane, u.head_dim / DIMS_PER_LANE - 1u)) * DIMS_PER_LANE;

    hot_step_aligned_kh0_0 = vec4<f16>(K_hot[row0 + 0u], K_hot[row0 + 1u], K_hot[row0 + 2u], K_hot[row0 + 3u]);
    hot_step_aligned_kh0_1 = vec4<f16>(K_hot[row0 + 4u], K_hot[row0 + 5u], K_hot[row0 + 6u], K_hot[row0 + 7u]);
    hot_step_aligned_vh0_0 = vec4<f16>(V_hot[row0 + 0u], V_hot[row0 + 1u], V_hot[row0 + 2u], V_hot[row0 + 3u]);
    hot_step_aligned_vh0_1 = vec4<f16>(V_hot[row0 + 4u], V_hot[row0 + 5u], V_hot[row0 + 6u], V_hot[row0 + 7u]);
    hot_step_aligned_kh1_0 = vec4<f16>(K_hot[row1 + 0u], K_hot[row1 + 1u], K_hot[row1 + 2u], K_hot[row1 + 3u]);
    hot_step_aligned_kh1_1 = vec4<f16>(K_hot[row1 + 4u], K_hot[row1 + 5u], K_hot[row1 + 6u], K_hot[row1 + 7u]);
    hot_step_aligned_vh1_0 = vec4<f16>(V_hot[row1 + 0u], V_hot[row1 + 1u], V_hot[row1 + 2u], V_hot[row1 + 3u]);
    hot_step_aligned_vh1_1 = vec4<f16>(V_hot[row1 + 4u], V_hot[row1 + 5u], V_hot[row1 + 6u], V_hot[row1 + 7u]);
}

// One step over the hot tier (head_dim a multiple of DIMS_PER_LANE): slot s scores key first + s * num_groups + key_group, s < 2
fn hot_step_aligned(first: u32, width: u32) {
    // This step's rows were loaded by the previous step (or before the loop); the next step's
    // are requested now, so that their loads are in flight while this step computes
    let key0 = first + 0u * num_groups + key_group;
    let live0 = in_group && key0 < hot_end;
    let key1 = first + 1u * num_groups + key_group;
    let live1 = in_group && key1 < hot_end;

    let kh0_0 = hot_step_aligned_kh0_0;
    let kh0_1 = hot_step_aligned_kh0_1;
    let vh0_0 = select(vec4<f16>(), hot_step_aligned_vh0_0, live0);
    let vh0_1 = select(vec4<f16>(), hot_step_aligned_vh0_1, live0);
    let kh1_0 = hot_step_aligned_kh1_0;
    let kh1_1 = hot_step_aligned_kh1_1;
    let vh1_0 = select(vec4<f16>(), hot_step_aligned_vh1_0, live1);
    let vh1_1 = select(vec4<f16>(), hot_step_aligned_vh1_1, live1);
    hot_step_aligned_fetch(first + 2u * num_groups);
    // Each slice converted (unpacked) once, for all 4 heads
    let kf0_0 = vec4<f32>(kh0_0);
    let kf0_1 = vec4<f32>(kh0_1);
    let vf0_0 = vec4<f32>(vh0_0);
    let vf0_1 = vec4<f32>(vh0_1);
    let kf1_0 = vec4<f32>(kh1_0);
    let kf1_1 = vec4<f32>(kh1_1);
    let vf1_0 = vec4<f32>(vh1_0);
    let vf1_1 = vec4<f32>(vh1_1);
    let part0_h0 = dot(q_0_h0, kf0_0) + dot(q_1_h0, kf0_1);
    let part0_h1 = dot(q_0_h1, kf0_0) + dot(q_1_h1, kf0_1);
    let part0_h2 = dot(q_0_h2, kf0_0) + dot(q_1_h2, kf0_1);
    let part0_h3 = dot(q_0_h3, kf0_0) + dot(q_1_h3, kf0_1);
    let part1_h0 = dot(q_0_h0, kf1_0) + dot(q_1_h0, kf1_1);
    let part1_h1 = dot(q_0_h1, kf1_0) + dot(q_1_h1, kf1_1);
    let part1_h2 = dot(q_0_h2, kf1_0) + dot(q_1_h2, kf1_1);
    let part1_h3 = dot(q_0_h3, kf1_0) + dot(q_1_h3, kf1_1);
    let dots0 = group_reduce(vec2<f32>(part0_h0, part0_h1), width);
    let dots2 = group_reduce(vec2<f32>(part0_h2, part0_h3), width);
    let dots4 = group_reduce(vec2<f32>(part1_h0, part1_h1), width);
    let dots6 = group_reduce(vec2<f32>(part1_h2, part1_h3), width);
    let abs0 = u.hot_start + key0;
    let open0 = abs0 >= open_first && abs0 <= open_last;
    let abs1 = u.hot_start + key1;
    let open1 = abs1 >= open_first && abs1 <= open_last;
    let score0_h0 = finish_score(dots0[0], open0);
    let score0_h1 = finish_score(dots0[1], open0);
    let score0_h2 = finish_score(dots2[0], open0);
    let score0_h3 = finish_score(dots2[1], open0);
    let score1_h0 = finish_score(dots4[0], open1);
    let score1_h1 = finish_score(dots4[1], open1);
    let score1_h2 = finish_score(dots6[0], open1);
    let score1_h3 = finish_score(dots6[1], open1);

    // Online softmax of head 0: fold the step's keys into the group's running max, sum and accumulator
    var m_h0 = run_max_h0;
    if (live0) { m_h0 = max(m_h0, score0_h0); }
    if (live1) { m_h0 = max(m_h0, score1_h0); }
    let correction_h0 = exp(run_max_h0 - m_h0);
    let w0_h0 = select(0.0, exp(score0_h0 - m_h0), live0);
    let w1_h0 = select(0.0, exp(score1_h0 - m_h0), live1);
    run_sum_h0 = run_sum_h0 * correction_h0 + w0_h0 + w1_h0;
    acc_0_h0 = acc_0_h0 * correction_h0 + w0_h0 * vf0_0 + w1_h0 * vf1_0;
    acc_1_h0 = acc_1_h0 * correction_h0 + w0_h0 * vf0_1 + w1_h0 * vf1_1;
    run_max_h0 = m_h0;

    // Online softmax of head 1: fold the step's keys into the group's running max, sum and accumulator
    var m_h1 = run_max_h1;
    if (live0) { m_h1 = max(m_h1, score0_h1); }
    if (live1) { m_h1 = max(m_h1, score1_h1); }
    let correction_h1 = exp(run_max_h1 - m_h1);
    let w0_h1 = select(0.0, exp(score0_h1 - m_h1), live0);
    let w1_h1 = select(0.0, exp(score1_h1 - m_h1), live1);
    run_sum_h1 = run_sum_h1 * correction_h1 + w0_h1 + w1_h1;
    acc_0_h1 = acc_0_h1 * correction_h1 + w0_h1 * vf0_0 + w1_h1 * vf1_0;
    acc_1_h1 = acc_1_h1 * correction_h1 + w0_h1 * vf0_1 + w1_h1 * vf1_1;
    run_max_h1 = m_h1;

    // Online softmax of head 2: fold the step's keys into the group's running max, sum and accumulator
    var m_h2 = run_max_h2;
    if (live0) { m_h2 = max(m_h2, score0_h2); }
    if (live1) { m_h2 = max(m_h2, score1_h2); }
    let correction_h2 = exp(run_max_h2 - m_h2);
    let w0_h2 = select(0.0, exp(score0_h2 - m_h2), live0);
    let w1_h2 = select(0.0, exp(score1_h2 - m_h2), live1);
    run_sum_h2 = run_sum_h2 * correction_h2 + w0_h2 + w1_h2;
    acc_0_h2 = acc_0_h2 * correction_h2 + w0_h2 * vf0_0 + w1_h2 * vf1_0;
    acc_1_h2 = acc_1_h2 * correction_h2 + w0_h2 * vf0_1 + w1_h2 * vf1_1;
    run_max_h2 = m_h2;

    // Online softmax of head 3: fold the step's keys into the group's running max, sum and accumulator
    var m_h3 = run_max_h3;
    if (live0) { m_h3 = max(m_h3, score0_h3); }
    if (live1) { m_h3 = max(m_h3, score1_h3); }
    let correction_h3 = exp(run_max_h3 - m_h3);
    let w0_h3 = select(0.0, exp(score0_h3 - m_h3), live0);
    let w1_h3 = select(0.0, exp(score1_h3 - m_h3), live1);
    run_sum_h3 = run_sum_h3 * correction_h3 + w0_h3 + w1_h3;
    acc_0_h3 = acc_0_h3 * correction_h3 + w0_h3 * vf0_0 + w1_h3 * vf1_0;
    acc_1_h3 = acc_1_h3 * correction_h3 + w0_h3 * vf0_1 + w1_h3 * vf1_1;
    run_max_h3 = m_h3;
}

// One step over the cold tier: slot s scores key first + s * num_groups + key_group, s < 2
fn cold_step_capped(first: u32, width: u32) {
    // This step's rows were loaded by the previous step (or before the loop); the next step's
    // are requested now, so that their loads are in flight while this step computes
    let key0 = first + 0u * num_groups + key_group;
    let live0 = in_group && key0 < cold_end;
    let key1 = first + 1u * num_groups + key_group;
    let live1 = in_group && key1 < cold_end;

    let ks0 = cold_step_ks0;
    let vs0 = select(0.0, cold_step_vs0, live0);
    let kw0_0 = cold_step_kw0_0;
    let vw0_0 = cold_step_vw0_0;
    let ks1 = cold_step_ks1;
    let vs1 = select(0.0, cold_step_vs1, live1);
    let kw1_0 = cold_step_kw1_0;
    let vw1_0 = cold_step_vw1_0;
    cold_step_fetch(first + 2u * num_groups);
    // Each slice converted (unpacked, V scaled) once, for all 4 heads
    let kf0_0 = unpack_quant_0(kw0_0);
    let kf0_1 = unpack_quant_4(kw0_0);
    let vf0_0 = unpack_quant_0(vw0_0) * vs0;
    let vf0_1 = unpack_quant_4(vw0_0) * vs0;
    let kf1_0 = unpack_quant_0(kw1_0);
    let kf1_1 = unpack_quant_4(kw1_0);
    let vf1_0 = unpack_quant_0(vw1_0) * vs1;
    let vf1_1 = unpack_quant_4(vw1_0) * vs1;
    let part0_h0 = (dot(q_0_h0, kf0_0) + dot(q_1_h0, kf0_1)) * ks0;
    let part0_h1 = (dot(q_0_h1, kf0_0) + dot(q_1_h1, kf0_1)) * ks0;
    let part0_h2 = (dot(q_0_h2, kf0_0) + dot(q_1_h2, kf0_1)) * ks0;
    let part0_h3 = (dot(q_0_h3, kf0_0) + dot(q_1_h3, kf0_1)) * ks0;
    let part1_h0 = (dot(q_0_h0, kf1_0) + dot(q_1_h0, kf1_1)) * ks1;
    let part1_h1 = (dot(q_0_h1, kf1_0) + dot(q_1_h1, kf1_1)) * ks1;
    let part1_h2 = (dot(q_0_h2, kf1_0) + dot(q_1_h2, kf1_1)) * ks1;
    let part1_h3 = (dot(q_0_h3, kf1_0) + dot(q_1_h3, kf1_1)) * ks1;
    let dots0 = group_reduce(vec2<f32>(part0_h0, part0_h1), width);
    let dots2 = group_reduce(vec2<f32>(part0_h2, part0_h3), width);
    let dots4 = group_reduce(vec2<f32>(part1_h0, part1_h1), width);
    let dots6 = group_reduce(vec2<f32>(part1_h2, part1_h3), width);
    let abs0 = key0;
    let open0 = abs0 >= open_first && abs0 <= open_last;
    let abs1 = key1;
    let open1 = abs1 >= open_first && abs1 <= open_last;
    let score0_h0 = finish_score_capped(dots0[0], open0);
    let score0_h1 = finish_score_capped(dots0[1], open0);
    let score0_h2 = finish_score_capped(dots2[0], open0);
    let score0_h3 = finish_score_capped(dots2[1], open0);
    let score1_h0 = finish_score_capped(dots4[0], open1);
    let score1_h1 = finish_score_capped(dots4[1], open1);
    let score1_h2 = finish_score_capped(dots6[0], open1);
    let score1_h3 = finish_score_capped(dots6[1], open1);

    // Online softmax of head 0: fold the step's keys into the group's running max, sum and accumulator
    var m_h0 = run_max_h0;
    if (live0) { m_h0 = max(m_h0, score0_h0); }
    if (live1) { m_h0 = max(m_h0, score1_h0); }
    let correction_h0 = exp(run_max_h0 - m_h0);
    let w0_h0 = select(0.0, exp(score0_h0 - m_h0), live0);
    let w1_h0 = select(0.0, exp(score1_h0 - m_h0), live1);
    run_sum_h0 = run_sum_h0 * correction_h0 + w0_h0 + w1_h0;
    acc_0_h0 = acc_0_h0 * correction_h0 + w0_h0 * vf0_0 + w1_h0 * vf1_0;
    acc_1_h0 = acc_1_h0 * correction_h0 + w0_h0 * vf0_1 + w1_h0 * vf1_1;
    run_max_h0 = m_h0;

    // Online softmax of head 1: fold the step's keys into the group's running max, sum and accumulator
    var m_h1 = run_max_h1;
    if (live0) { m_h1 = max(m_h1, score0_h1); }
    if (live1) { m_h1 = max(m_h1, score1_h1); }
    let correction_h1 = exp(run_max_h1 - m_h1);
    let w0_h1 = select(0.0, exp(score0_h1 - m_h1), live0);
    let w1_h1 = select(0.0, exp(score1_h1 - m_h1), live1);
    run_sum_h1 = run_sum_h1 * correction_h1 + w0_h1 + w1_h1;
    acc_0_h1 = acc_0_h1 * correction_h1 + w0_h1 * vf0_0 + w1_h1 * vf1_0;
    acc_1_h1 = acc_1_h1 * correction_h1 + w0_h1 * vf0_1 + w1_h1 * vf1_1;
    run_max_h1 = m_h1;

    // Online softmax of head 2: fold the step's keys into the group's running max, sum and accumulator
    var m_h2 = run_max_h2;
    if (live0) { m_h2 = max(m_h2, score0_h2); }
    if (live1) { m_h2 = max(m_h2, score1_h2); }
    let correction_h2 = exp(run_max_h2 - m_h2);
    let w0_h2 = select(0.0, exp(score0_h2 - m_h2), live0);
    let w1_h2 = select(0.0, exp(score1_h2 - m_h2), live1);
    run_sum_h2 = run_sum_h2 * correction_h2 + w0_h2 + w1_h2;
    acc_0_h2 = acc_0_h2 * correction_h2 + w0_h2 * vf0_0 + w1_h2 * vf1_0;
    acc_1_h2 = acc_1_h2 * correction_h2 + w0_h2 * vf0_1 + w1_h2 * vf1_1;
    run_max_h2 = m_h2;

    // Online softmax of head 3: fold the step's keys into the group's running max, sum and accumulator
    var m_h3 = run_max_h3;
    if (live0) { m_h3 = max(m_h3, score0_h3); }
    if (live1) { m_h3 = max(m_h3, score1_h3); }
    let correction_h3 = exp(run_max_h3 - m_h3);
    let w0_h3 = select(0.0, exp(score0_h3 - m_h3), live0);
    let w1_h3 = select(0.0, exp(score1_h3 - m_h3), live1);
    run_sum_h3 = run_sum_h3 * correction_h3 + w0_h3 + w1_h3;
    acc_0_h3 = acc_0_h3 * correction_h3 + w0_h3 * vf0_0 + w1_h3 * vf1_0;
    acc_1_h3 = acc_1_h3 * correction_h3 + w0_h3 * vf0_1 + w1_h3 * vf1_1;
    run_max_h3 = m_h3;
}

// One step over the hot tier: slot s scores key first + s * num_groups + key_group, s < 2
fn hot_step_capped(first: u32, width: u32) {
    // This step's rows were loaded by the previous step (or before the loop); the next step's
    // are requested now, so that their loads are in flight while this step computes
    let key0 = first + 0u * num_groups + key_group;
    let live0 = in_group && key0 < hot_end;
    let key1 = first + 1u * num_groups + key_group;
    let live1 = in_group && key1 < hot_end;

    let kh0_0 = hot_step_kh0_0;
    let kh0_1 = hot_step_kh0_1;
    let vh0_0 = select(vec4<f16>(), hot_step_vh0_0, live0);
    let vh0_1 = select(vec4<f16>(), hot_step_vh0_1, live0);
    let kh1_0 = hot_step_kh1_0;
    let kh1_1 = hot_step_kh1_1;
    let vh1_0 = select(vec4<f16>(), hot_step_vh1_0, live1);
    let vh1_1 = select(vec4<f16>(), hot_step_vh1_1, live1);
    hot_step_fetch(first + 2u * num_groups);
    // Each slice converted (unpacked) once, for all 4 heads
    let kf0_0 = vec4<f32>(kh0_0);
    let kf0_1 = vec4<f32>(kh0_1);
    let vf0_0 = vec4<f32>(vh0_0);
    let vf0_1 = vec4<f32>(vh0_1);
    let kf1_0 = vec4<f32>(kh1_0);
    let kf1_1 = vec4<f32>(kh1_1);
    let vf1_0 = vec4<f32>(vh1_0);
    let vf1_1 = vec4<f32>(vh1_1);
    let part0_h0 = dot(q_0_h0, kf0_0) + dot(q_1_h0, kf0_1);
    let part0_h1 = dot(q_0_h1, kf0_0) + dot(q_1_h1, kf0_1);
    let part0_h2 = dot(q_0_h2, kf0_0) + dot(q_1_h2, kf0_1);
    let part0_h3 = dot(q_0_h3, kf0_0) + dot(q_1_h3, kf0_1);
    let part1_h0 = dot(q_0_h0, kf1_0) + dot(q_1_h0, kf1_1);
    let part1_h1 = dot(q_0_h1, kf1_0) + dot(q_1_h1, kf1_1);
    let part1_h2 = dot(q_0_h2, kf1_0) + dot(q_1_h2, kf1_1);
    let part1_h3 = dot(q_0_h3, kf1_0) + dot(q_1_h3, kf1_1);
    let dots0 = group_reduce(vec2<f32>(part0_h0, part0_h1), width);
    let dots2 = group_reduce(vec2<f32>(part0_h2, part0_h3), width);
    let dots4 = group_reduce(vec2<f32>(part1_h0, part1_h1), width);
    let dots6 = group_reduce(vec2<f32>(part1_h2, part1_h3), width);
    let abs0 = u.hot_start + key0;
    let open0 = abs0 >= open_first && abs0 <= open_last;
    let abs1 = u.hot_start + key1;
    let open1 = abs1 >= open_first && abs1 <= open_last;
    let score0_h0 = finish_score_capped(dots0[0], open0);
    let score0_h1 = finish_score_capped(dots0[1], open0);
    let score0_h2 = finish_score_capped(dots2[0], open0);
    let score0_h3 = finish_score_capped(dots2[1], open0);
    let score1_h0 = finish_score_capped(dots4[0], open1);
    let score1_h1 = finish_score_capped(dots4[1], open1);
    let score1_h2 = finish_score_capped(dots6[0], open1);
    let score1_h3 = finish_score_capped(dots6[1], open1);

    // Online softmax of head 0: fold the step's keys into the group's running max, sum and accumulator
    var m_h0 = run_max_h0;
    if (live0) { m_h0 = max(m_h0, score0_h0); }
    if (live1) { m_h0 = max(m_h0, score1_h0); }
    let correction_h0 = exp(run_max_h0 - m_h0);
    let w0_h0 = select(0.0, exp(score0_h0 - m_h0), live0);
    let w1_h0 = select(0.0, exp(score1_h0 - m_h0), live1);
    run_sum_h0 = run_sum_h0 * correction_h0 + w0_h0 + w1_h0;
    acc_0_h0 = acc_0_h0 * correction_h0 + w0_h0 * vf0_0 + w1_h0 * vf1_0;
    acc_1_h0 = acc_1_h0 * correction_h0 + w0_h0 * vf0_1 + w1_h0 * vf1_1;
    run_max_h0 = m_h0;

    // Online softmax of head 1: fold the step's keys into the group's running max, sum and accumulator
    var m_h1 = run_max_h1;
    if (live0) { m_h1 = max(m_h1, score0_h1); }
    if (live1) { m_h1 = max(m_h1, score1_h1); }
    let correction_h1 = exp(run_max_h1 - m_h1);
    let w0_h1 = select(0.0, exp(score0_h1 - m_h1), live0);
    let w1_h1 = select(0.0, exp(score1_h1 - m_h1), live1);
    run_sum_h1 = run_sum_h1 * correction_h1 + w0_h1 + w1_h1;
    acc_0_h1 = acc_0_h1 * correction_h1 + w0_h1 * vf0_0 + w1_h1 * vf1_0;
    acc_1_h1 = acc_1_h1 * correction_h1 + w0_h1 * vf0_1 + w1_h1 * vf1_1;
    run_max_h1 = m_h1;

    // Online softmax of head 2: fold the step's keys into the group's running max, sum and accumulator
    var m_h2 = run_max_h2;
    if (live0) { m_h2 = max(m_h2, score0_h2); }
    if (live1) { m_h2 = max(m_h2, score1_h2); }
    let correction_h2 = exp(run_max_h2 - m_h2);
    let w0_h2 = select(0.0, exp(score0_h2 - m_h2), live0);
    let w1_h2 = select(0.0, exp(score1_h2 - m_h2), live1);
    run_sum_h2 = run_sum_h2 * correction_h2 + w0_h2 + w1_h2;
    acc_0_h2 = acc_0_h2 * correction_h2 + w0_h2 * vf0_0 + w1_h2 * vf1_0;
    acc_1_h2 = acc_1_h2 * correction_h2 + w0_h2 * vf0_1 + w1_h2 * vf1_1;
    run_max_h2 = m_h2;

    // Online softmax of head 3: fold the step's keys into the group's running max, sum and accumulator
    var m_h3 = run_max_h3;
    if (live0) { m_h3 = max(m_h3, score0_h3); }
    if (live1) { m_h3 = max(m_h3, score1_h3); }
    let correction_h3 = exp(run_max_h3 - m_h3);
    let w0_h3 = select(0.0, exp(score0_h3 - m_h3), live0);
    let w1_h3 = select(0.0, exp(score1_h3 - m_h3), live1);
    run_sum_h3 = run_sum_h3 * correction_h3 + w0_h3 + w1_h3;
    acc_0_h3 = acc_0_h3 * correction_h3 + w0_h3 * vf0_0 + w1_h3 * vf1_0;
    acc_1_h3 = acc_1_h3 * correction_h3 + w0_h3 * vf0_1 + w1_h3 * vf1_1;
    run_max_h3 = m_h3;
}

// One step over the hot tier (head_dim a multiple of DIMS_PER_LANE): slot s scores key first + s * num_groups + key_group, s < 2
fn hot_step_aligned_capped(first: u32, width: u32) {
    // This step's rows were loaded by the previous step (or before the loop); the next step's
    // are requested now, so that their loads are in flight while this step computes
    let key0 = first + 0u * num_groups + key_group;
    let live0 = in_group && key0 < hot_end;
    let key1 = first + 1u * num_groups + key_group;
    let live1 = in_group && key1 < hot_end;

    let kh0_0 = hot_step_aligned_kh0_0;
    let kh0_1 = hot_step_aligned_kh0_1;
    let vh0_0 = select(vec4<f16>(), hot_step_aligned_vh0_0, live0);
    let vh0_1 = select(vec4<f16>(), hot_step_aligned_vh0_1, live0);
    let kh1_0 = hot_step_aligned_kh1_0;
    let kh1_1 = hot_step_aligned_kh1_1;
    let vh1_0 = select(vec4<f16>(), hot_step_aligned_vh1_0, live1);
    let vh1_1 = select(vec4<f16>(), hot_step_aligned_vh1_1, live1);
    hot_step_aligned_fetch(first + 2u * num_groups);
    // Each slice converted (unpacked) once, for all 4 heads
    let kf0_0 = vec4<f32>(kh0_0);
    let kf0_1 = vec4<f32>(kh0_1);
    let vf0_0 = vec4<f32>(vh0_0);
    let vf0_1 = vec4<f32>(vh0_1);
    let kf1_0 = vec4<f32>(kh1_0);
    let kf1_1 = vec4<f32>(kh1_1);
    let vf1_0 = vec4<f32>(vh1_0);
    let vf1_1 = vec4<f32>(vh1_1);
    let part0_h0 = dot(q_0_h0, kf0_0) + dot(q_1_h0, kf0_1);
    let part0_h1 = dot(q_0_h1, kf0_0) + dot(q_1_h1, kf0_1);
    let part0_h2 = dot(q_0_h2, kf0_0) + dot(q_1_h2, kf0_1);
    let part0_h3 = dot(q_0_h3, kf0_0) + dot(q_1_h3, kf0_1);
    let part1_h0 = dot(q_0_h0, kf1_0) + dot(q_1_h0, kf1_1);
    let part1_h1 = dot(q_0_h1, kf1_0) + dot(q_1_h1, kf1_1);
    let part1_h2 = dot(q_0_h2, kf1_0) + dot(q_1_h2, kf1_1);
    let part1_h3 = dot(q_0_h3, kf1_0) + dot(q_1_h3, kf1_1);
    let dots0 = group_reduce(vec2<f32>(part0_h0, part0_h1), width);
    let dots2 = group_reduce(vec2<f32>(part0_h2, part0_h3), width);
    let dots4 = group_reduce(vec2<f32>(part1_h0, part1_h1), width);
    let dots6 = group_reduce(vec2<f32>(part1_h2, part1_h3), width);
    let abs0 = u.hot_start + key0;
    let open0 = abs0 >= open_first && abs0 <= open_last;
    let abs1 = u.hot_start + key1;
    let open1 = abs1 >= open_first && abs1 <= open_last;
    let score0_h0 = finish_score_capped(dots0[0], open0);
    let score0_h1 = finish_score_capped(dots0[1], open0);
    let score0_h2 = finish_score_capped(dots2[0], open0);
    let score0_h3 = finish_score_capped(dots2[1], open0);
    let score1_h0 = finish_score_capped(dots4[0], open1);
    let score1_h1 = finish_score_capped(dots4[1], open1);
    let score1_h2 = finish_score_capped(dots6[0], open1);
    let score1_h3 = finish_score_capped(dots6[1], open1);

    // Online softmax of head 0: fold the step's keys into the group's running max, sum and accumulator
    var m_h0 = run_max_h0;
    if (live0) { m_h0 = max(m_h0, score0_h0); }
    if (live1) { m_h0 = max(m_h0, score1_h0); }
    let correction_h0 = exp(run_max_h0 - m_h0);
    let w0_h0 = select(0.0, exp(score0_h0 - m_h0), live0);
    let w1_h0 = select(0.0, exp(score1_h0 - m_h0), live1);
    run_sum_h0 = run_sum_h0 * correction_h0 + w0_h0 + w1_h0;
    acc_0_h0 = acc_0_h0 * correction_h0 + w0_h0 * vf0_0 + w1_h0 * vf1_0;
    acc_1_h0 = acc_1_h0 * correction_h0 + w0_h0 * vf0_1 + w1_h0 * vf1_1;
    run_max_h0 = m_h0;

    // Online softmax of head 1: fold the step's keys into the group's running max, sum and accumulator
    var m_h1 = run_max_h1;
    if (live0) { m_h1 = max(m_h1, score0_h1); }
    if (live1) { m_h1 = max(m_h1, score1_h1); }
    let correction_h1 = exp(run_max_h1 - m_h1);
    let w0_h1 = select(0.0, exp(score0_h1 - m_h1), live0);
    let w1_h1 = select(0.0, exp(score1_h1 - m_h1), live1);
    run_sum_h1 = run_sum_h1 * correction_h1 + w0_h1 + w1_h1;
    acc_0_h1 = acc_0_h1 * correction_h1 + w0_h1 * vf0_0 + w1_h1 * vf1_0;
    acc_1_h1 = acc_1_h1 * correction_h1 + w0_h1 * vf0_1 + w1_h1 * vf1_1;
    run_max_h1 = m_h1;

    // Online softmax of head 2: fold the step's keys into the group's running max, sum and accumulator
    var m_h2 = run_max_h2;
    if (live0) { m_h2 = max(m_h2, score0_h2); }
    if (live1) { m_h2 = max(m_h2, score1_h2); }
    let correction_h2 = exp(run_max_h2 - m_h2);
    let w0_h2 = select(0.0, exp(score0_h2 - m_h2), live0);
    let w1_h2 = select(0.0, exp(score1_h2 - m_h2), live1);
    run_sum_h2 = run_sum_h2 * correction_h2 + w0_h2 + w1_h2;
    acc_0_h2 = acc_0_h2 * correction_h2 + w0_h2 * vf0_0 + w1_h2 * vf1_0;
    acc_1_h2 = acc_1_h2 * correction_h2 + w0_h2 * vf0_1 + w1_h2 * vf1_1;
    run_max_h2 = m_h2;

    // Online softmax of head 3: fold the step's keys into the group's running max, sum and accumulator
    var m_h3 = run_max_h3;
    if (live0) { m_h3 = max(m_h3, score0_h3); }
    if (live1) { m_h3 = max(m_h3, score1_h3); }
    let correction_h3 = exp(run_max_h3 - m_h3);
    let w0_h3 = select(0.0, exp(score0_h3 - m_h3), live0);
    let w1_h3 = select(0.0, exp(score1_h3 - m_h3), live1);
    run_sum_h3 = run_sum_h3 * correction_h3 + w0_h3 + w1_h3;
    acc_0_h3 = acc_0_h3 * correction_h3 + w0_h3 * vf0_0 + w1_h3 * vf1_0;
    acc_1_h3 = acc_1_h3 * correction_h3 + w0_h3 * vf0_1 + w1_h3 * vf1_1;
    run_max_h3 = m_h3;
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn main(
    @builtin(local_invocation_id) local_id: vec3<u32>,
    @builtin(workgroup_id) workgroup_id: vec3<u32>,
    @builtin(subgroup_size) subgroup_size: u32,
    @builtin(subgroup_invocation_id) sg_lane: u32,
) {
    // Workgroup -> (split, KV head, chunk of the KV head's query heads); a chunk past the group's
    // end serves its last head again and stores nothing for it
    let group = u.num_heads / u.num_kv_heads;
    let chunks_per_kv = (group + HEADS_PER_WORKGROUP - 1u) / HEADS_PER_WORKGROUP;
    let split = workgroup_id.x / (u.num_kv_heads * chunks_per_kv);
    let rest = workgroup_id.x % (u.num_kv_heads * chunks_per_kv);
    let first_in_group = (rest % chunks_per_kv) * HEADS_PER_WORKGROUP;
    let first_head = (rest / chunks_per_kv) * group + first_in_group;
    let head_live_h0 = first_in_group + 0u < group;
    let head_idx_h0 = first_head + min(0u, group - 1u - first_in_group);
    let head_live_h1 = first_in_group + 1u < group;
    let head_idx_h1 = first_head + min(1u, group - 1u - first_in_group);
    let head_live_h2 = first_in_group + 2u < group;
    let head_idx_h2 = first_head + min(2u, group - 1u - first_in_group);
    let head_live_h3 = first_in_group + 3u < group;
    let head_idx_h3 = first_head + min(3u, group - 1u - first_in_group);
    let head_dim = u.head_dim;
    let total_len = u.cold_len + u.hot_len;
    // This split's keys [first_key, last_key) of the cold-then-hot sequence, as tier ranges
    if (split >= used_splits()) {
        return;
    }
    let first_key = split * split_keys();
    let last_key = min(first_key + split_keys(), total_len);
    let cold_first = min(first_key, u.cold_len);
    let cold_last = min(last_key, u.cold_len);
    let hot_first = max(first_key, u.cold_len) - u.cold_len;
    let hot_last = max(last_key, u.cold_len) - u.cold_len;
    cold_end = cold_last;
    hot_end = hot_last;

    // Lanes per key: the smallest power of two covering head_dim at DIMS_PER_LANE each
    var lanes_per_key: u32 = 1u;
    while (lanes_per_key * DIMS_PER_LANE < head_dim) {
        lanes_per_key = lanes_per_key * 2u;
    }
    if (WORKGROUP_SIZE > MAX_WORKGROUP_SIZE || head_dim > MAX_HEAD_DIM ||
        lanes_per_key > WORKGROUP_SIZE || total_len > MAX_KV_LEN) {
        return;
    }

    tid = local_id.x;
    lanes = lanes_per_key;
    num_groups = WORKGROUP_SIZE / lanes_per_key;
    key_group = tid / lanes;
    group_lane = tid - key_group * lanes;
    in_group = key_group < num_groups;
    dim0 = group_lane * DIMS_PER_LANE;
    lane_live = in_group && dim0 < head_dim;
    kv_head = get_kv_head_idx(head_idx_h0);
    exchange_half = 0u;
    let open = open_keys();
    open_first = open.x;
    open_last = open.y;
    hot_base = hot_ring_base();
    run_max_h0 = MASKED_SCORE;
    run_sum_h0 = 0.0;
    let q_base_h0 = head_idx_h0 * head_dim + dim0;
    acc_0_h0 = vec4<f32>(0.0);
    q_0_h0 = vec4<f32>(0.0);
    acc_1_h0 = vec4<f32>(0.0);
    q_1_h0 = vec4<f32>(0.0);
    run_max_h1 = MASKED_SCORE;
    run_sum_h1 = 0.0;
    let q_base_h1 = head_idx_h1 * head_dim + dim0;
    acc_0_h1 = vec4<f32>(0.0);
    q_0_h1 = vec4<f32>(0.0);
    acc_1_h1 = vec4<f32>(0.0);
    q_1_h1 = vec4<f32>(0.0);
    run_max_h2 = MASKED_SCORE;
    run_sum_h2 = 0.0;
    let q_base_h2 = head_idx_h2 * head_dim + dim0;
    acc_0_h2 = vec4<f32>(0.0);
    q_0_h2 = vec4<f32>(0.0);
    acc_1_h2 = vec4<f32>(0.0);
    q_1_h2 = vec4<f32>(0.0);
    run_max_h3 = MASKED_SCORE;
    run_sum_h3 = 0.0;
    let q_base_h3 = head_idx_h3 * head_dim + dim0;
    acc_0_h3 = vec4<f32>(0.0);
    q_0_h3 = vec4<f32>(0.0);
    acc_1_h3 = vec4<f32>(0.0);
    q_1_h3 = vec4<f32>(0.0);
    if (lane_live) {
        if (dim0 + 0u < head_dim) { q_0_h0[0] = Q[q_base_h0 + 0u]; }
        if (dim0 + 1u < head_dim) { q_0_h0[1] = Q[q_base_h0 + 1u]; }
        if (dim0 + 2u < head_dim) { q_0_h0[2] = Q[q_base_h0 + 2u]; }
        if (dim0 + 3u < head_dim) { q_0_h0[3] = Q[q_base_h0 + 3u]; }
        if (dim0 + 4u < head_dim) { q_1_h0[0] = Q[q_base_h0 + 4u]; }
        if (dim0 + 5u < head_dim) { q_1_h0[1] = Q[q_base_h0 + 5u]; }
        if (dim0 + 6u < head_dim) { q_1_h0[2] = Q[q_base_h0 + 6u]; }
        if (dim0 + 7u < head_dim) { q_1_h0[3] = Q[q_base_h0 + 7u]; }
        if (dim0 + 0u < head_dim) { q_0_h1[0] = Q[q_base_h1 + 0u]; }
        if (dim0 + 1u < head_dim) { q_0_h1[1] = Q[q_base_h1 + 1u]; }
        if (dim0 + 2u < head_dim) { q_0_h1[2] = Q[q_base_h1 + 2u]; }
        if (dim0 + 3u < head_dim) { q_0_h1[3] = Q[q_base_h1 + 3u]; }
        if (dim0 + 4u < head_dim) { q_1_h1[0] = Q[q_base_h1 + 4u]; }
        if (dim0 + 5u < head_dim) { q_1_h1[1] = Q[q_base_h1 + 5u]; }
        if (dim0 + 6u < head_dim) { q_1_h1[2] = Q[q_base_h1 + 6u]; }
        if (dim0 + 7u < head_dim) { q_1_h1[3] = Q[q_base_h1 + 7u]; }
        if (dim0 + 0u < head_dim) { q_0_h2[0] = Q[q_base_h2 + 0u]; }
        if (dim0 + 1u < head_dim) { q_0_h2[1] = Q[q_base_h2 + 1u]; }
        if (dim0 + 2u < head_dim) { q_0_h2[2] = Q[q_base_h2 + 2u]; }
        if (dim0 + 3u < head_dim) { q_0_h2[3] = Q[q_base_h2 + 3u]; }
        if (dim0 + 4u < head_dim) { q_1_h2[0] = Q[q_base_h2 + 4u]; }
        if (dim0 + 5u < head_dim) { q_1_h2[1] = Q[q_base_h2 + 5u]; }
        if (dim0 + 6u < head_dim) { q_1_h2[2] = Q[q_base_h2 + 6u]; }
        if (dim0 + 7u < head_dim) { q_1_h2[3] = Q[q_base_h2 + 7u]; }
        if (dim0 + 0u < head_dim) { q_0_h3[0] = Q[q_base_h3 + 0u]; }
        if (dim0 + 1u < head_dim) { q_0_h3[1] = Q[q_base_h3 + 1u]; }
        if (dim0 + 2u < head_dim) { q_0_h3[2] = Q[q_base_h3 + 2u]; }
        if (dim0 + 3u < head_dim) { q_0_h3[3] = Q[q_base_h3 + 3u]; }
        if (dim0 + 4u < head_dim) { q_1_h3[0] = Q[q_base_h3 + 4u]; }
        if (dim0 + 5u < head_dim) { q_1_h3[1] = Q[q_base_h3 + 5u]; }
        if (dim0 + 6u < head_dim) { q_1_h3[2] = Q[q_base_h3 + 6u]; }
        if (dim0 + 7u < head_dim) { q_1_h3[3] = Q[q_base_h3 + 7u]; }
    }

    // Cold tier, then hot tier: every group steps the same number of times (barriers inside)
    let groups = WORKGROUP_SIZE / lanes_per_key;
    let keys_per_step = groups * 2u;
    // Lane groups reduce by subgroup shuffles when a group fits in a subgroup (0: workgroup memory)
    let shuffle_width = select(0u, lanes_per_key, lanes_per_key <= subgroup_size);
    // What is stored where the subgroups are laid out otherwise than the shuffles need
    let poison = bitcast<f32>(0x7fc00000u | (subgroup_size & 0u));
    // The key loops twice, with and without the softcap, so that no score branches on it
    if (u.attn_softcap > 0.0) {
        if (head_dim % DIMS_PER_LANE == 0u) {
            if (cold_first < cold_last) {
                cold_step_fetch(cold_first);
            }
            for (var first: u32 = cold_first; first < cold_last; first += keys_per_step) {
                cold_step_capped(first, shuffle_width);
            }
            if (hot_first < hot_last) {
                hot_step_aligned_fetch(hot_first);
            }
            for (var first: u32 = hot_first; first < hot_last; first += keys_per_step) {
                hot_step_aligned_capped(first, shuffle_width);
            }
        } else {
            if (cold_first < cold_last) {
                cold_step_fetch(cold_first);
            }
            for (var first: u32 = cold_first; first < cold_last; first += keys_per_step) {
                cold_step_capped(first, shuffle_width);
            }
            if (hot_first < hot_last) {
                hot_step_fetch(hot_first);
            }
            for (var first: u32 = hot_first; first < hot_last; first += keys_per_step) {
                hot_step_capped(first, shuffle_width);
            }
        }
    } else {
        if (head_dim % DIMS_PER_LANE == 0u) {
            if (cold_first < cold_last) {
                cold_step_fetch(cold_first);
            }
            for (var first: u32 = cold_first; first < cold_last; first += keys_per_step) {
                cold_step(first, shuffle_width);
            }
            if (hot_first < hot_last) {
                hot_step_aligned_fetch(hot_first);
            }
            for (var first: u32 = hot_first; first < hot_last; first += keys_per_step) {
                hot_step_aligned(first, shuffle_width);
            }
        } else {
            if (cold_first < cold_last) {
                cold_step_fetch(cold_first);
            }
            for (var first: u32 = cold_first; first < cold_last; first += keys_per_step) {
                cold_step(first, shuffle_width);
            }
            if (hot_first < hot_last) {
                hot_step_fetch(hot_first);
            }
            for (var first: u32 = hot_first; first < hot_last; first += keys_per_step) {
                hot_step(first, shuffle_width);
            }
        }
    }

    // The shuffles need each subgroup to be lanes 0 .. n - 1 holding tid = run_base + sg_lane, one
    // run_base a multiple of subgroup_size, n a multiple of lanes_per_key (so every lane group is
    // whole, in order) unless the run ends the workgroup (whose last, partial group is in no key
    // group), and n = subgroup_size where the workgroup is whole subgroups (the merge below takes
    // a subgroup's groups to be its block's). A subgroup laid out otherwise that holds a live
    // lane holds the representative of that lane's block (a subgroup that passes holds whole
    // blocks), which flags the row.
    let run_base = tid - sg_lane;
    let members = subgroupAdd(1u);
    let laid_out = subgroupAll(((members == subgroup_size) | (WORKGROUP_SIZE % subgroup_size != 0u)) &
        (sg_lane == tid % subgroup_size) & (sg_lane < members) &
        ((members % lanes_per_key == 0u) | (run_base + members == WORKGROUP_SIZE)) &
        (run_base == subgroupBroadcastFirst(run_base)));
    let misplaced = shuffle_width > 0u && !laid_out;
    // Merge the groups of each subgroup by xor shuffles (every group ends with the merged state)
    let by_subgroup = shuffle_width > 0u && WORKGROUP_SIZE % subgroup_size == 0u;
    if (by_subgroup) {
        for (var mask: u32 = lanes_per_key; mask < subgroup_size; mask = mask * 2u) {
            {  // head 0
            let other_max = subgroupShuffleXor(run_max_h0, mask);
            let other_sum = subgroupShuffleXor(run_sum_h0, mask);
            let m = max(run_max_h0, other_max);
            let mine = exp(run_max_h0 - m);
            let theirs = exp(other_max - m);
            run_sum_h0 = run_sum_h0 * mine + other_sum * theirs;
            acc_0_h0 = acc_0_h0 * mine + subgroupShuffleXor(acc_0_h0, mask) * theirs;
            acc_1_h0 = acc_1_h0 * mine + subgroupShuffleXor(acc_1_h0, mask) * theirs;
            run_max_h0 = m;
            }
            {  // head 1
            let other_max = subgroupShuffleXor(run_max_h1, mask);
            let other_sum = subgroupShuffleXor(run_sum_h1, mask);
            let m = max(run_max_h1, other_max);
            let mine = exp(run_max_h1 - m);
            let theirs = exp(other_max - m);
            run_sum_h1 = run_sum_h1 * mine + other_sum * theirs;
            acc_0_h1 = acc_0_h1 * mine + subgroupShuffleXor(acc_0_h1, mask) * theirs;
            acc_1_h1 = acc_1_h1 * mine + subgroupShuffleXor(acc_1_h1, mask) * theirs;
            run_max_h1 = m;
            }
            {  // head 2
            let other_max = subgroupShuffleXor(run_max_h2, mask);
            let other_sum = subgroupShuffleXor(run_sum_h2, mask);
            let m = max(run_max_h2, other_max);
            let mine = exp(run_max_h2 - m);
            let theirs = exp(other_max - m);
            run_sum_h2 = run_sum_h2 * mine + other_sum * theirs;
            acc_0_h2 = acc_0_h2 * mine + subgroupShuffleXor(acc_0_h2, mask) * theirs;
            acc_1_h2 = acc_1_h2 * mine + subgroupShuffleXor(acc_1_h2, mask) * theirs;
            run_max_h2 = m;
            }
            {  // head 3
            let other_max = subgroupShuffleXor(run_max_h3, mask);
            let other_sum = subgroupShuffleXor(run_sum_h3, mask);
            let m = max(run_max_h3, other_max);
            let mine = exp(run_max_h3 - m);
            let theirs = exp(other_max - m);
            run_sum_h3 = run_sum_h3 * mine + other_sum * theirs;
            acc_0_h3 = acc_0_h3 * mine + subgroupShuffleXor(acc_0_h3, mask) * theirs;
            acc_1_h3 = acc_1_h3 * mine + subgroupShuffleXor(acc_1_h3, mask) * theirs;
            run_max_h3 = m;
            }
        }
    }
    let block = select(lanes_per_key, subgroup_size, by_subgroup);
    // One representative group per block of lanes publishes its (max, sum)
    let reps = WORKGROUP_SIZE / block;
    let rep = tid / block;
    let is_rep = rep < reps && tid - rep * block < lanes_per_key;
    let slot = rep * lanes_per_key + group_lane;
    {  // head 0 of the workgroup's 4
        workgroupBarrier();
        if (is_rep && group_lane == 0u) {
            exchange[4u * rep] = run_max_h0;
            exchange[4u * rep + 1u] = run_sum_h0;
            exchange[4u * rep + 2u] = select(0.0, 1.0, misplaced);
        }
        workgroupBarrier();
        var row_max = MASKED_SCORE;
        var row_sum = 0.0;
        var flagged = false;
        for (var r: u32 = 0u; r < reps; r++) {
            let m = max(row_max, exchange[4u * r]);
            row_sum = row_sum * exp(row_max - m) + exchange[4u * r + 1u] * exp(exchange[4u * r] - m);
            row_max = m;
            flagged = flagged || exchange[4u * r + 2u] != 0.0;
        }
        // NaN is stored where a subgroup is laid out otherwise
        let spoiled = flagged;
        row_max = select(row_max, poison, spoiled);
        row_sum = select(row_sum, poison, spoiled);
        // Split-KV pass 1: this split's (max, sum) and unnormalised accumulator go to scratch; the
        // reduce pass normalises (and applies masked_row)
        let partial_slot = split * u.num_heads + head_idx_h0;
        if (tid == 0u && head_live_h0) {
            partial_ml[2u * partial_slot] = row_max;
            partial_ml[2u * partial_slot + 1u] = row_sum;
        }
        // This block's share of the softmax, relative to the row max
        let weight = exp(run_max_h0 - row_max);
        let out_base = partial_slot * head_dim + dim0;

        // Accumulator elements 0..3: the representatives', summed by the first group
        workgroupBarrier();
        if (is_rep) {
            set4(slot, acc_0_h0 * weight);
        }
        workgroupBarrier();
        if (key_group == 0u && lane_live && head_live_h0) {
            var total = vec4<f32>(0.0);
            for (var r: u32 = 0u; r < reps; r++) {
                total += get4(r * lanes_per_key + group_lane);
            }
            // (selected after the last product: the NaN stored is the poison's bits, not the result
            // of arithmetic on a NaN, which WGSL lets an implementation assume away)
            total = select(total, vec4<f32>(poison), spoiled);
            if (dim0 + 0u < head_dim) { partial_acc[out_base + 0u] = total[0]; }
            if (dim0 + 1u < head_dim) { partial_acc[out_base + 1u] = total[1]; }
            if (dim0 + 2u < head_dim) { partial_acc[out_base + 2u] = total[2]; }
            if (dim0 + 3u < head_dim) { partial_acc[out_base + 3u] = total[3]; }
        }

        // Accumulator elements 4..7: the representatives', summed by the first group
        workgroupBarrier();
        if (is_rep) {
            set4(slot, acc_1_h0 * weight);
        }
        workgroupBarrier();
        if (key_group == 0u && lane_live && head_live_h0) {
            var total = vec4<f32>(0.0);
            for (var r: u32 = 0u; r < reps; r++) {
                total += get4(r * lanes_per_key + group_lane);
            }
            // (selected after the last product: the NaN stored is the poison's bits, not the result
            // of arithmetic on a NaN, which WGSL lets an implementation assume away)
            total = select(total, vec4<f32>(poison), spoiled);
            if (dim0 + 4u < head_dim) { partial_acc[out_base + 4u] = total[0]; }
            if (dim0 + 5u < head_dim) { partial_acc[out_base + 5u] = total[1]; }
            if (dim0 + 6u < head_dim) { partial_acc[out_base + 6u] = total[2]; }
            if (dim0 + 7u < head_dim) { partial_acc[out_base + 7u] = total[3]; }
        }
    }
    {  // head 1 of the workgroup's 4
        workgroupBarrier();
        if (is_rep && group_lane == 0u) {
            exchange[4u * rep] = run_max_h1;
            exchange[4u * rep + 1u] = run_sum_h1;
            exchange[4u * rep + 2u] = select(0.0, 1.0, misplaced);
        }
        workgroupBarrier();
        var row_max = MASKED_SCORE;
        var row_sum = 0.0;
        var flagged = false;
        for (var r: u32 = 0u; r < reps; r++) {
            let m = max(row_max, exchange[4u * r]);
            row_sum = row_sum * exp(row_max - m) + exchange[4u * r + 1u] * exp(exchange[4u * r] - m);
            row_max = m;
            flagged = flagged || exchange[4u * r + 2u] != 0.0;
        }
        // NaN is stored where a subgroup is laid out otherwise
        let spoiled = flagged;
        row_max = select(row_max, poison, spoiled);
        row_sum = select(row_sum, poison, spoiled);
        // Split-KV pass 1: this split's (max, sum) and unnormalised accumulator go to scratch; the
        // reduce pass normalises (and applies masked_row)
        let partial_slot = split * u.num_heads + head_idx_h1;
        if (tid == 0u && head_live_h1) {
            partial_ml[2u * partial_slot] = row_max;
            partial_ml[2u * partial_slot + 1u] = row_sum;
        }
        // This block's share of the softmax, relative to the row max
        let weight = exp(run_max_h1 - row_max);
        let out_base = partial_slot * head_dim + dim0;

        // Accumulator elements 0..3: the representatives', summed by the first group
        workgroupBarrier();
        if (is_rep) {
            set4(slot, acc_0_h1 * weight);
        }
        workgroupBarrier();
        if (key_group == 0u && lane_live && head_live_h1) {
            var total = vec4<f32>(0.0);
            for (var r: u32 = 0u; r < reps; r++) {
                total += get4(r * lanes_per_key + group_lane);
            }
            // (selected after the last product: the NaN stored is the poison's bits, not the result
            // of arithmetic on a NaN, which WGSL lets an implementation assume away)
            total = select(total, vec4<f32>(poison), spoiled);
            if (dim0 + 0u < head_dim) { partial_acc[out_base + 0u] = total[0]; }
            if (dim0 + 1u < head_dim) { partial_acc[out_base + 1u] = total[1]; }
            if (dim0 + 2u < head_dim) { partial_acc[out_base + 2u] = total[2]; }
            if (dim0 + 3u < head_dim) { partial_acc[out_base + 3u] = total[3]; }
        }

        // Accumulator elements 4..7: the representatives', summed by the first group
        workgroupBarrier();
        if (is_rep) {
            set4(slot, acc_1_h1 * weight);
        }
        workgroupBarrier();
        if (key_group == 0u && lane_live && head_live_h1) {
            var total = vec4<f32>(0.0);
            for (var r: u32 = 0u; r < reps; r++) {
                total += get4(r * lanes_per_key + group_lane);
            }
            // (selected after the last product: the NaN stored is the poison's bits, not the result
            // of arithmetic on a NaN, which WGSL lets an implementation assume away)
            total = select(total, vec4<f32>(poison), spoiled);
            if (dim0 + 4u < head_dim) { partial_acc[out_base + 4u] = total[0]; }
            if (dim0 + 5u < head_dim) { partial_acc[out_base + 5u] = total[1]; }
            if (dim0 + 6u < head_dim) { partial_acc[out_base + 6u] = total[2]; }
            if (dim0 + 7u < head_dim) { partial_acc[out_base + 7u] = total[3]; }
        }
    }
    {  // head 2 of the workgroup's 4
        workgroupBarrier();
        if (is_rep && group_lane == 0u) {
            exchange[4u * rep] = run_max_h2;
            exchange[4u * rep + 1u] = run_sum_h2;
            exchange[4u * rep + 2u] = select(0.0, 1.0, misplaced);
        }
        workgroupBarrier();
        var row_max = MASKED_SCORE;
        var row_sum = 0.0;
        var flagged = false;
        for (var r: u32 = 0u; r < reps; r++) {
            let m = max(row_max, exchange[4u * r]);
            row_sum = row_sum * exp(row_max - m) + exchange[4u * r + 1u] * exp(exchange[4u * r] - m);
            row_max = m;
            flagged = flagged || exchange[4u * r + 2u] != 0.0;
        }
        // NaN is stored where a subgroup is laid out otherwise
        let spoiled = flagged;
        row_max = select(row_max, poison, spoiled);
        row_sum = select(row_sum, poison, spoiled);
        // Split-KV pass 1: this split's (max, sum) and unnormalised accumulator go to scratch; the
        // reduce pass normalises (and applies masked_row)
        let partial_slot = split * u.num_heads + head_idx_h2;
        if (tid == 0u && head_live_h2) {
            partial_ml[2u * partial_slot] = row_max;
            partial_ml[2u * partial_slot + 1u] = row_sum;
        }
        // This block's share of the softmax, relative to the row max
        let weight = exp(run_max_h2 - row_max);
        let out_base = partial_slot * head_dim + dim0;

        // Accumulator elements 0..3: the representatives', summed by the first group
        workgroupBarrier();
        if (is_rep) {
            set4(slot, acc_0_h2 * weight);
        }
        workgroupBarrier();
        if (key_group == 0u && lane_live && head_live_h2) {
            var total = vec4<f32>(0.0);
            for (var r: u32 = 0u; r < reps; r++) {
                total += get4(r * lanes_per_key + group_lane);
            }
            // (selected after the last product: the NaN stored is the poison's bits, not the result
            // of arithmetic on a NaN, which WGSL lets an implementation assume away)
            total = select(total, vec4<f32>(poison), spoiled);
            if (dim0 + 0u < head_dim) { partial_acc[out_base + 0u] = total[0]; }
            if (dim0 + 1u < head_dim) { partial_acc[out_base + 1u] = total[1]; }
            if (dim0 + 2u < head_dim) { partial_acc[out_base + 2u] = total[2]; }
            if (dim0 + 3u < head_dim) { partial_acc[out_base + 3u] = total[3]; }
        }

        // Accumulator elements 4..7: the representatives', summed by the first group
        workgroupBarrier();
        if (is_rep) {
            set4(slot, acc_1_h2 * weight);
        }
        workgroupBarrier();
        if (key_group == 0u && lane_live && head_live_h2) {
            var total = vec4<f32>(0.0);
            for (var r: u32 = 0u; r < reps; r++) {
                total += get4(r * lanes_per_key + group_lane);
            }
            // (selected after the last product: the NaN stored is the poison's bits, not the result
            // of arithmetic on a NaN, which WGSL lets an implementation assume away)
            total = select(total, vec4<f32>(poison), spoiled);
            if (dim0 + 4u < head_dim) { partial_acc[out_base + 4u] = total[0]; }
            if (dim0 + 5u < head_dim) { partial_acc[out_base + 5u] = total[1]; }
            if (dim0 + 6u < head_dim) { partial_acc[out_base + 6u] = total[2]; }
            if (dim0 + 7u < head_dim) { partial_acc[out_base + 7u] = total[3]; }
        }
    }
    {  // head 3 of the workgroup's 4
        workgroupBarrier();
        if (is_rep && group_lane == 0u) {
            exchange[4u * rep] = run_max_h3;
            exchange[4u * rep + 1u] = run_sum_h3;
            exchange[4u * rep + 2u] = select(0.0, 1.0, misplaced);
        }
        workgroupBarrier();
        var row_max = MASKED_SCORE;
        var row_sum = 0.0;
        var flagged = false;
        for (var r: u32 = 0u; r < reps; r++) {
            let m = max(row_max, exchange[4u * r]);
            row_sum = row_sum * exp(row_max - m) + exchange[4u * r + 1u] * exp(exchange[4u * r] - m);
            row_max = m;
            flagged = flagged || exchange[4u * r + 2u] != 0.0;
        }
        // NaN is stored where a subgroup is laid out otherwise
        let spoiled = flagged;
        row_max = select(row_max, poison, spoiled);
        row_sum = select(row_sum, poison, spoiled);
        // Split-KV pass 1: this split's (max, sum) and unnormalised accumulator go to scratch; the
        // reduce pass normalises (and applies masked_row)
        let partial_slot = split * u.num_heads + head_idx_h3;
        if (tid == 0u && head_live_h3) {
            partial_ml[2u * partial_slot] = row_max;
            partial_ml[2u * partial_slot + 1u] = row_sum;
        }
        // This block's share of the softmax, relative to the row max
        let weight = exp(run_max_h3 - row_max);
        let out_base = partial_slot * head_dim + dim0;

        // Accumulator elements 0..3: the representatives', summed by the first group
        workgroupBarrier();
        if (is_rep) {
            set4(slot, acc_0_h3 * weight);
        }
        workgroupBarrier();
        if (key_group == 0u && lane_live && head_live_h3) {
            var total = vec4<f32>(0.0);
            for (var r: u32 = 0u; r < reps; r++) {
                total += get4(r * lanes_per_key + group_lane);
            }
            // (selected after the last product: the NaN stored is the poison's bits, not the result
            // of arithmetic on a NaN, which WGSL lets an implementation assume away)
            total = select(total, vec4<f32>(poison), spoiled);
            if (dim0 + 0u < head_dim) { partial_acc[out_base + 0u] = total[0]; }
            if (dim0 + 1u < head_dim) { partial_acc[out_base + 1u] = total[1]; }
            if (dim0 + 2u < head_dim) { partial_acc[out_base + 2u] = total[2]; }
            if (dim0 + 3u < head_dim) { partial_acc[out_base + 3u] = total[3]; }
        }

        // Accumulator elements 4..7: the representatives', summed by the first group
        workgroupBarrier();
        if (is_rep) {
            set4(slot, acc_1_h3 * weight);
        }
        workgroupBarrier();
        if (key_group == 0u && lane_live && head_live_h3) {
            var total = vec4<f32>(0.0);
            for (var r: u32 = 0u; r < reps; r++) {
                total += get4(r * lanes_per_key + group_lane);
            }
            // (selected after the last product: the NaN stored is the poison's bits, not the result
            // of arithmetic on a NaN, which WGSL lets an implementation assume away)
            total = select(total, vec4<f32>(poison), spoiled);
            if (dim0 + 4u < head_dim) { partial_acc[out_base + 4u] = total[0]; }
            if (dim0 + 5u < head_dim) { partial_acc[out_base + 5u] = total[1]; }
            if (dim0 + 6u < head_dim) { partial_acc[out_base + 6u] = total[2]; }
            if (dim0 + 7u < head_dim) { partial_acc[out_base + 7u] = total[3]; }
        }
    }
}
