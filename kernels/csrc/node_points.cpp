// The point-list passes of a top-down growth stage, one loop over each node's points instead of a
// gather, a sort and a scatter per pass: the C++ CPU implementations of the plain-torch references in
// torchtree.kernels.node_points (which documents the contracts; tests/test_native.py checks equality).
//
// A node's points are the int32 indices buf[off .. off + cnt). Every output is an exact function of
// the inputs (minima, maxima, comparisons, integer sums), so any order of work gives the same result,
// except the float sums of split_sums / split_sum_intervals, which add in the reference's order (below).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
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

// The queries of each list (a counting sort on group [Q], values in [0, L)): list l's queries are
// qorder[qstart[l] .. qstart[l + 1]), in query order.
void queries_by_list(const at::Tensor& group, int64_t L, std::vector<int64_t>& qstart, std::vector<int64_t>& qorder) {
  const int64_t Q = group.numel();
  const int64_t* gq = group.data_ptr<int64_t>();
  qstart.assign(L + 1, 0);
  qorder.resize(Q);
  for (int64_t q = 0; q < Q; ++q) {
    TORCH_CHECK(gq[q] >= 0 && gq[q] < L, "a query's list is out of range");
    ++qstart[gq[q] + 1];
  }
  std::partial_sum(qstart.begin(), qstart.end(), qstart.begin());
  std::vector<int64_t> fill(qstart.begin(), qstart.end() - 1);
  for (int64_t q = 0; q < Q; ++q) qorder[fill[gq[q]]++] = q;
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
  std::vector<int64_t> qstart, qorder;
  queries_by_list(grp, L, qstart, qorder);
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

// A list's distinct ranks in one column, ascending (dr), with the count and the stats rows summed through
// each (acc, [m, S + 1]): a histogram over the ranks when the list has at least half as many points as there
// are ranks, else a radix sort of its ranks. The scratch buffers are kept from one list to the next.
struct DistinctRanks {
  const int64_t* r;   // rank [n, D]
  const int32_t* sp;  // stats [n, S]
  int64_t D, S, n_ranks;
  int rank_bits = 1;
  std::vector<int64_t> dr, acc, hist, digit_count, one;
  std::vector<uint64_t> keys, tmp;  // rank << 32 | point

  DistinctRanks(const int64_t* r_, const int32_t* sp_, int64_t D_, int64_t S_, int64_t n_ranks_)
      : r(r_), sp(sp_), D(D_), S(S_), n_ranks(n_ranks_), one(S_ + 1) {
    while ((int64_t(1) << rank_bits) < n_ranks) ++rank_bits;
  }

  void push(int64_t rank_v, const int64_t* add) {
    dr.push_back(rank_v);
    const size_t base = acc.size();
    acc.resize(base + S + 1);
    for (int64_t s = 0; s <= S; ++s) acc[base + s] = add[s] + (base ? acc[base - (S + 1) + s] : 0);
  }

  void build(const int32_t* p, int64_t n, int64_t d) {
    dr.clear();
    acc.clear();
    if (n_ranks <= 2 * n) {
      hist.assign(n_ranks * (S + 1), 0);
      for (int64_t t = 0; t < n; ++t) {
        const int64_t i = p[t];
        int64_t* h = hist.data() + r[i * D + d] * (S + 1);
        ++h[0];
        for (int64_t s = 0; s < S; ++s) h[1 + s] += sp[i * S + s];
      }
      for (int64_t k = 0; k < n_ranks; ++k)
        if (hist[k * (S + 1)]) push(k, hist.data() + k * (S + 1));
      return;
    }
    keys.resize(n);
    tmp.resize(n);
    for (int64_t t = 0; t < n; ++t)
      keys[t] = (static_cast<uint64_t>(r[static_cast<int64_t>(p[t]) * D + d]) << 32) | static_cast<uint32_t>(p[t]);
    // least-significant-digit radix sort on the rank's bits, 11 at a time
    for (int shift = 32; shift < 32 + rank_bits; shift += 11) {
      digit_count.assign(2049, 0);
      for (int64_t t = 0; t < n; ++t) ++digit_count[((keys[t] >> shift) & 2047) + 1];
      std::partial_sum(digit_count.begin(), digit_count.end(), digit_count.begin());
      for (int64_t t = 0; t < n; ++t) tmp[digit_count[(keys[t] >> shift) & 2047]++] = keys[t];
      keys.swap(tmp);
    }
    for (int64_t t = 0; t < n;) {
      std::fill(one.begin(), one.end(), 0);
      const uint64_t rank_v = keys[t] >> 32;
      int64_t e = t;
      for (; e < n && (keys[e] >> 32) == rank_v; ++e) {
        ++one[0];
        const int64_t i = static_cast<int64_t>(keys[e] & 0xFFFFFFFFu);
        for (int64_t s = 0; s < S; ++s) one[1 + s] += sp[i * S + s];
      }
      push(static_cast<int64_t>(rank_v), one.data());
      t = e;
    }
  }
};

void check_rank_inputs(const at::Tensor& buf, const at::Tensor& rank, const at::Tensor& stats) {
  TORCH_CHECK(buf.device().is_cpu() && buf.scalar_type() == at::kInt, "interval kernels: buf is int32 on the CPU");
  TORCH_CHECK(rank.scalar_type() == at::kLong && rank.dim() == 2, "interval kernels: rank is int64 [n, D]");
  TORCH_CHECK(stats.scalar_type() == at::kInt && stats.dim() == 2, "interval kernels: stats is int32 [n, S]");
}

// The empirical proposal's intervals. For query q on list g = group[q], column dim[g]: the list's distinct
// ranks r_0 < ... < r_{m-1} in that column give m - 1 intervals (n_int[q]); interval
// j = min(floor(u[q] (m - 1)), m - 2) lies between ranks rank0[q] = r_j and rank1[q] = r_{j+1}; n_left[q]
// counts the list's points of rank <= r_j and left[q] sums their stats rows.
std::vector<at::Tensor> split_intervals(at::Tensor buf, at::Tensor off, at::Tensor cnt, at::Tensor rank, at::Tensor dim,
                                        at::Tensor group, at::Tensor u, at::Tensor stats, int64_t n_ranks) {
  check_rank_inputs(buf, rank, stats);
  auto rk = rank.contiguous(), st = stats.contiguous();
  auto offc = off.contiguous(), cntc = cnt.contiguous(), dimc = dim.to(at::kLong).contiguous();
  auto grp = group.to(at::kLong).contiguous();
  auto uu = u.to(at::kDouble).contiguous();
  const int64_t L = offc.numel(), Q = grp.numel(), D = rk.size(1), S = st.size(1);
  auto n_left = at::zeros({Q}, offc.options());
  auto n_int = at::zeros({Q}, offc.options());
  auto rank0 = at::zeros({Q}, offc.options());
  auto rank1 = at::zeros({Q}, offc.options());
  auto left = at::zeros({Q, S}, st.options());
  std::vector<int64_t> qstart, qorder;
  queries_by_list(grp, L, qstart, qorder);
  const int32_t* b = buf.data_ptr<int32_t>();
  const int64_t *o = offc.data_ptr<int64_t>(), *c = cntc.data_ptr<int64_t>(), *dm = dimc.data_ptr<int64_t>();
  const double* up = uu.data_ptr<double>();
  int64_t *nl = n_left.data_ptr<int64_t>(), *ni = n_int.data_ptr<int64_t>();
  int64_t *r0 = rank0.data_ptr<int64_t>(), *r1 = rank1.data_ptr<int64_t>();
  int32_t* lf = left.data_ptr<int32_t>();
  at::parallel_for(0, L, list_grain(cntc), [&](int64_t l0, int64_t l1) {
    DistinctRanks ranks(rk.data_ptr<int64_t>(), st.data_ptr<int32_t>(), D, S, n_ranks);
    for (int64_t l = l0; l < l1; ++l) {
      if (qstart[l + 1] == qstart[l]) continue;
      ranks.build(b + o[l], c[l], dm[l]);
      const int64_t m = static_cast<int64_t>(ranks.dr.size());
      for (int64_t k = qstart[l]; k < qstart[l + 1]; ++k) {
        const int64_t q = qorder[k];
        const int64_t nc = m - 1;
        ni[q] = nc;
        if (nc < 1) continue;  // no interval: the caller never splits such a column
        const int64_t j = std::min(static_cast<int64_t>(up[q] * static_cast<double>(nc)), nc - 1);
        r0[q] = ranks.dr[j];
        r1[q] = ranks.dr[j + 1];
        const int64_t* a = ranks.acc.data() + j * (S + 1);
        nl[q] = a[0];
        for (int64_t s = 0; s < S; ++s) lf[q * S + s] = static_cast<int32_t>(a[1 + s]);
      }
    }
  });
  return {n_left, left, n_int, rank0, rank1};
}

// Regression's float statistics, summed in one defined order: that of the plain-torch sorted candidates
// (torchtree.steps.split_candidates.SortedCandidates). List by list, each list's points by rank with ties
// in list order (a stable sort), and one running sum of the stats rows over all of them, as torch.cumsum
// adds (cum[0] = 0, cum[t + 1] = cum[t] + row t, in double). A query's left statistics are then
// cum[start + n_left] - cum[start], the same subtraction, so the results equal the reference bit for bit.
struct SortedSums {
  std::vector<int64_t> start, rank;  // start [L + 1]; rank [T] of the sorted points
  std::vector<double> cum;           // [(T + 1) S]
  int64_t S = 0;

  void build(const int32_t* b, const int64_t* o, const int64_t* c, int64_t L, const int64_t* rk, int64_t D,
             const int64_t* dm, const double* sp, int64_t S_, const at::Tensor& cntc) {
    S = S_;
    start.assign(L + 1, 0);
    for (int64_t l = 0; l < L; ++l) start[l + 1] = start[l] + c[l];
    const int64_t T = start[L];
    rank.resize(T);
    std::vector<int64_t> point(T);
    at::parallel_for(0, L, list_grain(cntc), [&](int64_t l0, int64_t l1) {
      std::vector<std::pair<int64_t, int64_t>> kv;  // (rank, point)
      for (int64_t l = l0; l < l1; ++l) {
        const int32_t* p = b + o[l];
        kv.resize(c[l]);
        for (int64_t t = 0; t < c[l]; ++t) kv[t] = {rk[static_cast<int64_t>(p[t]) * D + dm[l]], p[t]};
        std::stable_sort(kv.begin(), kv.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
        for (int64_t t = 0; t < c[l]; ++t) {
          rank[start[l] + t] = kv[t].first;
          point[start[l] + t] = kv[t].second;
        }
      }
    });
    cum.assign((T + 1) * S, 0.0);
    for (int64_t t = 0; t < T; ++t) {
      const double* row = sp + point[t] * S;
      for (int64_t j = 0; j < S; ++j) cum[(t + 1) * S + j] = cum[t * S + j] + row[j];
    }
  }

  void left(int64_t l, int64_t n_left, double* out) const {
    const double *a = cum.data() + (start[l] + n_left) * S, *z = cum.data() + start[l] * S;
    for (int64_t j = 0; j < S; ++j) out[j] = a[j] - z[j];
  }
};

void check_sum_inputs(const at::Tensor& buf, const at::Tensor& rank, const at::Tensor& stats) {
  TORCH_CHECK(buf.device().is_cpu() && buf.scalar_type() == at::kInt, "sum kernels: buf is int32 on the CPU");
  TORCH_CHECK(rank.scalar_type() == at::kLong && rank.dim() == 2, "sum kernels: rank is int64 [n, D]");
  TORCH_CHECK(stats.scalar_type() == at::kDouble && stats.dim() == 2, "sum kernels: stats is float64 [n, S]");
}

// The prior proposal's cut with float statistics: for query q on list g = group[q], column dim[g],
// n_left[q] counts the list's points whose value (values[dim, rank], the column's sorted distinct values)
// is <= thr[q], and left[q] sums their stats rows in the order above.
std::vector<at::Tensor> split_sums(at::Tensor buf, at::Tensor off, at::Tensor cnt, at::Tensor rank, at::Tensor values,
                                   at::Tensor dim, at::Tensor group, at::Tensor thr, at::Tensor stats) {
  check_sum_inputs(buf, rank, stats);
  TORCH_CHECK(thr.scalar_type() == values.scalar_type() && values.dim() == 2, "thr must have the values' dtype");
  auto rk = rank.contiguous(), st = stats.contiguous(), vals = values.contiguous();
  auto offc = off.contiguous(), cntc = cnt.contiguous(), dimc = dim.to(at::kLong).contiguous();
  auto grp = group.to(at::kLong).contiguous();
  const int64_t L = offc.numel(), Q = grp.numel(), D = rk.size(1), S = st.size(1), nv = vals.size(1);
  auto n_left = at::zeros({Q}, offc.options());
  auto left = at::zeros({Q, S}, st.options());
  SortedSums ss;
  const int64_t* dm = dimc.data_ptr<int64_t>();
  ss.build(buf.data_ptr<int32_t>(), offc.data_ptr<int64_t>(), cntc.data_ptr<int64_t>(), L, rk.data_ptr<int64_t>(), D,
           dm, st.data_ptr<double>(), S, cntc);
  const int64_t* gq = grp.data_ptr<int64_t>();
  int64_t* nl = n_left.data_ptr<int64_t>();
  double* lf = left.data_ptr<double>();
  AT_DISPATCH_FLOATING_TYPES(vals.scalar_type(), "split_sums", [&] {
    const scalar_t* v = vals.data_ptr<scalar_t>();
    auto thc = thr.contiguous();
    const scalar_t* th = thc.data_ptr<scalar_t>();
    at::parallel_for(0, Q, 256, [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t l = gq[q];
        TORCH_CHECK(l >= 0 && l < L, "a query's list is out of range");
        const scalar_t* col = v + dm[l] * nv;
        // the first sorted point above thr: the count of those at or below it
        int64_t lo = ss.start[l], hi = ss.start[l + 1];
        while (lo < hi) {
          const int64_t mid = lo + (hi - lo) / 2;
          if (col[ss.rank[mid]] <= th[q]) lo = mid + 1; else hi = mid;
        }
        nl[q] = lo - ss.start[l];
        ss.left(l, nl[q], lf + q * S);
      }
    });
  });
  return {n_left, left};
}

// The empirical proposal's interval with float statistics: the list's boundaries between distinct ranks in
// sorted order give nc = m - 1 intervals (n_int[q]); interval j = min(floor(u[q] nc), nc - 1) ends at
// sorted position e, between ranks rank0[q] = rank[e] and rank1[q] = rank[e + 1]; n_left[q] = e + 1 - start
// and left[q] sums those points' stats rows in the order above.
std::vector<at::Tensor> split_sum_intervals(at::Tensor buf, at::Tensor off, at::Tensor cnt, at::Tensor rank,
                                            at::Tensor dim, at::Tensor group, at::Tensor u, at::Tensor stats) {
  check_sum_inputs(buf, rank, stats);
  auto rk = rank.contiguous(), st = stats.contiguous();
  auto offc = off.contiguous(), cntc = cnt.contiguous(), dimc = dim.to(at::kLong).contiguous();
  auto grp = group.to(at::kLong).contiguous();
  auto uu = u.to(at::kDouble).contiguous();
  const int64_t L = offc.numel(), Q = grp.numel(), D = rk.size(1), S = st.size(1);
  auto n_left = at::zeros({Q}, offc.options()), n_int = at::zeros({Q}, offc.options());
  auto rank0 = at::zeros({Q}, offc.options()), rank1 = at::zeros({Q}, offc.options());
  auto left = at::zeros({Q, S}, st.options());
  SortedSums ss;
  ss.build(buf.data_ptr<int32_t>(), offc.data_ptr<int64_t>(), cntc.data_ptr<int64_t>(), L, rk.data_ptr<int64_t>(), D,
           dimc.data_ptr<int64_t>(), st.data_ptr<double>(), S, cntc);
  // each list's boundaries: sorted positions e with rank[e] != rank[e + 1] inside the list
  std::vector<int64_t> bstart(L + 1, 0), bound;
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t e = ss.start[l]; e + 1 < ss.start[l + 1]; ++e)
      if (ss.rank[e] != ss.rank[e + 1]) bound.push_back(e);
    bstart[l + 1] = static_cast<int64_t>(bound.size());
  }
  const int64_t* gq = grp.data_ptr<int64_t>();
  const double* up = uu.data_ptr<double>();
  int64_t *nl = n_left.data_ptr<int64_t>(), *ni = n_int.data_ptr<int64_t>();
  int64_t *r0 = rank0.data_ptr<int64_t>(), *r1 = rank1.data_ptr<int64_t>();
  double* lf = left.data_ptr<double>();
  for (int64_t q = 0; q < Q; ++q) {
    const int64_t l = gq[q];
    TORCH_CHECK(l >= 0 && l < L, "a query's list is out of range");
    const int64_t nc = bstart[l + 1] - bstart[l];
    ni[q] = nc;
    if (nc < 1) continue;  // no interval: the caller never splits such a column
    const int64_t j = std::min(static_cast<int64_t>(up[q] * static_cast<double>(nc)), nc - 1);
    const int64_t e = bound[bstart[l] + j];
    r0[q] = ss.rank[e];
    r1[q] = ss.rank[e + 1];
    nl[q] = e + 1 - ss.start[l];
    ss.left(l, nl[q], lf + q * S);
  }
  return {n_left, left, n_int, rank0, rank1};
}

// Every interval between adjacent distinct values of every list, for the optimal proposal: list by list,
// interval by interval (the order of the sorted candidates' boundaries), its list (group [E]), the ranks on
// either side (rank0, rank1 [E]), and the count and stats of the list's points at or below rank0 (n_left
// [E], left [E, S]).
std::vector<at::Tensor> all_intervals(at::Tensor buf, at::Tensor off, at::Tensor cnt, at::Tensor rank, at::Tensor dim,
                                      at::Tensor stats, int64_t n_ranks) {
  check_rank_inputs(buf, rank, stats);
  auto rk = rank.contiguous(), st = stats.contiguous();
  auto offc = off.contiguous(), cntc = cnt.contiguous(), dimc = dim.to(at::kLong).contiguous();
  const int64_t L = offc.numel(), D = rk.size(1), S = st.size(1);
  const int32_t* b = buf.data_ptr<int32_t>();
  const int64_t *o = offc.data_ptr<int64_t>(), *c = cntc.data_ptr<int64_t>(), *dm = dimc.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> dr(L), acc(L);
  at::parallel_for(0, L, list_grain(cntc), [&](int64_t l0, int64_t l1) {
    DistinctRanks ranks(rk.data_ptr<int64_t>(), st.data_ptr<int32_t>(), D, S, n_ranks);
    for (int64_t l = l0; l < l1; ++l) {
      ranks.build(b + o[l], c[l], dm[l]);
      dr[l] = ranks.dr;
      acc[l] = ranks.acc;
    }
  });
  std::vector<int64_t> first(L + 1, 0);
  for (int64_t l = 0; l < L; ++l) first[l + 1] = first[l] + std::max<int64_t>(static_cast<int64_t>(dr[l].size()) - 1, 0);
  const int64_t E = first[L];
  auto group = at::empty({E}, offc.options()), rank0 = at::empty({E}, offc.options());
  auto rank1 = at::empty({E}, offc.options()), n_left = at::empty({E}, offc.options());
  auto left = at::empty({E, S}, st.options());
  int64_t *g = group.data_ptr<int64_t>(), *r0 = rank0.data_ptr<int64_t>(), *r1 = rank1.data_ptr<int64_t>();
  int64_t* nl = n_left.data_ptr<int64_t>();
  int32_t* lf = left.data_ptr<int32_t>();
  at::parallel_for(0, L, 64, [&](int64_t l0, int64_t l1) {
    for (int64_t l = l0; l < l1; ++l) {
      for (int64_t j = 0; j + 1 < static_cast<int64_t>(dr[l].size()); ++j) {
        const int64_t e = first[l] + j;
        const int64_t* a = acc[l].data() + j * (S + 1);
        g[e] = l;
        r0[e] = dr[l][j];
        r1[e] = dr[l][j + 1];
        nl[e] = a[0];
        for (int64_t s = 0; s < S; ++s) lf[e * S + s] = static_cast<int32_t>(a[1 + s]);
      }
    }
  });
  return {group, rank0, rank1, n_left, left};
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
  m.def("split_intervals(Tensor buf, Tensor off, Tensor cnt, Tensor rank, Tensor dim, Tensor group, Tensor u, "
        "Tensor stats, int n_ranks) -> Tensor[]");
  m.def("all_intervals(Tensor buf, Tensor off, Tensor cnt, Tensor rank, Tensor dim, Tensor stats, int n_ranks) "
        "-> Tensor[]");
  m.def("split_sums(Tensor buf, Tensor off, Tensor cnt, Tensor rank, Tensor values, Tensor dim, Tensor group, "
        "Tensor thr, Tensor stats) -> Tensor[]");
  m.def("split_sum_intervals(Tensor buf, Tensor off, Tensor cnt, Tensor rank, Tensor dim, Tensor group, Tensor u, "
        "Tensor stats) -> Tensor[]");
  m.def("partition_points(Tensor buf, Tensor off, Tensor cnt, Tensor X, Tensor feat, Tensor thr, Tensor side, "
        "Tensor expected) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(torchtree, CPU, m) {
  m.impl("node_extents", node_extents);
  m.impl("split_counts", split_counts);
  m.impl("split_intervals", split_intervals);
  m.impl("all_intervals", all_intervals);
  m.impl("split_sums", split_sums);
  m.impl("split_sum_intervals", split_sum_intervals);
  m.impl("partition_points", partition_points);
}
