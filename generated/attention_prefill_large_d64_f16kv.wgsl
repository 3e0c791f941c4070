// AUTO-GENERATED from templates/attention_prefill.wgsl.j2 for variant attention_prefill_large_d64_f16kv by doppler-gen - do not edit.
// Edit the template and variants.toml, then run `doppler-gen generate`.
// source-hash: sha256:860adf245de470e5fecb102d6afff502261196f7bd710092951b7ac34ff1b0ed

// Flash-attention style prefill: Q f32, K/V f16, output f32
//
// One workgroup per (query block, head); K/V tiles in workgroup memory (f16), register
// micro-tiles of 4 queries x 4 keys (S) and 4 queries x 4 dims (O).
// All arithmetic is f32; other dtypes appear only in storage.

enable f16;

const MAX_HEAD_DIM: u32 = 64u;
const MAX_BLOCK_Q: u32 = 64u;    // rows of the Q / P tiles
const BLOCK_K: u32 = 64u;        // keys per KV tile
const TILE_Q: u32 = 4u;          // queries per invocation
const TILE_K: u32 = 4u;          // keys per invocation (strided by COLS)
const COLS: u32 = 16u;             // invocations sharing a query group
const TILE_D4: u32 = 1u;          // head-dim vec4 columns per invocation (strided by COLS)
const ROW4: u32 = 17u;            // vec4s per Q/K/V tile row (padded against bank conflicts)
const WORKGROUP_SIZE: u32 = 256u;
const MASKED: f32 = -3.402823e+38;

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
@group(0) @binding(1) var<storage, read> Q: array<f32>;       // [query_len, num_heads, head_dim]
@group(0) @binding(2) var<storage, read> K: array<vec4<f16>>;       // [seq_len, num_kv_heads, head_dim / 4]
@group(0) @binding(3) var<storage, read> V: array<vec4<f16>>;       // [seq_len, num_kv_heads, head_dim / 4]
@group(0) @binding(4) var<storage, read_write> output: array<f32>; // [query_len, num_heads, head_dim]
@group(0) @binding(5) var<storage, read> kv_len_buffer: array<u32>;
@group(0) @binding(6) var<storage, read> page_table: array<u32>;

var<workgroup> tile_q: array<vec4<f32>, 1088>;      // [MAX_BLOCK_Q][ROW4]
var<workgroup> tile_kv: array<vec4<f16>, 1088>;     // [BLOCK_K][ROW4], K then V
var<workgroup> tile_p: array<vec4<f32>, 1024>;      // [MAX_BLOCK_Q][BLOCK_K / 4]
var<workgroup> row_part: array<f32, 1024>;          // [MAX_BLOCK_Q][COLS] partial max / sum

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
            output[base + d] = value[e];
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
    return vec4<f32>(tile_q[r * ROW4 + d4]);
}

// Scaled, soft-capped score
fn final_score(raw: f32) -> f32 {
    var score = raw * u.scale;
    if (u.attn_softcap > 0.0) {
        score = tanh(score / u.attn_softcap) * u.attn_softcap;
    }
    return score;
}

// Largest of the COLS partial maxima of tile row r
fn row_max(r: u32) -> f32 {
    var value: f32 = MASKED;
    for (var cc: u32 = 0u; cc < COLS; cc = cc + 1u) {
        value = max(value, row_part[r * COLS + cc]);
    }
    return value;
}

// Sum of the COLS partial row sums of tile row r
fn row_sum(r: u32) -> f32 {
    var value: f32 = 0.0;
    for (var cc: u32 = 0u; cc < COLS; cc = cc + 1u) {
        value = value + row_part[r * COLS + cc];
    }
    return value;
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn main(
    @builtin(local_invocation_id) local_id: vec3<u32>,
    @builtin(workgroup_id) wg_id: vec3<u32>,
    @builtin(num_workgroups) num_wg: vec3<u32>
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

    // Q tile (zeros past query_len, BLOCK_Q and head_dim)
    for (var idx: u32 = t; idx < MAX_BLOCK_Q * ROW4; idx = idx + WORKGROUP_SIZE) {
        let r = idx / ROW4;
        let d4 = idx - r * ROW4;
        var value = vec4<f32>();
        if (r < q_count && d4 < d4_count) {
            value = load_q4(((q0 + r) * u.num_heads + head) * u.head_dim, d4);
        }
        tile_q[idx] = value;
    }

    // KV tiles any query of this block can see; a tile that is not fully visible to every query
    // of the block is masked element by element
    let span = visible_keys(q0, q_count, kv_len);
    let first_tile = span.x / BLOCK_K;
    let end_tile = (span.y + BLOCK_K - 1u) / BLOCK_K;

    // Register micro-tiles (loops over them are unrolled here so every index is a constant)
    var m: array<f32, 4>;    // running row max (identical across a query group)
    var l: array<f32, 4>;    // this invocation's share of the row sum
    var acc: array<vec4<f32>, 4>;  // [TILE_Q][TILE_D4]: head-dim vec4 columns c + j * COLS
    m[0] = MASKED;
    l[0] = 0.0;
    acc[0] = vec4<f32>();
    m[1] = MASKED;
    l[1] = 0.0;
    acc[1] = vec4<f32>();
    m[2] = MASKED;
    l[2] = 0.0;
    acc[2] = vec4<f32>();
    m[3] = MASKED;
    l[3] = 0.0;
    acc[3] = vec4<f32>();

    // K/V tiles are prefetched into registers one phase ahead: the global loads of the next
    // tile are in flight while this one is computed
    var pre: array<vec4<f16>, 5>;
    pre[0] = kv_element(false, t + 0u * WORKGROUP_SIZE, first_tile * BLOCK_K, kv_len, kv_head, d4_count);
    pre[1] = kv_element(false, t + 1u * WORKGROUP_SIZE, first_tile * BLOCK_K, kv_len, kv_head, d4_count);
    pre[2] = kv_element(false, t + 2u * WORKGROUP_SIZE, first_tile * BLOCK_K, kv_len, kv_head, d4_count);
    pre[3] = kv_element(false, t + 3u * WORKGROUP_SIZE, first_tile * BLOCK_K, kv_len, kv_head, d4_count);
    pre[4] = kv_element(false, t + 4u * WORKGROUP_SIZE, first_tile * BLOCK_K, kv_len, kv_head, d4_count);

    for (var tile: u32 = first_tile; tile < end_tile; tile = tile + 1u) {
        let k0 = tile * BLOCK_K;
        workgroupBarrier();  // the previous tile's P·V is done with tile_kv and tile_p
        tile_kv[t + 0u * WORKGROUP_SIZE] = pre[0];
        tile_kv[t + 1u * WORKGROUP_SIZE] = pre[1];
        tile_kv[t + 2u * WORKGROUP_SIZE] = pre[2];
        tile_kv[t + 3u * WORKGROUP_SIZE] = pre[3];
        if (t + 4u * WORKGROUP_SIZE < BLOCK_K * ROW4) {
            tile_kv[t + 4u * WORKGROUP_SIZE] = pre[4];
        }

        pre[0] = kv_element(true, t + 0u * WORKGROUP_SIZE, k0, kv_len, kv_head, d4_count);
        pre[1] = kv_element(true, t + 1u * WORKGROUP_SIZE, k0, kv_len, kv_head, d4_count);
        pre[2] = kv_element(true, t + 2u * WORKGROUP_SIZE, k0, kv_len, kv_head, d4_count);
        pre[3] = kv_element(true, t + 3u * WORKGROUP_SIZE, k0, kv_len, kv_head, d4_count);
        pre[4] = kv_element(true, t + 4u * WORKGROUP_SIZE, k0, kv_len, kv_head, d4_count);

        workgroupBarrier();

        // S = Q·Kᵀ for TILE_Q queries (rows a * TILE_Q + i) x TILE_K keys (c + j * COLS)
        var s: array<f32, 16>;
        s[0] = 0.0;
        s[1] = 0.0;
        s[2] = 0.0;
        s[3] = 0.0;
        s[4] = 0.0;
        s[5] = 0.0;
        s[6] = 0.0;
        s[7] = 0.0;
        s[8] = 0.0;
        s[9] = 0.0;
        s[10] = 0.0;
        s[11] = 0.0;
        s[12] = 0.0;
        s[13] = 0.0;
        s[14] = 0.0;
        s[15] = 0.0;
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
            let qr2 = q_vec(q0, a * TILE_Q + 2u, d4, head);
            s[8] = s[8] + dot(qr2, kt0);
            s[9] = s[9] + dot(qr2, kt1);
            s[10] = s[10] + dot(qr2, kt2);
            s[11] = s[11] + dot(qr2, kt3);
            let qr3 = q_vec(q0, a * TILE_Q + 3u, d4, head);
            s[12] = s[12] + dot(qr3, kt0);
            s[13] = s[13] + dot(qr3, kt1);
            s[14] = s[14] + dot(qr3, kt2);
            s[15] = s[15] + dot(qr3, kt3);
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
        s[8] = final_score(s[8]);
        s[9] = final_score(s[9]);
        s[10] = final_score(s[10]);
        s[11] = final_score(s[11]);
        s[12] = final_score(s[12]);
        s[13] = final_score(s[13]);
        s[14] = final_score(s[14]);
        s[15] = final_score(s[15]);
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
            let span2 = visible_keys(q0 + a * TILE_Q + 2u, 1u, kv_len);
            s[8] = select(MASKED, s[8], (k0 + c + 0u * COLS >= span2.x) & (k0 + c + 0u * COLS < span2.y));
            s[9] = select(MASKED, s[9], (k0 + c + 1u * COLS >= span2.x) & (k0 + c + 1u * COLS < span2.y));
            s[10] = select(MASKED, s[10], (k0 + c + 2u * COLS >= span2.x) & (k0 + c + 2u * COLS < span2.y));
            s[11] = select(MASKED, s[11], (k0 + c + 3u * COLS >= span2.x) & (k0 + c + 3u * COLS < span2.y));
            let span3 = visible_keys(q0 + a * TILE_Q + 3u, 1u, kv_len);
            s[12] = select(MASKED, s[12], (k0 + c + 0u * COLS >= span3.x) & (k0 + c + 0u * COLS < span3.y));
            s[13] = select(MASKED, s[13], (k0 + c + 1u * COLS >= span3.x) & (k0 + c + 1u * COLS < span3.y));
            s[14] = select(MASKED, s[14], (k0 + c + 2u * COLS >= span3.x) & (k0 + c + 2u * COLS < span3.y));
            s[15] = select(MASKED, s[15], (k0 + c + 3u * COLS >= span3.x) & (k0 + c + 3u * COLS < span3.y));
        }
        row_part[(a * TILE_Q + 0u) * COLS + c] = max(max(max(s[0], s[1]), s[2]), s[3]);
        row_part[(a * TILE_Q + 1u) * COLS + c] = max(max(max(s[4], s[5]), s[6]), s[7]);
        row_part[(a * TILE_Q + 2u) * COLS + c] = max(max(max(s[8], s[9]), s[10]), s[11]);
        row_part[(a * TILE_Q + 3u) * COLS + c] = max(max(max(s[12], s[13]), s[14]), s[15]);
        workgroupBarrier();  // every invocation is done reading K; partial maxima are written

        tile_kv[t + 0u * WORKGROUP_SIZE] = pre[0];
        tile_kv[t + 1u * WORKGROUP_SIZE] = pre[1];
        tile_kv[t + 2u * WORKGROUP_SIZE] = pre[2];
        tile_kv[t + 3u * WORKGROUP_SIZE] = pre[3];
        if (t + 4u * WORKGROUP_SIZE < BLOCK_K * ROW4) {
            tile_kv[t + 4u * WORKGROUP_SIZE] = pre[4];
        }

        pre[0] = kv_element(false, t + 0u * WORKGROUP_SIZE, k0 + BLOCK_K, kv_len, kv_head, d4_count);
        pre[1] = kv_element(false, t + 1u * WORKGROUP_SIZE, k0 + BLOCK_K, kv_len, kv_head, d4_count);
        pre[2] = kv_element(false, t + 2u * WORKGROUP_SIZE, k0 + BLOCK_K, kv_len, kv_head, d4_count);
        pre[3] = kv_element(false, t + 3u * WORKGROUP_SIZE, k0 + BLOCK_K, kv_len, kv_head, d4_count);
        pre[4] = kv_element(false, t + 4u * WORKGROUP_SIZE, k0 + BLOCK_K, kv_len, kv_head, d4_count);

        // online softmax: P = exp(S - m_new) into tile_p, rescale l and acc by exp(m_old - m_new)
        // (while nothing is seen yet m_old == m_new == MASKED: acc and l are 0 whatever the factor)
        {
            let r = a * TILE_Q + 0u;
            let m_new = max(m[0], row_max(r));
            let correction = exp(m[0] - m_new);
            m[0] = m_new;
            let p0 = select(0.0, exp(s[0] - m_new), s[0] > MASKED);
            tile_p[r * (BLOCK_K / 4u) + (c + 0u * COLS) / 4u][(c + 0u * COLS) % 4u] = p0;
            let p1 = select(0.0, exp(s[1] - m_new), s[1] > MASKED);
            tile_p[r * (BLOCK_K / 4u) + (c + 1u * COLS) / 4u][(c + 1u * COLS) % 4u] = p1;
            let p2 = select(0.0, exp(s[2] - m_new), s[2] > MASKED);
            tile_p[r * (BLOCK_K / 4u) + (c + 2u * COLS) / 4u][(c + 2u * COLS) % 4u] = p2;
            let p3 = select(0.0, exp(s[3] - m_new), s[3] > MASKED);
            tile_p[r * (BLOCK_K / 4u) + (c + 3u * COLS) / 4u][(c + 3u * COLS) % 4u] = p3;
            l[0] = l[0] * correction + p0 + p1 + p2 + p3;
            acc[0] = acc[0] * correction;
        }
        {
            let r = a * TILE_Q + 1u;
            let m_new = max(m[1], row_max(r));
            let correction = exp(m[1] - m_new);
            m[1] = m_new;
            let p0 = select(0.0, exp(s[4] - m_new), s[4] > MASKED);
            tile_p[r * (BLOCK_K / 4u) + (c + 0u * COLS) / 4u][(c + 0u * COLS) % 4u] = p0;
            let p1 = select(0.0, exp(s[5] - m_new), s[5] > MASKED);
            tile_p[r * (BLOCK_K / 4u) + (c + 1u * COLS) / 4u][(c + 1u * COLS) % 4u] = p1;
            let p2 = select(0.0, exp(s[6] - m_new), s[6] > MASKED);
            tile_p[r * (BLOCK_K / 4u) + (c + 2u * COLS) / 4u][(c + 2u * COLS) % 4u] = p2;
            let p3 = select(0.0, exp(s[7] - m_new), s[7] > MASKED);
            tile_p[r * (BLOCK_K / 4u) + (c + 3u * COLS) / 4u][(c + 3u * COLS) % 4u] = p3;
            l[1] = l[1] * correction + p0 + p1 + p2 + p3;
            acc[1] = acc[1] * correction;
        }
        {
            let r = a * TILE_Q + 2u;
            let m_new = max(m[2], row_max(r));
            let correction = exp(m[2] - m_new);
            m[2] = m_new;
            let p0 = select(0.0, exp(s[8] - m_new), s[8] > MASKED);
            tile_p[r * (BLOCK_K / 4u) + (c + 0u * COLS) / 4u][(c + 0u * COLS) % 4u] = p0;
            let p1 = select(0.0, exp(s[9] - m_new), s[9] > MASKED);
            tile_p[r * (BLOCK_K / 4u) + (c + 1u * COLS) / 4u][(c + 1u * COLS) % 4u] = p1;
            let p2 = select(0.0, exp(s[10] - m_new), s[10] > MASKED);
            tile_p[r * (BLOCK_K / 4u) + (c + 2u * COLS) / 4u][(c + 2u * COLS) % 4u] = p2;
            let p3 = select(0.0, exp(s[11] - m_new), s[11] > MASKED);
            tile_p[r * (BLOCK_K / 4u) + (c + 3u * COLS) / 4u][(c + 3u * COLS) % 4u] = p3;
            l[2] = l[2] * correction + p0 + p1 + p2 + p3;
            acc[2] = acc[2] * correction;
        }
        {
            let r = a * TILE_Q + 3u;
            let m_new = max(m[3], row_max(r));
            let correction = exp(m[3] - m_new);
            m[3] = m_new;
            let p0 = select(0.0, exp(s[12] - m_new), s[12] > MASKED);
            tile_p[r * (BLOCK_K / 4u) + (c + 0u * COLS) / 4u][(c + 0u * COLS) % 4u] = p0;
            let p1 = select(0.0, exp(s[13] - m_new), s[13] > MASKED);
            tile_p[r * (BLOCK_K / 4u) + (c + 1u * COLS) / 4u][(c + 1u * COLS) % 4u] = p1;
            let p2 = select(0.0, exp(s[14] - m_new), s[14] > MASKED);
            tile_p[r * (BLOCK_K / 4u) + (c + 2u * COLS) / 4u][(c + 2u * COLS) % 4u] = p2;
            let p3 = select(0.0, exp(s[15] - m_new), s[15] > MASKED);
            tile_p[r * (BLOCK_K / 4u) + (c + 3u * COLS) / 4u][(c + 3u * COLS) % 4u] = p3;
            l[3] = l[3] * correction + p0 + p1 + p2 + p3;
            acc[3] = acc[3] * correction;
        }
        workgroupBarrier();  // V and P are in workgroup memory

        // O += P·V for TILE_Q queries x TILE_D4 head-dim vec4 columns
        for (var k4: u32 = 0u; k4 < BLOCK_K / 4u; k4 = k4 + 1u) {
            let p0 = vec4<f32>(tile_p[(a * TILE_Q + 0u) * (BLOCK_K / 4u) + k4]);
            let p1 = vec4<f32>(tile_p[(a * TILE_Q + 1u) * (BLOCK_K / 4u) + k4]);
            let p2 = vec4<f32>(tile_p[(a * TILE_Q + 2u) * (BLOCK_K / 4u) + k4]);
            let p3 = vec4<f32>(tile_p[(a * TILE_Q + 3u) * (BLOCK_K / 4u) + k4]);
            let v00 = vec4<f32>(tile_kv[(k4 * 4u + 0u) * ROW4 + c + 0u * COLS]);
            acc[0] = acc[0] + p0.x * v00;
            acc[1] = acc[1] + p1.x * v00;
            acc[2] = acc[2] + p2.x * v00;
            acc[3] = acc[3] + p3.x * v00;
            let v10 = vec4<f32>(tile_kv[(k4 * 4u + 1u) * ROW4 + c + 0u * COLS]);
            acc[0] = acc[0] + p0.y * v10;
            acc[1] = acc[1] + p1.y * v10;
            acc[2] = acc[2] + p2.y * v10;
            acc[3] = acc[3] + p3.y * v10;
            let v20 = vec4<f32>(tile_kv[(k4 * 4u + 2u) * ROW4 + c + 0u * COLS]);
            acc[0] = acc[0] + p0.z * v20;
            acc[1] = acc[1] + p1.z * v20;
            acc[2] = acc[2] + p2.z * v20;
            acc[3] = acc[3] + p3.z * v20;
            let v30 = vec4<f32>(tile_kv[(k4 * 4u + 3u) * ROW4 + c + 0u * COLS]);
            acc[0] = acc[0] + p0.w * v30;
            acc[1] = acc[1] + p1.w * v30;
            acc[2] = acc[2] + p2.w * v30;
            acc[3] = acc[3] + p3.w * v30;
        }
    }

    // Row sums: reduce the COLS shares, then normalise and store
    // (a query whose every key is masked has l == 0 and writes zeros: masked_row = "zero")
    workgroupBarrier();
    row_part[(a * TILE_Q + 0u) * COLS + c] = l[0];
    row_part[(a * TILE_Q + 1u) * COLS + c] = l[1];
    row_part[(a * TILE_Q + 2u) * COLS + c] = l[2];
    row_part[(a * TILE_Q + 3u) * COLS + c] = l[3];
    workgroupBarrier();
    if (a * TILE_Q + 0u < q_count) {
        let r = a * TILE_Q + 0u;
        let total = row_sum(r);
        let inv_l = select(0.0, 1.0 / total, total > 0.0);
        let base = ((q0 + r) * u.num_heads + head) * u.head_dim;
        store_out4(base, c + 0u * COLS, acc[0] * inv_l);
    }
    if (a * TILE_Q + 1u < q_count) {
        let r = a * TILE_Q + 1u;
        let total = row_sum(r);
        let inv_l = select(0.0, 1.0 / total, total > 0.0);
        let base = ((q0 + r) * u.num_heads + head) * u.head_dim;
        store_out4(base, c + 0u * COLS, acc[1] * inv_l);
    }
    if (a * TILE_Q + 2u < q_count) {
        let r = a * TILE_Q + 2u;
        let total = row_sum(r);
        let inv_l = select(0.0, 1.0 / total, total > 0.0);
        let base = ((q0 + r) * u.num_heads + head) * u.head_dim;
        store_out4(base, c + 0u * COLS, acc[2] * inv_l);
    }
    if (a * TILE_Q + 3u < q_count) {
        let r = a * TILE_Q + 3u;
        let total = row_sum(r);
        let inv_l = select(0.0, 1.0 / total, total > 0.0);
        let base = ((q0 + r) * u.num_heads + head) * u.head_dim;
        store_out4(base, c + 0u * COLS, acc[3] * inv_l);
    }
}
