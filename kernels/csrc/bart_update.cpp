// One BART tree update per chain, fused: the C++ CPU implementation of
// torchtree.steps.bart_moves.tree_update (the plain-torch reference), operation for operation.
//
// Per chain: the move (grow / prune / change) and its node from the uniforms, the node's cut
// ranges from its ancestors, the proposed rule (feature uniform among those with a cut left, or
// input column then split column for a coded table), one pass over the points accumulating the
// partial residual's sums per (leaf, side of the proposed rule), the Metropolis-Hastings ratio
// with the leaf values integrated out, the new tree, the leaves' Gibbs draws and a second pass
// writing every point's leaf and residual (only the residual where the tree kept its shape). Each cell's
// sum runs in the reference's dtype and order: LANES interleaved partial sums (point n in lane n % LANES),
// added lane by lane; float32 runs equal the reference bit for bit, float64 ones to the last bit (torch
// may order a lane's sum differently); see tests/test_native.py.
#include "bart_common.h"

#include <ATen/Parallel.h>

namespace {

using namespace torchtree_bart;

// a cell's residual sum is LANES partial sums, point n in lane n % LANES (torchtree.steps.bart_moves.SUM_LANES):
// consecutive points of one cell then add into different accumulators, which breaks the chain of dependent
// floating-point adds through memory that otherwise bounds the pass
constexpr int64_t LANES = 4;

// One tree update of one chain, in four phases, so a sweep can run one tree's pass 2 and the next tree's
// pass 1 in a single loop over the points (the two trees are different arrays; each point sees the same
// float operations in the same order as in two loops):
//   propose()      the move (grow / prune / change), its node and the proposed rule, from the uniforms;
//   add(n, r)      pass 1, per point: the partial residual's sums per (leaf, side of the proposed rule);
//   decide(z)      the Metropolis-Hastings ratio with the leaf values integrated out, the new tree and the
//                  leaves' Gibbs draws;
//   move(n, r)     pass 2, per point: its new leaf, and its residual with the new leaf value taken out.
template <typename scalar_t, typename leaf_t, typename feat_t>
struct TreeUpdate {
  // K: the heap's slots; Ku <= K: the slots that can hold a node during this update (every leaf, and a
  // grown node's children, lie below Ku), so the scans and per-cell buffers stop there
  int64_t K, Ku, N;
  feat_t *feat, *cut;
  scalar_t* value;
  leaf_t* leaf_of;
  const int16_t* Xb;
  const FeatureTables* tables;
  double s2;
  const double *u, *ps_lut, *log1m_ps;
  double tau2, pg, pp;
  int64_t max_depth;
  bool use_lik;
  // the proposal (bart_core.h)
  Proposal p{};
  const int16_t* xf = nullptr;
  int16_t k16 = 0;
  // pass 1's sums per (leaf, side); side 1 = left: s_lane [LANES, 2 Ku] partial sums, s_cell their total.
  // Counts are integers (exact, as the reference's float64 counts of at most 2^53 points)
  std::vector<scalar_t> s_lane, s_cell;
  std::vector<int64_t> n_cell;
  bool moved = false;  // the update changed the tree's shape: pass 2 moves points between leaves
  // pass 2's inputs: where each (leaf, side) cell goes, and the leaf values before the update
  std::vector<int64_t> to;
  std::vector<scalar_t> old_value;

  void propose() {
    torchtree_bart::propose(p, feat, cut, K, Ku, *tables, u, pg, pp, max_depth);
    xf = Xb + p.f_new * N;
    k16 = static_cast<int16_t>(p.k_new);
    s_lane.assign(LANES * 2 * Ku, scalar_t(0));
    n_cell.assign(2 * Ku, 0);
  }

  // pass 1 for point n whose current residual is r: R = r + value[leaf] (recomputed in pass 2 by the same
  // float operation, not stored: storing it would add a write and a read of N values per tree)
  inline void add(int64_t n, scalar_t r) {
    const int64_t leaf = static_cast<int64_t>(leaf_of[n]);
    const int64_t cell = 2 * leaf + (xf[n] <= k16 ? 1 : 0);
    s_lane[(n % LANES) * 2 * Ku + cell] += r + value[leaf];
    n_cell[cell] += 1;
  }

  void decide(const LeafNormals& z, int64_t* move_out, bool* accept_out) {
    s_cell.resize(2 * Ku);
    for (int64_t cell = 0; cell < 2 * Ku; ++cell) {  // the lanes added in order, as the reference
      scalar_t total = s_lane[cell];
      for (int64_t l = 1; l < LANES; ++l) total += s_lane[l * 2 * Ku + cell];
      s_cell[cell] = total;
    }
    to.resize(2 * Ku), old_value.resize(Ku);
    std::vector<double> s_leaf(Ku), n_leaf_pts(Ku);
    const bool accept = torchtree_bart::decide(p, feat, cut, value, s_cell.data(), n_cell.data(), use_lik, K, Ku, s2,
                                               tau2, pg, pp, u, ps_lut, log1m_ps, z, to.data(),
                                               old_value.data(), s_leaf.data(), n_leaf_pts.data());
    *move_out = p.move;
    *accept_out = accept;
    moved = accept;
  }

  // pass 2 where the tree kept its shape (!moved): point n stays in its leaf; returns its new residual
  inline scalar_t keep_point(int64_t n, scalar_t r) const {
    const int64_t leaf = static_cast<int64_t>(leaf_of[n]);
    const scalar_t rr = r + old_value[leaf];
    return rr - value[leaf];
  }

  // pass 2 for point n whose residual is r: writes its leaf, returns its new residual
  inline scalar_t move_point(int64_t n, scalar_t r) {
    const int64_t leaf = static_cast<int64_t>(leaf_of[n]);
    const int64_t nl = to[2 * leaf + (xf[n] <= k16 ? 1 : 0)];
    const scalar_t rr = r + old_value[leaf];
    leaf_of[n] = static_cast<leaf_t>(nl);
    return rr - value[nl];
  }

  // pass 2 alone, over every point's residual res[0..N)
  void pass2(scalar_t* res) {
    if (moved) for (int64_t n = 0; n < N; ++n) res[n] = move_point(n, res[n]);
    else for (int64_t n = 0; n < N; ++n) res[n] = keep_point(n, res[n]);
  }
};

template <typename scalar_t, typename leaf_t, typename feat_t>
void update_chain(int64_t K, int64_t Ku, int64_t N, feat_t* feat, feat_t* cut, scalar_t* value,
                  leaf_t* leaf_of, scalar_t* resid, const int16_t* Xb, const FeatureTables* tables, double s2,
                  const double* u, const LeafNormals& z, const double* ps_lut,
                  const double* log1m_ps, double tau2, double pg, double pp, int64_t max_depth, bool use_lik,
                  int64_t* move_out, bool* accept_out) {
  TreeUpdate<scalar_t, leaf_t, feat_t> up{K, Ku, N, feat, cut, value, leaf_of, Xb, tables, s2, u, ps_lut,
                                         log1m_ps, tau2, pg, pp, max_depth, use_lik};
  up.propose();
  for (int64_t n = 0; n < N; ++n) up.add(n, resid[n]);
  up.decide(z, move_out, accept_out);
  up.pass2(resid);
}

std::vector<at::Tensor> bart_tree_update(at::Tensor feature, at::Tensor cut, at::Tensor value, at::Tensor leaf_of,
                                         at::Tensor resid, at::Tensor Xb, at::Tensor n_cuts, at::Tensor sigma2,
                                         at::Tensor u, at::Tensor z, at::Tensor groups, at::Tensor ps_lut,
                                         at::Tensor log1m_ps, double tau2, double pg, double pp, int64_t max_depth,
                                         bool use_likelihood) {
  TORCH_CHECK(feature.device().is_cpu(), "bart_tree_update: CPU tensors only");
  auto feat = feature.to(at::kLong).contiguous().clone();
  auto cu = cut.to(at::kLong).contiguous().clone();
  auto val = value.contiguous().clone();
  auto lo = leaf_of.contiguous().clone();
  auto res = resid.contiguous().clone();
  const UpdateInputs in(Xb, n_cuts, sigma2, u, groups, ps_lut, log1m_ps);
  const auto &xb = in.xb, &nc = in.nc, &s2 = in.s2, &uu = in.uu, &gr = in.gr, &psl = in.psl, &l1m = in.l1m;
  auto zz = z.to(at::kDouble).contiguous();
  TORCH_CHECK(val.scalar_type() == res.scalar_type(), "value and resid must share a dtype");
  const int64_t C = feat.size(0), K = feat.size(1), N = res.size(1);
  auto move = at::empty({C}, feat.options());
  auto accept = at::empty({C}, feat.options().dtype(at::kBool));
  const HostTables tables(in);
  AT_DISPATCH_FLOATING_TYPES(val.scalar_type(), "bart_tree_update", [&] {
    auto run = [&](auto* leaf_ptr) {
      using leaf_t = std::remove_pointer_t<decltype(leaf_ptr)>;
      at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          update_chain<scalar_t, leaf_t, int64_t>(K, K, N, feat.data_ptr<int64_t>() + c * K, cu.data_ptr<int64_t>() + c * K,
                                         val.data_ptr<scalar_t>() + c * K, leaf_ptr + c * N,
                                         res.data_ptr<scalar_t>() + c * N, xb.data_ptr<int16_t>(),
                                         &tables.t, s2.data_ptr<double>()[c],
                                         uu.data_ptr<double>() + c * uu.size(1), LeafNormals{zz.data_ptr<double>() + c * K},
                                         psl.data_ptr<double>(), l1m.data_ptr<double>(), tau2, pg, pp, max_depth,
                                         use_likelihood, move.data_ptr<int64_t>() + c, accept.data_ptr<bool>() + c);
        }
      });
    };
    if (lo.scalar_type() == at::kShort) run(lo.data_ptr<int16_t>());
    else if (lo.scalar_type() == at::kInt) run(lo.data_ptr<int32_t>());
    else {
      TORCH_CHECK(lo.scalar_type() == at::kLong, "leaf_of must be int16, int32 or int64");
      run(lo.data_ptr<int64_t>());
    }
  });
  return {feat, cu, val, lo, res, move, accept};
}

// One backfitting sweep: every tree t in turn, every chain, in place. feature, cut: int16 [T, C, K];
// value: [T, C, K]; leaf_of: int16 [T, C, N]; resid: [C, N]; u: [T, C, 5]; z: [T, C, Kz] (Kz <= K: the
// slots that can be leaves this sweep; the others are never read), or empty: then each leaf's normal is
// drawn when needed, ndtri(keyed_uniform(leaves_base, keys[t, c], slot)) for slot < kz, else 0 (the
// same numbers a z tensor made by torchtree.core.random holds). Returns the proposed and accepted counts
// per move type, [2, 3].
at::Tensor bart_sweep(at::Tensor feature, at::Tensor cut, at::Tensor value, at::Tensor leaf_of, at::Tensor resid,
                      at::Tensor Xb, at::Tensor n_cuts, at::Tensor sigma2, at::Tensor u, at::Tensor z,
                      at::Tensor groups, at::Tensor ps_lut, at::Tensor log1m_ps, double tau2, double pg, double pp,
                      int64_t max_depth, bool use_likelihood, int64_t leaves_base, at::Tensor keys, int64_t kz) {
  TORCH_CHECK(feature.device().is_cpu(), "bart_sweep: CPU tensors only");
  TORCH_CHECK(feature.scalar_type() == at::kShort && cut.scalar_type() == at::kShort && leaf_of.scalar_type() == at::kShort,
              "bart_sweep: feature, cut and leaf_of are int16");
  TORCH_CHECK(feature.is_contiguous() && cut.is_contiguous() && value.is_contiguous() && leaf_of.is_contiguous() &&
              resid.is_contiguous(), "bart_sweep: contiguous state tensors");
  TORCH_CHECK(value.scalar_type() == resid.scalar_type(), "value and resid must share a dtype");
  const UpdateInputs in(Xb, n_cuts, sigma2, u, groups, ps_lut, log1m_ps);
  const auto &xb = in.xb, &nc = in.nc, &s2 = in.s2, &uu = in.uu, &gr = in.gr, &psl = in.psl, &l1m = in.l1m;
  const int64_t T = feature.size(0), C = feature.size(1), K = feature.size(2), N = resid.size(1);
  const bool keyed = z.numel() == 0;  // keyed draws (keys [T, C], slots < kz) instead of a z tensor
  const int64_t Kz = keyed ? kz : z.size(2);
  const int64_t Ku = std::min(K, Kz);  // slots >= Kz hold no leaf and, a grow adding one level, no node this sweep
  auto zz = keyed ? z : z.to(at::kDouble).contiguous();
  auto kk = keyed ? keys.to(at::kLong).contiguous() : keys;
  const HostTables tables(in);
  std::vector<int64_t> moves(static_cast<size_t>(C) * T), accepted(static_cast<size_t>(C) * T);
  AT_DISPATCH_FLOATING_TYPES(value.scalar_type(), "bart_sweep", [&] {
    using Update = TreeUpdate<scalar_t, int16_t, int16_t>;
    at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
      std::vector<double> zrow(K, 0.0);
      auto normals = [&](int64_t t, int64_t c) {
        LeafNormals zs;
        if (keyed) {
          zs.base = static_cast<uint64_t>(leaves_base), zs.key = kk.data_ptr<int64_t>()[t * C + c], zs.kz = Kz;
        } else {
          const double* zt = zz.data_ptr<double>() + (t * C + c) * Kz;
          std::copy(zt, zt + Kz, zrow.begin());
          zs.row = zrow.data();
        }
        return zs;
      };
      // the update scans only the slots that can hold a node this sweep (Ku); the heaps keep stride K
      auto update = [&](int64_t t, int64_t c) {
        Update up{K, Ku, N, feature.data_ptr<int16_t>() + (t * C + c) * K, cut.data_ptr<int16_t>() + (t * C + c) * K,
                  value.data_ptr<scalar_t>() + (t * C + c) * K, leaf_of.data_ptr<int16_t>() + (t * C + c) * N,
                  xb.data_ptr<int16_t>(), &tables.t, s2.data_ptr<double>()[c],
                  uu.data_ptr<double>() + (t * C + c) * 5, psl.data_ptr<double>(), l1m.data_ptr<double>(), tau2, pg, pp,
                  max_depth, use_likelihood};
        up.propose();
        return up;
      };
      auto decide = [&](Update& up, int64_t t, int64_t c) {
        bool acc = false;
        up.decide(normals(t, c), &moves[c * T + t], &acc);
        accepted[c * T + t] = acc ? 1 : 0;
      };
      for (int64_t c = c0; c < c1; ++c) {
        scalar_t* res = resid.data_ptr<scalar_t>() + c * N;
        if (T == 0) continue;
        Update cur = update(0, c);
        for (int64_t n = 0; n < N; ++n) cur.add(n, res[n]);
        decide(cur, 0, c);
        for (int64_t t = 0; t < T; ++t) {
          if (t + 1 == T) {
            cur.pass2(res);
            break;
          }
          // tree t's pass 2 and tree t + 1's pass 1 in one loop: t + 1's proposal needs only its own tree.
          // Most moves are refused: then no point changes leaf, and its leaf index is neither read for a
          // rule nor written
          Update nxt = update(t + 1, c);
          if (cur.moved) {
            for (int64_t n = 0; n < N; ++n) {
              const scalar_t r = cur.move_point(n, res[n]);
              res[n] = r;
              nxt.add(n, r);
            }
          } else {
            for (int64_t n = 0; n < N; ++n) {
              const scalar_t r = cur.keep_point(n, res[n]);
              res[n] = r;
              nxt.add(n, r);
            }
          }
          decide(nxt, t + 1, c);
          cur = std::move(nxt);
        }
      }
    });
  });
  auto counts = at::zeros({2, 3}, feature.options().dtype(at::kLong));
  auto cp = counts.data_ptr<int64_t>();
  for (size_t i = 0; i < moves.size(); ++i) {
    cp[moves[i]] += 1;
    cp[3 + moves[i]] += accepted[i];
  }
  return counts;
}

}  // namespace

TORCH_LIBRARY(torchtree, m) {
  m.def("bart_tree_update(Tensor feature, Tensor cut, Tensor value, Tensor leaf_of, Tensor resid, Tensor Xb, "
        "Tensor n_cuts, Tensor sigma2, Tensor u, Tensor z, Tensor groups, Tensor ps_lut, Tensor log1m_ps, "
        "float tau2, float pg, float pp, int max_depth, bool use_likelihood) -> Tensor[]");
  m.def("bart_sweep(Tensor(a!) feature, Tensor(b!) cut, Tensor(c!) value, Tensor(d!) leaf_of, Tensor(e!) resid, "
        "Tensor Xb, Tensor n_cuts, Tensor sigma2, Tensor u, Tensor z, Tensor groups, Tensor ps_lut, "
        "Tensor log1m_ps, float tau2, float pg, float pp, int max_depth, bool use_likelihood, int leaves_base, "
        "Tensor keys, int kz) -> Tensor");
}

TORCH_LIBRARY_IMPL(torchtree, CPU, m) {
  m.impl("bart_tree_update", bart_tree_update);
  m.impl("bart_sweep", bart_sweep);
}
