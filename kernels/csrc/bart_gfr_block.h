// BART's grow-from-root sweep of one chain run by one block of threads: the CUDA kernel's body (bart_cuda.cu,
// one block per chain) and, through host threads standing in for the block, a CPU operator that tests it
// against the CPU kernel (bart_block.cpp, tests/test_bart_block.py). The model and every decision are
// bart_gfr.cpp's (gfr_chain): each tree regrown from the root on its partial residual, every node's stop or
// split (column, cut) drawn in proportion to prior x marginal likelihood, then the leaves' Gibbs draws. The
// block shares the passes over a node's points (its residual sum, its histogram per column and bin, its
// stable partition) and the sums over its candidates; thread 0 makes the decisions. With one thread every
// sum runs in the CPU kernel's order, so the stand-in equals it bit for bit; with more, the sums' last bits
// depend on the schedule. Plain C++ over raw pointers: no torch. The block type is bart_block.h's (tid,
// size, sync, add).
#pragma once
#include "bart_core.h"
#include "keyed.h"

namespace torchtree_bart {

// the most threads a block may have (the shared state's per-thread partials)
constexpr int GFR_MAX_THREADS = 512;

// a node's uniform: u[tc * K + j] of a tensor [T * C, K], or keyed_uniform(base, keys[tc], j)
struct BlockUniforms {
  const double* u;
  const int64_t* keys;
  uint64_t base;
  int64_t K;
  TT_HD double operator()(int64_t tc, int64_t j) const {
    return u ? u[tc * K + j] : torchtree_keyed::keyed_uniform(base, keys[tc], j);
  }
};

// One grow-from-root sweep's tensors and settings (shapes as bart_gfr_sweep: feature, cut int16 [T, C, K],
// value [T, C, K], leaf_of int16 [T, C, N], resid [C, N], Xb int16 [D, N], n_cuts [D], sigma2 [C], groups [D]
// or null, ps_lut [max_depth + 2]) and each chain's scratch in global memory (gfr_scratch_sizes).
template <class scalar_t>
struct GfrArgs {
  int16_t *feature, *cut;
  scalar_t* value;
  int16_t* leaf_of;
  scalar_t* resid;
  const int16_t* Xb;
  const int64_t* n_cuts;
  const double* sigma2;
  const int64_t* groups;
  const double* ps_lut;
  double tau2;
  int64_t max_depth;
  bool use_lik;
  int64_t T, C, K, N, D;
  int64_t MB;  // bins per column in the histograms: the most cuts of a column + 1
  // scratch, per chain c at c * (its size per chain)
  scalar_t* R;            // [C, N] the partial residual
  int32_t *idx, *tmp;     // [C, N] the points by node (a node's points idx[start .. end)), a partition's copy
  int32_t *lo, *hi;       // [C, K, D] each node's cut range per column
  int64_t *start, *end;   // [C, K]
  double *s_leaf, *n_leaf;  // [C, K]
  double* hs;             // [C, D, MB] a node's residual sum per (column, bin)
  int32_t* hn;            // [C, D, MB] its point count
  double* pf;             // [C, D] the prior's probability of each column at the node (0: not available)
  int64_t* off;           // [C, D] a column's first candidate among the node's weights (-1: not available)
  double* w;              // [C, 1 + D (MB - 1)] the node's weights: stop, then every (column, cut)
};

// the block's shared state
struct GfrShared {
  double s, mx;
  int64_t n_w, nl, f, k;
  bool go, split;
  double part[GFR_MAX_THREADS];
  int64_t cnt[GFR_MAX_THREADS];
};

// [begin, end) of thread tid's contiguous chunk of n items split over B threads
TT_HD inline void chunk_of(int64_t n, int64_t tid, int64_t B, int64_t& begin, int64_t& end) {
  const int64_t cs = (n + B - 1) / B;
  begin = lesser<int64_t>(n, tid * cs);
  end = lesser<int64_t>(n, begin + cs);
}

// Chain c's grow-from-root sweep: every tree t in turn, in place (gfr_chain's, bart_gfr.cpp). normal(tc, k):
// the standard normal of tree-chain tc's leaf in slot k; u(tc, j): node j's uniform.
template <class Blk, class scalar_t, class Uniforms, class Normals>
TT_HD void gfr_sweep_chain(Blk& b, const GfrArgs<scalar_t>& a, const Uniforms& u, const Normals& normal,
                           GfrShared& h, int64_t c) {
  const int64_t tid = b.tid(), B = b.size(), C = a.C, K = a.K, N = a.N, D = a.D, MB = a.MB;
  const double s2 = a.sigma2[c], tau2 = a.tau2;
  scalar_t* res = a.resid + c * N;
  scalar_t* R = a.R + c * N;
  int32_t* idx = a.idx + c * N;
  int32_t* tmp = a.tmp + c * N;
  int32_t* lo = a.lo + c * K * D;
  int32_t* hi = a.hi + c * K * D;
  int64_t* start = a.start + c * K;
  int64_t* end = a.end + c * K;
  double* s_leaf = a.s_leaf + c * K;
  double* n_leaf = a.n_leaf + c * K;
  double* hs = a.hs + c * D * MB;
  int32_t* hn = a.hn + c * D * MB;
  double* pf = a.pf + c * D;
  int64_t* off = a.off + c * D;
  double* w = a.w + c * (1 + D * (MB - 1));
  auto lm = [&](double n, double s) { return log_marginal(n, s, s2, tau2); };

  for (int64_t t = 0; t < a.T; ++t) {
    const int64_t tc = t * C + c;
    int16_t* feat = a.feature + tc * K;
    int16_t* cut = a.cut + tc * K;
    scalar_t* value = a.value + tc * K;
    int16_t* leaf_of = a.leaf_of + tc * N;
    // the partial residual (the old tree's values added back), then the tree reset to its root
    for (int64_t n = tid; n < N; n += B) R[n] = res[n] + value[static_cast<int64_t>(leaf_of[n])];
    for (int64_t n = tid; n < N; n += B) idx[n] = static_cast<int32_t>(n);
    for (int64_t k = tid; k < K; k += B) feat[k] = static_cast<int16_t>(k == 0 ? LEAF : ABSENT), cut[k] = 0;
    for (int64_t d = tid; d < D; d += B) lo[d] = 0, hi[d] = static_cast<int32_t>(a.n_cuts[d]);
    if (tid == 0) start[0] = 0, end[0] = N;
    b.sync();
    for (int64_t j = 0; j < K; ++j) {
      if (feat[j] != LEAF) continue;  // the same in every thread: feat is written by thread 0 before a sync
      const int64_t s0 = start[j], e0 = end[j];
      if (tid == 0) h.s = 0.0;
      b.sync();
      {
        double part = 0.0;
        for (int64_t i = s0 + tid; i < e0; i += B) part += static_cast<double>(R[idx[i]]);
        b.add(&h.s, part);
      }
      b.sync();
      const int32_t* lj = lo + j * D;
      const int32_t* hj = hi + j * D;
      if (tid == 0) {
        double s = h.s, n = static_cast<double>(e0 - s0);
        if (!a.use_lik) s = 0.0, n = 0.0;
        s_leaf[j] = s, n_leaf[j] = n, h.s = s;
        const int64_t depth = heap_depth(j);
        int64_t nav = 0;
        for (int64_t d = 0; d < D; ++d) nav += hj[d] - lj[d] > 0 ? 1 : 0;
        h.go = !(depth >= a.max_depth || nav == 0 || 2 * j + 2 >= K);
        if (h.go) {
          // the prior's column probabilities (by input column, then split column, on a coded table), each
          // available column's place among the weights
          for (int64_t d = 0; d < D; ++d) pf[d] = 0.0;
          if (a.groups) {
            int64_t ng = 0;
            for (int64_t d = 0; d < D; ++d) off[d] = 0;  // per input column: its available split columns
            for (int64_t d = 0; d < D; ++d) off[a.groups[d]] += hj[d] - lj[d] > 0 ? 1 : 0;
            for (int64_t g = 0; g < D; ++g) ng += off[g] > 0 ? 1 : 0;
            for (int64_t d = 0; d < D; ++d)
              if (hj[d] - lj[d] > 0)
                pf[d] = 1.0 / (static_cast<double>(ng) * static_cast<double>(off[a.groups[d]]));
          } else {
            for (int64_t d = 0; d < D; ++d)
              if (hj[d] - lj[d] > 0) pf[d] = 1.0 / static_cast<double>(nav);
          }
          int64_t at = 1;
          for (int64_t d = 0; d < D; ++d) {
            const bool av = hj[d] - lj[d] > 0;
            off[d] = av ? at : -1;
            at += av ? hj[d] - lj[d] : 0;
          }
          h.n_w = at;
          w[0] = log1p(-a.ps_lut[depth]) + lm(n, s);  // stop
        }
      }
      b.sync();
      if (!h.go) continue;
      const int64_t n_pts = e0 - s0;
      // the histograms of the available columns: residual sum and count per bin lo..hi
      for (int64_t x = tid; x < D * MB; x += B) {
        const int64_t d = x / MB;
        if (off[d] >= 0 && x % MB <= hj[d] - lj[d]) hs[x] = 0.0, hn[x] = 0;
      }
      b.sync();
      if (a.use_lik) {
        for (int64_t i = s0 + tid; i < e0; i += B) {
          const int64_t p = idx[i];
          const double r = static_cast<double>(R[p]);
          for (int64_t d = 0; d < D; ++d) {
            if (off[d] < 0) continue;
            const int64_t bin = lesser<int64_t>(greater<int64_t>(a.Xb[d * N + p], lj[d]), hj[d]) - lj[d];
            b.add(&hs[d * MB + bin], r);
            b.add(&hn[d * MB + bin], int32_t(1));
          }
        }
      }
      b.sync();
      // every cut's weight, a column per thread: running sums over its bins, left of the cut and right
      {
        const double depth_ps = a.ps_lut[heap_depth(j)], s = h.s, n = static_cast<double>(a.use_lik ? n_pts : 0);
        for (int64_t d = tid; d < D; d += B) {
          if (off[d] < 0) continue;
          const double base = log(depth_ps) + log(pf[d]) - log(static_cast<double>(hj[d] - lj[d]));
          double sl = 0.0, nl = 0.0;
          for (int64_t k = lj[d]; k < hj[d]; ++k) {
            sl += hs[d * MB + k - lj[d]], nl += static_cast<double>(hn[d * MB + k - lj[d]]);
            w[off[d] + k - lj[d]] = base + lm(nl, sl) + lm(n - nl, s - sl);
          }
        }
      }
      b.sync();
      // the draw: weights relative to their maximum, their sum, the first running sum above u x sum
      const int64_t W = h.n_w;
      int64_t w0, w1;
      chunk_of(W, tid, B, w0, w1);
      {
        double mx = -INFINITY;
        for (int64_t i = w0; i < w1; ++i) mx = greater(mx, w[i]);
        h.part[tid] = mx;
      }
      b.sync();
      if (tid == 0) {
        double mx = -INFINITY;
        for (int64_t q = 0; q < B; ++q) mx = greater(mx, h.part[q]);
        h.mx = mx;
      }
      b.sync();
      {
        const double mx = h.mx;
        double tot = 0.0;
        for (int64_t i = w0; i < w1; ++i) tot += (w[i] = exp(w[i] - mx));
        h.part[tid] = tot;
      }
      b.sync();
      if (tid == 0) {
        double tot = 0.0;
        for (int64_t q = 0; q < B; ++q) tot += h.part[q];
        const double target = u(tc, j) * tot;
        // whole chunks while the target lies past them, then weight by weight (to the end if rounding makes
        // the chunk's own running sum fall short of its total)
        int64_t q = 0;
        double acc = 0.0;
        while (q + 1 < B && !(target < acc + h.part[q])) acc += h.part[q++];
        int64_t i0, i1, pick = W - 1;
        chunk_of(W, q, B, i0, i1);
        for (int64_t i = i0; i < W; ++i) {
          acc += w[i];
          if (target < acc) {
            pick = i;
            break;
          }
        }
        h.split = pick != 0;
        if (h.split) {
          for (int64_t d = 0; d < D; ++d)
            if (off[d] >= 0 && pick >= off[d] && pick < off[d] + hj[d] - lj[d]) h.f = d, h.k = lj[d] + pick - off[d];
        }
      }
      b.sync();
      if (!h.split) continue;  // j stays a leaf
      // a stable partition of j's points, left (bin <= k) first: each thread counts its chunk's left points,
      // thread 0 places the chunks, each thread copies its chunk's points to their places, the block copies back
      const int64_t f = h.f, k = h.k;
      const int16_t* xf = a.Xb + f * N;
      int64_t p0, p1;
      chunk_of(n_pts, tid, B, p0, p1);
      {
        int64_t nl = 0;
        for (int64_t i = s0 + p0; i < s0 + p1; ++i) nl += xf[idx[i]] <= k ? 1 : 0;
        h.cnt[tid] = nl;
      }
      b.sync();
      if (tid == 0) {
        int64_t acc = 0;
        for (int64_t q = 0; q < B; ++q) {
          const int64_t x = h.cnt[q];
          h.cnt[q] = acc, acc += x;
        }
        h.nl = acc;
      }
      b.sync();
      {
        int64_t li = s0 + h.cnt[tid], ri = s0 + h.nl + (p0 - h.cnt[tid]);
        for (int64_t i = s0 + p0; i < s0 + p1; ++i) {
          const int32_t p = idx[i];
          if (xf[p] <= k) tmp[li++] = p;
          else tmp[ri++] = p;
        }
      }
      b.sync();
      for (int64_t i = s0 + tid; i < e0; i += B) idx[i] = tmp[i];
      const int64_t L = 2 * j + 1, Rr = 2 * j + 2;
      for (int64_t d = tid; d < D; d += B) {  // the children's cut ranges: the parent's, narrowed on column f
        lo[L * D + d] = lo[Rr * D + d] = lj[d];
        hi[L * D + d] = hi[Rr * D + d] = hj[d];
        if (d == f) hi[L * D + d] = static_cast<int32_t>(k), lo[Rr * D + d] = static_cast<int32_t>(k + 1);
      }
      if (tid == 0) {
        feat[j] = static_cast<int16_t>(f), cut[j] = static_cast<int16_t>(k);
        feat[L] = feat[Rr] = static_cast<int16_t>(LEAF);
        start[L] = s0, end[L] = s0 + h.nl, start[Rr] = s0 + h.nl, end[Rr] = e0;
      }
      b.sync();
    }
    // the leaves' Gibbs draws, then every point's leaf and residual
    if (tid == 0) {
      for (int64_t j = 0; j < K; ++j) {
        if (feat[j] != LEAF) {
          value[j] = scalar_t(0);
          continue;
        }
        const double v = s2 + n_leaf[j] * tau2;
        const double zj = static_cast<double>(static_cast<scalar_t>(normal(tc, j)));  // rounded to the values' dtype
        value[j] = static_cast<scalar_t>(tau2 * s_leaf[j] / v + sqrt(tau2 * s2 / v) * zj);
      }
    }
    b.sync();
    for (int64_t j = 0; j < K; ++j) {
      if (feat[j] != LEAF) continue;
      for (int64_t i = start[j] + tid; i < end[j]; i += B) {
        const int64_t p = idx[i];
        leaf_of[p] = static_cast<int16_t>(j);
        res[p] = static_cast<scalar_t>(R[p] - value[j]);
      }
    }
    b.sync();
  }
}

}  // namespace torchtree_bart
