// Reading a forest of heap trees: sums of trees at new points (the C++ CPU implementation of
// torchtree.model.bart.forest_sum), and the summaries a BART sweep reads of its chains (forest_stats).
//
// Heap trees: node k's children at 2k + 1 and 2k + 2; feature < 0 marks a leaf or an absent slot. A tree
// with at most CODE_BITS split nodes is read without walking it: each split node i's rule is tested on a
// block of points at once (a vectorised comparison of a contiguous row of bins), setting bit i of each
// point's code, and a table of the tree's 2^splits codes gives the leaf value (the walk done once per code
// instead of once per point). Larger trees are walked point by point for a fixed number of levels. A draw's
// sum runs tree by tree in float64; rows go in blocks that stay in cache while every tree passes over them.
#include "bart_common.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

// This file's loops start on a cache line: the prediction loops' speed then does not depend on where the linker
// places them (they ran 20% slower at another address after an unrelated object of the library grew).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("align-loops=64")
#endif

namespace {

constexpr int64_t ROW_BLOCK = 2048;
constexpr int CODE_BITS = 8;
// Below this many points a tree's code table (and the allocations of its plan) costs more than walking the
// points through it: every tree is walked (the same leaves, added in the same order, so the same sums).
constexpr int64_t CODED_MIN_POINTS = 64;

// code[m] |= (x[m] > c) << bit for m < n: one split node's rule on a block of points. On x86-64 with GCC it is
// built for AVX-512, AVX2 and the baseline, the widest the CPU has chosen when the library loads.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TORCHTREE_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TORCHTREE_VECTOR_CLONES
#endif
TORCHTREE_VECTOR_CLONES
void set_bits(const int16_t* x, int16_t c, uint16_t* code, int64_t n, int bit) {
  for (int64_t m = 0; m < n; ++m) code[m] |= static_cast<uint16_t>(static_cast<uint16_t>(x[m] > c) << bit);
}

// A draw's trees in a form ready for a block of points, in flat arrays reused from draw to draw (no allocation
// per tree): tree t's depth (levels[t], 0 for a lone leaf) and, for a coded tree, its split nodes
// nodes[node_at[t] ...] (bit i = the i-th of them) and its leaf value per code table[table_at[t] ...]
// (table_at[t] < 0: walked).
struct DrawPlan {
  std::vector<int64_t> levels, node_at, table_at, nodes;
  std::vector<double> table;
  std::vector<int> bit_of;  // per heap slot: the bit of a split node while its tree's table is built, else -1

  void reset(int64_t T, int64_t K) {
    levels.resize(T);
    node_at.resize(T);
    table_at.resize(T);
    nodes.clear();
    table.clear();
    if (static_cast<int64_t>(bit_of.size()) != K) bit_of.assign(K, -1);
  }
};

// The number of levels a walk through the tree takes: the depth of its deepest split node, plus one (0: a lone leaf)
inline int64_t walk_levels(const int32_t* f, int64_t K) {
  int64_t deepest = -1;
  for (int64_t k = 0; 2 * k + 2 < K; ++k)
    if (f[k] >= 0) deepest = k;
  return deepest < 0 ? 0 : torchtree_bart::heap_depth(deepest) + 1;
}

template <typename scalar_t>
void plan_draw(const int32_t* feat, const scalar_t* value, int64_t T, int64_t K, DrawPlan& p) {
  p.reset(T, K);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* f = feat + t * K;
    const scalar_t* v = value + t * K;
    const int64_t first = static_cast<int64_t>(p.nodes.size());
    int64_t deepest = -1;
    for (int64_t k = 0; 2 * k + 2 < K; ++k)
      if (f[k] >= 0) {
        deepest = k;
        p.nodes.push_back(k);
      }
    p.levels[t] = deepest < 0 ? 0 : torchtree_bart::heap_depth(deepest) + 1;
    p.node_at[t] = first;
    const int64_t ns = static_cast<int64_t>(p.nodes.size()) - first;
    if (ns > CODE_BITS) {
      p.table_at[t] = -1;
      continue;
    }
    for (int64_t i = 0; i < ns; ++i) p.bit_of[p.nodes[first + i]] = static_cast<int>(i);
    const int64_t at = static_cast<int64_t>(p.table.size());
    p.table_at[t] = at;
    p.table.resize(at + (int64_t(1) << ns));
    for (int64_t code = 0; code < (int64_t(1) << ns); ++code) {
      int64_t k = 0;
      while (2 * k + 2 < K && f[k] >= 0) k = 2 * k + 1 + ((code >> p.bit_of[k]) & 1);
      p.table[at + code] = static_cast<double>(v[k]);
    }
    for (int64_t i = 0; i < ns; ++i) p.bit_of[p.nodes[first + i]] = -1;
  }
}

// A tree walked point by point for ``levels`` levels: out[m] += its leaf value at point m, for m in [m0, m1)
template <typename scalar_t>
inline void walk_tree(const int32_t* f, const int32_t* c, const scalar_t* v, int64_t K, int64_t levels,
                      const int16_t* Xb, int64_t M, int64_t m0, int64_t m1, double* out) {
  for (int64_t m = m0; m < m1; ++m) {
    int64_t k = 0;
    for (int64_t l = 0; l < levels; ++l) {
      const int32_t fk = f[k];
      const bool split = fk >= 0 && 2 * k + 2 < K;
      const int64_t x = Xb[static_cast<int64_t>(std::max(fk, 0)) * M + m];
      const int64_t next = 2 * k + 1 + (x > c[k] ? 1 : 0);
      k = split ? next : k;
    }
    out[m] += static_cast<double>(v[k]);
  }
}

template <typename scalar_t>
void sum_draw(const int32_t* feat, const int32_t* cut, const scalar_t* value, int64_t T, int64_t K, const int16_t* Xb,
              int64_t M, double* out, DrawPlan& plan, std::vector<uint16_t>& code) {
  std::fill(out, out + M, 0.0);
  if (M < CODED_MIN_POINTS) {  // few points: walk every tree, no plans
    for (int64_t t = 0; t < T; ++t)
      walk_tree(feat + t * K, cut + t * K, value + t * K, K, walk_levels(feat + t * K, K), Xb, M, 0, M, out);
    return;
  }
  plan_draw(feat, value, T, K, plan);
  code.resize(ROW_BLOCK);
  for (int64_t m0 = 0; m0 < M; m0 += ROW_BLOCK) {
    const int64_t m1 = std::min(M, m0 + ROW_BLOCK), n = m1 - m0;
    for (int64_t t = 0; t < T; ++t) {
      const int32_t* f = feat + t * K;
      const int32_t* c = cut + t * K;
      double* o = out + m0;
      const int64_t at = plan.table_at[t];
      if (at >= 0) {
        const int64_t first = plan.node_at[t];
        const int64_t ns = (t + 1 < T ? plan.node_at[t + 1] : static_cast<int64_t>(plan.nodes.size())) - first;
        std::fill(code.begin(), code.begin() + n, uint16_t(0));
        for (int64_t i = 0; i < ns; ++i) {
          const int64_t k = plan.nodes[first + i];
          // bins are int16 and cut indices non-negative: clamping the cut keeps every comparison
          const int16_t ck = static_cast<int16_t>(std::min<int32_t>(c[k], 32767));
          set_bits(Xb + static_cast<int64_t>(f[k]) * M + m0, ck, code.data(), n, static_cast<int>(i));
        }
        const double* tab = plan.table.data() + at;
        for (int64_t m = 0; m < n; ++m) o[m] += tab[code[m]];
        continue;
      }
      walk_tree(f, c, value + t * K, K, plan.levels[t], Xb, M, m0, m1, out);
    }
  }
}

// feature, cut: integer [S, T, K] heap trees; value: float [S, T, K]; Xb: int16 [D, M] bins. Returns float64
// [S, M]: sum over t of value[s, t, leaf of point m in tree (s, t)], added in tree order.
at::Tensor forest_sum(at::Tensor feature, at::Tensor cut, at::Tensor value, at::Tensor Xb) {
  TORCH_CHECK(feature.device().is_cpu() && Xb.device().is_cpu(), "forest_sum: CPU tensors only");
  TORCH_CHECK(feature.dim() == 3 && cut.sizes() == feature.sizes() && value.sizes() == feature.sizes(),
              "forest_sum: feature, cut and value are [S, T, K]");
  TORCH_CHECK(Xb.scalar_type() == at::kShort && Xb.dim() == 2, "forest_sum: Xb is int16 [D, M]");
  const int64_t S = feature.size(0), T = feature.size(1), K = feature.size(2), M = Xb.size(1);
  auto f = feature.to(at::kInt).contiguous();
  auto c = cut.to(at::kInt).contiguous();
  auto v = value.contiguous();
  auto x = Xb.contiguous();
  auto out = at::empty({S, M}, value.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES(v.scalar_type(), "forest_sum", [&] {
    at::parallel_for(0, S, 1, [&](int64_t s0, int64_t s1) {
      DrawPlan plan;  // one per thread's range of draws, reused draw to draw
      std::vector<uint16_t> code;
      for (int64_t s = s0; s < s1; ++s)
        sum_draw<scalar_t>(f.data_ptr<int32_t>() + s * T * K, c.data_ptr<int32_t>() + s * T * K,
                           v.data_ptr<scalar_t>() + s * T * K, T, K, x.data_ptr<int16_t>(), M,
                           out.data_ptr<double>() + s * M, plan, code);
    });
  });
  return out;
}

// feature: int16 [T, C, K] heap trees (-2 absent, -1 leaf). Returns float64 [C + 1]: each chain's leaves
// per tree (mean over the T trees), then the depth of the deepest slot that holds a node (0 for none).
at::Tensor forest_stats(at::Tensor feature) {
  TORCH_CHECK(feature.device().is_cpu() && feature.scalar_type() == at::kShort && feature.dim() == 3,
              "forest_stats: feature is int16 [T, C, K] on the CPU");
  auto f = feature.contiguous();
  const int64_t T = f.size(0), C = f.size(1), K = f.size(2);
  auto out = at::zeros({C + 1}, f.options().dtype(at::kDouble));
  const int16_t* p = f.data_ptr<int16_t>();
  double* o = out.data_ptr<double>();
  std::vector<int16_t> used(K, 0);  // per slot: any tree holds a node there (branch-free, vectorised loops)
  for (int64_t c = 0; c < C; ++c) {
    int64_t leaves = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int16_t* tree = p + (t * C + c) * K;
      int32_t n = 0;
      for (int64_t k = 0; k < K; ++k) {
        n += tree[k] == -1;
        used[k] |= tree[k] != -2;
      }
      leaves += n;
    }
    o[c] = T ? static_cast<double>(leaves) / static_cast<double>(T) : 0.0;
  }
  int64_t last = K - 1;
  while (last >= 0 && !used[last]) --last;
  o[C] = last < 0 ? 0.0 : static_cast<double>(torchtree_bart::heap_depth(last));
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchtree, m) {
  m.def("forest_sum(Tensor feature, Tensor cut, Tensor value, Tensor Xb) -> Tensor");
  m.def("forest_stats(Tensor feature) -> Tensor");
}

TORCH_LIBRARY_IMPL(torchtree, CPU, m) {
  m.impl("forest_sum", forest_sum);
  m.impl("forest_stats", forest_stats);
}
