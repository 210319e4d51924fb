// tree_leaves: torchtree.kernels.traversal.leaf_index as one compiled pass: each (tree, point) pair walks its
// tree from the root to a leaf. The reference (torch) routes the pairs level by level with gathers and a
// shrinking working set; both compare x[feature] > threshold (threshold converted to X's dtype first), so
// the leaves are the same.
#include <torch/extension.h>
#include <ATen/Parallel.h>

namespace {

template <typename scalar_t>
void walk(const int32_t* feature, const scalar_t* thr, const int32_t* left, const int32_t* right, const scalar_t* X,
          int64_t* out, int64_t P, int64_t C, int64_t M, int64_t D) {
  // one task per (tree, block of points): a tree's nodes stay in cache while its points walk it
  const int64_t block = 256, n_blocks = (M + block - 1) / block;
  at::parallel_for(0, P * n_blocks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t p = t / n_blocks, m0 = (t % n_blocks) * block, m1 = std::min(M, m0 + block);
      const int32_t *f = feature + p * C, *l = left + p * C, *r = right + p * C;
      const scalar_t* th = thr + p * C;
      int64_t* o = out + p * M;
      for (int64_t m = m0; m < m1; ++m) {
        const scalar_t* x = X + m * D;
        int64_t node = 0;
        for (int64_t step = 0; step < C && f[node] >= 0; ++step) node = x[f[node]] > th[node] ? r[node] : l[node];
        o[m] = node;
      }
    }
  });
}

// feature, left, right: int32 [P, C]; threshold: [P, C] in X's dtype; X: [M, D] float32 or float64 -> int64 [P, M]
at::Tensor tree_leaves(at::Tensor feature, at::Tensor threshold, at::Tensor left, at::Tensor right, at::Tensor X) {
  TORCH_CHECK(feature.dim() == 2 && X.dim() == 2, "feature [P, C] and X [M, D]");
  TORCH_CHECK(feature.scalar_type() == at::kInt && left.scalar_type() == at::kInt && right.scalar_type() == at::kInt,
              "feature, left, right: int32");
  TORCH_CHECK(threshold.scalar_type() == X.scalar_type(), "threshold in X's dtype");
  TORCH_CHECK(threshold.sizes() == feature.sizes() && left.sizes() == feature.sizes() && right.sizes() == feature.sizes(),
              "feature, threshold, left, right: one shape");
  const int64_t P = feature.size(0), C = feature.size(1), M = X.size(0), D = X.size(1);
  auto fc = feature.contiguous(), tc = threshold.contiguous(), lc = left.contiguous(), rc = right.contiguous();
  auto xc = X.contiguous();
  auto out = at::zeros({P, M}, X.options().dtype(at::kLong));
  if (P == 0 || M == 0 || C == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(X.scalar_type(), "tree_leaves", [&] {
    walk<scalar_t>(fc.data_ptr<int32_t>(), tc.data_ptr<scalar_t>(), lc.data_ptr<int32_t>(), rc.data_ptr<int32_t>(),
                   xc.data_ptr<scalar_t>(), out.data_ptr<int64_t>(), P, C, M, D);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchtree, m) {
  m.def("tree_leaves(Tensor feature, Tensor threshold, Tensor left, Tensor right, Tensor X) -> Tensor");
}

TORCH_LIBRARY_IMPL(torchtree, CPU, m) { m.impl("tree_leaves", tree_leaves); }
