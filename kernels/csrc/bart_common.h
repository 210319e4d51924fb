// Helpers shared by the BART kernels (bart_update.cpp: the MCMC tree update and sweep; bart_gfr.cpp: the
// grow-from-root sweep): torchtree's keyed uniforms bit for bit, the leaf normals, the prior's draws of a
// node and a column, the leaf marginal likelihood, and the read-only inputs converted once.
#pragma once
#include <torch/extension.h>
#include <ATen/native/Math.h>

#include "keyed.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace torchtree_bart {

constexpr int64_t LEAF = -1;
constexpr int64_t ABSENT = -2;
constexpr int GROW = 0, PRUNE = 1, CHANGE = 2;

using torchtree_keyed::keyed_uniform;
using torchtree_keyed::mix64;

// where a leaf's standard normal comes from: a row of a tensor, or keyed draws made on demand
struct LeafNormals {
  const double* row = nullptr;  // [K] (zeros past the drawn slots)
  uint64_t base = 0;
  int64_t key = 0, kz = 0;
  double operator()(int64_t k) const {
    if (row) return row[k];
    return k < kz ? calc_ndtri(keyed_uniform(base, key, k)) : 0.0;
  }
};

// floor(u * count)-th True of mask[0..n) (the reference's pick_nth): n - 1 when there is none.
inline int64_t pick_nth(const std::vector<char>& mask, int64_t n, double u) {
  int64_t cnt = 0;
  for (int64_t i = 0; i < n; ++i) cnt += mask[i];
  int64_t nth = static_cast<int64_t>(std::floor(u * static_cast<double>(cnt)));
  nth = std::min(nth, std::max<int64_t>(cnt - 1, 0));
  int64_t before = 0, seen = 0;
  for (int64_t i = 0; i < n; ++i) {
    seen += mask[i];
    if (seen <= nth) ++before;
  }
  return std::min(before, n - 1);
}

// the k-th True of mask (k < count), as kth_true of torchtree.model.feature_groups
inline int64_t kth_true(const std::vector<char>& mask, int64_t n, int64_t k) {
  int64_t seen = 0;
  for (int64_t i = 0; i < n; ++i) {
    seen += mask[i];
    if (seen > k) return i;
  }
  return 0;
}

// choose_column of torchtree.model.feature_groups: input column, then split column
inline int64_t choose_grouped(const std::vector<char>& mask, int64_t D, double u, const int64_t* groups) {
  std::vector<int64_t> cnt(D, 0);
  for (int64_t d = 0; d < D; ++d) cnt[groups[d]] += mask[d];
  std::vector<char> has(D, 0);
  int64_t n_groups = 0;
  for (int64_t g = 0; g < D; ++g) {
    has[g] = cnt[g] > 0;
    n_groups += has[g];
  }
  double s = u * static_cast<double>(n_groups);
  int64_t k = std::min(static_cast<int64_t>(std::floor(s)), std::max<int64_t>(n_groups - 1, 0));
  int64_t g = kth_true(has, D, k);
  double frac = std::min(std::max(s - static_cast<double>(k), 0.0), 1.0 - 1e-12);
  int64_t c = cnt[g];
  int64_t k2 = std::min(static_cast<int64_t>(std::floor(frac * static_cast<double>(c))), std::max<int64_t>(c - 1, 0));
  std::vector<char> in_g(D, 0);
  for (int64_t d = 0; d < D; ++d) in_g[d] = mask[d] && groups[d] == g;
  return kth_true(in_g, D, k2);
}

inline double log_marginal(double n, double s, double s2, double tau2) {
  double v = s2 + n * tau2;
  return -0.5 * std::log(v / s2) + 0.5 * tau2 * s * s / (s2 * v);
}

inline int64_t heap_depth(int64_t j) {
  int64_t d = 0;
  while ((j + 1) >> (d + 1)) ++d;
  return d;
}

// The read-only inputs of the tree updates, converted once to the dtypes their loops read: bins int16
// [D, N], cuts per feature int64 [D], sigma^2 and the uniforms float64, groups int64 [D] (or empty), the
// split probability and log(1 - p) per depth float64.
struct UpdateInputs {
  at::Tensor xb, nc, s2, uu, gr, psl, l1m;
  UpdateInputs(const at::Tensor& Xb, const at::Tensor& n_cuts, const at::Tensor& sigma2, const at::Tensor& u,
               const at::Tensor& groups, const at::Tensor& ps_lut, const at::Tensor& log1m_ps)
      : xb(Xb.to(at::kShort).contiguous()), nc(n_cuts.to(at::kLong).contiguous()),
        s2(sigma2.to(at::kDouble).contiguous()), uu(u.to(at::kDouble).contiguous()),
        gr(groups.numel() ? groups.to(at::kLong).contiguous() : groups),
        psl(ps_lut.to(at::kDouble).contiguous()), l1m(log1m_ps.to(at::kDouble).contiguous()) {}
};

}  // namespace torchtree_bart
