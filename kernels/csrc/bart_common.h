// Helpers shared by the BART CPU kernels (bart_update.cpp: the MCMC tree update and sweep; bart_gfr.cpp: the
// grow-from-root sweep): torchtree's keyed uniforms bit for bit, the leaf normals and the read-only inputs
// converted once; bart_core.h holds the update's decisions (host and device code).
#pragma once
#include <torch/extension.h>
#include <ATen/native/Math.h>

#include "bart_core.h"
#include "keyed.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace torchtree_bart {

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

// feature_tables of a CPU operator's n_cuts and groups, with their storage
struct HostTables {
  std::vector<int64_t> buf;
  FeatureTables t;
  explicit HostTables(const UpdateInputs& in) : buf(feature_tables_size(in.nc.numel())) {
    t = feature_tables(in.nc.numel(), in.nc.data_ptr<int64_t>(), in.gr.numel() ? in.gr.data_ptr<int64_t>() : nullptr,
                       buf.data());
  }
};

}  // namespace torchtree_bart
