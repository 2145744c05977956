// Exact attention over a paged KV cache, for the native int8 forward (no torch types: tests compile it alone).
//
// A pass's rows belong to segments, one per sequence; a segment's slots are logical (0 .. start + count) and map
// to physical cache slots through its page table. Every score is one chain of multiply-adds over the head
// dimensions in order, every output lane one chain over the row's visible slots in slot order, and the softmax
// sums in a fixed order over the visible slots: so a row's bits depend on its query, its visible slots and
// the cache contents only, never on how many rows, heads or sequences share the pass. Work is shared where it
// cannot change a bit: the query heads of one kv head and several rows score against each key block loaded
// once, and the weighted sum runs over the slots all of them see before each goes on alone.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "lanes.h"

namespace paradecode {

// The rows of one sequence in a pass. Row i of the segment (pass row first_row + i) sits at logical slot
// start + i and sees the logical slots its mask row allows (mask [count, start + count], row-major), or with no
// mask the slots up to and including its own.
struct Segment {
  const int32_t* pages;  // physical page of each logical page
  int64_t start;
  int64_t count;
  const bool* mask;  // nullptr: causal
  int64_t first_row;
  const int64_t* physical;  // [start + count] the physical slot of each logical slot (from `pages`)
};

// One layer's cache, in half floats: keys transposed in 16-slot blocks [Hkv, slots / 16, hd, 16], values
// [Hkv, slots, hd].
struct LayerCache {
  half* keys_t;
  half* values;
  int64_t slots;       // physical slots (a multiple of the page size)
  int64_t page_shift;  // a page holds 2^page_shift slots, a multiple of kLanes
  int64_t head_dim;
  int64_t physical(const int32_t* pages, int64_t logical) const {
    return (static_cast<int64_t>(pages[logical >> page_shift]) << page_shift) |
           (logical & ((int64_t{1} << page_shift) - 1));
  }
  half* key_block(int64_t kv_head, int64_t physical_slot) const {  // the 16-slot block holding this slot
    return keys_t + (kv_head * (slots / kLanes) + physical_slot / kLanes) * head_dim * kLanes;
  }
  half* value(int64_t kv_head, int64_t physical_slot) const {
    return values + (kv_head * slots + physical_slot) * head_dim;
  }
};

struct AttentionShape {
  int64_t heads, kv_heads, head_dim, row_width;  // row_width: floats per row of the qkv input
  float scale;                                   // scores are multiplied by it (usually 1 / sqrt(head_dim))
  int64_t window;                                // a row at position p sees logical slots > p - window; 0: all
  const int64_t* positions;                      // [pass rows] each row's position (read where window > 0)
};

constexpr int kMaxQueries = 8;  // queries of one attention unit (attend scores them in groups of kScoreQueries)

// Register budget of the tiles below. A vf takes one register with AVX-512 (32 of them), two with AVX/AVX2 (16
// of them) and four with SSE: a tile keeps its sums and its loaded operands in registers, plus one broadcast.
// Tiles past the budget spilled their sums to the stack on every multiply-add: on an AMD EPYC Zen 3 (AVX2) a
// 6-query score tile of two key blocks and a 3-query value tile of 64 lanes did.
#if defined(__AVX512F__)
constexpr int kVectorRegisters = 32, kRegistersPerVf = 1;
#elif defined(__AVX__)
constexpr int kVectorRegisters = 16, kRegistersPerVf = 2;
#else
constexpr int kVectorRegisters = 16, kRegistersPerVf = 4;
#endif
constexpr bool fits_registers(int sums, int operands) {
  return (sums + operands) * kRegistersPerVf + 1 <= kVectorRegisters;
}
constexpr int most_queries(int limit) {  // the most queries (at most limit) whose sums fit beside one operand
  int n = 1;
  while (n < limit && fits_registers(n + 1, 1)) ++n;
  return n;
}
constexpr int kScoreQueries = most_queries(kMaxQueries);  // queries scored together against one key block
constexpr int kPvQueries = most_queries(6);                // queries summed together over one value row
// A score tile takes two key blocks at a time (twice the independent sums in flight) where their sums fit.
template <int NQ>
constexpr int score_blocks_at_once() { return fits_registers(2 * NQ, 2) ? 2 : 1; }
// A value tile covers 64, 32 or 16 lanes of the head dimension per pass over the slots: the widest that fits.
template <int NQ>
constexpr int value_chunk_vectors() { return fits_registers(4 * NQ, 4) ? 4 : fits_registers(2 * NQ, 2) ? 2 : 1; }
// Prefetch: the scores ask for the key blocks ahead and the weighted sums for the value row kValuesAhead
// slots ahead. A key block is 2 KiB (half the 4 KiB page the hardware prefetcher stays within) and a slot's pages
// may lie anywhere, so the loads stalled: on an Intel Xeon (AMX, 2 threads, SmolLM2-135M q4) the attention stage
// took 0.74-0.83 ms at T=1 after 256 cached tokens and 2.62-2.91 ms after 1,000, and 0.65-0.70 / 1.91-2.29 with
// these (three alternating processes each; T=8: 1.62-2.02 / 5.46-5.47 ms, then 1.52-1.58 / 4.76-5.00).
constexpr int64_t kValuesAhead = 16;

// Scores of NQ queries (hd floats each) against NB 16-slot blocks at a time, from logical slot `block` (a multiple
// of kLanes) while NB whole blocks start before `seen`: scores[i * padded + slot]; slots past `seen` inside the
// last block are scored too. Returns the first block not scored.
template <int NQ, int NB>
inline int64_t score_tiles(const LayerCache& cache, const int32_t* pages, int64_t g, const float* const* q,
                           int64_t block, int64_t seen, float* scores, int64_t padded) {
  const int64_t hd = cache.head_dim;
  const int64_t block_bytes = hd * kLanes * static_cast<int64_t>(sizeof(half));
  for (; block + (NB - 1) * kLanes < seen; block += NB * kLanes) {
    const half* k[NB];
#pragma GCC unroll 2
    for (int b = 0; b < NB; ++b) k[b] = cache.key_block(g, cache.physical(pages, block + b * kLanes));
    if (block + (2 * NB - 1) * kLanes < seen) {  // the next NB blocks, where a whole step follows (Prefetch, above)
#pragma GCC unroll 2
      for (int b = 0; b < NB; ++b) {
        const int64_t ahead = cache.physical(pages, block + (NB + b) * kLanes);
        const char* n = reinterpret_cast<const char*>(cache.key_block(g, ahead));
        for (int64_t off = 0; off < block_bytes; off += 64) __builtin_prefetch(n + off, 0, 3);
      }
    }
    vf a[NB][NQ];
#pragma GCC unroll 2
    for (int b = 0; b < NB; ++b)
#pragma GCC unroll 8
      for (int i = 0; i < NQ; ++i) a[b][i] = vf{};
    for (int64_t c = 0; c < hd; ++c) {
      vf x[NB];
#pragma GCC unroll 2
      for (int b = 0; b < NB; ++b) x[b] = load(k[b] + c * kLanes);
#pragma GCC unroll 8
      for (int i = 0; i < NQ; ++i) {
        const vf qc = splat(q[i][c]);
#pragma GCC unroll 2
        for (int b = 0; b < NB; ++b) a[b][i] = mul_add(qc, x[b], a[b][i]);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < NQ; ++i)
#pragma GCC unroll 2
      for (int b = 0; b < NB; ++b) store(scores + i * padded + block + b * kLanes, a[b][i]);
  }
  return block;
}

// Scores of NQ queries against the 16-slot blocks covering logical slots [first, seen) (score_tiles' layout):
// two blocks at a time where their sums fit the registers, then one. Each score is one chain over the head
// dimensions in order whatever the tile, so the tile never changes a bit.
template <int NQ>
inline void score_blocks(const LayerCache& cache, const int32_t* pages, int64_t g, const float* const* q,
                         int64_t first, int64_t seen, float* scores, int64_t padded) {
  constexpr int NB = score_blocks_at_once<NQ>();
  int64_t block = score_tiles<NQ, NB>(cache, pages, g, q, first, seen, scores, padded);
  if (NB > 1) score_tiles<NQ, 1>(cache, pages, g, q, block, seen, scores, padded);
}

inline void score_queries(const LayerCache& cache, const int32_t* pages, int64_t g, const float* const* q, int nq,
                          int64_t first, int64_t seen, float* scores, int64_t padded) {
  static_assert(kScoreQueries >= 2 && kScoreQueries <= 8, "score tiles of 2 to 8 queries");
  switch (std::min(nq, kScoreQueries)) {
    case 1: return score_blocks<1>(cache, pages, g, q, first, seen, scores, padded);
    case 2: return score_blocks<2>(cache, pages, g, q, first, seen, scores, padded);
    case 3: return score_blocks<3>(cache, pages, g, q, first, seen, scores, padded);
    case 4: return score_blocks<4>(cache, pages, g, q, first, seen, scores, padded);
    case 5: return score_blocks<5>(cache, pages, g, q, first, seen, scores, padded);
    case 6: return score_blocks<6>(cache, pages, g, q, first, seen, scores, padded);
    case 7: return score_blocks<7>(cache, pages, g, q, first, seen, scores, padded);
    default: return score_blocks<8>(cache, pages, g, q, first, seen, scores, padded);
  }
}

// acc[j][d] += sum over visible[from .. to) of p[j][i] * value[d], in slot order, for NQ queries that share
// those visible slots (physical slots); acc holds each query's running sums (hd floats each) between calls.
// Each pass over the slots covers CH vectors (16 CH lanes) of the head dimension; every lane is one chain in slot
// order whatever CH is.
template <int NQ>
inline void weighted_values(const LayerCache& cache, int64_t g, const int64_t* visible, int64_t from, int64_t to,
                            const float* const* p, float* const* acc) {
  constexpr int CH = value_chunk_vectors<NQ>();
  const int64_t hd = cache.head_dim;
  const half* values = cache.value(g, 0);
  int64_t chunk = 0;
  for (; chunk + CH * kLanes <= hd; chunk += CH * kLanes) {
    vf a[NQ][CH];
#pragma GCC unroll 8
    for (int j = 0; j < NQ; ++j)
#pragma GCC unroll 4
      for (int l = 0; l < CH; ++l) a[j][l] = load(acc[j] + chunk + l * kLanes);
    for (int64_t i = from; i < to; ++i) {
      const half* v = values + visible[i] * hd + chunk;
      if (i + kValuesAhead < to && (CH >= 4 || chunk % 32 == 0)) {  // the cache lines of this chunk further on
        const char* ahead = reinterpret_cast<const char*>(values + visible[i + kValuesAhead] * hd + chunk);
        __builtin_prefetch(ahead, 0, 3);
        if (CH >= 4) __builtin_prefetch(ahead + 64, 0, 3);
      }
      vf x[CH];
#pragma GCC unroll 4
      for (int l = 0; l < CH; ++l) x[l] = load(v + l * kLanes);
#pragma GCC unroll 8
      for (int j = 0; j < NQ; ++j) {
        const vf s = splat(p[j][i]);
#pragma GCC unroll 4
        for (int l = 0; l < CH; ++l) a[j][l] = mul_add(s, x[l], a[j][l]);
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < NQ; ++j)
#pragma GCC unroll 4
      for (int l = 0; l < CH; ++l) store(acc[j] + chunk + l * kLanes, a[j][l]);
  }
  for (; chunk + kLanes <= hd; chunk += kLanes) {
    for (int j = 0; j < NQ; ++j) {
      vf a = load(acc[j] + chunk);
      for (int64_t i = from; i < to; ++i) a = mul_add(splat(p[j][i]), load(values + visible[i] * hd + chunk), a);
      store(acc[j] + chunk, a);
    }
  }
  for (; chunk < hd; ++chunk) {
    for (int j = 0; j < NQ; ++j) {
      float a = acc[j][chunk];
      for (int64_t i = from; i < to; ++i) a = mul_add(p[j][i], from_half(values[visible[i] * hd + chunk]), a);
      acc[j][chunk] = a;
    }
  }
}

inline void weigh_queries(const LayerCache& cache, int64_t g, const int64_t* visible, int64_t from, int64_t to,
                          const float* const* p, float* const* acc, int nq) {
  static_assert(kPvQueries >= 2 && kPvQueries <= 6, "value tiles of 2 to 6 queries");
  switch (std::min(nq, kPvQueries)) {
    case 1: return weighted_values<1>(cache, g, visible, from, to, p, acc);
    case 2: return weighted_values<2>(cache, g, visible, from, to, p, acc);
    case 3: return weighted_values<3>(cache, g, visible, from, to, p, acc);
    case 4: return weighted_values<4>(cache, g, visible, from, to, p, acc);
    case 5: return weighted_values<5>(cache, g, visible, from, to, p, acc);
    default: return weighted_values<6>(cache, g, visible, from, to, p, acc);
  }
}

// Scratch memory of one attention task, grown on demand.
struct AttentionScratch {
  std::vector<float> scores, probs;
  std::vector<int64_t> visible, physical;  // each row's visible logical slots, and their physical slots
  std::vector<int64_t> counts;
  std::vector<const float*> queries, probs_of;
  std::vector<float*> accs;
};

// Attention of rows [r0, r1) of `segment` (segment-local) and query heads [h0, h1) of kv head g:
// qkv rows (queries in the first heads * head_dim floats) -> out rows [pass rows, heads * head_dim].
inline void attend(const AttentionShape& shape, const LayerCache& cache, const Segment& segment, int64_t g,
                   int64_t r0, int64_t r1, int64_t h0, int64_t h1, const float* qkv, float* out,
                   AttentionScratch& scratch) {
  const int64_t hd = shape.head_dim, group = shape.heads / shape.kv_heads;
  const int64_t end = segment.start + segment.count;
  const int64_t rows = r1 - r0, per_row = h1 - h0, nq = rows * per_row;  // rows <= kMaxQueries
  const int64_t seen = segment.mask ? end : segment.start + r1;  // slots any of these rows may see
  const int64_t padded = (seen + kLanes - 1) / kLanes * kLanes;
  // The first logical slot each row may see: 0, or under a window the first slot past its position - window (a
  // causal row always sees its own slot).
  int64_t low[kMaxQueries];
  int64_t lowest = seen;
  for (int64_t r = 0; r < rows; ++r) {
    low[r] = 0;
    if (shape.window > 0) {
      low[r] = std::max<int64_t>(0, shape.positions[segment.first_row + r0 + r] - shape.window + 1);
      if (!segment.mask) low[r] = std::min(low[r], segment.start + r0 + r);
    }
    lowest = std::min(lowest, low[r]);
  }
  scratch.scores.resize(nq * padded);
  scratch.probs.resize(nq * end);
  if (segment.mask) {
    scratch.visible.resize(rows * end);
    scratch.physical.resize(rows * end);
  }
  scratch.counts.resize(rows);
  const float scale = shape.scale;

  auto& queries = scratch.queries;
  queries.resize(nq);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < per_row; ++h) {
      const int64_t head = g * group + h0 + h;
      queries[r * per_row + h] = qkv + (segment.first_row + r0 + r) * shape.row_width + head * hd;
    }
  for (int64_t first = 0; first < nq; first += kScoreQueries) {
    const int n = static_cast<int>(std::min<int64_t>(kScoreQueries, nq - first));
    score_queries(cache, segment.pages, g, queries.data() + first, n, lowest / kLanes * kLanes, seen,
                  scratch.scores.data() + first * padded, padded);
  }
  // Each row's visible slots (logical, in slot order) and their physical slots; the rows' common leading run is
  // summed for all of them at once. A causal row sees slots low .. start + its index: no list to build.
  const int64_t* vis_of[kMaxQueries];
  const int64_t* phys_of[kMaxQueries];
  int64_t common = -1;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t local = r0 + r;
    int64_t count = 0;
    if (segment.mask) {
      int64_t* vis = scratch.visible.data() + r * end;
      int64_t* phys = scratch.physical.data() + r * end;
      const bool* row = segment.mask + local * end;
      for (int64_t j = low[r]; j < end; ++j)
        if (row[j]) {
          phys[count] = segment.physical[j];
          vis[count++] = j;
        }
      vis_of[r] = vis;
      phys_of[r] = phys;
    } else {
      count = segment.start + local + 1 - low[r];
      vis_of[r] = nullptr;
      phys_of[r] = segment.physical + low[r];
    }
    scratch.counts[r] = count;
    if (r == 0) {
      common = count;
    } else if (segment.mask) {
      int64_t same = 0;
      while (same < common && same < count && vis_of[r][same] == vis_of[0][same]) ++same;
      common = same;
    } else {
      common = low[r] == low[0] ? std::min(common, count) : 0;
    }
  }
  // Softmax of each query's visible scores.
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t* vis = vis_of[r];
    const int64_t count = scratch.counts[r];
    for (int64_t h = 0; h < per_row; ++h) {
      const int64_t i = r * per_row + h;
      const float* sp = scratch.scores.data() + i * padded;
      float* pp = scratch.probs.data() + i * end;
      if (vis) {
        for (int64_t k = 0; k < count; ++k) pp[k] = sp[vis[k]] * scale;
      } else {
        each(count, [&](int64_t k, auto z) { st(pp + k, ld(sp + low[r] + k, z) * scale); });
      }
      const float top = max_value(pp, count);
      each(count, [&](int64_t k, auto z) { st(pp + k, exp_approx(ld(pp + k, z) - top)); });
    }
  }
  // Weighted values: the common run for groups of queries, then each row's own remaining slots.
  auto& accs = scratch.accs;
  auto& probs = scratch.probs_of;
  accs.resize(nq);
  probs.resize(nq);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < per_row; ++h) {
      const int64_t i = r * per_row + h, head = g * group + h0 + h;
      accs[i] = out + (segment.first_row + r0 + r) * shape.heads * hd + head * hd;
      std::fill(accs[i], accs[i] + hd, 0.f);
      probs[i] = scratch.probs.data() + i * end;
    }
  for (int64_t first = 0; first < nq; first += kPvQueries) {
    const int n = static_cast<int>(std::min<int64_t>(kPvQueries, nq - first));
    weigh_queries(cache, g, phys_of[0], 0, common, probs.data() + first, accs.data() + first, n);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t* phys = phys_of[r];
    const int64_t count = scratch.counts[r];
    for (int64_t h = 0; h < per_row; ++h) {
      const int64_t i = r * per_row + h;
      if (count > common) weigh_queries(cache, g, phys, common, count, &probs[i], &accs[i], 1);
      const float inv = 1.f / lane_sum(probs[i], count);
      float* o = accs[i];
      each(hd, [&](int64_t d, auto z) { st(o + d, ld(o + d, z) * inv); });
    }
  }
}

}  // namespace paradecode
