// BART's grow-from-root sweep (torchtree.steps.bart_moves.gfr_sweep_native calls it). It has no plain-torch
// twin: without the compiled kernels these sweeps run as MCMC sweeps. tests/test_native.py checks that
// without the likelihood one regrowth draws the BART tree prior.
#include "bart_common.h"

#include <ATen/Parallel.h>

namespace {

using namespace torchtree_bart;

// where a node's uniform comes from: a row of a tensor, or keyed draws made on demand (the numbers a tensor
// made by torchtree.core.random.keyed_uniform holds)
struct NodeUniforms {
  const double* row = nullptr;  // [K]
  uint64_t base = 0;
  int64_t key = 0;
  double operator()(int64_t j) const { return row ? row[j] : keyed_uniform(base, key, j); }
};

// One grow-from-root sweep (XBART's warm start, He & Hahn 2021; paper 001's one-step optimal
// proposal applied to one tree): every tree t in turn, every chain, regrown from the root on its
// partial residual. At a node of depth d with points P (count n, residual sum s), stop with weight
// (1 - p_d) l(n, s), or split on rule (f, k) with weight p_d P(f) / avail_f l(n_L, s_L) l(n_R, s_R),
// P(f) the prior's feature draw (1 / nav, or by input column for a coded table), l the leaf marginal
// likelihood; the choice is drawn with u[t, c, slot]. Nodes are taken in heap order; the leaves then
// take Gibbs draws with z[t, c, slot] (rounded to the values' dtype). Shapes and dtypes as bart_sweep, u and
// z [T, C, K]; or u and z empty: then u[t, c, slot] = keyed_uniform(u_base, keys[t, c], slot) and z[t, c, slot]
// = ndtri(keyed_uniform(leaves_base, keys[t, c], slot)), drawn only for the nodes and leaves that use them.
template <typename scalar_t>
void gfr_chain(int64_t K, int64_t N, int64_t D, int16_t* feat, int16_t* cut, scalar_t* value, int16_t* leaf_of,
               scalar_t* resid, const int16_t* Xb, const int64_t* n_cuts, double s2, const NodeUniforms& u,
               const LeafNormals& z,
               const int64_t* groups, const double* ps_lut, double tau2, int64_t max_depth, bool use_lik,
               std::vector<int64_t>& idx, std::vector<int64_t>& tmp, std::vector<int64_t>& rng_lo,
               std::vector<int64_t>& rng_hi, std::vector<int64_t>& start, std::vector<int64_t>& end,
               std::vector<double>& hs, std::vector<double>& hn, std::vector<double>& w, const double* v_n,
               const double* hl_n) {
  // log_marginal(n, s) with its two terms in n looked up (v_n[n] = s2 + n tau2, hl_n[n] = -log(v / s2) / 2):
  // the same arithmetic as log_marginal, so the same numbers
  auto lm = [&](double n, double s) {
    const int64_t i = static_cast<int64_t>(n);
    return hl_n[i] + 0.5 * tau2 * s * s / (s2 * v_n[i]);
  };
  std::vector<scalar_t> R(N);
  for (int64_t n = 0; n < N; ++n) R[n] = resid[n] + value[static_cast<int64_t>(leaf_of[n])];
  for (int64_t k = 0; k < K; ++k) feat[k] = static_cast<int16_t>(ABSENT), cut[k] = 0;
  feat[0] = static_cast<int16_t>(LEAF);
  for (int64_t n = 0; n < N; ++n) idx[n] = n;
  start[0] = 0, end[0] = N;
  for (int64_t d = 0; d < D; ++d) rng_lo[d] = 0, rng_hi[d] = n_cuts[d];
  std::vector<double> s_leaf(K, 0.0), n_leaf(K, 0.0);
  std::vector<char> avail(D);
  for (int64_t j = 0; j < K; ++j) {
    if (feat[j] != LEAF) continue;
    const int64_t a = start[j], b = end[j];
    double s = 0.0;
    for (int64_t i = a; i < b; ++i) s += static_cast<double>(R[idx[i]]);
    double n = static_cast<double>(b - a);
    if (!use_lik) s = 0.0, n = 0.0;
    s_leaf[j] = s, n_leaf[j] = n;
    const int64_t depth = heap_depth(j);
    const int64_t* lo = &rng_lo[j * D];
    const int64_t* hi = &rng_hi[j * D];
    int64_t nav = 0;
    for (int64_t d = 0; d < D; ++d) nav += (avail[d] = hi[d] - lo[d] > 0);
    if (depth >= max_depth || nav == 0 || 2 * j + 2 >= K) continue;
    // the prior's feature probabilities
    std::vector<double> pf(D, 0.0);
    if (groups) {
      std::vector<int64_t> cnt(D, 0);
      for (int64_t d = 0; d < D; ++d) cnt[groups[d]] += avail[d];
      int64_t ng = 0;
      for (int64_t g = 0; g < D; ++g) ng += cnt[g] > 0;
      for (int64_t d = 0; d < D; ++d)
        if (avail[d]) pf[d] = 1.0 / (static_cast<double>(ng) * static_cast<double>(cnt[groups[d]]));
    } else {
      for (int64_t d = 0; d < D; ++d)
        if (avail[d]) pf[d] = 1.0 / static_cast<double>(nav);
    }
    const double ps = ps_lut[depth];
    w.clear();
    w.push_back(std::log1p(-ps) + lm(n, s));  // stop
    for (int64_t f = 0; f < D; ++f) {
      if (!avail[f]) continue;
      const int64_t nb = hi[f] - lo[f] + 1;  // bins lo..hi
      std::fill(hs.begin(), hs.begin() + nb, 0.0);
      std::fill(hn.begin(), hn.begin() + nb, 0.0);
      if (use_lik) {
        const int16_t* xf = Xb + f * N;
        for (int64_t i = a; i < b; ++i) {
          int64_t bin = std::min(std::max<int64_t>(xf[idx[i]], lo[f]), hi[f]) - lo[f];
          hs[bin] += static_cast<double>(R[idx[i]]);
          hn[bin] += 1.0;
        }
      }
      const double base = std::log(ps) + std::log(pf[f]) - std::log(static_cast<double>(hi[f] - lo[f]));
      double sl = 0.0, nl = 0.0;
      for (int64_t k = lo[f]; k < hi[f]; ++k) {
        sl += hs[k - lo[f]], nl += hn[k - lo[f]];
        w.push_back(base + lm(nl, sl) + lm(n - nl, s - sl));
      }
    }
    double mx = -std::numeric_limits<double>::infinity();
    for (double x : w) mx = std::max(mx, x);
    double tot = 0.0;
    for (double& x : w) tot += (x = std::exp(x - mx));
    double target = u(j) * tot, acc = 0.0;
    size_t pick = w.size() - 1;
    for (size_t i = 0; i < w.size(); ++i) {
      acc += w[i];
      if (target < acc) { pick = i; break; }
    }
    if (pick == 0) continue;  // stop: j stays a leaf
    size_t r = pick - 1;
    int64_t f = 0, k = 0;
    for (f = 0; f < D; ++f) {
      if (!avail[f]) continue;
      const size_t m = static_cast<size_t>(hi[f] - lo[f]);
      if (r < m) { k = lo[f] + static_cast<int64_t>(r); break; }
      r -= m;
    }
    // split j: a stable partition of its points, left (bin <= k) first
    const int16_t* xf = Xb + f * N;
    int64_t nl_pts = 0, nr_pts = 0;
    for (int64_t i = a; i < b; ++i) (xf[idx[i]] <= k ? idx[a + nl_pts++] : tmp[nr_pts++]) = idx[i];
    std::copy(tmp.begin(), tmp.begin() + nr_pts, idx.begin() + a + nl_pts);
    feat[j] = static_cast<int16_t>(f), cut[j] = static_cast<int16_t>(k);
    const int64_t L = 2 * j + 1, Rr = 2 * j + 2;
    feat[L] = feat[Rr] = static_cast<int16_t>(LEAF);
    start[L] = a, end[L] = a + nl_pts, start[Rr] = a + nl_pts, end[Rr] = b;
    std::copy(lo, lo + D, &rng_lo[L * D]);
    std::copy(hi, hi + D, &rng_hi[L * D]);
    std::copy(lo, lo + D, &rng_lo[Rr * D]);
    std::copy(hi, hi + D, &rng_hi[Rr * D]);
    rng_hi[L * D + f] = k;
    rng_lo[Rr * D + f] = k + 1;
  }
  // leaves: Gibbs draws, then every point's leaf and residual
  for (int64_t j = 0; j < K; ++j) {
    if (feat[j] != LEAF) {
      value[j] = scalar_t(0);
      continue;
    }
    double v = s2 + n_leaf[j] * tau2;
    const double zj = static_cast<double>(static_cast<scalar_t>(z(j)));  // rounded to the values' dtype first
    value[j] = static_cast<scalar_t>(tau2 * s_leaf[j] / v + std::sqrt(tau2 * s2 / v) * zj);
    for (int64_t i = start[j]; i < end[j]; ++i) {
      leaf_of[idx[i]] = static_cast<int16_t>(j);
      resid[idx[i]] = R[idx[i]] - value[j];
    }
  }
}

void bart_gfr_sweep(at::Tensor feature, at::Tensor cut, at::Tensor value, at::Tensor leaf_of, at::Tensor resid,
                    at::Tensor Xb, at::Tensor n_cuts, at::Tensor sigma2, at::Tensor u, at::Tensor z, at::Tensor groups,
                    at::Tensor ps_lut, double tau2, int64_t max_depth, bool use_likelihood, int64_t u_base,
                    int64_t leaves_base, at::Tensor keys) {
  TORCH_CHECK(feature.device().is_cpu(), "bart_gfr_sweep: CPU tensors only");
  TORCH_CHECK(feature.scalar_type() == at::kShort && cut.scalar_type() == at::kShort && leaf_of.scalar_type() == at::kShort,
              "bart_gfr_sweep: feature, cut and leaf_of are int16");
  TORCH_CHECK(feature.is_contiguous() && cut.is_contiguous() && value.is_contiguous() && leaf_of.is_contiguous() &&
              resid.is_contiguous(), "bart_gfr_sweep: contiguous state tensors");
  auto xb = Xb.to(at::kShort).contiguous();
  auto nc = n_cuts.to(at::kLong).contiguous();
  auto s2 = sigma2.to(at::kDouble).contiguous();
  const bool keyed = u.numel() == 0;  // keyed draws (keys [T, C]) instead of u and z tensors
  auto uu = keyed ? u : u.to(at::kDouble).contiguous();
  auto zz = keyed ? z : z.to(at::kDouble).contiguous();
  auto kk = keyed ? keys.to(at::kLong).contiguous() : keys;
  auto gr = groups.numel() ? groups.to(at::kLong).contiguous() : groups;
  auto psl = ps_lut.to(at::kDouble).contiguous();
  const int64_t T = feature.size(0), C = feature.size(1), K = feature.size(2), N = resid.size(1), D = xb.size(0);
  int64_t max_cut = 1;
  for (int64_t d = 0; d < D; ++d) max_cut = std::max(max_cut, nc.data_ptr<int64_t>()[d] + 1);
  const int64_t* g = groups.numel() ? gr.data_ptr<int64_t>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES(value.scalar_type(), "bart_gfr_sweep", [&] {
    at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
      std::vector<int64_t> idx(N), tmp(N), lo(K * D), hi(K * D), st(K), en(K);
      std::vector<double> hs(max_cut), hn(max_cut), w, v_n(N + 1), hl_n(N + 1);
      for (int64_t c = c0; c < c1; ++c) {
        const double s2c = s2.data_ptr<double>()[c];
        for (int64_t n = 0; n <= N; ++n) {
          v_n[n] = s2c + static_cast<double>(n) * tau2;
          hl_n[n] = -0.5 * std::log(v_n[n] / s2c);
        }
        for (int64_t t = 0; t < T; ++t) {
          const int64_t o = t * C + c;
          NodeUniforms us;
          LeafNormals zs;
          if (keyed) {
            const int64_t key = kk.data_ptr<int64_t>()[o];
            us.base = static_cast<uint64_t>(u_base), us.key = key;
            zs.base = static_cast<uint64_t>(leaves_base), zs.key = key, zs.kz = K;
          } else {
            us.row = uu.data_ptr<double>() + o * K;
            zs.row = zz.data_ptr<double>() + o * K;
          }
          gfr_chain<scalar_t>(K, N, D, feature.data_ptr<int16_t>() + o * K, cut.data_ptr<int16_t>() + o * K,
                              value.data_ptr<scalar_t>() + o * K, leaf_of.data_ptr<int16_t>() + o * N,
                              resid.data_ptr<scalar_t>() + c * N, xb.data_ptr<int16_t>(), nc.data_ptr<int64_t>(),
                              s2.data_ptr<double>()[c], us, zs, g,
                              psl.data_ptr<double>(), tau2, max_depth, use_likelihood, idx, tmp, lo, hi, st, en, hs, hn,
                              w, v_n.data(), hl_n.data());
        }
      }
    });
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchtree, m) {
  m.def("bart_gfr_sweep(Tensor(a!) feature, Tensor(b!) cut, Tensor(c!) value, Tensor(d!) leaf_of, Tensor(e!) resid, "
        "Tensor Xb, Tensor n_cuts, Tensor sigma2, Tensor u, Tensor z, Tensor groups, Tensor ps_lut, float tau2, "
        "int max_depth, bool use_likelihood, int u_base, int leaves_base, Tensor keys) -> ()");
}

TORCH_LIBRARY_IMPL(torchtree, CPU, m) {
  m.impl("bart_gfr_sweep", bart_gfr_sweep);
}
