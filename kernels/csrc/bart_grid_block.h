// A BART backfitting sweep of one chain run by G blocks of threads (bart_cuda.cu's grid kernel, G blocks per
// chain, all resident at once: a cooperative launch), each block passing over its own slice of the points, so a
// chain's passes use G multiprocessors instead of one. Per tree: block 0 (the chain's leader) gathers the chain's
// cell sums, thread 0 decides the tree and proposes the next (bart_core.h, as bart_block.h's sweep) and the leader
// publishes the decision; every block then copies it into its own shared memory, runs the fused pass over its
// points (the decided tree's second pass, the next tree's first) and adds its cell sums into the chain's. Two
// chain-wide barriers per tree (Blk::chain_sync); what one block wrote and another reads goes through L2
// (Blk::load). Same moves as bart_block.h's sweep; the cell sums add in another order. Plain C++ over raw
// pointers: no torch. Blk supplies bart_block.h's members and chain_sync(), load(const T*).
#pragma once
#include "bart_block.h"

namespace torchtree_bart {

// the chain-wide state in global memory ([C, ...] arrays; zeroed before the launch)
template <class scalar_t>
struct GridArgs {
  scalar_t* cell_s;  // [C, 2, 2K]: the chain's cell sums of the tree being summed (by tree parity)
  int32_t* cell_n;   // [C, 2, 2K]
  int32_t* to;       // [C, 2K]: the decided tree's (leaf, side) -> new leaf
  scalar_t* old_v;   // [C, K]: the decided tree's values before the decision
  int64_t* bcast;    // [C, 4]: moved, then the next tree's rule column and cut and its slots Ku
  int64_t G;         // blocks per chain
};

// bytes of a grid block's shared state: bart_block.h's, then the values of the decided and the next tree
template <class scalar_t>
TT_HD inline int64_t grid_block_bytes(int64_t K) {
  return block_bytes<scalar_t>(K) + round_up(2 * K * sizeof(scalar_t), 16);
}

// Chain c's sweep by its block g of G (points [g N / G, (g + 1) N / G)), in place.
template <int kPoints, class Blk, class scalar_t, class Normals>
TT_HD void sweep_chain_grid(Blk& b, const SweepArgs<scalar_t>& a, const GridArgs<scalar_t>& ga, const Normals& normal,
                            unsigned char* buf, int64_t c, int64_t g) {
  const int64_t tid = b.tid(), B = b.size(), lane = b.lane(), T = a.T, C = a.C, K = a.K, N = a.N, G = ga.G;
  const int64_t lo = g * N / G, hi = (g + 1) * N / G;
  const bool lead = g == 0;
  const BlockArrays<scalar_t> sh = carve<scalar_t>(buf, K);
  scalar_t* v_cur = reinterpret_cast<scalar_t*>(buf + block_bytes<scalar_t>(K));
  scalar_t* v_nxt = v_cur + K;
  BlockHeader& h = *sh.h;
  scalar_t* res = a.resid + c * N;
  scalar_t* const gs[2] = {ga.cell_s + (c * 2) * 2 * K, ga.cell_s + (c * 2 + 1) * 2 * K};
  int32_t* const gn[2] = {ga.cell_n + (c * 2) * 2 * K, ga.cell_n + (c * 2 + 1) * 2 * K};
  int32_t* gto = ga.to + c * 2 * K;
  scalar_t* gold = ga.old_v + c * K;
  int64_t* bc = ga.bcast + c * 4;
  ChainDecisions<Blk, scalar_t, Normals> d{b, a, normal, sh, c};  // the leader's
  auto at = [&](int64_t t) { return d.at(t); };
  // the leader's thread 0: tree t's proposal, published (rule column, cut, slots) for every block
  auto propose_tree = [&](int64_t t) {
    const Proposal& p = d.propose_tree(t);
    bc[1] = p.f_new, bc[2] = p.k_new, bc[3] = h.ku[t % 2];
  };
  auto decide_tree = [&](int64_t t) { bc[0] = d.decide_tree(t) ? 1 : 0; };
  // every block, after a chain_sync: the next tree's rule and slots, its values, its cells cleared in shared memory
  struct Rule {
    int64_t f, k, ku;
  };
  auto next_rule = [&](int64_t t) {
    const Rule r{b.load(&bc[1]), b.load(&bc[2]), b.load(&bc[3])};
    const scalar_t* v = a.value + at(t) * K;
    for (int64_t k = tid; k < r.ku; k += B) v_nxt[k] = b.load(&v[k]);
    for (int64_t k = tid; k < 2 * r.ku; k += B) sh.s_cell[k] = scalar_t(0), sh.n_cell[k] = 0;
    return r;
  };
  // every block, after its pass and a block sync: its cell sums added into the chain's
  auto flush = [&](int par, int64_t ku) {
    for (int64_t k = tid; k < 2 * ku; k += B)
      if (sh.n_cell[k] != 0) b.add(&gs[par][k], sh.s_cell[k]), b.add(&gn[par][k], sh.n_cell[k]);
  };
  auto pass1 = [&](const Rule& r, int64_t t, bool ok, int64_t n, scalar_t resid) {
    const int16_t* L = a.leaf_of + at(t) * N;
    const int64_t leaf = ok ? L[n] : 0;
    const int64_t cell = ok ? 2 * leaf + (a.Xb[r.f * N + n] <= r.k ? 1 : 0) : -1;
    b.add_cell(sh.s_cell, sh.n_cell, cell, ok ? static_cast<scalar_t>(resid + v_nxt[leaf]) : scalar_t(0));
  };

  if (T == 0) return;
  if (lead) {
    d.start();
    if (tid == 0) propose_tree(0);
  }
  b.chain_sync();
  Rule cur = next_rule(0);
  b.sync();
  for (int64_t n0 = lo + tid - lane; n0 < hi; n0 += B) {  // tree 0's first pass over this block's points
    const int64_t n = n0 + lane;
    const bool ok = n < hi;
    pass1(cur, 0, ok, n, ok ? res[n] : scalar_t(0));
  }
  b.sync();
  flush(0, cur.ku);
  b.chain_sync();
  for (int64_t t = 0; t < T; ++t) {
    const int par = static_cast<int>(t % 2);
    if (lead) {  // the chain's sums of tree t, its decision and tree t + 1's proposal, published
      for (int64_t k = tid; k < 2 * cur.ku; k += B) sh.s_cell[k] = b.load(&gs[par][k]), sh.n_cell[k] = b.load(&gn[par][k]);
      b.sync();
      if (tid == 0) {
        decide_tree(t);
        if (t + 1 < T) {
          propose_tree(t + 1);
          h.deep[t % 2] = 0;  // to hold tree t + 2's deepest slot, scanned below
        }
      }
      b.sync();
      for (int64_t k = tid; k < 2 * cur.ku; k += B) gto[k] = sh.to[k];
      for (int64_t k = tid; k < cur.ku; k += B) gold[k] = sh.old_value[k];
      if (t + 1 < T)
        for (int64_t k = tid; k < 2 * b.load(&bc[3]); k += B) gs[1 - par][k] = scalar_t(0), gn[1 - par][k] = 0;
    }
    b.chain_sync();
    const bool moved = b.load(&bc[0]) != 0;
    {  // tree t's decision (and values) into this block's shared memory
      const scalar_t* v = a.value + at(t) * K;
      for (int64_t k = tid; k < cur.ku; k += B) v_cur[k] = b.load(&v[k]);
      if (!lead) {
        for (int64_t k = tid; k < 2 * cur.ku; k += B) sh.to[k] = b.load(&gto[k]);
        for (int64_t k = tid; k < cur.ku; k += B) sh.old_value[k] = b.load(&gold[k]);
      }
    }
    const Rule nxt = t + 1 < T ? next_rule(t + 1) : Rule{0, 0, 0};
    b.sync();
    int16_t* Lc = a.leaf_of + at(t) * N;
    const int16_t* xc = a.Xb + cur.f * N;
    if (t + 1 < T) {
      fused_pass<kPoints>(b, lo, hi, moved, Lc, xc, cur.k, v_cur, a.leaf_of + at(t + 1) * N, a.Xb + nxt.f * N, nxt.k,
                          v_nxt, res, sh);
      b.sync();
      flush(1 - par, nxt.ku);
      if (lead && t + 2 < T) d.scan(t + 2);
      b.chain_sync();
      cur = nxt;
    } else {
      for (int64_t n = lo + tid; n < hi; n += B) {  // the last tree's second pass
        const int64_t leaf = Lc[n];
        const scalar_t rr = res[n] + sh.old_value[leaf];
        const int64_t nl = moved ? sh.to[2 * leaf + (xc[n] <= cur.k ? 1 : 0)] : leaf;
        if (moved) Lc[n] = static_cast<int16_t>(nl);
        res[n] = static_cast<scalar_t>(rr - v_cur[nl]);
      }
    }
  }
  if (lead && tid == 0)
    for (int i = 0; i < 6; ++i) b.add(&a.counts[i], h.tally[i]);
}

}  // namespace torchtree_bart
