// AUTO-GENERATED from templates/attention_streaming.wgsl.j2 for variant attention_streaming_f16kv by doppler-gen - do not edit.
// Edit the template and variants.toml, then run `doppler-gen generate`.
// source-hash: sha256:1c9cd2cbd0a7c2a5fd050e4b0b00228057f5bd0206fad716aeab037418a740fc

// Streaming attention (no workgroup storage): Q f32, K/V f16, output f32
//
// One workgroup per (query, head); every invocation computes the query's scores and owns
// 16 head-dim columns of its output. All arithmetic is f32.

enable f16;

const MAX_HEAD_DIM: u32 = 512u;
const BLOCK_K: u32 = 8u;        // keys per online-softmax chunk
const TILE_D4: u32 = 4u;          // head-dim vec4 columns per invocation
const WORKGROUP_SIZE: u32 = 32u;

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
@group(0) @binding(2) var<storage, read> K: array<f16>;       // [seq_len, num_kv_heads, head_dim]
@group(0) @binding(3) var<storage, read> V: array<f16>;       // [seq_len, num_kv_heads, head_dim]
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

// Elements 4·d4 .. 4·d4 + 3 of the Q row at base (zeros past head_dim; branch-free: an
// index past the row reads a neighbour, or nothing under robust buffer access, and is discarded)
fn load_q4(base: u32, d4: u32) -> vec4<f32> {
    let d = d4 * 4u;
    let zero = f32(0.0);
    return vec4<f32>(
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
            output[base + d] = value[e];
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
    @builtin(num_workgroups) num_wg: vec3<u32>
) {
    // Workgroup w of query_len * num_heads, dispatched in one dimension or, past the device's
    // limit, folded into two (dispatch_fold): a folded grid's spare workgroups return here
    let w = wg_id.x + wg_id.y * num_wg.x;
    let head = w % u.num_heads;
    if (u.head_dim > MAX_HEAD_DIM || w / u.num_heads >= u.query_len) {
        return;
    }
    // Workgroup w runs query query_len - 1 - w / num_heads: under a causal mask the last queries
    // see the most keys, and starting them first shortens the tail of the dispatch
    let query = u.query_len - 1u - w / u.num_heads;
    let t = local_id.x;
    let kv_head = get_kv_head_idx(head);
    let d4_count = (u.head_dim + 3u) / 4u;
    let q_base = (query * u.num_heads + head) * u.head_dim;
    let span = visible_keys(query, 1u, get_kv_len());

    var m: f32 = -3.402823e+38;
    var l: f32 = 0.0;
    var acc: array<vec4<f32>, 4>;
    acc[0] = vec4<f32>();
    acc[1] = vec4<f32>();
    acc[2] = vec4<f32>();
    acc[3] = vec4<f32>();

    // chunks of BLOCK_K keys (loops over the chunk are unrolled here: constant register indices)
    for (var k0: u32 = span.x; k0 < span.y; k0 = k0 + BLOCK_K) {
        let last = min(BLOCK_K, span.y - k0) - 1u;  // keys past the span repeat the last one, p = 0
        let base0 = (get_kv_pos(k0 + min(0u, last)) * u.num_kv_heads + kv_head) * u.head_dim;
        let base1 = (get_kv_pos(k0 + min(1u, last)) * u.num_kv_heads + kv_head) * u.head_dim;
        let base2 = (get_kv_pos(k0 + min(2u, last)) * u.num_kv_heads + kv_head) * u.head_dim;
        let base3 = (get_kv_pos(k0 + min(3u, last)) * u.num_kv_heads + kv_head) * u.head_dim;
        let base4 = (get_kv_pos(k0 + min(4u, last)) * u.num_kv_heads + kv_head) * u.head_dim;
        let base5 = (get_kv_pos(k0 + min(5u, last)) * u.num_kv_heads + kv_head) * u.head_dim;
        let base6 = (get_kv_pos(k0 + min(6u, last)) * u.num_kv_heads + kv_head) * u.head_dim;
        let base7 = (get_kv_pos(k0 + min(7u, last)) * u.num_kv_heads + kv_head) * u.head_dim;
        var s: array<f32, 8>;
        s[0] = 0.0;
        s[1] = 0.0;
        s[2] = 0.0;
        s[3] = 0.0;
        s[4] = 0.0;
        s[5] = 0.0;
        s[6] = 0.0;
        s[7] = 0.0;
        for (var d4: u32 = 0u; d4 < d4_count; d4 = d4 + 1u) {
            let qv = vec4<f32>(load_q4(q_base, d4));
            s[0] = s[0] + dot(qv, vec4<f32>(load_k4(base0, d4)));
            s[1] = s[1] + dot(qv, vec4<f32>(load_k4(base1, d4)));
            s[2] = s[2] + dot(qv, vec4<f32>(load_k4(base2, d4)));
            s[3] = s[3] + dot(qv, vec4<f32>(load_k4(base3, d4)));
            s[4] = s[4] + dot(qv, vec4<f32>(load_k4(base4, d4)));
            s[5] = s[5] + dot(qv, vec4<f32>(load_k4(base5, d4)));
            s[6] = s[6] + dot(qv, vec4<f32>(load_k4(base6, d4)));
            s[7] = s[7] + dot(qv, vec4<f32>(load_k4(base7, d4)));
        }
        var chunk_max: f32 = -3.402823e+38;
        s[0] = final_score(s[0]);
        chunk_max = select(chunk_max, max(chunk_max, s[0]), 0u <= last);
        s[1] = final_score(s[1]);
        chunk_max = select(chunk_max, max(chunk_max, s[1]), 1u <= last);
        s[2] = final_score(s[2]);
        chunk_max = select(chunk_max, max(chunk_max, s[2]), 2u <= last);
        s[3] = final_score(s[3]);
        chunk_max = select(chunk_max, max(chunk_max, s[3]), 3u <= last);
        s[4] = final_score(s[4]);
        chunk_max = select(chunk_max, max(chunk_max, s[4]), 4u <= last);
        s[5] = final_score(s[5]);
        chunk_max = select(chunk_max, max(chunk_max, s[5]), 5u <= last);
        s[6] = final_score(s[6]);
        chunk_max = select(chunk_max, max(chunk_max, s[6]), 6u <= last);
        s[7] = final_score(s[7]);
        chunk_max = select(chunk_max, max(chunk_max, s[7]), 7u <= last);
        let m_new = max(m, chunk_max);
        let correction = exp(m - m_new);
        m = m_new;
        let p0 = select(0.0, exp(s[0] - m_new), 0u <= last);
        let p1 = select(0.0, exp(s[1] - m_new), 1u <= last);
        let p2 = select(0.0, exp(s[2] - m_new), 2u <= last);
        let p3 = select(0.0, exp(s[3] - m_new), 3u <= last);
        let p4 = select(0.0, exp(s[4] - m_new), 4u <= last);
        let p5 = select(0.0, exp(s[5] - m_new), 5u <= last);
        let p6 = select(0.0, exp(s[6] - m_new), 6u <= last);
        let p7 = select(0.0, exp(s[7] - m_new), 7u <= last);
        l = l * correction + p0 + p1 + p2 + p3 + p4 + p5 + p6 + p7;
        if (t + 0u * WORKGROUP_SIZE < d4_count) {
            let col = t + 0u * WORKGROUP_SIZE;
            var o = acc[0] * correction;
            o = o + p0 * vec4<f32>(load_v4(base0, col));
            o = o + p1 * vec4<f32>(load_v4(base1, col));
            o = o + p2 * vec4<f32>(load_v4(base2, col));
            o = o + p3 * vec4<f32>(load_v4(base3, col));
            o = o + p4 * vec4<f32>(load_v4(base4, col));
            o = o + p5 * vec4<f32>(load_v4(base5, col));
            o = o + p6 * vec4<f32>(load_v4(base6, col));
            o = o + p7 * vec4<f32>(load_v4(base7, col));
            acc[0] = o;
        }
        if (t + 1u * WORKGROUP_SIZE < d4_count) {
            let col = t + 1u * WORKGROUP_SIZE;
            var o = acc[1] * correction;
            o = o + p0 * vec4<f32>(load_v4(base0, col));
            o = o + p1 * vec4<f32>(load_v4(base1, col));
            o = o + p2 * vec4<f32>(load_v4(base2, col));
            o = o + p3 * vec4<f32>(load_v4(base3, col));
            o = o + p4 * vec4<f32>(load_v4(base4, col));
            o = o + p5 * vec4<f32>(load_v4(base5, col));
            o = o + p6 * vec4<f32>(load_v4(base6, col));
            o = o + p7 * vec4<f32>(load_v4(base7, col));
            acc[1] = o;
        }
        if (t + 2u * WORKGROUP_SIZE < d4_count) {
            let col = t + 2u * WORKGROUP_SIZE;
            var o = acc[2] * correction;
            o = o + p0 * vec4<f32>(load_v4(base0, col));
            o = o + p1 * vec4<f32>(load_v4(base1, col));
            o = o + p2 * vec4<f32>(load_v4(base2, col));
            o = o + p3 * vec4<f32>(load_v4(base3, col));
            o = o + p4 * vec4<f32>(load_v4(base4, col));
            o = o + p5 * vec4<f32>(load_v4(base5, col));
            o = o + p6 * vec4<f32>(load_v4(base6, col));
            o = o + p7 * vec4<f32>(load_v4(base7, col));
            acc[2] = o;
        }
        if (t + 3u * WORKGROUP_SIZE < d4_count) {
            let col = t + 3u * WORKGROUP_SIZE;
            var o = acc[3] * correction;
            o = o + p0 * vec4<f32>(load_v4(base0, col));
            o = o + p1 * vec4<f32>(load_v4(base1, col));
            o = o + p2 * vec4<f32>(load_v4(base2, col));
            o = o + p3 * vec4<f32>(load_v4(base3, col));
            o = o + p4 * vec4<f32>(load_v4(base4, col));
            o = o + p5 * vec4<f32>(load_v4(base5, col));
            o = o + p6 * vec4<f32>(load_v4(base6, col));
            o = o + p7 * vec4<f32>(load_v4(base7, col));
            acc[3] = o;
        }
    }

    // A query whose every key is masked has l == 0 and writes zeros (masked_row = "zero")
    let inv_l = select(0.0, 1.0 / l, l > 0.0);
    if (t + 0u * WORKGROUP_SIZE < d4_count) {
        store_out4(q_base, t + 0u * WORKGROUP_SIZE, acc[0] * inv_l);
    }
    if (t + 1u * WORKGROUP_SIZE < d4_count) {
        store_out4(q_base, t + 1u * WORKGROUP_SIZE, acc[1] * inv_l);
    }
    if (t + 2u * WORKGROUP_SIZE < d4_count) {
        store_out4(q_base, t + 2u * WORKGROUP_SIZE, acc[2] * inv_l);
    }
    if (t + 3u * WORKGROUP_SIZE < d4_count) {
        store_out4(q_base, t + 3u * WORKGROUP_SIZE, acc[3] * inv_l);
    }
}
