// AUTO-GENERATED from templates/attention_streaming.wgsl.j2 for variant attention_streaming_sg_d128_f16kv by doppler-gen - do not edit.
// Edit the template and variants.toml, then run `doppler-gen generate`.
// source-hash: sha256:73f474f4426950789e66bf4e0d145356a37f996966334f5d98da597ac5a979ab

// Streaming attention (no workgroup storage): Q f32, K/V f16, output f32
//
// One workgroup (one subgroup) per (query, head) in 2 key group(s) of 16 lanes: lane r of a
// group owns head-dim vec4 columns r + j * 16 (j < 2) of Q, K, V and the output; a score is
// a reduce-scatter over the group's lanes; the groups merge at the end. All arithmetic is f32.
// K and V are read as vec4s: head_dim must be a multiple of 4.

enable f16;

enable subgroups;

const MAX_HEAD_DIM: u32 = 128u;
const BLOCK_K: u32 = 16u;        // keys per online-softmax chunk
const LANES_PER_KEY: u32 = 16u;    // lanes sharing a key's dot product (a key group)
const GROUPS: u32 = 2u;           // key groups (WORKGROUP_SIZE / LANES_PER_KEY), each its own keys
const VEC4_PER_LANE: u32 = 2u;    // head-dim vec4 columns per lane (MAX_HEAD_DIM / 4 / LANES_PER_KEY)
const MIN_SUBGROUP_SIZE: u32 = 32u;  // the workgroup is one subgroup; narrower ones store NaN
const WORKGROUP_SIZE: u32 = 32u;
const MASKED: f32 = -3.402823e+38;

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
@group(0) @binding(2) var<storage, read> K: array<vec4<f16>>;       // [seq_len, num_kv_heads, head_dim / 4]
@group(0) @binding(3) var<storage, read> V: array<vec4<f16>>;       // [seq_len, num_kv_heads, head_dim / 4]
@group(0) @binding(4) var<storage, read_write> output: array<f32>; // [query_len, num_heads, head_dim]
@group(0) @binding(5) var<storage, read> kv_len_buffer: array<u32>;
@group(0) @binding(6) var<storage, read> page_table: array<u32>;

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

// KV length: the uniform, or the first word of kv_len_buffer when kv_len_source != 0
fn get_kv_len() -> u32 {
    if (u.kv_len_source == 0u) {
        return u.seq_len;
    }
    return kv_len_buffer[0];
}

// Logical keys [x, y) that queries q0 .. q0 + q_count - 1 can see. For one query (q_count 1)
// this range is exactly its unmasked keys: causal masks abs_key > abs_query, a window w > 0
// masks abs_key < abs_query - w + 1 once abs_query >= w, and keys past the KV length are absent
fn visible_keys(q0: u32, q_count: u32, kv_len: u32) -> vec2<u32> {
    let first_abs = q0 + u.start_pos;
    let last_abs = first_abs + q_count - 1u;
    var end = kv_len;
    if (u.is_causal != 0u) {
        end = min(end, select(0u, last_abs + 1u - u.kv_start, last_abs + 1u > u.kv_start));
    }
    var begin: u32 = 0u;
    if (u.sliding_window > 0u && first_abs >= u.sliding_window) {
        let lowest = first_abs - u.sliding_window + 1u;
        begin = select(0u, lowest - u.kv_start, lowest > u.kv_start);
    }
    return vec2<u32>(begin, max(begin, end));
}

// Scaled, soft-capped score
fn final_score(raw: f32) -> f32 {
    var score = raw * u.scale;
    if (u.attn_softcap > 0.0) {
        score = tanh(score / u.attn_softcap) * u.attn_softcap;
    }
    return score;
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn main(
    @builtin(local_invocation_id) local_id: vec3<u32>,
    @builtin(workgroup_id) wg_id: vec3<u32>,
    @builtin(num_workgroups) num_wg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) subgroup_size: u32
) {
    // Workgroup w of query_len * num_heads, dispatched in one dimension or, past the device's
    // limit, folded into two (dispatch_fold): a folded grid's spare workgroups return here
    let w = wg_id.x + wg_id.y * num_wg.x;
    let head = w % u.num_heads;
    if (u.head_dim > MAX_HEAD_DIM || w / u.num_heads >= u.query_len || u.head_dim % 4u != 0u) {
        return;
    }
    // Workgroup w runs query query_len - 1 - w / num_heads: under a causal mask the last queries
    // see the most keys, and starting them first shortens the tail of the dispatch
    let query = u.query_len - 1u - w / u.num_heads;
    let kv_head = get_kv_head_idx(head);
    let d4_count = (u.head_dim + 3u) / 4u;
    let q_base = (query * u.num_heads + head) * u.head_dim;
    let span = visible_keys(query, 1u, get_kv_len());

    var m: f32 = -3.402823e+38;
    var l: f32 = 0.0;
    // The workgroup must be one subgroup with lanes 0 .. WORKGROUP_SIZE - 1 (else NaN is stored):
    // all WORKGROUP_SIZE invocations in this subgroup, their distinct lane ids up to WORKGROUP_SIZE - 1
    let numbered = (subgroupAdd(1u) == WORKGROUP_SIZE) & (subgroupMax(lane) + 1u == WORKGROUP_SIZE);
    // Key group g = lane / LANES_PER_KEY; lane r = lane % LANES_PER_KEY owns vec4 columns r + j * LANES_PER_KEY
    // of Q (zeros past head_dim), of its group's K/V rows and of the output. Numbered by subgroup
    // lane, not local index: the shuffles address lanes, and no API promises the two agree
    let g = lane / LANES_PER_KEY;
    let r = lane - g * LANES_PER_KEY;
    let hd4 = u.head_dim / 4u;
    let used = (hd4 + LANES_PER_KEY - 1u) / LANES_PER_KEY;  // vec4s per lane in use (uniform)
    var q: array<vec4<f32>, VEC4_PER_LANE>;
    var acc: array<vec4<f32>, VEC4_PER_LANE>;
    let qo0 = q_base + 4u * (r + 0u);
    q[0] = select(vec4<f32>(), vec4<f32>(f32(Q[qo0]), f32(Q[qo0 + 1u]), f32(Q[qo0 + 2u]), f32(Q[qo0 + 3u])), r + 0u < hd4);
    acc[0] = vec4<f32>();
    let qo1 = q_base + 4u * (r + 16u);
    q[1] = select(vec4<f32>(), vec4<f32>(f32(Q[qo1]), f32(Q[qo1 + 1u]), f32(Q[qo1 + 2u]), f32(Q[qo1 + 3u])), r + 16u < hd4);
    acc[1] = vec4<f32>();

    // chunks of GROUPS * BLOCK_K keys: group g scores keys k0 + g + k * GROUPS (k < BLOCK_K,
    // unrolled) with its own online softmax; the groups merge once, at the end
    for (var k0: u32 = span.x; k0 < span.y; k0 = k0 + GROUPS * BLOCK_K) {
        let key0 = k0 + g + 0u;
        let base0 = (get_kv_pos(min(key0, span.y - 1u)) * u.num_kv_heads + kv_head) * hd4 + r;
        var dot0: f32 = 0.0;
        let key1 = k0 + g + 2u;
        let base1 = (get_kv_pos(min(key1, span.y - 1u)) * u.num_kv_heads + kv_head) * hd4 + r;
        var dot1: f32 = 0.0;
        let key2 = k0 + g + 4u;
        let base2 = (get_kv_pos(min(key2, span.y - 1u)) * u.num_kv_heads + kv_head) * hd4 + r;
        var dot2: f32 = 0.0;
        let key3 = k0 + g + 6u;
        let base3 = (get_kv_pos(min(key3, span.y - 1u)) * u.num_kv_heads + kv_head) * hd4 + r;
        var dot3: f32 = 0.0;
        let key4 = k0 + g + 8u;
        let base4 = (get_kv_pos(min(key4, span.y - 1u)) * u.num_kv_heads + kv_head) * hd4 + r;
        var dot4: f32 = 0.0;
        let key5 = k0 + g + 10u;
        let base5 = (get_kv_pos(min(key5, span.y - 1u)) * u.num_kv_heads + kv_head) * hd4 + r;
        var dot5: f32 = 0.0;
        let key6 = k0 + g + 12u;
        let base6 = (get_kv_pos(min(key6, span.y - 1u)) * u.num_kv_heads + kv_head) * hd4 + r;
        var dot6: f32 = 0.0;
        let key7 = k0 + g + 14u;
        let base7 = (get_kv_pos(min(key7, span.y - 1u)) * u.num_kv_heads + kv_head) * hd4 + r;
        var dot7: f32 = 0.0;
        let key8 = k0 + g + 16u;
        let base8 = (get_kv_pos(min(key8, span.y - 1u)) * u.num_kv_heads + kv_head) * hd4 + r;
        var dot8: f32 = 0.0;
        let key9 = k0 + g + 18u;
        let base9 = (get_kv_pos(min(key9, span.y - 1u)) * u.num_kv_heads + kv_head) * hd4 + r;
        var dot9: f32 = 0.0;
        let key10 = k0 + g + 20u;
        let base10 = (get_kv_pos(min(key10, span.y - 1u)) * u.num_kv_heads + kv_head) * hd4 + r;
        var dot10: f32 = 0.0;
        let key11 = k0 + g + 22u;
        let base11 = (get_kv_pos(min(key11, span.y - 1u)) * u.num_kv_heads + kv_head) * hd4 + r;
        var dot11: f32 = 0.0;
        let key12 = k0 + g + 24u;
        let base12 = (get_kv_pos(min(key12, span.y - 1u)) * u.num_kv_heads + kv_head) * hd4 + r;
        var dot12: f32 = 0.0;
        let key13 = k0 + g + 26u;
        let base13 = (get_kv_pos(min(key13, span.y - 1u)) * u.num_kv_heads + kv_head) * hd4 + r;
        var dot13: f32 = 0.0;
        let key14 = k0 + g + 28u;
        let base14 = (get_kv_pos(min(key14, span.y - 1u)) * u.num_kv_heads + kv_head) * hd4 + r;
        var dot14: f32 = 0.0;
        let key15 = k0 + g + 30u;
        let base15 = (get_kv_pos(min(key15, span.y - 1u)) * u.num_kv_heads + kv_head) * hd4 + r;
        var dot15: f32 = 0.0;
        {
            dot0 = dot0 + dot(q[0], select(vec4<f32>(), vec4<f32>(K[base0 + 0u]), r + 0u < hd4));
            dot1 = dot1 + dot(q[0], select(vec4<f32>(), vec4<f32>(K[base1 + 0u]), r + 0u < hd4));
            dot2 = dot2 + dot(q[0], select(vec4<f32>(), vec4<f32>(K[base2 + 0u]), r + 0u < hd4));
            dot3 = dot3 + dot(q[0], select(vec4<f32>(), vec4<f32>(K[base3 + 0u]), r + 0u < hd4));
            dot4 = dot4 + dot(q[0], select(vec4<f32>(), vec4<f32>(K[base4 + 0u]), r + 0u < hd4));
            dot5 = dot5 + dot(q[0], select(vec4<f32>(), vec4<f32>(K[base5 + 0u]), r + 0u < hd4));
            dot6 = dot6 + dot(q[0], select(vec4<f32>(), vec4<f32>(K[base6 + 0u]), r + 0u < hd4));
            dot7 = dot7 + dot(q[0], select(vec4<f32>(), vec4<f32>(K[base7 + 0u]), r + 0u < hd4));
            dot8 = dot8 + dot(q[0], select(vec4<f32>(), vec4<f32>(K[base8 + 0u]), r + 0u < hd4));
            dot9 = dot9 + dot(q[0], select(vec4<f32>(), vec4<f32>(K[base9 + 0u]), r + 0u < hd4));
            dot10 = dot10 + dot(q[0], select(vec4<f32>(), vec4<f32>(K[base10 + 0u]), r + 0u < hd4));
            dot11 = dot11 + dot(q[0], select(vec4<f32>(), vec4<f32>(K[base11 + 0u]), r + 0u < hd4));
            dot12 = dot12 + dot(q[0], select(vec4<f32>(), vec4<f32>(K[base12 + 0u]), r + 0u < hd4));
            dot13 = dot13 + dot(q[0], select(vec4<f32>(), vec4<f32>(K[base13 + 0u]), r + 0u < hd4));
            dot14 = dot14 + dot(q[0], select(vec4<f32>(), vec4<f32>(K[base14 + 0u]), r + 0u < hd4));
            dot15 = dot15 + dot(q[0], select(vec4<f32>(), vec4<f32>(K[base15 + 0u]), r + 0u < hd4));
        }
        if (1u < used) {
            dot0 = dot0 + dot(q[1], select(vec4<f32>(), vec4<f32>(K[base0 + 16u]), r + 16u < hd4));
            dot1 = dot1 + dot(q[1], select(vec4<f32>(), vec4<f32>(K[base1 + 16u]), r + 16u < hd4));
            dot2 = dot2 + dot(q[1], select(vec4<f32>(), vec4<f32>(K[base2 + 16u]), r + 16u < hd4));
            dot3 = dot3 + dot(q[1], select(vec4<f32>(), vec4<f32>(K[base3 + 16u]), r + 16u < hd4));
            dot4 = dot4 + dot(q[1], select(vec4<f32>(), vec4<f32>(K[base4 + 16u]), r + 16u < hd4));
            dot5 = dot5 + dot(q[1], select(vec4<f32>(), vec4<f32>(K[base5 + 16u]), r + 16u < hd4));
            dot6 = dot6 + dot(q[1], select(vec4<f32>(), vec4<f32>(K[base6 + 16u]), r + 16u < hd4));
            dot7 = dot7 + dot(q[1], select(vec4<f32>(), vec4<f32>(K[base7 + 16u]), r + 16u < hd4));
            dot8 = dot8 + dot(q[1], select(vec4<f32>(), vec4<f32>(K[base8 + 16u]), r + 16u < hd4));
            dot9 = dot9 + dot(q[1], select(vec4<f32>(), vec4<f32>(K[base9 + 16u]), r + 16u < hd4));
            dot10 = dot10 + dot(q[1], select(vec4<f32>(), vec4<f32>(K[base10 + 16u]), r + 16u < hd4));
            dot11 = dot11 + dot(q[1], select(vec4<f32>(), vec4<f32>(K[base11 + 16u]), r + 16u < hd4));
            dot12 = dot12 + dot(q[1], select(vec4<f32>(), vec4<f32>(K[base12 + 16u]), r + 16u < hd4));
            dot13 = dot13 + dot(q[1], select(vec4<f32>(), vec4<f32>(K[base13 + 16u]), r + 16u < hd4));
            dot14 = dot14 + dot(q[1], select(vec4<f32>(), vec4<f32>(K[base14 + 16u]), r + 16u < hd4));
            dot15 = dot15 + dot(q[1], select(vec4<f32>(), vec4<f32>(K[base15 + 16u]), r + 16u < hd4));
        }
        // (an element past head_dim reads a neighbour, or nothing under robust buffer access, and
        // is discarded)
        // reduce-scatter over the group: each exchange sends the half the partner keeps
        let upper8 = (r & 8u) != 0u;
        let sum8_0 = select(dot0, dot8, upper8) + subgroupShuffleXor(select(dot8, dot0, upper8), 8u);
        let sum8_1 = select(dot1, dot9, upper8) + subgroupShuffleXor(select(dot9, dot1, upper8), 8u);
        let sum8_2 = select(dot2, dot10, upper8) + subgroupShuffleXor(select(dot10, dot2, upper8), 8u);
        let sum8_3 = select(dot3, dot11, upper8) + subgroupShuffleXor(select(dot11, dot3, upper8), 8u);
        let sum8_4 = select(dot4, dot12, upper8) + subgroupShuffleXor(select(dot12, dot4, upper8), 8u);
        let sum8_5 = select(dot5, dot13, upper8) + subgroupShuffleXor(select(dot13, dot5, upper8), 8u);
        let sum8_6 = select(dot6, dot14, upper8) + subgroupShuffleXor(select(dot14, dot6, upper8), 8u);
        let sum8_7 = select(dot7, dot15, upper8) + subgroupShuffleXor(select(dot15, dot7, upper8), 8u);
        let upper4 = (r & 4u) != 0u;
        let sum4_0 = select(sum8_0, sum8_4, upper4) + subgroupShuffleXor(select(sum8_4, sum8_0, upper4), 4u);
        let sum4_1 = select(sum8_1, sum8_5, upper4) + subgroupShuffleXor(select(sum8_5, sum8_1, upper4), 4u);
        let sum4_2 = select(sum8_2, sum8_6, upper4) + subgroupShuffleXor(select(sum8_6, sum8_2, upper4), 4u);
        let sum4_3 = select(sum8_3, sum8_7, upper4) + subgroupShuffleXor(select(sum8_7, sum8_3, upper4), 4u);
        let upper2 = (r & 2u) != 0u;
        let sum2_0 = select(sum4_0, sum4_2, upper2) + subgroupShuffleXor(select(sum4_2, sum4_0, upper2), 2u);
        let sum2_1 = select(sum4_1, sum4_3, upper2) + subgroupShuffleXor(select(sum4_3, sum4_1, upper2), 2u);
        let upper1 = (r & 1u) != 0u;
        let sum1_0 = select(sum2_0, sum2_1, upper1) + subgroupShuffleXor(select(sum2_1, sum2_0, upper1), 1u);
        // this lane's keys: chunk keys r * 1 + i; a key past the span scores MASKED, weighs 0
        let mine0 = k0 + g + (r * 1u + 0u) * GROUPS;
        let s0 = select(MASKED, final_score(sum1_0), mine0 < span.y);
        var chunk_max = s0;
        chunk_max = max(chunk_max, subgroupShuffleXor(chunk_max, 1u));
        chunk_max = max(chunk_max, subgroupShuffleXor(chunk_max, 2u));
        chunk_max = max(chunk_max, subgroupShuffleXor(chunk_max, 4u));
        chunk_max = max(chunk_max, subgroupShuffleXor(chunk_max, 8u));
        let m_new = max(m, chunk_max);
        let correction = exp(m - m_new);
        m = m_new;
        let p0 = select(0.0, exp(s0 - m_new), mine0 < span.y);
        l = l * correction + p0;
        // key k's weight from lane k / 1 of the group (its value p(k % 1))
        let group_first = lane - r;
        let w0 = subgroupShuffle(p0, group_first + 0u);
        let w1 = subgroupShuffle(p0, group_first + 1u);
        let w2 = subgroupShuffle(p0, group_first + 2u);
        let w3 = subgroupShuffle(p0, group_first + 3u);
        let w4 = subgroupShuffle(p0, group_first + 4u);
        let w5 = subgroupShuffle(p0, group_first + 5u);
        let w6 = subgroupShuffle(p0, group_first + 6u);
        let w7 = subgroupShuffle(p0, group_first + 7u);
        let w8 = subgroupShuffle(p0, group_first + 8u);
        let w9 = subgroupShuffle(p0, group_first + 9u);
        let w10 = subgroupShuffle(p0, group_first + 10u);
        let w11 = subgroupShuffle(p0, group_first + 11u);
        let w12 = subgroupShuffle(p0, group_first + 12u);
        let w13 = subgroupShuffle(p0, group_first + 13u);
        let w14 = subgroupShuffle(p0, group_first + 14u);
        let w15 = subgroupShuffle(p0, group_first + 15u);
        {
            acc[0] = acc[0] * correction + w0 * vec4<f32>(V[base0 + 0u]) + w1 * vec4<f32>(V[base1 + 0u]) + w2 * vec4<f32>(V[base2 + 0u]) + w3 * vec4<f32>(V[base3 + 0u]) + w4 * vec4<f32>(V[base4 + 0u]) + w5 * vec4<f32>(V[base5 + 0u]) + w6 * vec4<f32>(V[base6 + 0u]) + w7 * vec4<f32>(V[base7 + 0u]) + w8 * vec4<f32>(V[base8 + 0u]) + w9 * vec4<f32>(V[base9 + 0u]) + w10 * vec4<f32>(V[base10 + 0u]) + w11 * vec4<f32>(V[base11 + 0u]) + w12 * vec4<f32>(V[base12 + 0u]) + w13 * vec4<f32>(V[base13 + 0u]) + w14 * vec4<f32>(V[base14 + 0u]) + w15 * vec4<f32>(V[base15 + 0u]);
        }
        if (1u < used) {
            acc[1] = acc[1] * correction + w0 * vec4<f32>(V[base0 + 16u]) + w1 * vec4<f32>(V[base1 + 16u]) + w2 * vec4<f32>(V[base2 + 16u]) + w3 * vec4<f32>(V[base3 + 16u]) + w4 * vec4<f32>(V[base4 + 16u]) + w5 * vec4<f32>(V[base5 + 16u]) + w6 * vec4<f32>(V[base6 + 16u]) + w7 * vec4<f32>(V[base7 + 16u]) + w8 * vec4<f32>(V[base8 + 16u]) + w9 * vec4<f32>(V[base9 + 16u]) + w10 * vec4<f32>(V[base10 + 16u]) + w11 * vec4<f32>(V[base11 + 16u]) + w12 * vec4<f32>(V[base12 + 16u]) + w13 * vec4<f32>(V[base13 + 16u]) + w14 * vec4<f32>(V[base14 + 16u]) + w15 * vec4<f32>(V[base15 + 16u]);
        }
    }

    // each lane summed the weights of its own keys: the group's sum
    l = l + subgroupShuffleXor(l, 1u);
    l = l + subgroupShuffleXor(l, 2u);
    l = l + subgroupShuffleXor(l, 4u);
    l = l + subgroupShuffleXor(l, 8u);

    // merge the groups' (max, sum, acc): lane r of every group ends with the whole query's
    // (a group that saw no key has m = MASKED and l = acc = 0, and weighs 0)
    {
        let m_other = subgroupShuffleXor(m, 16u);
        let m_all = max(m, m_other);
        let mine = exp(m - m_all);
        let other = exp(m_other - m_all);
        l = l * mine + subgroupShuffleXor(l, 16u) * other;
        {
            acc[0] = acc[0] * mine + subgroupShuffleXor(acc[0], 16u) * other;
        }
        if (1u < used) {
            acc[1] = acc[1] * mine + subgroupShuffleXor(acc[1], 16u) * other;
        }
        m = m_all;
    }

    // A query whose every key is masked has l == 0 and writes zeros (masked_row = "zero");
    // NaN, built at run time, where the workgroup is not one subgroup numbered 0 .. WORKGROUP_SIZE - 1
    let inv_l = select(bitcast<f32>(0x7fc00000u | (subgroup_size & 0u)), select(0.0, 1.0 / l, l > 0.0), numbered);

    if (g == 0u) {
        if (r + 0u < hd4) {
            let out0 = acc[0] * inv_l;
            output[q_base + 4u * (r + 0u) + 0u] = out0[0];
            output[q_base + 4u * (r + 0u) + 1u] = out0[1];
            output[q_base + 4u * (r + 0u) + 2u] = out0[2];
            output[q_base + 4u * (r + 0u) + 3u] = out0[3];
        }
        if (r + 16u < hd4) {
            let out1 = acc[1] * inv_l;
            output[q_base + 4u * (r + 16u) + 0u] = out1[0];
            output[q_base + 4u * (r + 16u) + 1u] = out1[1];
            output[q_base + 4u * (r + 16u) + 2u] = out1[2];
            output[q_base + 4u * (r + 16u) + 3u] = out1[3];
        }
    }
}
