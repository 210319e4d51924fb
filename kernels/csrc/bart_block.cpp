// bart_block.h's sweep and bart_gfr_block.h's grow-from-root sweep on the CPU, each chain's block of `threads`
// threads stood in for by host threads (one at a time where threads = 1): the CUDA kernels' code, tested against
// bart_sweep and bart_gfr_sweep (tests/test_bart_block.py).
#include "bart_block_args.h"

#include <ATen/Parallel.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace {

using namespace torchtree_bart;

// a reusable barrier for n threads
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t gen = gen_;
    if (++count_ == n_) {
      count_ = 0, ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, count_ = 0;
  int64_t gen_ = 0;
};

// a block of threads on the host: thread `id` of `n`, in "warps" of `warp` threads (each thread adds its own
// values: no warp runs in step here), atomics under one lock
struct HostBlock {
  int64_t id, n, warp;
  Barrier* barrier;
  std::mutex* mu;
  Barrier* chain = nullptr;  // every thread of the chain's blocks (bart_grid_block.h), or none
  int64_t tid() const { return id; }
  int64_t size() const { return n; }
  int64_t lane() const { return id % warp; }
  void sync() {
    if (n > 1) barrier->wait();
  }
  void chain_sync() {
    if (chain) chain->wait();
  }
  template <class T>
  T load(const T* p) const {
    return *p;
  }
  template <class T>
  void add(T* p, T v) {
    std::lock_guard<std::mutex> lock(*mu);
    *p += v;
  }
  template <class T>
  void add_cell(T* s, int32_t* cnt, int64_t cell, T v) {
    if (cell < 0) return;
    std::lock_guard<std::mutex> lock(*mu);
    s[cell] += v, cnt[cell] += 1;
  }
  void max(int* p, int v) {
    std::lock_guard<std::mutex> lock(*mu);
    *p = std::max(*p, v);
  }
};

// runs body(block) for chain c on `threads` host threads sharing one barrier and one lock
template <class Body>
void run_block(int64_t threads, const Body& body) {
  Barrier barrier(static_cast<int>(threads));
  std::mutex mu;
  auto run = [&](int64_t id) {
    HostBlock b{id, threads, threads % 4 == 0 ? 4 : 1, &barrier, &mu};  // warps of 4 where they divide the block
    body(b);
  };
  if (threads == 1) return run(0);
  std::vector<std::thread> pool;
  for (int64_t id = 0; id < threads; ++id) pool.emplace_back(run, id);
  for (auto& th : pool) th.join();
}

// runs body(block, g) for chain c on G blocks of `threads` host threads: a barrier per block and one for the chain
template <class Body>
void run_grid(int64_t threads, int64_t G, const Body& body) {
  std::vector<std::unique_ptr<Barrier>> blocks;
  for (int64_t g = 0; g < G; ++g) blocks.emplace_back(new Barrier(static_cast<int>(threads)));
  Barrier chain(static_cast<int>(threads * G));
  std::mutex mu;
  std::vector<std::thread> pool;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t id = 0; id < threads; ++id)
      pool.emplace_back([&, g, id] {
        HostBlock b{id, threads, threads % 4 == 0 ? 4 : 1, blocks[g].get(), &mu, &chain};
        body(b, g);
      });
  for (auto& th : pool) th.join();
}

// One sweep, as bart_sweep, in place: chain c by a block of `threads` host threads (or, with
// TORCHTREE_CHAIN_BLOCKS=G > 1, by G such blocks: bart_grid_block.h).
// Returns the proposed and accepted counts per move type, [2, 3].
at::Tensor bart_sweep_blocks(at::Tensor feature, at::Tensor cut, at::Tensor value, at::Tensor leaf_of,
                             at::Tensor resid, at::Tensor Xb, at::Tensor n_cuts, at::Tensor sigma2, at::Tensor u,
                             at::Tensor z, at::Tensor groups, at::Tensor ps_lut, at::Tensor log1m_ps, double tau2,
                             double pg, double pp, int64_t max_depth, bool use_likelihood, int64_t leaves_base,
                             at::Tensor keys, int64_t kz, int64_t threads) {
  TORCH_CHECK(feature.device().is_cpu(), "bart_sweep_blocks: CPU tensors only");
  TORCH_CHECK(threads >= 1, "bart_sweep_blocks: threads >= 1");
  auto in = block_inputs("bart_sweep_blocks", feature, cut, value, leaf_of, resid, Xb, n_cuts, sigma2, u, z, groups,
                         ps_lut, log1m_ps, leaves_base, keys, kz);
  AT_DISPATCH_FLOATING_TYPES(value.scalar_type(), "bart_sweep_blocks", [&] {
    const SweepArgs<scalar_t> a =
        sweep_args<scalar_t>(in, feature, cut, value, leaf_of, resid, tau2, pg, pp, max_depth, use_likelihood);
    const int64_t G = chain_blocks_setting() > 1 ? chain_blocks_setting() : 1;
    if (G > 1) {
      GridScratch s = grid_scratch(value, a.C, a.K);
      const GridArgs<scalar_t> ga = grid_args<scalar_t>(s, G);
      for (int64_t c = 0; c < a.C; ++c) {
        std::vector<std::vector<unsigned char>> bufs(G, std::vector<unsigned char>(grid_block_bytes<scalar_t>(a.K)));
        run_grid(threads, G, [&](HostBlock& b, int64_t g) {
          if (block_points() == 4) sweep_chain_grid<4>(b, a, ga, in.normals, bufs[g].data(), c, g);
          else sweep_chain_grid<1>(b, a, ga, in.normals, bufs[g].data(), c, g);
        });
      }
      return;
    }
    for (int64_t c = 0; c < a.C; ++c) {
      std::vector<unsigned char> buf(block_bytes<scalar_t>(a.K));
      if (block_points() == 4)
        run_block(threads, [&](HostBlock& b) { sweep_chain<4>(b, a, in.normals, buf.data(), c); });
      else
        run_block(threads, [&](HostBlock& b) { sweep_chain<1>(b, a, in.normals, buf.data(), c); });
    }
  });
  return in.counts;
}

// One grow-from-root sweep, as bart_gfr_sweep, in place: chain c by a block of `threads` host threads, with
// histograms of max_bins bins per column (at least the most cuts of a column + 1). threads = 1 makes every sum
// in bart_gfr_sweep's order.
void bart_gfr_blocks(at::Tensor feature, at::Tensor cut, at::Tensor value, at::Tensor leaf_of, at::Tensor resid,
                     at::Tensor Xb, at::Tensor n_cuts, at::Tensor sigma2, at::Tensor u, at::Tensor z, at::Tensor groups,
                     at::Tensor ps_lut, double tau2, int64_t max_depth, bool use_likelihood, int64_t u_base,
                     int64_t leaves_base, at::Tensor keys, int64_t max_bins, int64_t threads) {
  TORCH_CHECK(feature.device().is_cpu(), "bart_gfr_blocks: CPU tensors only");
  TORCH_CHECK(threads >= 1 && threads <= GFR_MAX_THREADS, "bart_gfr_blocks: 1 <= threads <= ", GFR_MAX_THREADS);
  auto g = gfr_block_inputs("bart_gfr_blocks", feature, cut, value, leaf_of, resid, Xb, n_cuts, sigma2, u, z, groups,
                            ps_lut, u_base, leaves_base, keys, max_bins);
  AT_DISPATCH_FLOATING_TYPES(value.scalar_type(), "bart_gfr_blocks", [&] {
    const GfrArgs<scalar_t> a = gfr_args<scalar_t>(g, feature, cut, value, leaf_of, resid, tau2, max_depth, use_likelihood);
    for (int64_t c = 0; c < a.C; ++c) {
      GfrShared shared;
      run_block(threads, [&](HostBlock& b) { gfr_sweep_chain(b, a, g.uniforms, g.normals, shared, c); });
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchtree, m) {
  m.def("bart_sweep_blocks(Tensor(a!) feature, Tensor(b!) cut, Tensor(c!) value, Tensor(d!) leaf_of, "
        "Tensor(e!) resid, Tensor Xb, Tensor n_cuts, Tensor sigma2, Tensor u, Tensor z, Tensor groups, "
        "Tensor ps_lut, Tensor log1m_ps, float tau2, float pg, float pp, int max_depth, bool use_likelihood, "
        "int leaves_base, Tensor keys, int kz, int threads) -> Tensor");
  m.def("bart_gfr_blocks(Tensor(a!) feature, Tensor(b!) cut, Tensor(c!) value, Tensor(d!) leaf_of, Tensor(e!) resid, "
        "Tensor Xb, Tensor n_cuts, Tensor sigma2, Tensor u, Tensor z, Tensor groups, Tensor ps_lut, float tau2, "
        "int max_depth, bool use_likelihood, int u_base, int leaves_base, Tensor keys, int max_bins, int threads) -> ()");
}

TORCH_LIBRARY_IMPL(torchtree, CPU, m) {
  m.impl("bart_sweep_blocks", bart_sweep_blocks);
  m.impl("bart_gfr_blocks", bart_gfr_blocks);
}
