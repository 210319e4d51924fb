// The tensors of a block sweep (bart_block.h) checked, converted once to the dtypes its loops read and laid
// out as SweepArgs: shared by the CPU stand-in operator (bart_block.cpp) and the CUDA one (bart_cuda.cu).
#pragma once
#include "bart_block.h"
#include "bart_common.h"
#include "bart_gfr_block.h"
#include "bart_grid_block.h"

#include <cstdlib>
#include <initializer_list>
#include <string>

namespace torchtree_bart {

// the points of a thread's turn in the block sweep's fused passes (bart_block.h's kPoints): 4, or 1 where the
// environment sets TORCHTREE_BLOCK_POINTS=1 (on an H200 four took 51.9 against 59.5 ms per sweep at 10^5 rows)
inline int block_points() {
  const char* v = std::getenv("TORCHTREE_BLOCK_POINTS");
  return v && std::string(v) == "1" ? 1 : 4;
}

// blocks per chain of the CUDA sweep (bart_grid_block.h; its CPU stand-in reads it too): TORCHTREE_CHAIN_BLOCKS
// as a number, 0 for "auto" (as many as stay resident, with at least GRID_MIN_POINTS points each), else 1
// (bart_block.h's one block per chain; a switch for the GPU benchmark until it has timed the grid)
constexpr int64_t GRID_MIN_POINTS = 4096;
inline int64_t chain_blocks_setting() {
  const char* v = std::getenv("TORCHTREE_CHAIN_BLOCKS");
  if (!v) return 1;
  if (std::string(v) == "auto") return 0;
  const long n = std::strtol(v, nullptr, 10);
  return n >= 1 ? n : 1;
}

// the chain-wide scratch of a grid sweep (zeroed), kept alive while it runs, and its GridArgs
struct GridScratch {
  at::Tensor cell_s, cell_n, to, old_v, bcast, bar;
};

inline GridScratch grid_scratch(const at::Tensor& value, int64_t C, int64_t K) {
  const auto i32 = value.options().dtype(at::kInt);
  return {at::zeros({C, 2, 2 * K}, value.options()), at::zeros({C, 2, 2 * K}, i32), at::zeros({C, 2 * K}, i32),
          at::zeros({C, K}, value.options()), at::zeros({C, 4}, value.options().dtype(at::kLong)), at::zeros({C, 2}, i32)};
}

template <class scalar_t>
GridArgs<scalar_t> grid_args(GridScratch& s, int64_t G) {
  return {s.cell_s.data_ptr<scalar_t>(), s.cell_n.data_ptr<int32_t>(), s.to.data_ptr<int32_t>(),
          s.old_v.data_ptr<scalar_t>(), s.bcast.data_ptr<int64_t>(), G};
}

// the standard normal of a leaf: z[tc, k] of a tensor [T * C, kz], or drawn from its key,
// ndtri(keyed_uniform(base, keys[tc], k)) (the numbers such a tensor made by torchtree.core.random holds:
// bit for bit on the CPU, to the last bits on CUDA, whose normcdfinv may round otherwise); 0 from slot kz on
struct BlockNormals {
  const double* z;
  const int64_t* keys;
  uint64_t base;
  int64_t kz;
  TT_HD double operator()(int64_t tc, int64_t k) const {
    if (k >= kz) return 0.0;
    if (z) return z[tc * kz + k];
    const double u = keyed_uniform(base, keys[tc], k);
#ifdef __CUDA_ARCH__
    return normcdfinv(u);
#else
    return calc_ndtri(u);
#endif
  }
};

// the converted read-only inputs (kept alive while the sweep runs), the leaves' normals, scratch and move counts
struct BlockSweepInputs {
  UpdateInputs in;
  at::Tensor zz, kk, scratch, counts;
  BlockNormals normals;
};

// the chains' state a block sweep updates in place: int16 trees and leaf maps, contiguous, values and residuals of
// one dtype
inline void check_state(const char* name, const at::Tensor& feature, const at::Tensor& cut, const at::Tensor& value,
                        const at::Tensor& leaf_of, const at::Tensor& resid) {
  TORCH_CHECK(feature.scalar_type() == at::kShort && cut.scalar_type() == at::kShort &&
                  leaf_of.scalar_type() == at::kShort,
              name, ": feature, cut and leaf_of are int16");
  TORCH_CHECK(feature.is_contiguous() && cut.is_contiguous() && value.is_contiguous() && leaf_of.is_contiguous() &&
                  resid.is_contiguous(),
              name, ": contiguous state tensors");
  TORCH_CHECK(value.scalar_type() == resid.scalar_type(), name, ": value and resid must share a dtype");
}

// every input holding data is on the state's device (the kernels read their data pointers there)
inline void check_devices(const char* name, const at::Tensor& feature, std::initializer_list<at::Tensor> inputs) {
  for (const at::Tensor& t : inputs)
    TORCH_CHECK(!t.defined() || t.numel() == 0 || t.device() == feature.device(), name,
                ": every non-empty input must be on the trees' device (", feature.device(), "), one is on ", t.device());
}

inline BlockSweepInputs block_inputs(const char* name, const at::Tensor& feature, const at::Tensor& cut,
                                     const at::Tensor& value, const at::Tensor& leaf_of, const at::Tensor& resid,
                                     const at::Tensor& Xb, const at::Tensor& n_cuts, const at::Tensor& sigma2,
                                     const at::Tensor& u, const at::Tensor& z, const at::Tensor& groups,
                                     const at::Tensor& ps_lut, const at::Tensor& log1m_ps, int64_t leaves_base,
                                     const at::Tensor& keys, int64_t kz) {
  check_state(name, feature, cut, value, leaf_of, resid);
  check_devices(name, feature, {cut, value, leaf_of, resid, Xb, n_cuts, sigma2, u, z, groups, ps_lut, log1m_ps, keys});
  const bool keyed = z.numel() == 0;  // keyed draws (keys [T, C], slots < kz) instead of a z tensor
  TORCH_CHECK(keyed ? keys.numel() == feature.size(0) * feature.size(1)
                    : z.dim() == 3 && z.size(0) == feature.size(0) && z.size(1) == feature.size(1),
              name, ": z [T, C, Kz], or keys [T, C] with z empty");
  const int64_t C = feature.size(1), D = Xb.size(0);
  BlockSweepInputs b{UpdateInputs(Xb, n_cuts, sigma2, u, groups, ps_lut, log1m_ps),
                     keyed ? z : z.to(at::kDouble).contiguous(), keyed ? keys.to(at::kLong).contiguous() : keys,
                     at::empty({C, feature_tables_size(D)}, feature.options().dtype(at::kLong)),
                     at::zeros({2, 3}, feature.options().dtype(at::kLong)), BlockNormals{}};
  b.normals = keyed ? BlockNormals{nullptr, b.kk.data_ptr<int64_t>(), static_cast<uint64_t>(leaves_base), kz}
                    : BlockNormals{b.zz.data_ptr<double>(), nullptr, 0, b.zz.size(2)};
  return b;
}

template <class scalar_t>
SweepArgs<scalar_t> sweep_args(BlockSweepInputs& b, at::Tensor& feature, at::Tensor& cut, at::Tensor& value,
                               at::Tensor& leaf_of, at::Tensor& resid, double tau2, double pg, double pp,
                               int64_t max_depth, bool use_likelihood) {
  const UpdateInputs& in = b.in;
  SweepArgs<scalar_t> a;
  a.feature = feature.data_ptr<int16_t>(), a.cut = cut.data_ptr<int16_t>();
  a.value = value.data_ptr<scalar_t>(), a.leaf_of = leaf_of.data_ptr<int16_t>(), a.resid = resid.data_ptr<scalar_t>();
  a.Xb = in.xb.data_ptr<int16_t>(), a.n_cuts = in.nc.data_ptr<int64_t>(), a.sigma2 = in.s2.data_ptr<double>();
  a.U = in.uu.data_ptr<double>();
  a.groups = in.gr.numel() ? in.gr.data_ptr<int64_t>() : nullptr;
  a.ps_lut = in.psl.data_ptr<double>(), a.log1m_ps = in.l1m.data_ptr<double>();
  a.tau2 = tau2, a.pg = pg, a.pp = pp, a.max_depth = max_depth, a.use_lik = use_likelihood;
  a.T = feature.size(0), a.C = feature.size(1), a.K = feature.size(2);
  a.N = resid.size(1), a.D = in.xb.size(0);
  a.scratch = b.scratch.data_ptr<int64_t>(), a.counts = b.counts.data_ptr<int64_t>();
  return a;
}

// A grow-from-root block sweep's inputs (bart_gfr_block.h) checked and converted, its scratch allocated on the
// state's device, its uniforms and normals (keyed, or rows of u and z [T, C, K]): shared by the CPU stand-in
// operator (bart_block.cpp) and the CUDA one (bart_cuda.cu).
struct GfrBlockInputs {
  at::Tensor xb, nc, s2, gr, psl, uu, zz, kk;
  std::vector<at::Tensor> scratch;
  BlockUniforms uniforms;
  BlockNormals normals;
  int64_t MB;
};

inline GfrBlockInputs gfr_block_inputs(const char* name, const at::Tensor& feature, const at::Tensor& cut,
                                       const at::Tensor& value, const at::Tensor& leaf_of, const at::Tensor& resid,
                                       const at::Tensor& Xb, const at::Tensor& n_cuts, const at::Tensor& sigma2,
                                       const at::Tensor& u, const at::Tensor& z, const at::Tensor& groups,
                                       const at::Tensor& ps_lut, int64_t u_base, int64_t leaves_base,
                                       const at::Tensor& keys, int64_t max_bins) {
  check_state(name, feature, cut, value, leaf_of, resid);
  check_devices(name, feature, {cut, value, leaf_of, resid, Xb, n_cuts, sigma2, u, z, groups, ps_lut, keys});
  const int64_t T = feature.size(0), C = feature.size(1), K = feature.size(2), N = resid.size(1), D = Xb.size(0);
  const bool keyed = u.numel() == 0;  // keyed draws (keys [T, C]) instead of u and z tensors [T, C, K]
  TORCH_CHECK(keyed ? keys.numel() == T * C : u.numel() == T * C * K && z.numel() == T * C * K,
              name, ": u and z [T, C, K], or keys [T, C] with u and z empty");
  GfrBlockInputs g;
  g.xb = Xb.to(at::kShort).contiguous(), g.nc = n_cuts.to(at::kLong).contiguous();
  g.s2 = sigma2.to(at::kDouble).contiguous(), g.psl = ps_lut.to(at::kDouble).contiguous();
  g.gr = groups.numel() ? groups.to(at::kLong).contiguous() : groups;
  g.uu = keyed ? u : u.to(at::kDouble).contiguous(), g.zz = keyed ? z : z.to(at::kDouble).contiguous();
  g.kk = keyed ? keys.to(at::kLong).contiguous() : keys;
  TORCH_CHECK(max_bins >= 1, name, ": max_bins >= 1 (the most cuts of a column + 1)");
  g.MB = max_bins;  // given by the caller: the bound is known on the host, and reading n_cuts would wait for a GPU
  const auto opt = feature.options();
  const int64_t W = 1 + D * (g.MB - 1);
  g.scratch.push_back(at::empty({C, N}, opt.dtype(at::kInt)));          // idx
  g.scratch.push_back(at::empty({C, N}, opt.dtype(at::kInt)));          // tmp
  g.scratch.push_back(at::empty({C, K, D}, opt.dtype(at::kInt)));       // lo
  g.scratch.push_back(at::empty({C, K, D}, opt.dtype(at::kInt)));       // hi
  g.scratch.push_back(at::empty({C, K}, opt.dtype(at::kLong)));         // start
  g.scratch.push_back(at::empty({C, K}, opt.dtype(at::kLong)));         // end
  g.scratch.push_back(at::empty({C, K}, opt.dtype(at::kDouble)));       // s_leaf
  g.scratch.push_back(at::empty({C, K}, opt.dtype(at::kDouble)));       // n_leaf
  g.scratch.push_back(at::empty({C, D, g.MB}, opt.dtype(at::kDouble)));  // hs
  g.scratch.push_back(at::empty({C, D, g.MB}, opt.dtype(at::kInt)));     // hn
  g.scratch.push_back(at::empty({C, D}, opt.dtype(at::kDouble)));       // pf
  g.scratch.push_back(at::empty({C, D}, opt.dtype(at::kLong)));         // off
  g.scratch.push_back(at::empty({C, W}, opt.dtype(at::kDouble)));       // w
  g.scratch.push_back(at::empty({C, N}, resid.options()));              // R
  g.uniforms = keyed ? BlockUniforms{nullptr, g.kk.data_ptr<int64_t>(), static_cast<uint64_t>(u_base), K}
                     : BlockUniforms{g.uu.data_ptr<double>(), nullptr, 0, K};
  g.normals = keyed ? BlockNormals{nullptr, g.kk.data_ptr<int64_t>(), static_cast<uint64_t>(leaves_base), K}
                    : BlockNormals{g.zz.data_ptr<double>(), nullptr, 0, K};
  return g;
}

template <class scalar_t>
GfrArgs<scalar_t> gfr_args(GfrBlockInputs& g, at::Tensor& feature, at::Tensor& cut, at::Tensor& value,
                           at::Tensor& leaf_of, at::Tensor& resid, double tau2, int64_t max_depth, bool use_likelihood) {
  GfrArgs<scalar_t> a;
  a.feature = feature.data_ptr<int16_t>(), a.cut = cut.data_ptr<int16_t>();
  a.value = value.data_ptr<scalar_t>(), a.leaf_of = leaf_of.data_ptr<int16_t>(), a.resid = resid.data_ptr<scalar_t>();
  a.Xb = g.xb.data_ptr<int16_t>(), a.n_cuts = g.nc.data_ptr<int64_t>(), a.sigma2 = g.s2.data_ptr<double>();
  a.groups = g.gr.numel() ? g.gr.data_ptr<int64_t>() : nullptr;
  a.ps_lut = g.psl.data_ptr<double>();
  a.tau2 = tau2, a.max_depth = max_depth, a.use_lik = use_likelihood;
  a.T = feature.size(0), a.C = feature.size(1), a.K = feature.size(2), a.N = resid.size(1), a.D = g.xb.size(0);
  a.MB = g.MB;
  auto& s = g.scratch;
  a.idx = s[0].data_ptr<int32_t>(), a.tmp = s[1].data_ptr<int32_t>();
  a.lo = s[2].data_ptr<int32_t>(), a.hi = s[3].data_ptr<int32_t>();
  a.start = s[4].data_ptr<int64_t>(), a.end = s[5].data_ptr<int64_t>();
  a.s_leaf = s[6].data_ptr<double>(), a.n_leaf = s[7].data_ptr<double>();
  a.hs = s[8].data_ptr<double>(), a.hn = s[9].data_ptr<int32_t>();
  a.pf = s[10].data_ptr<double>(), a.off = s[11].data_ptr<int64_t>(), a.w = s[12].data_ptr<double>();
  a.R = s[13].data_ptr<scalar_t>();
  return a;
}

}  // namespace torchtree_bart
