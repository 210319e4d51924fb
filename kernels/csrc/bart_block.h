// A BART backfitting sweep of one chain run by one block of threads: the CUDA kernel's body (bart_cuda.cu,
// one block per chain) and, through a serial stand-in for the block, a CPU operator that tests it
// (bart_block.cpp). The decisions are bart_core.h's, made by thread 0; the passes over the points are
// shared by the block's threads, point n on thread n % size, the cell sums added atomically (their order,
// and so the last bits of a float sum, depends on the schedule and on whether a warp adds its own first).
// Plain C++ over raw pointers: no torch.
//
// The block type Blk supplies tid(), size(), lane() (the thread's place in its warp: size() is a multiple of the
// warp's), sync() (every thread waits there, and sees the others' writes afterwards), add(T* p, T v) (an atomic
// add), max(int* p, int v) (an atomic maximum) and add_cell(s, n, cell, v) (s[cell] += v and n[cell] += 1 where
// cell >= 0; called by every thread of a warp together, so a warp may add its threads' values per cell first).
#pragma once
#include "bart_core.h"

namespace torchtree_bart {

// One sweep's tensors and settings (shapes as torchtree.steps.bart_moves.sweep_native): feature, cut int16
// [T, C, K]; value [T, C, K]; leaf_of int16 [T, C, N]; resid [C, N]; Xb int16 [D, N]; n_cuts [D]; sigma2 [C];
// U [T, C, 5]; groups [D] or null; ps_lut, log1m_ps [max_depth + 2].
template <class scalar_t>
struct SweepArgs {
  int16_t *feature, *cut;
  scalar_t* value;
  int16_t* leaf_of;
  scalar_t* resid;
  const int16_t* Xb;
  const int64_t* n_cuts;
  const double *sigma2, *U;
  const int64_t* groups;
  const double *ps_lut, *log1m_ps;
  double tau2, pg, pp;
  int64_t max_depth;
  bool use_lik;
  int64_t T, C, K, N, D;
  int64_t* scratch;  // [C, feature_tables_size(D)]: thread 0's feature tables
  int64_t* counts;   // [2, 3]: proposed, then accepted, grow / prune / change (added to)
};

// The block's shared state: two proposals (the tree being decided and the next) with their slot counts, the
// deepest slot of the next two trees, whether the decided tree changed shape, and the move counts; then the
// per-slot arrays for K slots (BlockArrays), all in one buffer of block_bytes(K) bytes.
struct BlockHeader {
  Proposal prop[2];
  int64_t ku[2];
  int deep[2];
  bool moved;
  int64_t tally[6];
};

template <class scalar_t>
struct BlockArrays {
  BlockHeader* h;
  scalar_t *s_cell, *old_value;  // [2 K], [K]
  int32_t *n_cell, *to;          // [2 K] each
  double *s_leaf, *n_leaf;       // [K] each
};

TT_HD inline int64_t round_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// bytes of the block's state for K slots (each part 16-byte aligned)
template <class scalar_t>
TT_HD inline int64_t block_bytes(int64_t K) {
  return round_up(sizeof(BlockHeader), 16) + round_up(3 * K * sizeof(scalar_t), 16) +
         round_up(4 * K * sizeof(int32_t), 16) + round_up(2 * K * sizeof(double), 16);
}

// where the block's state lies in buf (block_bytes(K) bytes); writes nothing
template <class scalar_t>
TT_HD inline BlockArrays<scalar_t> carve(unsigned char* buf, int64_t K) {
  BlockArrays<scalar_t> s;
  s.h = reinterpret_cast<BlockHeader*>(buf);
  unsigned char* at = buf + round_up(sizeof(BlockHeader), 16);
  s.s_cell = reinterpret_cast<scalar_t*>(at);
  s.old_value = s.s_cell + 2 * K;
  at += round_up(3 * K * sizeof(scalar_t), 16);
  s.n_cell = reinterpret_cast<int32_t*>(at);
  s.to = s.n_cell + 2 * K;
  at += round_up(4 * K * sizeof(int32_t), 16);
  s.s_leaf = reinterpret_cast<double*>(at);
  s.n_leaf = s.s_leaf + K;
  return s;
}

// Chain c's trees as a block decides them (the one-block sweep's block, the grid sweep's leader): thread 0's
// feature tables, the block's scans of a tree's deepest slot, thread 0's proposal of a tree and its decision.
template <class Blk, class scalar_t, class Normals>
struct ChainDecisions {
  Blk& b;
  const SweepArgs<scalar_t>& a;
  const Normals& normal;
  const BlockArrays<scalar_t>& sh;
  int64_t c;
  FeatureTables tables{};

  TT_HD int64_t at(int64_t t) const { return t * a.C + c; }  // tree t of chain c in [T, C, ...]
  // the block: tree t's deepest used slot, into h.deep[t % 2]
  TT_HD void scan(int64_t t) {
    const int16_t* f = a.feature + at(t) * a.K;
    for (int64_t k = b.tid(); k < a.K; k += b.size())
      if (f[k] != ABSENT) b.max(&sh.h->deep[t % 2], static_cast<int>(k));
  }
  // the block: thread 0's tables and tallies, then trees 0 and 1 scanned (T >= 1)
  TT_HD void start() {
    if (b.tid() == 0) {
      tables = feature_tables(a.D, a.n_cuts, a.groups, a.scratch + c * feature_tables_size(a.D));
      sh.h->deep[0] = sh.h->deep[1] = 0;
      for (int i = 0; i < 6; ++i) sh.h->tally[i] = 0;
    }
    b.sync();
    scan(0);
    if (a.T > 1) scan(1);
    b.sync();
  }
  // thread 0: tree t's proposal on its slots Ku (two levels below its deepest node), counted
  TT_HD const Proposal& propose_tree(int64_t t) {
    BlockHeader& h = *sh.h;
    Proposal& p = h.prop[t % 2];
    const int64_t K = a.K, ku = lesser<int64_t>(K, (int64_t(1) << (heap_depth(h.deep[t % 2]) + 2)) - 1);
    propose(p, a.feature + at(t) * K, a.cut + at(t) * K, K, ku, tables, a.U + at(t) * 5, a.pg, a.pp, a.max_depth);
    h.ku[t % 2] = ku;
    h.tally[p.move] += 1;
    return p;
  }
  // thread 0: the decision on tree t from the cell sums in sh, counted; whether it was accepted
  TT_HD bool decide_tree(int64_t t) {
    BlockHeader& h = *sh.h;
    const Proposal& p = h.prop[t % 2];
    const int64_t tc = at(t), K = a.K;
    auto z = [&](int64_t k) { return normal(tc, k); };
    const bool acc = decide(p, a.feature + tc * K, a.cut + tc * K, a.value + tc * K, sh.s_cell, sh.n_cell, a.use_lik, K,
                            h.ku[t % 2], a.sigma2[c], a.tau2, a.pg, a.pp, a.U + tc * 5, a.ps_lut, a.log1m_ps, z,
                            sh.to, sh.old_value, sh.s_leaf, sh.n_leaf);
    h.tally[3 + p.move] += acc ? 1 : 0;
    return acc;
  }
};

// The fused pass over points [lo, hi) of a block: the decided tree's second pass (each point's new leaf where the
// tree changed shape, moved; its residual with the tree's new value in place of its old, old_value, to) and the
// next tree's first (its (leaf, side) cell sums, added into sh's cells). kPoints points per thread's turn, every
// load of the turn issued before any is used; every thread of a warp takes the same turns (add_cell's contract).
// Lc, xc, kc, vc: the decided tree's leaf map, rule column, cut and values; Ln, xn, kn, vn: the next tree's.
template <int kPoints, class Blk, class scalar_t>
TT_HD void fused_pass(Blk& b, int64_t lo, int64_t hi, bool moved, int16_t* Lc, const int16_t* xc, int64_t kc,
                      const scalar_t* vc, const int16_t* Ln, const int16_t* xn, int64_t kn, const scalar_t* vn,
                      scalar_t* res, const BlockArrays<scalar_t>& sh) {
  const int64_t tid = b.tid(), B = b.size(), lane = b.lane();
  for (int64_t n0 = lo + tid - lane; n0 < hi; n0 += kPoints * B) {  // points n0 + u B + lane, u < kPoints
    int16_t lcu[kPoints], xcu[kPoints], lnu[kPoints], xnu[kPoints];
    scalar_t rc[kPoints];
    for (int u = 0; u < kPoints; ++u) {  // the turn's loads
      const int64_t n = n0 + u * B + lane;
      const bool ok = n < hi;
      lcu[u] = ok ? Lc[n] : int16_t(0);
      xcu[u] = ok && moved ? xc[n] : int16_t(0);
      rc[u] = ok ? res[n] : scalar_t(0);
      lnu[u] = ok ? Ln[n] : int16_t(0);
      xnu[u] = ok ? xn[n] : int16_t(0);
    }
    for (int u = 0; u < kPoints; ++u) {
      const int64_t n = n0 + u * B + lane;
      const bool ok = n < hi;
      const int64_t leaf = lcu[u];
      const scalar_t rr = rc[u] + sh.old_value[leaf];
      const int64_t nl = moved ? sh.to[2 * leaf + (xcu[u] <= kc ? 1 : 0)] : leaf;
      const scalar_t r = ok ? static_cast<scalar_t>(rr - vc[nl]) : scalar_t(0);
      if (ok) {
        if (moved) Lc[n] = static_cast<int16_t>(nl);
        res[n] = r;
      }
      const int64_t cell = ok ? 2 * int64_t(lnu[u]) + (xnu[u] <= kn ? 1 : 0) : -1;
      b.add_cell(sh.s_cell, sh.n_cell, cell, ok ? static_cast<scalar_t>(r + vn[lnu[u]]) : scalar_t(0));
    }
  }
}

// Chain c's sweep: every tree t in turn, in place. Per tree, thread 0 proposes (bart_core.h) on the slots
// that can hold a node this update (Ku: the complete levels to two below the tree's deepest node, found by
// the block), the block sums the partial residual per (leaf, side) cell (pass 1), thread 0 decides, and
// the block moves the points and updates the residuals (pass 2), fused with the next tree's pass 1.
// normal(t * C + c, k): the standard normal of tree t's leaf in slot k. kPoints: the points of a thread's turn in
// the fused passes, every load of the turn issued before any is used (on a GPU a turn then waits for one round
// trip to memory, not one per point); the same cells are added, in another order where kPoints > 1 and B > 1.
template <int kPoints, class Blk, class scalar_t, class Normals>
TT_HD void sweep_chain(Blk& b, const SweepArgs<scalar_t>& a, const Normals& normal, unsigned char* buf, int64_t c) {
  const int64_t tid = b.tid(), B = b.size(), lane = b.lane(), T = a.T, C = a.C, K = a.K, N = a.N;
  const BlockArrays<scalar_t> sh = carve<scalar_t>(buf, K);
  BlockHeader& h = *sh.h;
  scalar_t* res = a.resid + c * N;
  ChainDecisions<Blk, scalar_t, Normals> d{b, a, normal, sh, c};
  auto at = [&](int64_t t) { return d.at(t); };
  // thread 0: tree t's proposal, and its cells' sums cleared for pass 1
  auto propose_tree = [&](int64_t t) {
    const int64_t ku = (d.propose_tree(t), h.ku[t % 2]);
    for (int64_t cell = 0; cell < 2 * ku; ++cell) sh.s_cell[cell] = scalar_t(0), sh.n_cell[cell] = 0;
  };
  auto decide_tree = [&](int64_t t) { h.moved = d.decide_tree(t); };
  auto scan = [&](int64_t t) { d.scan(t); };
  // what a pass over the points reads of tree t: its leaves' map, values, and the proposed rule's column and cut
  struct View {
    int16_t* L;
    const scalar_t* v;
    const int16_t* xf;
    int16_t k;
  };
  auto view = [&](int64_t t) {
    const Proposal& p = h.prop[t % 2];
    return View{a.leaf_of + at(t) * N, a.value + at(t) * K, a.Xb + p.f_new * N, static_cast<int16_t>(p.k_new)};
  };
  // pass 1 on tree w for point n (none where !ok: every thread of a warp calls it together), residual r: its
  // (leaf, side) cell's sum and count
  auto pass1 = [&](const View& w, bool ok, int64_t n, scalar_t r) {
    const int64_t leaf = ok ? w.L[n] : 0;
    const int64_t cell = ok ? 2 * leaf + (w.xf[n] <= w.k ? 1 : 0) : -1;
    b.add_cell(sh.s_cell, sh.n_cell, cell, ok ? static_cast<scalar_t>(r + w.v[leaf]) : scalar_t(0));
  };
  // pass 2 on the decided tree w for point n: its new leaf (where the tree changed shape), its new residual
  auto pass2 = [&](const View& w, bool moved, int64_t n) {
    const int64_t leaf = w.L[n];
    const scalar_t rr = res[n] + sh.old_value[leaf];
    if (!moved) return static_cast<scalar_t>(rr - w.v[leaf]);
    const int64_t nl = sh.to[2 * leaf + (w.xf[n] <= w.k ? 1 : 0)];
    w.L[n] = static_cast<int16_t>(nl);
    return static_cast<scalar_t>(rr - w.v[nl]);
  };

  if (T == 0) return;
  d.start();
  if (tid == 0) propose_tree(0);
  b.sync();
  {
    const View w = view(0);
    for (int64_t n0 = tid - lane; n0 < N; n0 += B) {  // point n0 + lane, the same count of turns per warp
      const int64_t n = n0 + lane;
      const bool ok = n < N;
      pass1(w, ok, n, ok ? res[n] : scalar_t(0));
    }
  }
  b.sync();
  for (int64_t t = 0; t < T; ++t) {
    if (tid == 0) {
      decide_tree(t);
      if (t + 1 < T) {
        propose_tree(t + 1);
        h.deep[t % 2] = 0;  // to hold tree t + 2's deepest slot, scanned in the pass below
      }
    }
    b.sync();
    const View cur = view(t);
    const bool moved = h.moved;
    if (t + 1 < T) {
      const View nxt = view(t + 1);
      fused_pass<kPoints>(b, int64_t(0), N, moved, cur.L, cur.xf, cur.k, cur.v, nxt.L, nxt.xf, nxt.k, nxt.v, res, sh);
      if (t + 2 < T) scan(t + 2);
    } else {
      for (int64_t n = tid; n < N; n += B) res[n] = pass2(cur, moved, n);
    }
    b.sync();
  }
  if (tid == 0)
    for (int i = 0; i < 6; ++i) b.add(&a.counts[i], h.tally[i]);
}

}  // namespace torchtree_bart
