// The point-list passes of a top-down growth stage, one loop over each node's points instead of a
// gather, a sort and a scatter per pass: the C++ CPU implementations of the plain-torch references in
// torchtree.kernels.node_points (which documents the contracts; tests/test_native.py checks equality).
//
// A node's points are the int32 indices buf[off .. off + cnt). Every output is an exact function of
// the inputs (minima, maxima, comparisons, integer sums), so any order of work gives the same result.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace {

void check_lists(const at::Tensor& buf, const at::Tensor& off, const at::Tensor& cnt, const at::Tensor& X) {
  TORCH_CHECK(buf.device().is_cpu() && X.device().is_cpu(), "node_points kernels: CPU tensors only");
  TORCH_CHECK(buf.scalar_type() == at::kInt, "buf must be int32");
  TORCH_CHECK(off.scalar_type() == at::kLong && cnt.scalar_type() == at::kLong, "off and cnt must be int64");
  TORCH_CHECK(X.dim() == 2, "X must be [n, D]");
}

// grain for parallel_for over lists: about 32k points of work per task
int64_t list_grain(const at::Tensor& cnt) {
  const int64_t L = cnt.numel();
  if (L == 0) return 1;
  const int64_t total = cnt.sum().item<int64_t>();
  return std::max<int64_t>(1, L * 32768 / std::max<int64_t>(total, 1));
}

// lo, hi [L, D]: column-wise min and max of X over each list (+inf / -inf for an empty one)
std::vector<at::Tensor> node_extents(at::Tensor buf, at::Tensor off, at::Tensor cnt, at::Tensor X) {
  check_lists(buf, off, cnt, X);
  auto Xc = X.contiguous();
  auto offc = off.contiguous(), cntc = cnt.contiguous();
  const int64_t L = offc.numel(), D = Xc.size(1);
  auto lo = at::empty({L, D}, Xc.options()), hi = at::empty({L, D}, Xc.options());
  AT_DISPATCH_FLOATING_TYPES(Xc.scalar_type(), "node_extents", [&] {
    const scalar_t* x = Xc.data_ptr<scalar_t>();
    const int32_t* b = buf.data_ptr<int32_t>();
    const int64_t *o = offc.data_ptr<int64_t>(), *c = cntc.data_ptr<int64_t>();
    scalar_t *pl = lo.data_ptr<scalar_t>(), *ph = hi.data_ptr<scalar_t>();
    at::parallel_for(0, L, list_grain(cntc), [&](int64_t l0, int64_t l1) {
      for (int64_t l = l0; l < l1; ++l) {
        scalar_t* lw = pl + l * D;
        scalar_t* hg = ph + l * D;
        std::fill(lw, lw + D, std::numeric_limits<scalar_t>::infinity());
        std::fill(hg, hg + D, -std::numeric_limits<scalar_t>::infinity());
        const int32_t* p = b + o[l];
        for (int64_t t = 0; t < c[l]; ++t) {
          const scalar_t* row = x + static_cast<int64_t>(p[t]) * D;
          for (int64_t d = 0; d < D; ++d) {
            lw[d] = std::min(lw[d], row[d]);
            hg[d] = std::max(hg[d], row[d]);
          }
        }
      }
    });
  });
  return {lo, hi};
}

// For query q on list g = group[q] and column dim[g]: n_left[q] = #{points with X <= thr[q]} and
// left[q] = the sum of their stats rows (int32 [n, S]). Per list, the queries are sorted by threshold
// and each point goes to the bucket of the first threshold at or above its value (a binary search),
// so a list costs (points) x log2(queries) comparisons; prefix sums of the buckets give every query.
std::vector<at::Tensor> split_counts(at::Tensor buf, at::Tensor off, at::Tensor cnt, at::Tensor X, at::Tensor dim,
                                     at::Tensor group, at::Tensor thr, at::Tensor stats) {
  check_lists(buf, off, cnt, X);
  TORCH_CHECK(stats.scalar_type() == at::kInt && stats.dim() == 2, "stats must be int32 [n, S]");
  TORCH_CHECK(thr.scalar_type() == X.scalar_type(), "thr must have X's dtype");
  auto Xc = X.contiguous();
  auto offc = off.contiguous(), cntc = cnt.contiguous(), dimc = dim.to(at::kLong).contiguous();
  auto grp = group.to(at::kLong).contiguous();
  auto st = stats.contiguous();
  const int64_t L = offc.numel(), Q = grp.numel(), D = Xc.size(1), S = st.size(1);
  auto n_left = at::zeros({Q}, offc.options());
  auto left = at::zeros({Q, S}, st.options());
  // queries by list (a counting sort on group)
  std::vector<int64_t> qstart(L + 1, 0), qorder(Q);
  const int64_t* gq = grp.data_ptr<int64_t>();
  for (int64_t q = 0; q < Q; ++q) {
    TORCH_CHECK(gq[q] >= 0 && gq[q] < L, "split_counts: group out of range");
    ++qstart[gq[q] + 1];
  }
  std::partial_sum(qstart.begin(), qstart.end(), qstart.begin());
  {
    std::vector<int64_t> fill(qstart.begin(), qstart.end() - 1);
    for (int64_t q = 0; q < Q; ++q) qorder[fill[gq[q]]++] = q;
  }
  AT_DISPATCH_FLOATING_TYPES(Xc.scalar_type(), "split_counts", [&] {
    const scalar_t* x = Xc.data_ptr<scalar_t>();
    auto thc = thr.contiguous();
    const scalar_t* th = thc.data_ptr<scalar_t>();
    const int32_t* b = buf.data_ptr<int32_t>();
    const int32_t* sp = st.data_ptr<int32_t>();
    const int64_t *o = offc.data_ptr<int64_t>(), *c = cntc.data_ptr<int64_t>(), *dm = dimc.data_ptr<int64_t>();
    int64_t* nl = n_left.data_ptr<int64_t>();
    int32_t* lf = left.data_ptr<int32_t>();
    at::parallel_for(0, L, list_grain(cntc), [&](int64_t l0, int64_t l1) {
      std::vector<std::pair<scalar_t, int64_t>> qs;
      std::vector<scalar_t> ts;
      std::vector<int64_t> bucket;  // [m + 1, S + 1]: count, then the stats
      for (int64_t l = l0; l < l1; ++l) {
        const int64_t m = qstart[l + 1] - qstart[l];
        if (m == 0) continue;
        qs.clear();
        for (int64_t k = qstart[l]; k < qstart[l + 1]; ++k) qs.emplace_back(th[qorder[k]], qorder[k]);
        std::sort(qs.begin(), qs.end());
        ts.resize(m);
        for (int64_t j = 0; j < m; ++j) ts[j] = qs[j].first;
        bucket.assign((m + 1) * (S + 1), 0);
        const int32_t* p = b + o[l];
        const int64_t d = dm[l];
        for (int64_t t = 0; t < c[l]; ++t) {
          const int64_t i = p[t];
          const scalar_t v = x[i * D + d];
          const int64_t k = m == 1 ? (ts[0] < v) : std::lower_bound(ts.begin(), ts.end(), v) - ts.begin();
          int64_t* bk = bucket.data() + k * (S + 1);
          ++bk[0];
          const int32_t* s = sp + i * S;
          for (int64_t j = 0; j < S; ++j) bk[1 + j] += s[j];
        }
        std::vector<int64_t> acc(S + 1, 0);
        for (int64_t j = 0; j < m; ++j) {
          const int64_t* bk = bucket.data() + j * (S + 1);
          for (int64_t s = 0; s <= S; ++s) acc[s] += bk[s];
          const int64_t q = qs[j].second;
          nl[q] = acc[0];
          for (int64_t s = 0; s < S; ++s) lf[q * S + s] = static_cast<int32_t>(acc[1 + s]);
        }
      }
    });
  });
  return {n_left, left};
}

// The children's point lists: for list k (its parent's points), the points with (X[:, feat[k]] >
// thr[k] in X's dtype) == side[k], in the parent's order, written at out_off[k] in an int32 [total]
// output. Returns (points, counts [K]); a count above expected[k] is reported, its extra points not
// written (the caller checks counts against expected).
std::vector<at::Tensor> partition_points(at::Tensor buf, at::Tensor off, at::Tensor cnt, at::Tensor X,
                                         at::Tensor feat, at::Tensor thr, at::Tensor side, at::Tensor expected) {
  check_lists(buf, off, cnt, X);
  auto Xc = X.contiguous();
  auto offc = off.contiguous(), cntc = cnt.contiguous(), fc = feat.to(at::kLong).contiguous();
  auto thd = thr.to(at::kDouble).contiguous();
  auto sd = side.to(at::kBool).contiguous();
  auto ex = expected.to(at::kLong).contiguous();
  const int64_t K = offc.numel(), D = Xc.size(1);
  auto ostart = at::zeros({K}, ex.options());
  if (K > 1) ostart.narrow(0, 1, K - 1).copy_(ex.narrow(0, 0, K - 1).cumsum(0));
  const int64_t total = K ? ostart[K - 1].item<int64_t>() + ex[K - 1].item<int64_t>() : 0;
  auto out = at::empty({total}, buf.options());
  auto counts = at::zeros({K}, ex.options());
  AT_DISPATCH_FLOATING_TYPES(Xc.scalar_type(), "partition_points", [&] {
    const scalar_t* x = Xc.data_ptr<scalar_t>();
    const int32_t* b = buf.data_ptr<int32_t>();
    const int64_t *o = offc.data_ptr<int64_t>(), *c = cntc.data_ptr<int64_t>(), *f = fc.data_ptr<int64_t>();
    const int64_t *os = ostart.data_ptr<int64_t>(), *e = ex.data_ptr<int64_t>();
    const double* th = thd.data_ptr<double>();
    const bool* s = sd.data_ptr<bool>();
    int32_t* w = out.data_ptr<int32_t>();
    int64_t* n = counts.data_ptr<int64_t>();
    at::parallel_for(0, K, list_grain(cntc), [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        const scalar_t cut = static_cast<scalar_t>(th[k]);
        const int32_t* p = b + o[k];
        const int64_t fk = f[k];
        const bool right = s[k];
        int64_t got = 0;
        for (int64_t t = 0; t < c[k]; ++t) {
          const int32_t i = p[t];
          if ((x[static_cast<int64_t>(i) * D + fk] > cut) == right) {
            if (got < e[k]) w[os[k] + got] = i;
            ++got;
          }
        }
        n[k] = got;
      }
    });
  });
  return {out, counts};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchtree, m) {
  m.def("node_extents(Tensor buf, Tensor off, Tensor cnt, Tensor X) -> Tensor[]");
  m.def("split_counts(Tensor buf, Tensor off, Tensor cnt, Tensor X, Tensor dim, Tensor group, Tensor thr, "
        "Tensor stats) -> Tensor[]");
  m.def("partition_points(Tensor buf, Tensor off, Tensor cnt, Tensor X, Tensor feat, Tensor thr, Tensor side, "
        "Tensor expected) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(torchtree, CPU, m) {
  m.impl("node_extents", node_extents);
  m.impl("split_counts", split_counts);
  m.impl("partition_points", partition_points);
}
