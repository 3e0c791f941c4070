// AUTO-GENERATED from templates/attention_streaming.wgsl.j2 for variant attention_streaming_sg_d128_f16 by doppler-gen - do not edit.
// Edit the template and variants.toml, then run `doppler-gen generate`.
// source-hash: sha256:91ae61da54416d37193b4cdaef803da0ba341f0c530a5742eb52d30eb0537d91

// Streaming attention (no workgroup storage): Q f16, K/V f16, output f16
//
// One workgroup (one subgroup) per (query, head) in 2 key group(s) of 16 lanes: lane r of a
// group owns head-dim elements r + j * 16 (j < 8) of Q, K, V and the output; a score is
// a shuffle sum over the group's lanes; the groups merge at the end. All arithmetic is f32.

enable f16;

enable subgroups;

const MAX_HEAD_DIM: u32 = 128u;
const BLOCK_K: u32 = 8u;        // keys per online-softmax chunk
const LANES_PER_KEY: u32 = 16u;    // lanes sharing a key's dot product (a key group)
const GROUPS: u32 = 2u;           // key groups (WORKGROUP_SIZE / LANES_PER_KEY), each its own keys
const DIMS_PER_LANE: u32 = 8u;    // head-dim elements per lane (MAX_HEAD_DIM / LANES_PER_KEY)
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
@group(0) @binding(1) var<storage, read> Q: array<f16>;       // [query_len, num_heads, head_dim]
@group(0) @binding(2) var<storage, read> K: array<f16>;       // [seq_len, num_kv_heads, head_dim]
@group(0) @binding(3) var<storage, read> V: array<f16>;       // [seq_len, num_kv_heads, head_dim]
@group(0) @binding(4) var<storage, read_write> output: array<f16>; // [query_len, num_heads, head_dim]
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

// Elements 4·d4 .. 4·d4 + 3 of the Q row at base (zeros past head_dim; branch-free: an
// index past the row reads a neighbour, or nothing under robust buffer access, and is discarded)
fn load_q4(base: u32, d4: u32) -> vec4<f16> {
    let d = d4 * 4u;
    let zero = f16(0.0);
    return vec4<f16>(
        select(zero, Q[base + d], d < u.head_dim),
        select(zero, Q[base + d + 1u], d + 1u < u.head_dim),
        select(zero, Q[base + d + 2u], d + 2u < u.head_dim),
        select(zero, Q[base + d + 3u], d + 3u < u.head_dim),
    );
}

// Elements 4·d4 .. 4·d4 + 3 of the K row at base (zeros past head_dim; branch-free: an
// index past the row reads a neighbour, or nothing under robust buffer access, and is discarded)
fn load_k4(base: u32, d4: u32) -> vec4<f16> {
    let d = d4 * 4u;
    let zero = f16(0.0);
    return vec4<f16>(
        select(zero, K[base + d], d < u.head_dim),
        select(zero, K[base + d + 1u], d + 1u < u.head_dim),
        select(zero, K[base + d + 2u], d + 2u < u.head_dim),
        select(zero, K[base + d + 3u], d + 3u < u.head_dim),
    );
}

// Elements 4·d4 .. 4·d4 + 3 of the V row at base (zeros past head_dim; branch-free: an
// index past the row reads a neighbour, or nothing under robust buffer access, and is discarded)
fn load_v4(base: u32, d4: u32) -> vec4<f16> {
    let d = d4 * 4u;
    let zero = f16(0.0);
    return vec4<f16>(
        select(zero, V[base + d], d < u.head_dim),
        select(zero, V[base + d + 1u], d + 1u < u.head_dim),
        select(zero, V[base + d + 2u], d + 2u < u.head_dim),
        select(zero, V[base + d + 3u], d + 3u < u.head_dim),
    );
}

// Store elements 4·d4 .. 4·d4 + 3 of the output row at base (none past head_dim)
fn store_out4(base: u32, d4: u32, value: vec4<f32>) {
    for (var e: u32 = 0u; e < 4u; e = e + 1u) {
        let d = d4 * 4u + e;
        if (d < u.head_dim) {
            output[base + d] = f16(value[e]);
        }
    }
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
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) subgroup_size: u32
) {
    let head = wg_id.x % u.num_heads;
    if (u.head_dim > MAX_HEAD_DIM || wg_id.x / u.num_heads >= u.query_len) {
        return;
    }
    // Workgroup w runs query query_len - 1 - w / num_heads: under a causal mask the last queries
    // see the most keys, and starting them first shortens the tail of the dispatch
    let query = u.query_len - 1u - wg_id.x / u.num_heads;
    let t = local_id.x;
    let kv_head = get_kv_head_idx(head);
    let d4_count = (u.head_dim + 3u) / 4u;
    let q_base = (query * u.num_heads + head) * u.head_dim;
    let span = visible_keys(query, 1u, get_kv_len());

    var m: f32 = -3.402823e+38;
    var l: f32 = 0.0;
    // The workgroup must be one subgroup with lanes 0 .. WORKGROUP_SIZE - 1 (else NaN is stored)
    let numbered = (subgroupAdd(1u) == WORKGROUP_SIZE) & (subgroupMax(lane) + 1u == WORKGROUP_SIZE);
    // Key group g = t / LANES_PER_KEY; lane r = t % LANES_PER_KEY owns elements r + j * LANES_PER_KEY
    // of Q (zeros past head_dim), of its group's K/V rows and of the output
    let g = t / LANES_PER_KEY;
    let r = t - g * LANES_PER_KEY;
    let used = (u.head_dim + LANES_PER_KEY - 1u) / LANES_PER_KEY;  // elements per lane in use (uniform)
    var q: array<f32, DIMS_PER_LANE>;
    var acc: array<f32, DIMS_PER_LANE>;
    q[0] = select(0.0, f32(Q[q_base + r + 0u]), r + 0u < u.head_dim);
    acc[0] = 0.0;
    q[1] = select(0.0, f32(Q[q_base + r + 16u]), r + 16u < u.head_dim);
    acc[1] = 0.0;
    q[2] = select(0.0, f32(Q[q_base + r + 32u]), r + 32u < u.head_dim);
    acc[2] = 0.0;
    q[3] = select(0.0, f32(Q[q_base + r + 48u]), r + 48u < u.head_dim);
    acc[3] = 0.0;
    q[4] = select(0.0, f32(Q[q_base + r + 64u]), r + 64u < u.head_dim);
    acc[4] = 0.0;
    q[5] = select(0.0, f32(Q[q_base + r + 80u]), r + 80u < u.head_dim);
    acc[5] = 0.0;
    q[6] = select(0.0, f32(Q[q_base + r + 96u]), r + 96u < u.head_dim);
    acc[6] = 0.0;
    q[7] = select(0.0, f32(Q[q_base + r + 112u]), r + 112u < u.head_dim);
    acc[7] = 0.0;

    // chunks of GROUPS * BLOCK_K keys: group g scores keys k0 + g + k * GROUPS (k < BLOCK_K,
    // unrolled) with its own online softmax; the groups merge once, at the end
    for (var k0: u32 = span.x; k0 < span.y; k0 = k0 + GROUPS * BLOCK_K) {
        let key0 = k0 + g + 0u;
        let base0 = (get_kv_pos(min(key0, span.y - 1u)) * u.num_kv_heads + kv_head) * u.head_dim + r;
        var dot0: f32 = 0.0;
        let key1 = k0 + g + 2u;
        let base1 = (get_kv_pos(min(key1, span.y - 1u)) * u.num_kv_heads + kv_head) * u.head_dim + r;
        var dot1: f32 = 0.0;
        let key2 = k0 + g + 4u;
        let base2 = (get_kv_pos(min(key2, span.y - 1u)) * u.num_kv_heads + kv_head) * u.head_dim + r;
        var dot2: f32 = 0.0;
        let key3 = k0 + g + 6u;
        let base3 = (get_kv_pos(min(key3, span.y - 1u)) * u.num_kv_heads + kv_head) * u.head_dim + r;
        var dot3: f32 = 0.0;
        let key4 = k0 + g + 8u;
        let base4 = (get_kv_pos(min(key4, span.y - 1u)) * u.num_kv_heads + kv_head) * u.head_dim + r;
        var dot4: f32 = 0.0;
        let key5 = k0 + g + 10u;
        let base5 = (get_kv_pos(min(key5, span.y - 1u)) * u.num_kv_heads + kv_head) * u.head_dim + r;
        var dot5: f32 = 0.0;
        let key6 = k0 + g + 12u;
        let base6 = (get_kv_pos(min(key6, span.y - 1u)) * u.num_kv_heads + kv_head) * u.head_dim + r;
        var dot6: f32 = 0.0;
        let key7 = k0 + g + 14u;
        let base7 = (get_kv_pos(min(key7, span.y - 1u)) * u.num_kv_heads + kv_head) * u.head_dim + r;
        var dot7: f32 = 0.0;
        {
            dot0 = dot0 + q[0] * select(0.0, f32(K[base0 + 0u]), r + 0u < u.head_dim);
            dot1 = dot1 + q[0] * select(0.0, f32(K[base1 + 0u]), r + 0u < u.head_dim);
            dot2 = dot2 + q[0] * select(0.0, f32(K[base2 + 0u]), r + 0u < u.head_dim);
            dot3 = dot3 + q[0] * select(0.0, f32(K[base3 + 0u]), r + 0u < u.head_dim);
            dot4 = dot4 + q[0] * select(0.0, f32(K[base4 + 0u]), r + 0u < u.head_dim);
            dot5 = dot5 + q[0] * select(0.0, f32(K[base5 + 0u]), r + 0u < u.head_dim);
            dot6 = dot6 + q[0] * select(0.0, f32(K[base6 + 0u]), r + 0u < u.head_dim);
            dot7 = dot7 + q[0] * select(0.0, f32(K[base7 + 0u]), r + 0u < u.head_dim);
        }
        if (1u < used) {
            dot0 = dot0 + q[1] * select(0.0, f32(K[base0 + 16u]), r + 16u < u.head_dim);
            dot1 = dot1 + q[1] * select(0.0, f32(K[base1 + 16u]), r + 16u < u.head_dim);
            dot2 = dot2 + q[1] * select(0.0, f32(K[base2 + 16u]), r + 16u < u.head_dim);
            dot3 = dot3 + q[1] * select(0.0, f32(K[base3 + 16u]), r + 16u < u.head_dim);
            dot4 = dot4 + q[1] * select(0.0, f32(K[base4 + 16u]), r + 16u < u.head_dim);
            dot5 = dot5 + q[1] * select(0.0, f32(K[base5 + 16u]), r + 16u < u.head_dim);
            dot6 = dot6 + q[1] * select(0.0, f32(K[base6 + 16u]), r + 16u < u.head_dim);
            dot7 = dot7 + q[1] * select(0.0, f32(K[base7 + 16u]), r + 16u < u.head_dim);
        }
        if (2u < used) {
            dot0 = dot0 + q[2] * select(0.0, f32(K[base0 + 32u]), r + 32u < u.head_dim);
            dot1 = dot1 + q[2] * select(0.0, f32(K[base1 + 32u]), r + 32u < u.head_dim);
            dot2 = dot2 + q[2] * select(0.0, f32(K[base2 + 32u]), r + 32u < u.head_dim);
            dot3 = dot3 + q[2] * select(0.0, f32(K[base3 + 32u]), r + 32u < u.head_dim);
            dot4 = dot4 + q[2] * select(0.0, f32(K[base4 + 32u]), r + 32u < u.head_dim);
            dot5 = dot5 + q[2] * select(0.0, f32(K[base5 + 32u]), r + 32u < u.head_dim);
            dot6 = dot6 + q[2] * select(0.0, f32(K[base6 + 32u]), r + 32u < u.head_dim);
            dot7 = dot7 + q[2] * select(0.0, f32(K[base7 + 32u]), r + 32u < u.head_dim);
        }
        if (3u < used) {
            dot0 = dot0 + q[3] * select(0.0, f32(K[base0 + 48u]), r + 48u < u.head_dim);
            dot1 = dot1 + q[3] * select(0.0, f32(K[base1 + 48u]), r + 48u < u.head_dim);
            dot2 = dot2 + q[3] * select(0.0, f32(K[base2 + 48u]), r + 48u < u.head_dim);
            dot3 = dot3 + q[3] * select(0.0, f32(K[base3 + 48u]), r + 48u < u.head_dim);
            dot4 = dot4 + q[3] * select(0.0, f32(K[base4 + 48u]), r + 48u < u.head_dim);
            dot5 = dot5 + q[3] * select(0.0, f32(K[base5 + 48u]), r + 48u < u.head_dim);
            dot6 = dot6 + q[3] * select(0.0, f32(K[base6 + 48u]), r + 48u < u.head_dim);
            dot7 = dot7 + q[3] * select(0.0, f32(K[base7 + 48u]), r + 48u < u.head_dim);
        }
        if (4u < used) {
            dot0 = dot0 + q[4] * select(0.0, f32(K[base0 + 64u]), r + 64u < u.head_dim);
            dot1 = dot1 + q[4] * select(0.0, f32(K[base1 + 64u]), r + 64u < u.head_dim);
            dot2 = dot2 + q[4] * select(0.0, f32(K[base2 + 64u]), r + 64u < u.head_dim);
            dot3 = dot3 + q[4] * select(0.0, f32(K[base3 + 64u]), r + 64u < u.head_dim);
            dot4 = dot4 + q[4] * select(0.0, f32(K[base4 + 64u]), r + 64u < u.head_dim);
            dot5 = dot5 + q[4] * select(0.0, f32(K[base5 + 64u]), r + 64u < u.head_dim);
            dot6 = dot6 + q[4] * select(0.0, f32(K[base6 + 64u]), r + 64u < u.head_dim);
            dot7 = dot7 + q[4] * select(0.0, f32(K[base7 + 64u]), r + 64u < u.head_dim);
        }
        if (5u < used) {
            dot0 = dot0 + q[5] * select(0.0, f32(K[base0 + 80u]), r + 80u < u.head_dim);
            dot1 = dot1 + q[5] * select(0.0, f32(K[base1 + 80u]), r + 80u < u.head_dim);
            dot2 = dot2 + q[5] * select(0.0, f32(K[base2 + 80u]), r + 80u < u.head_dim);
            dot3 = dot3 + q[5] * select(0.0, f32(K[base3 + 80u]), r + 80u < u.head_dim);
            dot4 = dot4 + q[5] * select(0.0, f32(K[base4 + 80u]), r + 80u < u.head_dim);
            dot5 = dot5 + q[5] * select(0.0, f32(K[base5 + 80u]), r + 80u < u.head_dim);
            dot6 = dot6 + q[5] * select(0.0, f32(K[base6 + 80u]), r + 80u < u.head_dim);
            dot7 = dot7 + q[5] * select(0.0, f32(K[base7 + 80u]), r + 80u < u.head_dim);
        }
        if (6u < used) {
            dot0 = dot0 + q[6] * select(0.0, f32(K[base0 + 96u]), r + 96u < u.head_dim);
            dot1 = dot1 + q[6] * select(0.0, f32(K[base1 + 96u]), r + 96u < u.head_dim);
            dot2 = dot2 + q[6] * select(0.0, f32(K[base2 + 96u]), r + 96u < u.head_dim);
            dot3 = dot3 + q[6] * select(0.0, f32(K[base3 + 96u]), r + 96u < u.head_dim);
            dot4 = dot4 + q[6] * select(0.0, f32(K[base4 + 96u]), r + 96u < u.head_dim);
            dot5 = dot5 + q[6] * select(0.0, f32(K[base5 + 96u]), r + 96u < u.head_dim);
            dot6 = dot6 + q[6] * select(0.0, f32(K[base6 + 96u]), r + 96u < u.head_dim);
            dot7 = dot7 + q[6] * select(0.0, f32(K[base7 + 96u]), r + 96u < u.head_dim);
        }
        if (7u < used) {
            dot0 = dot0 + q[7] * select(0.0, f32(K[base0 + 112u]), r + 112u < u.head_dim);
            dot1 = dot1 + q[7] * select(0.0, f32(K[base1 + 112u]), r + 112u < u.head_dim);
            dot2 = dot2 + q[7] * select(0.0, f32(K[base2 + 112u]), r + 112u < u.head_dim);
            dot3 = dot3 + q[7] * select(0.0, f32(K[base3 + 112u]), r + 112u < u.head_dim);
            dot4 = dot4 + q[7] * select(0.0, f32(K[base4 + 112u]), r + 112u < u.head_dim);
            dot5 = dot5 + q[7] * select(0.0, f32(K[base5 + 112u]), r + 112u < u.head_dim);
            dot6 = dot6 + q[7] * select(0.0, f32(K[base6 + 112u]), r + 112u < u.head_dim);
            dot7 = dot7 + q[7] * select(0.0, f32(K[base7 + 112u]), r + 112u < u.head_dim);
        }
        // (an element past head_dim reads a neighbour, or nothing under robust buffer access, and
        // is discarded); a key's dot product is the sum over its group's lanes
        dot0 = dot0 + subgroupShuffleXor(dot0, 1u);
        dot1 = dot1 + subgroupShuffleXor(dot1, 1u);
        dot2 = dot2 + subgroupShuffleXor(dot2, 1u);
        dot3 = dot3 + subgroupShuffleXor(dot3, 1u);
        dot4 = dot4 + subgroupShuffleXor(dot4, 1u);
        dot5 = dot5 + subgroupShuffleXor(dot5, 1u);
        dot6 = dot6 + subgroupShuffleXor(dot6, 1u);
        dot7 = dot7 + subgroupShuffleXor(dot7, 1u);
        dot0 = dot0 + subgroupShuffleXor(dot0, 2u);
        dot1 = dot1 + subgroupShuffleXor(dot1, 2u);
        dot2 = dot2 + subgroupShuffleXor(dot2, 2u);
        dot3 = dot3 + subgroupShuffleXor(dot3, 2u);
        dot4 = dot4 + subgroupShuffleXor(dot4, 2u);
        dot5 = dot5 + subgroupShuffleXor(dot5, 2u);
        dot6 = dot6 + subgroupShuffleXor(dot6, 2u);
        dot7 = dot7 + subgroupShuffleXor(dot7, 2u);
        dot0 = dot0 + subgroupShuffleXor(dot0, 4u);
        dot1 = dot1 + subgroupShuffleXor(dot1, 4u);
        dot2 = dot2 + subgroupShuffleXor(dot2, 4u);
        dot3 = dot3 + subgroupShuffleXor(dot3, 4u);
        dot4 = dot4 + subgroupShuffleXor(dot4, 4u);
        dot5 = dot5 + subgroupShuffleXor(dot5, 4u);
        dot6 = dot6 + subgroupShuffleXor(dot6, 4u);
        dot7 = dot7 + subgroupShuffleXor(dot7, 4u);
        dot0 = dot0 + subgroupShuffleXor(dot0, 8u);
        dot1 = dot1 + subgroupShuffleXor(dot1, 8u);
        dot2 = dot2 + subgroupShuffleXor(dot2, 8u);
        dot3 = dot3 + subgroupShuffleXor(dot3, 8u);
        dot4 = dot4 + subgroupShuffleXor(dot4, 8u);
        dot5 = dot5 + subgroupShuffleXor(dot5, 8u);
        dot6 = dot6 + subgroupShuffleXor(dot6, 8u);
        dot7 = dot7 + subgroupShuffleXor(dot7, 8u);
        // keys past the span score MASKED and weigh 0 (their rows repeat the last key's)
        let s0 = select(MASKED, final_score(dot0), key0 < span.y);
        let s1 = select(MASKED, final_score(dot1), key1 < span.y);
        let s2 = select(MASKED, final_score(dot2), key2 < span.y);
        let s3 = select(MASKED, final_score(dot3), key3 < span.y);
        let s4 = select(MASKED, final_score(dot4), key4 < span.y);
        let s5 = select(MASKED, final_score(dot5), key5 < span.y);
        let s6 = select(MASKED, final_score(dot6), key6 < span.y);
        let s7 = select(MASKED, final_score(dot7), key7 < span.y);
        let m_new = max(m, max(max(max(max(max(max(max(s0, s1), s2), s3), s4), s5), s6), s7));
        let correction = exp(m - m_new);
        m = m_new;
        let p0 = select(0.0, exp(s0 - m_new), key0 < span.y);
        let p1 = select(0.0, exp(s1 - m_new), key1 < span.y);
        let p2 = select(0.0, exp(s2 - m_new), key2 < span.y);
        let p3 = select(0.0, exp(s3 - m_new), key3 < span.y);
        let p4 = select(0.0, exp(s4 - m_new), key4 < span.y);
        let p5 = select(0.0, exp(s5 - m_new), key5 < span.y);
        let p6 = select(0.0, exp(s6 - m_new), key6 < span.y);
        let p7 = select(0.0, exp(s7 - m_new), key7 < span.y);
        l = l * correction + p0 + p1 + p2 + p3 + p4 + p5 + p6 + p7;
        {
            acc[0] = acc[0] * correction + p0 * f32(V[base0 + 0u]) + p1 * f32(V[base1 + 0u]) + p2 * f32(V[base2 + 0u]) + p3 * f32(V[base3 + 0u]) + p4 * f32(V[base4 + 0u]) + p5 * f32(V[base5 + 0u]) + p6 * f32(V[base6 + 0u]) + p7 * f32(V[base7 + 0u]);
        }
        if (1u < used) {
            acc[1] = acc[1] * correction + p0 * f32(V[base0 + 16u]) + p1 * f32(V[base1 + 16u]) + p2 * f32(V[base2 + 16u]) + p3 * f32(V[base3 + 16u]) + p4 * f32(V[base4 + 16u]) + p5 * f32(V[base5 + 16u]) + p6 * f32(V[base6 + 16u]) + p7 * f32(V[base7 + 16u]);
        }
        if (2u < used) {
            acc[2] = acc[2] * correction + p0 * f32(V[base0 + 32u]) + p1 * f32(V[base1 + 32u]) + p2 * f32(V[base2 + 32u]) + p3 * f32(V[base3 + 32u]) + p4 * f32(V[base4 + 32u]) + p5 * f32(V[base5 + 32u]) + p6 * f32(V[base6 + 32u]) + p7 * f32(V[base7 + 32u]);
        }
        if (3u < used) {
            acc[3] = acc[3] * correction + p0 * f32(V[base0 + 48u]) + p1 * f32(V[base1 + 48u]) + p2 * f32(V[base2 + 48u]) + p3 * f32(V[base3 + 48u]) + p4 * f32(V[base4 + 48u]) + p5 * f32(V[base5 + 48u]) + p6 * f32(V[base6 + 48u]) + p7 * f32(V[base7 + 48u]);
        }
        if (4u < used) {
            acc[4] = acc[4] * correction + p0 * f32(V[base0 + 64u]) + p1 * f32(V[base1 + 64u]) + p2 * f32(V[base2 + 64u]) + p3 * f32(V[base3 + 64u]) + p4 * f32(V[base4 + 64u]) + p5 * f32(V[base5 + 64u]) + p6 * f32(V[base6 + 64u]) + p7 * f32(V[base7 + 64u]);
        }
        if (5u < used) {
            acc[5] = acc[5] * correction + p0 * f32(V[base0 + 80u]) + p1 * f32(V[base1 + 80u]) + p2 * f32(V[base2 + 80u]) + p3 * f32(V[base3 + 80u]) + p4 * f32(V[base4 + 80u]) + p5 * f32(V[base5 + 80u]) + p6 * f32(V[base6 + 80u]) + p7 * f32(V[base7 + 80u]);
        }
        if (6u < used) {
            acc[6] = acc[6] * correction + p0 * f32(V[base0 + 96u]) + p1 * f32(V[base1 + 96u]) + p2 * f32(V[base2 + 96u]) + p3 * f32(V[base3 + 96u]) + p4 * f32(V[base4 + 96u]) + p5 * f32(V[base5 + 96u]) + p6 * f32(V[base6 + 96u]) + p7 * f32(V[base7 + 96u]);
        }
        if (7u < used) {
            acc[7] = acc[7] * correction + p0 * f32(V[base0 + 112u]) + p1 * f32(V[base1 + 112u]) + p2 * f32(V[base2 + 112u]) + p3 * f32(V[base3 + 112u]) + p4 * f32(V[base4 + 112u]) + p5 * f32(V[base5 + 112u]) + p6 * f32(V[base6 + 112u]) + p7 * f32(V[base7 + 112u]);
        }
    }

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
        if (2u < used) {
            acc[2] = acc[2] * mine + subgroupShuffleXor(acc[2], 16u) * other;
        }
        if (3u < used) {
            acc[3] = acc[3] * mine + subgroupShuffleXor(acc[3], 16u) * other;
        }
        if (4u < used) {
            acc[4] = acc[4] * mine + subgroupShuffleXor(acc[4], 16u) * other;
        }
        if (5u < used) {
            acc[5] = acc[5] * mine + subgroupShuffleXor(acc[5], 16u) * other;
        }
        if (6u < used) {
            acc[6] = acc[6] * mine + subgroupShuffleXor(acc[6], 16u) * other;
        }
        if (7u < used) {
            acc[7] = acc[7] * mine + subgroupShuffleXor(acc[7], 16u) * other;
        }
        m = m_all;
    }

    // A query whose every key is masked has l == 0 and writes zeros (masked_row = "zero");
    // NaN, built at run time, where the workgroup is not one subgroup numbered 0 .. WORKGROUP_SIZE - 1
    let inv_l = select(bitcast<f32>(0x7fc00000u | (subgroup_size & 0u)), select(0.0, 1.0 / l, l > 0.0), numbered);

    if (g == 0u) {
        if (r + 0u < u.head_dim) {
            output[q_base + r + 0u] = f16(acc[0] * inv_l);
        }
        if (r + 16u < u.head_dim) {
            output[q_base + r + 16u] = f16(acc[1] * inv_l);
        }
        if (r + 32u < u.head_dim) {
            output[q_base + r + 32u] = f16(acc[2] * inv_l);
        }
        if (r + 48u < u.head_dim) {
            output[q_base + r + 48u] = f16(acc[3] * inv_l);
        }
        if (r + 64u < u.head_dim) {
            output[q_base + r + 64u] = f16(acc[4] * inv_l);
        }
        if (r + 80u < u.head_dim) {
            output[q_base + r + 80u] = f16(acc[5] * inv_l);
        }
        if (r + 96u < u.head_dim) {
            output[q_base + r + 96u] = f16(acc[6] * inv_l);
        }
        if (r + 112u < u.head_dim) {
            output[q_base + r + 112u] = f16(acc[7] * inv_l);
        }
    }
}
