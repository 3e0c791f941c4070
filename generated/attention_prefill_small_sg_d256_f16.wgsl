// AUTO-GENERATED from templates/attention_prefill.wgsl.j2 for variant attention_prefill_small_sg_d256_f16 by doppler-gen - do not edit.
// Edit the template and variants.toml, then run `doppler-gen generate`.
// source-hash: sha256:568b587d8faab937436ea3940cd8598087dc5a9f998ac89bce0d8d4180ecd4b5

// Flash-attention style prefill: Q f16, K/V f16, output f16
//
// One workgroup per (query block, head); K/V tiles in workgroup memory (f16), register
// micro-tiles of 2 queries x 4 keys (S) and 2 queries x 64 dims (O).
// All arithmetic is f32; other dtypes appear only in storage.

enable f16;

enable subgroups;

const MAX_HEAD_DIM: u32 = 256u;
const MAX_BLOCK_Q: u32 = 64u;    // rows of the Q / P tiles
const BLOCK_K: u32 = 16u;        // keys per KV tile
const TILE_Q: u32 = 2u;          // queries per invocation
const TILE_K: u32 = 4u;          // keys per invocation (strided by COLS)
const COLS: u32 = 4u;             // invocations sharing a query group
const TILE_D4: u32 = 16u;          // head-dim vec4 columns per invocation (strided by COLS)
const ROW4: u32 = 65u;            // vec4s per Q/K/V tile row (padded against bank conflicts)
const WORKGROUP_SIZE: u32 = 128u;
const MASKED: f32 = -3.402823e+38;
const MIN_SUBGROUP_SIZE: u32 = 4u;  // a query group's COLS lanes share a subgroup; narrower ones store NaN

// Queries per workgroup as the host dispatches them (a smaller value than MAX_BLOCK_Q leaves tile
// rows idle and stays correct; a larger one makes the kernel return without writing)
override BLOCK_Q: u32 = 64u;

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
@group(0) @binding(2) var<storage, read> K: array<vec4<f16>>;       // [seq_len, num_kv_heads, head_dim / 4]
@group(0) @binding(3) var<storage, read> V: array<vec4<f16>>;       // [seq_len, num_kv_heads, head_dim / 4]
@group(0) @binding(4) var<storage, read_write> output: array<f16>; // [query_len, num_heads, head_dim]
@group(0) @binding(5) var<storage, read> kv_len_buffer: array<u32>;
@group(0) @binding(6) var<storage, read> page_table: array<u32>;

var<workgroup> tile_kv: array<vec4<f16>, 1040>;     // [BLOCK_K][ROW4], K then V
var<workgroup> tile_p: array<vec4<f16>, 256>;      // [MAX_BLOCK_Q][BLOCK_K / 4]

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

// Does any (query, key) of queries q0 .. q0 + q_count - 1 x keys k0 .. k0 + BLOCK_K - 1 need a mask?
fn tile_needs_mask(q0: u32, q_count: u32, k0: u32, kv_len: u32) -> bool {
    if (k0 + BLOCK_K > kv_len) {
        return true;
    }
    let first_abs = q0 + u.start_pos;
    let last_abs = first_abs + q_count - 1u;
    if (u.is_causal != 0u && u.kv_start + k0 + BLOCK_K - 1u > first_abs) {
        return true;
    }
    if (u.sliding_window > 0u && last_abs >= u.sliding_window) {
        if (u.kv_start + k0 < last_abs - u.sliding_window + 1u) {
            return true;
        }
    }
    return false;
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

// Elements 4·d4 .. 4·d4 + 3 of the K row at base (one vec4 load: head_dim is a multiple of 4)
fn load_k4(base: u32, d4: u32) -> vec4<f16> {
    return K[base / 4u + d4];
}

// Elements 4·d4 .. 4·d4 + 3 of the V row at base (one vec4 load: head_dim is a multiple of 4)
fn load_v4(base: u32, d4: u32) -> vec4<f16> {
    return V[base / 4u + d4];
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

// Element idx (row idx / ROW4, vec4 column idx % ROW4) of the K or V tile starting at key k0
// (zeros past the tile, the KV end and head_dim)
fn kv_element(is_v: bool, idx: u32, k0: u32, kv_len: u32, kv_head: u32, d4_count: u32) -> vec4<f16> {
    let r = idx / ROW4;
    let d4 = idx - r * ROW4;
    let key = k0 + r;
    var value = vec4<f16>();
    if (idx < BLOCK_K * ROW4 && key < kv_len && d4 < d4_count) {
        let base = (get_kv_pos(key) * u.num_kv_heads + kv_head) * u.head_dim;
        if (is_v) {
            value = load_v4(base, d4);
        } else {
            value = load_k4(base, d4);
        }
    }
    return value;
}

// Query tile row r, head-dim vec4 d4, as f32
fn q_vec(q0: u32, r: u32, d4: u32, head: u32) -> vec4<f32> {
    let query = q0 + r;
    if (query >= u.query_len || r >= BLOCK_Q) {
        return vec4<f32>();
    }
    return vec4<f32>(load_q4((query * u.num_heads + head) * u.head_dim, d4));
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
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32
) {
    // Workgroup w of ceil(query_len / BLOCK_Q) * num_heads, dispatched in one dimension or, past
    // the device's limit, folded into two (dispatch_fold): a folded grid's spares return below
    let w = wg_id.x + wg_id.y * num_wg.x;
    let head = w % u.num_heads;
    let blocks = (u.query_len + BLOCK_Q - 1u) / BLOCK_Q;
    let block = w / u.num_heads;
    // a head_dim over MAX_HEAD_DIM or not a multiple of 4, or a host-set BLOCK_Q over the tile rows, returns unwritten
    if (u.head_dim > MAX_HEAD_DIM || BLOCK_Q > MAX_BLOCK_Q || block >= blocks || u.head_dim % 4u != 0u) {
        return;
    }
    // Workgroup w runs query block blocks - 1 - w / num_heads: under a causal mask the last
    // blocks see the most keys, and starting them first shortens the tail of the dispatch
    let q0 = (blocks - 1u - block) * BLOCK_Q;   // first query of this workgroup
    let t = local_id.x;
    let a = t / COLS;      // query group: tile rows a * TILE_Q ..
    let c = t - a * COLS;  // key column / head-dim column
    let kv_head = get_kv_head_idx(head);
    let kv_len = get_kv_len();
    let d4_count = (u.head_dim + 3u) / 4u;
    let q_count = min(BLOCK_Q, u.query_len - q0);

    // KV tiles any query of this block can see; a tile that is not fully visible to every query
    // of the block is masked element by element
    let span = visible_keys(q0, q_count, kv_len);
    let first_tile = span.x / BLOCK_K;
    let end_tile = (span.y + BLOCK_K - 1u) / BLOCK_K;

    // Register micro-tiles (loops over them are unrolled here so every index is a constant)
    var m: array<f32, 2>;    // running row max (identical across a query group)
    var l: array<f32, 2>;    // this invocation's share of the row sum
    var acc: array<vec4<f32>, 32>;  // [TILE_Q][TILE_D4]: head-dim vec4 columns c + j * COLS
    m[0] = MASKED;
    l[0] = 0.0;
    acc[0] = vec4<f32>();
    acc[1] = vec4<f32>();
    acc[2] = vec4<f32>();
    acc[3] = vec4<f32>();
    acc[4] = vec4<f32>();
    acc[5] = vec4<f32>();
    acc[6] = vec4<f32>();
    acc[7] = vec4<f32>();
    acc[8] = vec4<f32>();
    acc[9] = vec4<f32>();
    acc[10] = vec4<f32>();
    acc[11] = vec4<f32>();
    acc[12] = vec4<f32>();
    acc[13] = vec4<f32>();
    acc[14] = vec4<f32>();
    acc[15] = vec4<f32>();
    m[1] = MASKED;
    l[1] = 0.0;
    acc[16] = vec4<f32>();
    acc[17] = vec4<f32>();
    acc[18] = vec4<f32>();
    acc[19] = vec4<f32>();
    acc[20] = vec4<f32>();
    acc[21] = vec4<f32>();
    acc[22] = vec4<f32>();
    acc[23] = vec4<f32>();
    acc[24] = vec4<f32>();
    acc[25] = vec4<f32>();
    acc[26] = vec4<f32>();
    acc[27] = vec4<f32>();
    acc[28] = vec4<f32>();
    acc[29] = vec4<f32>();
    acc[30] = vec4<f32>();
    acc[31] = vec4<f32>();

    // K/V tiles are prefetched into registers one phase ahead: the global loads of the next
    // tile are in flight while this one is computed
    var pre: array<vec4<f16>, 9>;
    pre[0] = kv_element(false, t + 0u * WORKGROUP_SIZE, first_tile * BLOCK_K, kv_len, kv_head, d4_count);
    pre[1] = kv_element(false, t + 1u * WORKGROUP_SIZE, first_tile * BLOCK_K, kv_len, kv_head, d4_count);
    pre[2] = kv_element(false, t + 2u * WORKGROUP_SIZE, first_tile * BLOCK_K, kv_len, kv_head, d4_count);
    pre[3] = kv_element(false, t + 3u * WORKGROUP_SIZE, first_tile * BLOCK_K, kv_len, kv_head, d4_count);
    pre[4] = kv_element(false, t + 4u * WORKGROUP_SIZE, first_tile * BLOCK_K, kv_len, kv_head, d4_count);
    pre[5] = kv_element(false, t + 5u * WORKGROUP_SIZE, first_tile * BLOCK_K, kv_len, kv_head, d4_count);
    pre[6] = kv_element(false, t + 6u * WORKGROUP_SIZE, first_tile * BLOCK_K, kv_len, kv_head, d4_count);
    pre[7] = kv_element(false, t + 7u * WORKGROUP_SIZE, first_tile * BLOCK_K, kv_len, kv_head, d4_count);
    pre[8] = kv_element(false, t + 8u * WORKGROUP_SIZE, first_tile * BLOCK_K, kv_len, kv_head, d4_count);

    for (var tile: u32 = first_tile; tile < end_tile; tile = tile + 1u) {
        let k0 = tile * BLOCK_K;
        workgroupBarrier();  // the previous tile's P·V is done with tile_kv and tile_p
        tile_kv[t + 0u * WORKGROUP_SIZE] = pre[0];
        tile_kv[t + 1u * WORKGROUP_SIZE] = pre[1];
        tile_kv[t + 2u * WORKGROUP_SIZE] = pre[2];
        tile_kv[t + 3u * WORKGROUP_SIZE] = pre[3];
        tile_kv[t + 4u * WORKGROUP_SIZE] = pre[4];
        tile_kv[t + 5u * WORKGROUP_SIZE] = pre[5];
        tile_kv[t + 6u * WORKGROUP_SIZE] = pre[6];
        tile_kv[t + 7u * WORKGROUP_SIZE] = pre[7];
        if (t + 8u * WORKGROUP_SIZE < BLOCK_K * ROW4) {
            tile_kv[t + 8u * WORKGROUP_SIZE] = pre[8];
        }

        pre[0] = kv_element(true, t + 0u * WORKGROUP_SIZE, k0, kv_len, kv_head, d4_count);
        pre[1] = kv_element(true, t + 1u * WORKGROUP_SIZE, k0, kv_len, kv_head, d4_count);
        pre[2] = kv_element(true, t + 2u * WORKGROUP_SIZE, k0, kv_len, kv_head, d4_count);
        pre[3] = kv_element(true, t + 3u * WORKGROUP_SIZE, k0, kv_len, kv_head, d4_count);
        pre[4] = kv_element(true, t + 4u * WORKGROUP_SIZE, k0, kv_len, kv_head, d4_count);
        pre[5] = kv_element(true, t + 5u * WORKGROUP_SIZE, k0, kv_len, kv_head, d4_count);
        pre[6] = kv_element(true, t + 6u * WORKGROUP_SIZE, k0, kv_len, kv_head, d4_count);
        pre[7] = kv_element(true, t + 7u * WORKGROUP_SIZE, k0, kv_len, kv_head, d4_count);
        pre[8] = kv_element(true, t + 8u * WORKGROUP_SIZE, k0, kv_len, kv_head, d4_count);

        workgroupBarrier();

        // S = Q·Kᵀ for TILE_Q queries (rows a * TILE_Q + i) x TILE_K keys (c + j * COLS)
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
            let kt0 = vec4<f32>(tile_kv[(c + 0u * COLS) * ROW4 + d4]);
            let kt1 = vec4<f32>(tile_kv[(c + 1u * COLS) * ROW4 + d4]);
            let kt2 = vec4<f32>(tile_kv[(c + 2u * COLS) * ROW4 + d4]);
            let kt3 = vec4<f32>(tile_kv[(c + 3u * COLS) * ROW4 + d4]);
            let qr0 = q_vec(q0, a * TILE_Q + 0u, d4, head);
            s[0] = s[0] + dot(qr0, kt0);
            s[1] = s[1] + dot(qr0, kt1);
            s[2] = s[2] + dot(qr0, kt2);
            s[3] = s[3] + dot(qr0, kt3);
            let qr1 = q_vec(q0, a * TILE_Q + 1u, d4, head);
            s[4] = s[4] + dot(qr1, kt0);
            s[5] = s[5] + dot(qr1, kt1);
            s[6] = s[6] + dot(qr1, kt2);
            s[7] = s[7] + dot(qr1, kt3);
        }

        // scale and softcap; masks only on tiles that straddle a mask edge (a key outside its
        // query's visible range [span.x, span.y) scores MASKED); partial row maxima
        s[0] = final_score(s[0]);
        s[1] = final_score(s[1]);
        s[2] = final_score(s[2]);
        s[3] = final_score(s[3]);
        s[4] = final_score(s[4]);
        s[5] = final_score(s[5]);
        s[6] = final_score(s[6]);
        s[7] = final_score(s[7]);
        if (tile_needs_mask(q0, q_count, k0, kv_len)) {
            let span0 = visible_keys(q0 + a * TILE_Q + 0u, 1u, kv_len);
            s[0] = select(MASKED, s[0], (k0 + c + 0u * COLS >= span0.x) & (k0 + c + 0u * COLS < span0.y));
            s[1] = select(MASKED, s[1], (k0 + c + 1u * COLS >= span0.x) & (k0 + c + 1u * COLS < span0.y));
            s[2] = select(MASKED, s[2], (k0 + c + 2u * COLS >= span0.x) & (k0 + c + 2u * COLS < span0.y));
            s[3] = select(MASKED, s[3], (k0 + c + 3u * COLS >= span0.x) & (k0 + c + 3u * COLS < span0.y));
            let span1 = visible_keys(q0 + a * TILE_Q + 1u, 1u, kv_len);
            s[4] = select(MASKED, s[4], (k0 + c + 0u * COLS >= span1.x) & (k0 + c + 0u * COLS < span1.y));
            s[5] = select(MASKED, s[5], (k0 + c + 1u * COLS >= span1.x) & (k0 + c + 1u * COLS < span1.y));
            s[6] = select(MASKED, s[6], (k0 + c + 2u * COLS >= span1.x) & (k0 + c + 2u * COLS < span1.y));
            s[7] = select(MASKED, s[7], (k0 + c + 3u * COLS >= span1.x) & (k0 + c + 3u * COLS < span1.y));
        }
        var tile_max0 = max(max(max(s[0], s[1]), s[2]), s[3]);
        tile_max0 = max(tile_max0, subgroupShuffleXor(tile_max0, 1u));
        tile_max0 = max(tile_max0, subgroupShuffleXor(tile_max0, 2u));
        var tile_max1 = max(max(max(s[4], s[5]), s[6]), s[7]);
        tile_max1 = max(tile_max1, subgroupShuffleXor(tile_max1, 1u));
        tile_max1 = max(tile_max1, subgroupShuffleXor(tile_max1, 2u));
        workgroupBarrier();  // every invocation is done reading K

        tile_kv[t + 0u * WORKGROUP_SIZE] = pre[0];
        tile_kv[t + 1u * WORKGROUP_SIZE] = pre[1];
        tile_kv[t + 2u * WORKGROUP_SIZE] = pre[2];
        tile_kv[t + 3u * WORKGROUP_SIZE] = pre[3];
        tile_kv[t + 4u * WORKGROUP_SIZE] = pre[4];
        tile_kv[t + 5u * WORKGROUP_SIZE] = pre[5];
        tile_kv[t + 6u * WORKGROUP_SIZE] = pre[6];
        tile_kv[t + 7u * WORKGROUP_SIZE] = pre[7];
        if (t + 8u * WORKGROUP_SIZE < BLOCK_K * ROW4) {
            tile_kv[t + 8u * WORKGROUP_SIZE] = pre[8];
        }

        pre[0] = kv_element(false, t + 0u * WORKGROUP_SIZE, k0 + BLOCK_K, kv_len, kv_head, d4_count);
        pre[1] = kv_element(false, t + 1u * WORKGROUP_SIZE, k0 + BLOCK_K, kv_len, kv_head, d4_count);
        pre[2] = kv_element(false, t + 2u * WORKGROUP_SIZE, k0 + BLOCK_K, kv_len, kv_head, d4_count);
        pre[3] = kv_element(false, t + 3u * WORKGROUP_SIZE, k0 + BLOCK_K, kv_len, kv_head, d4_count);
        pre[4] = kv_element(false, t + 4u * WORKGROUP_SIZE, k0 + BLOCK_K, kv_len, kv_head, d4_count);
        pre[5] = kv_element(false, t + 5u * WORKGROUP_SIZE, k0 + BLOCK_K, kv_len, kv_head, d4_count);
        pre[6] = kv_element(false, t + 6u * WORKGROUP_SIZE, k0 + BLOCK_K, kv_len, kv_head, d4_count);
        pre[7] = kv_element(false, t + 7u * WORKGROUP_SIZE, k0 + BLOCK_K, kv_len, kv_head, d4_count);
        pre[8] = kv_element(false, t + 8u * WORKGROUP_SIZE, k0 + BLOCK_K, kv_len, kv_head, d4_count);

        // online softmax: P = exp(S - m_new) into tile_p, rescale l and acc by exp(m_old - m_new)
        // (while nothing is seen yet m_old == m_new == MASKED: acc and l are 0 whatever the factor)
        {
            let r = a * TILE_Q + 0u;
            let m_new = max(m[0], tile_max0);
            let correction = exp(m[0] - m_new);
            m[0] = m_new;
            let p0_h = f16(select(0.0, exp(s[0] - m_new), s[0] > MASKED));
            let p0 = f32(p0_h);  // the row sum adds the rounded weight the P·V step uses
            tile_p[r * (BLOCK_K / 4u) + (c + 0u * COLS) / 4u][(c + 0u * COLS) % 4u] = p0_h;
            let p1_h = f16(select(0.0, exp(s[1] - m_new), s[1] > MASKED));
            let p1 = f32(p1_h);  // the row sum adds the rounded weight the P·V step uses
            tile_p[r * (BLOCK_K / 4u) + (c + 1u * COLS) / 4u][(c + 1u * COLS) % 4u] = p1_h;
            let p2_h = f16(select(0.0, exp(s[2] - m_new), s[2] > MASKED));
            let p2 = f32(p2_h);  // the row sum adds the rounded weight the P·V step uses
            tile_p[r * (BLOCK_K / 4u) + (c + 2u * COLS) / 4u][(c + 2u * COLS) % 4u] = p2_h;
            let p3_h = f16(select(0.0, exp(s[3] - m_new), s[3] > MASKED));
            let p3 = f32(p3_h);  // the row sum adds the rounded weight the P·V step uses
            tile_p[r * (BLOCK_K / 4u) + (c + 3u * COLS) / 4u][(c + 3u * COLS) % 4u] = p3_h;
            l[0] = l[0] * correction + p0 + p1 + p2 + p3;
            acc[0] = acc[0] * correction;
            acc[1] = acc[1] * correction;
            acc[2] = acc[2] * correction;
            acc[3] = acc[3] * correction;
            acc[4] = acc[4] * correction;
            acc[5] = acc[5] * correction;
            acc[6] = acc[6] * correction;
            acc[7] = acc[7] * correction;
            acc[8] = acc[8] * correction;
            acc[9] = acc[9] * correction;
            acc[10] = acc[10] * correction;
            acc[11] = acc[11] * correction;
            acc[12] = acc[12] * correction;
            acc[13] = acc[13] * correction;
            acc[14] = acc[14] * correction;
            acc[15] = acc[15] * correction;
        }
        {
            let r = a * TILE_Q + 1u;
            let m_new = max(m[1], tile_max1);
            let correction = exp(m[1] - m_new);
            m[1] = m_new;
            let p0_h = f16(select(0.0, exp(s[4] - m_new), s[4] > MASKED));
            let p0 = f32(p0_h);  // the row sum adds the rounded weight the P·V step uses
            tile_p[r * (BLOCK_K / 4u) + (c + 0u * COLS) / 4u][(c + 0u * COLS) % 4u] = p0_h;
            let p1_h = f16(select(0.0, exp(s[5] - m_new), s[5] > MASKED));
            let p1 = f32(p1_h);  // the row sum adds the rounded weight the P·V step uses
            tile_p[r * (BLOCK_K / 4u) + (c + 1u * COLS) / 4u][(c + 1u * COLS) % 4u] = p1_h;
            let p2_h = f16(select(0.0, exp(s[6] - m_new), s[6] > MASKED));
            let p2 = f32(p2_h);  // the row sum adds the rounded weight the P·V step uses
            tile_p[r * (BLOCK_K / 4u) + (c + 2u * COLS) / 4u][(c + 2u * COLS) % 4u] = p2_h;
            let p3_h = f16(select(0.0, exp(s[7] - m_new), s[7] > MASKED));
            let p3 = f32(p3_h);  // the row sum adds the rounded weight the P·V step uses
            tile_p[r * (BLOCK_K / 4u) + (c + 3u * COLS) / 4u][(c + 3u * COLS) % 4u] = p3_h;
            l[1] = l[1] * correction + p0 + p1 + p2 + p3;
            acc[16] = acc[16] * correction;
            acc[17] = acc[17] * correction;
            acc[18] = acc[18] * correction;
            acc[19] = acc[19] * correction;
            acc[20] = acc[20] * correction;
            acc[21] = acc[21] * correction;
            acc[22] = acc[22] * correction;
            acc[23] = acc[23] * correction;
            acc[24] = acc[24] * correction;
            acc[25] = acc[25] * correction;
            acc[26] = acc[26] * correction;
            acc[27] = acc[27] * correction;
            acc[28] = acc[28] * correction;
            acc[29] = acc[29] * correction;
            acc[30] = acc[30] * correction;
            acc[31] = acc[31] * correction;
        }
        workgroupBarrier();  // V and P are in workgroup memory

        // O += P·V for TILE_Q queries x TILE_D4 head-dim vec4 columns
        for (var k4: u32 = 0u; k4 < BLOCK_K / 4u; k4 = k4 + 1u) {
            let p0 = vec4<f32>(tile_p[(a * TILE_Q + 0u) * (BLOCK_K / 4u) + k4]);
            let p1 = vec4<f32>(tile_p[(a * TILE_Q + 1u) * (BLOCK_K / 4u) + k4]);
            let v00 = vec4<f32>(tile_kv[(k4 * 4u + 0u) * ROW4 + c + 0u * COLS]);
            acc[0] = acc[0] + p0.x * v00;
            acc[16] = acc[16] + p1.x * v00;
            let v01 = vec4<f32>(tile_kv[(k4 * 4u + 0u) * ROW4 + c + 1u * COLS]);
            acc[1] = acc[1] + p0.x * v01;
            acc[17] = acc[17] + p1.x * v01;
            let v02 = vec4<f32>(tile_kv[(k4 * 4u + 0u) * ROW4 + c + 2u * COLS]);
            acc[2] = acc[2] + p0.x * v02;
            acc[18] = acc[18] + p1.x * v02;
            let v03 = vec4<f32>(tile_kv[(k4 * 4u + 0u) * ROW4 + c + 3u * COLS]);
            acc[3] = acc[3] + p0.x * v03;
            acc[19] = acc[19] + p1.x * v03;
            let v04 = vec4<f32>(tile_kv[(k4 * 4u + 0u) * ROW4 + c + 4u * COLS]);
            acc[4] = acc[4] + p0.x * v04;
            acc[20] = acc[20] + p1.x * v04;
            let v05 = vec4<f32>(tile_kv[(k4 * 4u + 0u) * ROW4 + c + 5u * COLS]);
            acc[5] = acc[5] + p0.x * v05;
            acc[21] = acc[21] + p1.x * v05;
            let v06 = vec4<f32>(tile_kv[(k4 * 4u + 0u) * ROW4 + c + 6u * COLS]);
            acc[6] = acc[6] + p0.x * v06;
            acc[22] = acc[22] + p1.x * v06;
            let v07 = vec4<f32>(tile_kv[(k4 * 4u + 0u) * ROW4 + c + 7u * COLS]);
            acc[7] = acc[7] + p0.x * v07;
            acc[23] = acc[23] + p1.x * v07;
            let v08 = vec4<f32>(tile_kv[(k4 * 4u + 0u) * ROW4 + c + 8u * COLS]);
            acc[8] = acc[8] + p0.x * v08;
            acc[24] = acc[24] + p1.x * v08;
            let v09 = vec4<f32>(tile_kv[(k4 * 4u + 0u) * ROW4 + c + 9u * COLS]);
            acc[9] = acc[9] + p0.x * v09;
            acc[25] = acc[25] + p1.x * v09;
            let v010 = vec4<f32>(tile_kv[(k4 * 4u + 0u) * ROW4 + c + 10u * COLS]);
            acc[10] = acc[10] + p0.x * v010;
            acc[26] = acc[26] + p1.x * v010;
            let v011 = vec4<f32>(tile_kv[(k4 * 4u + 0u) * ROW4 + c + 11u * COLS]);
            acc[11] = acc[11] + p0.x * v011;
            acc[27] = acc[27] + p1.x * v011;
            let v012 = vec4<f32>(tile_kv[(k4 * 4u + 0u) * ROW4 + c + 12u * COLS]);
            acc[12] = acc[12] + p0.x * v012;
            acc[28] = acc[28] + p1.x * v012;
            let v013 = vec4<f32>(tile_kv[(k4 * 4u + 0u) * ROW4 + c + 13u * COLS]);
            acc[13] = acc[13] + p0.x * v013;
            acc[29] = acc[29] + p1.x * v013;
            let v014 = vec4<f32>(tile_kv[(k4 * 4u + 0u) * ROW4 + c + 14u * COLS]);
            acc[14] = acc[14] + p0.x * v014;
            acc[30] = acc[30] + p1.x * v014;
            let v015 = vec4<f32>(tile_kv[(k4 * 4u + 0u) * ROW4 + c + 15u * COLS]);
            acc[15] = acc[15] + p0.x * v015;
            acc[31] = acc[31] + p1.x * v015;
            let v10 = vec4<f32>(tile_kv[(k4 * 4u + 1u) * ROW4 + c + 0u * COLS]);
            acc[0] = acc[0] + p0.y * v10;
            acc[16] = acc[16] + p1.y * v10;
            let v11 = vec4<f32>(tile_kv[(k4 * 4u + 1u) * ROW4 + c + 1u * COLS]);
            acc[1] = acc[1] + p0.y * v11;
            acc[17] = acc[17] + p1.y * v11;
            let v12 = vec4<f32>(tile_kv[(k4 * 4u + 1u) * ROW4 + c + 2u * COLS]);
            acc[2] = acc[2] + p0.y * v12;
            acc[18] = acc[18] + p1.y * v12;
            let v13 = vec4<f32>(tile_kv[(k4 * 4u + 1u) * ROW4 + c + 3u * COLS]);
            acc[3] = acc[3] + p0.y * v13;
            acc[19] = acc[19] + p1.y * v13;
            let v14 = vec4<f32>(tile_kv[(k4 * 4u + 1u) * ROW4 + c + 4u * COLS]);
            acc[4] = acc[4] + p0.y * v14;
            acc[20] = acc[20] + p1.y * v14;
            let v15 = vec4<f32>(tile_kv[(k4 * 4u + 1u) * ROW4 + c + 5u * COLS]);
            acc[5] = acc[5] + p0.y * v15;
            acc[21] = acc[21] + p1.y * v15;
            let v16 = vec4<f32>(tile_kv[(k4 * 4u + 1u) * ROW4 + c + 6u * COLS]);
            acc[6] = acc[6] + p0.y * v16;
            acc[22] = acc[22] + p1.y * v16;
            let v17 = vec4<f32>(tile_kv[(k4 * 4u + 1u) * ROW4 + c + 7u * COLS]);
            acc[7] = acc[7] + p0.y * v17;
            acc[23] = acc[23] + p1.y * v17;
            let v18 = vec4<f32>(tile_kv[(k4 * 4u + 1u) * ROW4 + c + 8u * COLS]);
            acc[8] = acc[8] + p0.y * v18;
            acc[24] = acc[24] + p1.y * v18;
            let v19 = vec4<f32>(tile_kv[(k4 * 4u + 1u) * ROW4 + c + 9u * COLS]);
            acc[9] = acc[9] + p0.y * v19;
            acc[25] = acc[25] + p1.y * v19;
            let v110 = vec4<f32>(tile_kv[(k4 * 4u + 1u) * ROW4 + c + 10u * COLS]);
            acc[10] = acc[10] + p0.y * v110;
            acc[26] = acc[26] + p1.y * v110;
            let v111 = vec4<f32>(tile_kv[(k4 * 4u + 1u) * ROW4 + c + 11u * COLS]);
            acc[11] = acc[11] + p0.y * v111;
            acc[27] = acc[27] + p1.y * v111;
            let v112 = vec4<f32>(tile_kv[(k4 * 4u + 1u) * ROW4 + c + 12u * COLS]);
            acc[12] = acc[12] + p0.y * v112;
            acc[28] = acc[28] + p1.y * v112;
            let v113 = vec4<f32>(tile_kv[(k4 * 4u + 1u) * ROW4 + c + 13u * COLS]);
            acc[13] = acc[13] + p0.y * v113;
            acc[29] = acc[29] + p1.y * v113;
            let v114 = vec4<f32>(tile_kv[(k4 * 4u + 1u) * ROW4 + c + 14u * COLS]);
            acc[14] = acc[14] + p0.y * v114;
            acc[30] = acc[30] + p1.y * v114;
            let v115 = vec4<f32>(tile_kv[(k4 * 4u + 1u) * ROW4 + c + 15u * COLS]);
            acc[15] = acc[15] + p0.y * v115;
            acc[31] = acc[31] + p1.y * v115;
            let v20 = vec4<f32>(tile_kv[(k4 * 4u + 2u) * ROW4 + c + 0u * COLS]);
            acc[0] = acc[0] + p0.z * v20;
            acc[16] = acc[16] + p1.z * v20;
            let v21 = vec4<f32>(tile_kv[(k4 * 4u + 2u) * ROW4 + c + 1u * COLS]);
            acc[1] = acc[1] + p0.z * v21;
            acc[17] = acc[17] + p1.z * v21;
            let v22 = vec4<f32>(tile_kv[(k4 * 4u + 2u) * ROW4 + c + 2u * COLS]);
            acc[2] = acc[2] + p0.z * v22;
            acc[18] = acc[18] + p1.z * v22;
            let v23 = vec4<f32>(tile_kv[(k4 * 4u + 2u) * ROW4 + c + 3u * COLS]);
            acc[3] = acc[3] + p0.z * v23;
            acc[19] = acc[19] + p1.z * v23;
            let v24 = vec4<f32>(tile_kv[(k4 * 4u + 2u) * ROW4 + c + 4u * COLS]);
            acc[4] = acc[4] + p0.z * v24;
            acc[20] = acc[20] + p1.z * v24;
            let v25 = vec4<f32>(tile_kv[(k4 * 4u + 2u) * ROW4 + c + 5u * COLS]);
            acc[5] = acc[5] + p0.z * v25;
            acc[21] = acc[21] + p1.z * v25;
            let v26 = vec4<f32>(tile_kv[(k4 * 4u + 2u) * ROW4 + c + 6u * COLS]);
            acc[6] = acc[6] + p0.z * v26;
            acc[22] = acc[22] + p1.z * v26;
            let v27 = vec4<f32>(tile_kv[(k4 * 4u + 2u) * ROW4 + c + 7u * COLS]);
            acc[7] = acc[7] + p0.z * v27;
            acc[23] = acc[23] + p1.z * v27;
            let v28 = vec4<f32>(tile_kv[(k4 * 4u + 2u) * ROW4 + c + 8u * COLS]);
            acc[8] = acc[8] + p0.z * v28;
            acc[24] = acc[24] + p1.z * v28;
            let v29 = vec4<f32>(tile_kv[(k4 * 4u + 2u) * ROW4 + c + 9u * COLS]);
            acc[9] = acc[9] + p0.z * v29;
            acc[25] = acc[25] + p1.z * v29;
            let v210 = vec4<f32>(tile_kv[(k4 * 4u + 2u) * ROW4 + c + 10u * COLS]);
            acc[10] = acc[10] + p0.z * v210;
            acc[26] = acc[26] + p1.z * v210;
            let v211 = vec4<f32>(tile_kv[(k4 * 4u + 2u) * ROW4 + c + 11u * COLS]);
            acc[11] = acc[11] + p0.z * v211;
            acc[27] = acc[27] + p1.z * v211;
            let v212 = vec4<f32>(tile_kv[(k4 * 4u + 2u) * ROW4 + c + 12u * COLS]);
            acc[12] = acc[12] + p0.z * v212;
            acc[28] = acc[28] + p1.z * v212;
            let v213 = vec4<f32>(tile_kv[(k4 * 4u + 2u) * ROW4 + c + 13u * COLS]);
            acc[13] = acc[13] + p0.z * v213;
            acc[29] = acc[29] + p1.z * v213;
            let v214 = vec4<f32>(tile_kv[(k4 * 4u + 2u) * ROW4 + c + 14u * COLS]);
            acc[14] = acc[14] + p0.z * v214;
            acc[30] = acc[30] + p1.z * v214;
            let v215 = vec4<f32>(tile_kv[(k4 * 4u + 2u) * ROW4 + c + 15u * COLS]);
            acc[15] = acc[15] + p0.z * v215;
            acc[31] = acc[31] + p1.z * v215;
            let v30 = vec4<f32>(tile_kv[(k4 * 4u + 3u) * ROW4 + c + 0u * COLS]);
            acc[0] = acc[0] + p0.w * v30;
            acc[16] = acc[16] + p1.w * v30;
            let v31 = vec4<f32>(tile_kv[(k4 * 4u + 3u) * ROW4 + c + 1u * COLS]);
            acc[1] = acc[1] + p0.w * v31;
            acc[17] = acc[17] + p1.w * v31;
            let v32 = vec4<f32>(tile_kv[(k4 * 4u + 3u) * ROW4 + c + 2u * COLS]);
            acc[2] = acc[2] + p0.w * v32;
            acc[18] = acc[18] + p1.w * v32;
            let v33 = vec4<f32>(tile_kv[(k4 * 4u + 3u) * ROW4 + c + 3u * COLS]);
            acc[3] = acc[3] + p0.w * v33;
            acc[19] = acc[19] + p1.w * v33;
            let v34 = vec4<f32>(tile_kv[(k4 * 4u + 3u) * ROW4 + c + 4u * COLS]);
            acc[4] = acc[4] + p0.w * v34;
            acc[20] = acc[20] + p1.w * v34;
            let v35 = vec4<f32>(tile_kv[(k4 * 4u + 3u) * ROW4 + c + 5u * COLS]);
            acc[5] = acc[5] + p0.w * v35;
            acc[21] = acc[21] + p1.w * v35;
            let v36 = vec4<f32>(tile_kv[(k4 * 4u + 3u) * ROW4 + c + 6u * COLS]);
            acc[6] = acc[6] + p0.w * v36;
            acc[22] = acc[22] + p1.w * v36;
            let v37 = vec4<f32>(tile_kv[(k4 * 4u + 3u) * ROW4 + c + 7u * COLS]);
            acc[7] = acc[7] + p0.w * v37;
            acc[23] = acc[23] + p1.w * v37;
            let v38 = vec4<f32>(tile_kv[(k4 * 4u + 3u) * ROW4 + c + 8u * COLS]);
            acc[8] = acc[8] + p0.w * v38;
            acc[24] = acc[24] + p1.w * v38;
            let v39 = vec4<f32>(tile_kv[(k4 * 4u + 3u) * ROW4 + c + 9u * COLS]);
            acc[9] = acc[9] + p0.w * v39;
            acc[25] = acc[25] + p1.w * v39;
            let v310 = vec4<f32>(tile_kv[(k4 * 4u + 3u) * ROW4 + c + 10u * COLS]);
            acc[10] = acc[10] + p0.w * v310;
            acc[26] = acc[26] + p1.w * v310;
            let v311 = vec4<f32>(tile_kv[(k4 * 4u + 3u) * ROW4 + c + 11u * COLS]);
            acc[11] = acc[11] + p0.w * v311;
            acc[27] = acc[27] + p1.w * v311;
            let v312 = vec4<f32>(tile_kv[(k4 * 4u + 3u) * ROW4 + c + 12u * COLS]);
            acc[12] = acc[12] + p0.w * v312;
            acc[28] = acc[28] + p1.w * v312;
            let v313 = vec4<f32>(tile_kv[(k4 * 4u + 3u) * ROW4 + c + 13u * COLS]);
            acc[13] = acc[13] + p0.w * v313;
            acc[29] = acc[29] + p1.w * v313;
            let v314 = vec4<f32>(tile_kv[(k4 * 4u + 3u) * ROW4 + c + 14u * COLS]);
            acc[14] = acc[14] + p0.w * v314;
            acc[30] = acc[30] + p1.w * v314;
            let v315 = vec4<f32>(tile_kv[(k4 * 4u + 3u) * ROW4 + c + 15u * COLS]);
            acc[15] = acc[15] + p0.w * v315;
            acc[31] = acc[31] + p1.w * v315;
        }
    }

    // Row sums: reduce the COLS shares, then normalise and store
    // (a query whose every key is masked has l == 0 and writes zeros: masked_row = "zero")
    // by shuffles: a query group's COLS lanes must be consecutive lanes of one subgroup (NaN is
    // stored where the subgroups are narrower or numbered otherwise). Proved here: the subgroup
    // is lanes 0 .. n - 1, n a multiple of COLS, holding t = run_base + sg_lane, one run_base a
    // multiple of sg_size: so each query group's COLS lanes are all in it, in order.
    // (sg_lane == t % sg_size alone let two subgroups trade invocations of one lane number.)
    let run_base = t - sg_lane;
    let members = subgroupAdd(1u);
    let numbered = subgroupAll((sg_size >= COLS) &
        (sg_lane == t % sg_size) & (sg_lane < members) &
        (members % COLS == 0u) &
        (run_base == subgroupBroadcastFirst(run_base)));
    let poison = bitcast<f32>(0x7fc00000u | (sg_size & 0u));
    var total0 = l[0];
    total0 = total0 + subgroupShuffleXor(total0, 1u);
    total0 = total0 + subgroupShuffleXor(total0, 2u);
    var total1 = l[1];
    total1 = total1 + subgroupShuffleXor(total1, 1u);
    total1 = total1 + subgroupShuffleXor(total1, 2u);
    if (a * TILE_Q + 0u < q_count) {
        let r = a * TILE_Q + 0u;
        let total = total0;
        let inv_l = select(poison, select(0.0, 1.0 / total, total > 0.0), numbered);
        let base = ((q0 + r) * u.num_heads + head) * u.head_dim;
        store_out4(base, c + 0u * COLS, acc[0] * inv_l);
        store_out4(base, c + 1u * COLS, acc[1] * inv_l);
        store_out4(base, c + 2u * COLS, acc[2] * inv_l);
        store_out4(base, c + 3u * COLS, acc[3] * inv_l);
        store_out4(base, c + 4u * COLS, acc[4] * inv_l);
        store_out4(base, c + 5u * COLS, acc[5] * inv_l);
        store_out4(base, c + 6u * COLS, acc[6] * inv_l);
        store_out4(base, c + 7u * COLS, acc[7] * inv_l);
        store_out4(base, c + 8u * COLS, acc[8] * inv_l);
        store_out4(base, c + 9u * COLS, acc[9] * inv_l);
        store_out4(base, c + 10u * COLS, acc[10] * inv_l);
        store_out4(base, c + 11u * COLS, acc[11] * inv_l);
        store_out4(base, c + 12u * COLS, acc[12] * inv_l);
        store_out4(base, c + 13u * COLS, acc[13] * inv_l);
        store_out4(base, c + 14u * COLS, acc[14] * inv_l);
        store_out4(base, c + 15u * COLS, acc[15] * inv_l);
    }
    if (a * TILE_Q + 1u < q_count) {
        let r = a * TILE_Q + 1u;
        let total = total1;
        let inv_l = select(poison, select(0.0, 1.0 / total, total > 0.0), numbered);
        let base = ((q0 + r) * u.num_heads + head) * u.head_dim;
        store_out4(base, c + 0u * COLS, acc[16] * inv_l);
        store_out4(base, c + 1u * COLS, acc[17] * inv_l);
        store_out4(base, c + 2u * COLS, acc[18] * inv_l);
        store_out4(base, c + 3u * COLS, acc[19] * inv_l);
        store_out4(base, c + 4u * COLS, acc[20] * inv_l);
        store_out4(base, c + 5u * COLS, acc[21] * inv_l);
        store_out4(base, c + 6u * COLS, acc[22] * inv_l);
        store_out4(base, c + 7u * COLS, acc[23] * inv_l);
        store_out4(base, c + 8u * COLS, acc[24] * inv_l);
        store_out4(base, c + 9u * COLS, acc[25] * inv_l);
        store_out4(base, c + 10u * COLS, acc[26] * inv_l);
        store_out4(base, c + 11u * COLS, acc[27] * inv_l);
        store_out4(base, c + 12u * COLS, acc[28] * inv_l);
        store_out4(base, c + 13u * COLS, acc[29] * inv_l);
        store_out4(base, c + 14u * COLS, acc[30] * inv_l);
        store_out4(base, c + 15u * COLS, acc[31] * inv_l);
    }
}
