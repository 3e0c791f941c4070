// AUTO-GENERATED from templates/attention_decode_tiered.wgsl.j2 for variant attention_decode_tiered_f16kv by doppler-gen - do not edit.
// Edit the template and variants.toml, then run `doppler-gen generate`.
// source-hash: sha256:9ec975faefe7aa50e7fb6cb785e7c55007907eca70efdda66288d6c2d5dfca41

// Tiered Decode Attention Kernel (f16 cold, f16 hot, f32 Q, f32 output)
//
// One workgroup per query head. The workgroup is split into lane groups of LANES_PER_KEY
// invocations (the smallest power of two with LANES_PER_KEY * DIMS_PER_LANE >= head_dim); a
// group scores 2 key(s) per step, each lane owning DIMS_PER_LANE head-dim elements of
// q, K, V and the output. The q.k dot is reduced across the group
// through workgroup memory,
// and every group keeps its own online-softmax state (running max, running sum, accumulator
// slice) over the keys it visits, cold tier first, then hot. The groups' states are merged at
// the end. Nothing is stored per key, so the KV length is bounded only by buffer sizes.
// Requires head_dim <= MAX_HEAD_DIM and LANES_PER_KEY <= WORKGROUP_SIZE <= MAX_WORKGROUP_SIZE,
// else the kernel returns without writing.
// Fully masked row: average of V over all keys (masked scores are -3.4e38).

enable f16;

const MAX_KV_LEN: u32 = 131072u;
const MAX_HEAD_DIM: u32 = 256u;
const MAX_WORKGROUP_SIZE: u32 = 1024u;
const DIMS_PER_LANE: u32 = 8u;
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
    cold_page_size: u32,  // Rows per cold page when cold_layout == 2
    cold_layout: u32,     // 2 = paged through cold_page_table, else contiguous
    hot_layout: u32,      // 1 = ring of hot_window rows (when hot_window > 0), else linear
    _pad: u32,
}

@group(0) @binding(0) var<uniform> u: Uniforms;
@group(0) @binding(1) var<storage, read> Q: array<f32>;
@group(0) @binding(2) var<storage, read> K_hot: array<f16>;
@group(0) @binding(3) var<storage, read> V_hot: array<f16>;
@group(0) @binding(4) var<storage, read> K_cold: array<f16>;
@group(0) @binding(5) var<storage, read> V_cold: array<f16>;
@group(0) @binding(6) var<storage, read_write> output: array<f32>;
@group(0) @binding(7) var<storage, read> cold_page_table: array<u32>;

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
var<private> run_max: f32;
var<private> run_sum: f32;
var<private> q_0: vec4<f32>;
var<private> q_1: vec4<f32>;
var<private> acc_0: vec4<f32>;
var<private> acc_1: vec4<f32>;

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
    if (u.hot_layout == 1u && u.hot_window > 0u) {
        return u.hot_start % u.hot_window;
    }
    return 0u;
}

// Physical row of hot key hot_pos: a ring of hot_window rows starting at hot_start, so row
// (hot_start + hot_pos) % hot_window. A ring holds hot_window keys: with hot_len <= hot_window,
// hot_base + hot_pos is below 2 * hot_window and one subtraction replaces the division (4 % of
// the long split kernel's time on the H200)
fn get_hot_pos(hot_pos: u32) -> u32 {
    if (u.hot_layout == 1u && u.hot_window > 0u) {
        let p = hot_base + hot_pos;
        if (p >= 2u * u.hot_window) {
            return p % u.hot_window;  // hot_len > hot_window: keys share rows
        }
        return select(p, p - u.hot_window, p >= u.hot_window);
    }
    return hot_pos;
}

// Physical row of cold key i: through cold_page_table when cold_layout == 2, else i
fn get_cold_pos(key_pos: u32) -> u32 {
    if (u.cold_layout == 2u) {
        let page_idx = key_pos / u.cold_page_size;
        let in_page = key_pos - (page_idx * u.cold_page_size);
        let phys_page = cold_page_table[page_idx];
        return phys_page * u.cold_page_size + in_page;
    }
    return key_pos;
}

// Scale and softcap a key's q.k dot into its score; a masked key (not `open`) scores MASKED_SCORE
fn finish_score(dot: f32, open: bool) -> f32 {
    var s = dot * u.scale;
    if (u.attn_softcap > 0.0) {
        s = tanh(s / u.attn_softcap) * u.attn_softcap;
    }
    return select(MASKED_SCORE, s, open);
}

// Sum two key slots' partial q.k dots over each lane group
fn group_reduce(partial: vec2<f32>, width: u32) -> vec2<f32> {
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

// One step over the cold tier: slot s scores key first + s * num_groups + key_group, s < 2
fn cold_step(first: u32, width: u32) {
    let key0 = first + 0u * num_groups + key_group;
    let live0 = in_group && key0 < u.cold_len;
    let at0 = min(key0, u.cold_len - 1u);
    let key1 = first + 1u * num_groups + key_group;
    let live1 = in_group && key1 < u.cold_len;
    let at1 = min(key1, u.cold_len - 1u);
    let row0 = (get_cold_pos(at0) * u.num_kv_heads + kv_head) * u.head_dim;
    let row1 = (get_cold_pos(at1) * u.num_kv_heads + kv_head) * u.head_dim;

    let kh0_0 = vec4<f16>(K_cold[row0 + min(dim0 + 0u, u.head_dim - 1u)], K_cold[row0 + min(dim0 + 1u, u.head_dim - 1u)], K_cold[row0 + min(dim0 + 2u, u.head_dim - 1u)], K_cold[row0 + min(dim0 + 3u, u.head_dim - 1u)]);
    let kh0_1 = vec4<f16>(K_cold[row0 + min(dim0 + 4u, u.head_dim - 1u)], K_cold[row0 + min(dim0 + 5u, u.head_dim - 1u)], K_cold[row0 + min(dim0 + 6u, u.head_dim - 1u)], K_cold[row0 + min(dim0 + 7u, u.head_dim - 1u)]);
    let vh0_0 = select(vec4<f16>(), vec4<f16>(V_cold[row0 + min(dim0 + 0u, u.head_dim - 1u)], V_cold[row0 + min(dim0 + 1u, u.head_dim - 1u)], V_cold[row0 + min(dim0 + 2u, u.head_dim - 1u)], V_cold[row0 + min(dim0 + 3u, u.head_dim - 1u)]), live0);
    let vh0_1 = select(vec4<f16>(), vec4<f16>(V_cold[row0 + min(dim0 + 4u, u.head_dim - 1u)], V_cold[row0 + min(dim0 + 5u, u.head_dim - 1u)], V_cold[row0 + min(dim0 + 6u, u.head_dim - 1u)], V_cold[row0 + min(dim0 + 7u, u.head_dim - 1u)]), live0);
    let kh1_0 = vec4<f16>(K_cold[row1 + min(dim0 + 0u, u.head_dim - 1u)], K_cold[row1 + min(dim0 + 1u, u.head_dim - 1u)], K_cold[row1 + min(dim0 + 2u, u.head_dim - 1u)], K_cold[row1 + min(dim0 + 3u, u.head_dim - 1u)]);
    let kh1_1 = vec4<f16>(K_cold[row1 + min(dim0 + 4u, u.head_dim - 1u)], K_cold[row1 + min(dim0 + 5u, u.head_dim - 1u)], K_cold[row1 + min(dim0 + 6u, u.head_dim - 1u)], K_cold[row1 + min(dim0 + 7u, u.head_dim - 1u)]);
    let vh1_0 = select(vec4<f16>(), vec4<f16>(V_cold[row1 + min(dim0 + 0u, u.head_dim - 1u)], V_cold[row1 + min(dim0 + 1u, u.head_dim - 1u)], V_cold[row1 + min(dim0 + 2u, u.head_dim - 1u)], V_cold[row1 + min(dim0 + 3u, u.head_dim - 1u)]), live1);
    let vh1_1 = select(vec4<f16>(), vec4<f16>(V_cold[row1 + min(dim0 + 4u, u.head_dim - 1u)], V_cold[row1 + min(dim0 + 5u, u.head_dim - 1u)], V_cold[row1 + min(dim0 + 6u, u.head_dim - 1u)], V_cold[row1 + min(dim0 + 7u, u.head_dim - 1u)]), live1);
    let part0 = dot(q_0, vec4<f32>(kh0_0)) + dot(q_1, vec4<f32>(kh0_1));
    let part1 = dot(q_0, vec4<f32>(kh1_0)) + dot(q_1, vec4<f32>(kh1_1));
    let dots0 = group_reduce(vec2<f32>(part0, part1), width);
    let abs0 = key0;
    let open0 = abs0 >= open_first && abs0 <= open_last;
    let abs1 = key1;
    let open1 = abs1 >= open_first && abs1 <= open_last;
    let score0 = finish_score(dots0[0], open0);
    let score1 = finish_score(dots0[1], open1);

    // Online softmax: fold the step's keys into the group's running max, sum and accumulator
    var m = run_max;
    if (live0) { m = max(m, score0); }
    if (live1) { m = max(m, score1); }
    let correction = exp(run_max - m);
    let w0 = select(0.0, exp(score0 - m), live0);
    let w1 = select(0.0, exp(score1 - m), live1);
    run_sum = run_sum * correction + w0 + w1;
    acc_0 = acc_0 * correction + w0 * vec4<f32>(vh0_0) + w1 * vec4<f32>(vh1_0);
    acc_1 = acc_1 * correction + w0 * vec4<f32>(vh0_1) + w1 * vec4<f32>(vh1_1);
    run_max = m;
}

// One step over the hot tier: slot s scores key first + s * num_groups + key_group, s < 2
fn hot_step(first: u32, width: u32) {
    let key0 = first + 0u * num_groups + key_group;
    let live0 = in_group && key0 < u.hot_len;
    let at0 = min(key0, u.hot_len - 1u);
    let key1 = first + 1u * num_groups + key_group;
    let live1 = in_group && key1 < u.hot_len;
    let at1 = min(key1, u.hot_len - 1u);
    let row0 = (get_hot_pos(at0) * u.num_kv_heads + kv_head) * u.head_dim;
    let row1 = (get_hot_pos(at1) * u.num_kv_heads + kv_head) * u.head_dim;

    let kh0_0 = vec4<f16>(K_hot[row0 + min(dim0 + 0u, u.head_dim - 1u)], K_hot[row0 + min(dim0 + 1u, u.head_dim - 1u)], K_hot[row0 + min(dim0 + 2u, u.head_dim - 1u)], K_hot[row0 + min(dim0 + 3u, u.head_dim - 1u)]);
    let kh0_1 = vec4<f16>(K_hot[row0 + min(dim0 + 4u, u.head_dim - 1u)], K_hot[row0 + min(dim0 + 5u, u.head_dim - 1u)], K_hot[row0 + min(dim0 + 6u, u.head_dim - 1u)], K_hot[row0 + min(dim0 + 7u, u.head_dim - 1u)]);
    let vh0_0 = select(vec4<f16>(), vec4<f16>(V_hot[row0 + min(dim0 + 0u, u.head_dim - 1u)], V_hot[row0 + min(dim0 + 1u, u.head_dim - 1u)], V_hot[row0 + min(dim0 + 2u, u.head_dim - 1u)], V_hot[row0 + min(dim0 + 3u, u.head_dim - 1u)]), live0);
    let vh0_1 = select(vec4<f16>(), vec4<f16>(V_hot[row0 + min(dim0 + 4u, u.head_dim - 1u)], V_hot[row0 + min(dim0 + 5u, u.head_dim - 1u)], V_hot[row0 + min(dim0 + 6u, u.head_dim - 1u)], V_hot[row0 + min(dim0 + 7u, u.head_dim - 1u)]), live0);
    let kh1_0 = vec4<f16>(K_hot[row1 + min(dim0 + 0u, u.head_dim - 1u)], K_hot[row1 + min(dim0 + 1u, u.head_dim - 1u)], K_hot[row1 + min(dim0 + 2u, u.head_dim - 1u)], K_hot[row1 + min(dim0 + 3u, u.head_dim - 1u)]);
    let kh1_1 = vec4<f16>(K_hot[row1 + min(dim0 + 4u, u.head_dim - 1u)], K_hot[row1 + min(dim0 + 5u, u.head_dim - 1u)], K_hot[row1 + min(dim0 + 6u, u.head_dim - 1u)], K_hot[row1 + min(dim0 + 7u, u.head_dim - 1u)]);
    let vh1_0 = select(vec4<f16>(), vec4<f16>(V_hot[row1 + min(dim0 + 0u, u.head_dim - 1u)], V_hot[row1 + min(dim0 + 1u, u.head_dim - 1u)], V_hot[row1 + min(dim0 + 2u, u.head_dim - 1u)], V_hot[row1 + min(dim0 + 3u, u.head_dim - 1u)]), live1);
    let vh1_1 = select(vec4<f16>(), vec4<f16>(V_hot[row1 + min(dim0 + 4u, u.head_dim - 1u)], V_hot[row1 + min(dim0 + 5u, u.head_dim - 1u)], V_hot[row1 + min(dim0 + 6u, u.head_dim - 1u)], V_hot[row1 + min(dim0 + 7u, u.head_dim - 1u)]), live1);
    let part0 = dot(q_0, vec4<f32>(kh0_0)) + dot(q_1, vec4<f32>(kh0_1));
    let part1 = dot(q_0, vec4<f32>(kh1_0)) + dot(q_1, vec4<f32>(kh1_1));
    let dots0 = group_reduce(vec2<f32>(part0, part1), width);
    let abs0 = u.hot_start + key0;
    let open0 = abs0 >= open_first && abs0 <= open_last;
    let abs1 = u.hot_start + key1;
    let open1 = abs1 >= open_first && abs1 <= open_last;
    let score0 = finish_score(dots0[0], open0);
    let score1 = finish_score(dots0[1], open1);

    // Online softmax: fold the step's keys into the group's running max, sum and accumulator
    var m = run_max;
    if (live0) { m = max(m, score0); }
    if (live1) { m = max(m, score1); }
    let correction = exp(run_max - m);
    let w0 = select(0.0, exp(score0 - m), live0);
    let w1 = select(0.0, exp(score1 - m), live1);
    run_sum = run_sum * correction + w0 + w1;
    acc_0 = acc_0 * correction + w0 * vec4<f32>(vh0_0) + w1 * vec4<f32>(vh1_0);
    acc_1 = acc_1 * correction + w0 * vec4<f32>(vh0_1) + w1 * vec4<f32>(vh1_1);
    run_max = m;
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn main(
    @builtin(local_invocation_id) local_id: vec3<u32>,
    @builtin(workgroup_id) workgroup_id: vec3<u32>,
) {
    let head_idx = workgroup_id.x;
    let head_dim = u.head_dim;
    let total_len = u.cold_len + u.hot_len;

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
    kv_head = get_kv_head_idx(head_idx);
    exchange_half = 0u;
    let open = open_keys();
    open_first = open.x;
    open_last = open.y;
    hot_base = hot_ring_base();
    run_max = MASKED_SCORE;
    run_sum = 0.0;
    let q_base = head_idx * head_dim + dim0;
    acc_0 = vec4<f32>(0.0);
    q_0 = vec4<f32>(0.0);
    acc_1 = vec4<f32>(0.0);
    q_1 = vec4<f32>(0.0);
    if (lane_live) {
        if (dim0 + 0u < head_dim) { q_0[0] = Q[q_base + 0u]; }
        if (dim0 + 1u < head_dim) { q_0[1] = Q[q_base + 1u]; }
        if (dim0 + 2u < head_dim) { q_0[2] = Q[q_base + 2u]; }
        if (dim0 + 3u < head_dim) { q_0[3] = Q[q_base + 3u]; }
        if (dim0 + 4u < head_dim) { q_1[0] = Q[q_base + 4u]; }
        if (dim0 + 5u < head_dim) { q_1[1] = Q[q_base + 5u]; }
        if (dim0 + 6u < head_dim) { q_1[2] = Q[q_base + 6u]; }
        if (dim0 + 7u < head_dim) { q_1[3] = Q[q_base + 7u]; }
    }

    // Cold tier, then hot tier: every group steps the same number of times (barriers inside)
    let groups = WORKGROUP_SIZE / lanes_per_key;
    let keys_per_step = groups * 2u;
    let shuffle_width = 0u;  // 0: reduce through workgroup memory
    for (var first: u32 = 0u; first < u.cold_len; first += keys_per_step) {
        cold_step(first, shuffle_width);
    }
    for (var first: u32 = 0u; first < u.hot_len; first += keys_per_step) {
        hot_step(first, shuffle_width);
    }

    let block = lanes_per_key;
    // One representative group per block of lanes publishes its (max, sum)
    let reps = WORKGROUP_SIZE / block;
    let rep = tid / block;
    let is_rep = rep < reps && tid - rep * block < lanes_per_key;
    let slot = rep * lanes_per_key + group_lane;
    workgroupBarrier();
    if (is_rep && group_lane == 0u) {
        exchange[4u * rep] = run_max;
        exchange[4u * rep + 1u] = run_sum;
    }
    workgroupBarrier();
    var row_max = MASKED_SCORE;
    var row_sum = 0.0;
    for (var r: u32 = 0u; r < reps; r++) {
        let m = max(row_max, exchange[4u * r]);
        row_sum = row_sum * exp(row_max - m) + exchange[4u * r + 1u] * exp(exchange[4u * r] - m);
        row_max = m;
    }
    var inv_sum = select(0.0, 1.0 / row_sum, row_sum > 0.0);
    // This block's share of the softmax, relative to the row max
    let weight = exp(run_max - row_max);
    let out_base = head_idx * head_dim + dim0;

    // Accumulator elements 0..3: the representatives', summed by the first group
    workgroupBarrier();
    if (is_rep) {
        set4(slot, acc_0 * weight);
    }
    workgroupBarrier();
    if (key_group == 0u && lane_live) {
        var total = vec4<f32>(0.0);
        for (var r: u32 = 0u; r < reps; r++) {
            total += get4(r * lanes_per_key + group_lane);
        }
        total = total * inv_sum;
        if (dim0 + 0u < head_dim) { output[out_base + 0u] = total[0]; }
        if (dim0 + 1u < head_dim) { output[out_base + 1u] = total[1]; }
        if (dim0 + 2u < head_dim) { output[out_base + 2u] = total[2]; }
        if (dim0 + 3u < head_dim) { output[out_base + 3u] = total[3]; }
    }

    // Accumulator elements 4..7: the representatives', summed by the first group
    workgroupBarrier();
    if (is_rep) {
        set4(slot, acc_1 * weight);
    }
    workgroupBarrier();
    if (key_group == 0u && lane_live) {
        var total = vec4<f32>(0.0);
        for (var r: u32 = 0u; r < reps; r++) {
            total += get4(r * lanes_per_key + group_lane);
        }
        total = total * inv_sum;
        if (dim0 + 4u < head_dim) { output[out_base + 4u] = total[0]; }
        if (dim0 + 5u < head_dim) { output[out_base + 5u] = total[1]; }
        if (dim0 + 6u < head_dim) { output[out_base + 6u] = total[2]; }
        if (dim0 + 7u < head_dim) { output[out_base + 7u] = total[3]; }
    }
}
