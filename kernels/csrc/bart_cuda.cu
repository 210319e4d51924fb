// bart_sweep on CUDA: a whole backfitting sweep in one kernel launch, one block of threads per chain running
// bart_block.h's sweep (every tree in turn: thread 0 proposes and decides, the block passes over the points);
// and bart_gfr_blocks: a grow-from-root sweep the same way (bart_gfr_block.h, its scratch in global memory).
// Nothing is read back to the host, so the launch can be recorded in a CUDA graph. The leaves' normals are
// drawn in the kernel from their keys, as the CPU kernel's (or read from a z tensor). The block's state lives in
// shared memory: block_bytes(K), 36 KB for float64 at max_depth 8; the largest max_depth is the one whose
// state fits the device's opt-in limit (10 on an A100 or H100).
#include "bart_block_args.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdlib>
#include <string>

namespace {

using namespace torchtree_bart;

// the block of threads running a chain's sweep (host stubs: bart_block.h's code is host and device code).
// kWarp: a warp adds its threads' values per cell first (one shared-memory atomic per distinct cell of the
// warp's 32 points instead of one per point: a tree has few leaves, so most of a warp's points share a cell)
template <bool kWarp>
struct CudaBlock {
  unsigned* bar = nullptr;  // a grid sweep's chain barrier: [arrivals, generation] (bart_grid_block.h)
  unsigned G = 1;           // the chain's blocks
  __host__ __device__ int64_t tid() const {
#ifdef __CUDA_ARCH__
    return threadIdx.x;
#else
    return 0;
#endif
  }
  __host__ __device__ int64_t size() const {
#ifdef __CUDA_ARCH__
    return blockDim.x;
#else
    return 1;
#endif
  }
  __host__ __device__ int64_t lane() const {
#ifdef __CUDA_ARCH__
    return threadIdx.x & 31;
#else
    return 0;
#endif
  }
  __host__ __device__ void sync() const {
#ifdef __CUDA_ARCH__
    __syncthreads();
#endif
  }
  // every thread of the chain's G blocks waits here, and sees their writes afterwards through load (the blocks
  // are resident together: a cooperative launch). Thread 0 of each block arrives (after a fence), the last one
  // resets the count and opens the next generation; the others spin on it.
  __host__ __device__ void chain_sync() const {
#ifdef __CUDA_ARCH__
    __syncthreads();
    if (threadIdx.x == 0) {
      volatile unsigned* gen = bar + 1;
      const unsigned g0 = *gen;
      __threadfence();
      if (atomicAdd(bar, 1u) == G - 1) {
        atomicExch(bar, 0u);
        __threadfence();
        atomicAdd(bar + 1, 1u);
      } else {
        while (*gen == g0) __nanosleep(32);
      }
      __threadfence();
    }
    __syncthreads();
#endif
  }
  // a value another block wrote before a chain_sync: read from L2 (this multiprocessor's L1 may hold an old copy)
  template <class T>
  __host__ __device__ T load(const T* p) const {
#ifdef __CUDA_ARCH__
    return __ldcg(p);
#else
    return *p;
#endif
  }
  template <class T>
  __host__ __device__ void add(T* p, T v) const {
#ifdef __CUDA_ARCH__
    atomicAdd(p, v);
#endif
  }
  __host__ __device__ void add(int64_t* p, int64_t v) const {
#ifdef __CUDA_ARCH__
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
#endif
  }
  __host__ __device__ void max(int* p, int v) const {
#ifdef __CUDA_ARCH__
    atomicMax(p, v);
#endif
  }
  // every thread of the warp calls this together (bart_block.h's loops give each warp the same turns)
  template <class T>
  __host__ __device__ void add_cell(T* s, int32_t* cnt, int64_t cell, T v) const {
#ifdef __CUDA_ARCH__
    if (!kWarp) {
      if (cell >= 0) atomicAdd(&s[cell], v), atomicAdd(&cnt[cell], 1);
      return;
    }
    const unsigned all = 0xffffffffu;
    const int c = static_cast<int>(cell);
    unsigned todo = __ballot_sync(all, c >= 0);
    while (todo) {  // the same in every thread: one turn per distinct cell of the warp's points
      const int src = __ffs(todo) - 1;
      const int target = __shfl_sync(all, c, src);
      const unsigned peers = __ballot_sync(all, c == target);
      T x = c == target ? v : T(0);
      for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(all, x, o);
      if (static_cast<int>(threadIdx.x & 31) == src) atomicAdd(&s[target], x), atomicAdd(&cnt[target], __popc(peers));
      todo &= ~peers;
    }
#endif
  }
};

// threads per block: enough to keep a chain's passes over the points busy, few where there are few points
inline int block_threads(int64_t N) { return N >= 8192 ? 512 : (N >= 1024 ? 256 : 64); }

// the most threads a block runs (block_threads); the registers per thread are held to what 512 allow
constexpr int MAX_THREADS = 512;

template <class scalar_t, bool kWarp, int kPoints>
__global__ void __launch_bounds__(MAX_THREADS) sweep_kernel(SweepArgs<scalar_t> a, BlockNormals normals) {
  extern __shared__ __align__(16) unsigned char block_state[];
  CudaBlock<kWarp> b;
  sweep_chain<kPoints>(b, a, normals, block_state, static_cast<int64_t>(blockIdx.x));
}

// a chain's sweep by G blocks (bart_grid_block.h), launched cooperatively: block c G + g is chain c's g-th
template <class scalar_t, bool kWarp, int kPoints>
__global__ void __launch_bounds__(MAX_THREADS) grid_kernel(SweepArgs<scalar_t> a, GridArgs<scalar_t> ga,
                                                           BlockNormals normals, unsigned* bar) {
  extern __shared__ __align__(16) unsigned char block_state[];
  const int64_t c = blockIdx.x / ga.G, g = blockIdx.x % ga.G;
  CudaBlock<kWarp> b;
  b.bar = bar + 2 * c, b.G = static_cast<unsigned>(ga.G);
  sweep_chain_grid<kPoints>(b, a, ga, normals, block_state, c, g);
}

// the cell adds' variant: a warp's adds per cell first (the default) or, with TORCHTREE_CUDA_CELL_ADDS=atomic,
// one shared-memory atomic per point (3.9-4.4x slower per sweep on an H200, 10^4-10^5 rows, 4 chains)
inline bool warp_cell_adds() {
  const char* v = std::getenv("TORCHTREE_CUDA_CELL_ADDS");
  return !(v && std::string(v) == "atomic");
}

template <class scalar_t, bool kWarp, int kPoints>
void launch(const SweepArgs<scalar_t>& a, const BlockNormals& normals, int64_t bytes) {
  if (bytes > 48 * 1024)
    C10_CUDA_CHECK(cudaFuncSetAttribute(sweep_kernel<scalar_t, kWarp, kPoints>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  sweep_kernel<scalar_t, kWarp, kPoints><<<static_cast<unsigned>(a.C), block_threads(a.N), bytes,
                                           c10::cuda::getCurrentCUDAStream()>>>(a, normals);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// the blocks per chain of a grid sweep (chain_blocks_setting; 1: one block per chain), at most as many as stay
// resident beside the other chains' (a cooperative launch needs every block resident)
template <class scalar_t, bool kWarp, int kPoints>
int64_t grid_blocks(const SweepArgs<scalar_t>& a, int64_t bytes) {
  const int64_t want = chain_blocks_setting();
  if (want == 1) return 1;
  int device = 0, sms = 0, per_sm = 0, coop = 0, optin = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (!coop || bytes > optin) return 1;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const auto kernel = grid_kernel<scalar_t, kWarp, kPoints>;
  if (bytes > 48 * 1024)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block_threads(a.N), bytes));
  const int64_t fit = static_cast<int64_t>(per_sm) * sms / a.C;
  const int64_t G = want > 1 ? want : greater<int64_t>(1, a.N / GRID_MIN_POINTS);
  return lesser<int64_t>(G, fit);
}

// false where the cooperative launch was refused (nothing ran: the caller runs one block per chain instead)
template <class scalar_t, bool kWarp, int kPoints>
bool launch_grid(const SweepArgs<scalar_t>& a, const BlockNormals& normals, at::Tensor value, int64_t G) {
  GridScratch s = grid_scratch(value, a.C, a.K);
  GridArgs<scalar_t> ga = grid_args<scalar_t>(s, G);
  SweepArgs<scalar_t> aa = a;
  BlockNormals nn = normals;
  unsigned* bar = reinterpret_cast<unsigned*>(s.bar.data_ptr<int32_t>());
  void* args[] = {&aa, &ga, &nn, &bar};
  const cudaError_t err = cudaLaunchCooperativeKernel(
      reinterpret_cast<void*>(grid_kernel<scalar_t, kWarp, kPoints>), dim3(static_cast<unsigned>(a.C * G)),
      dim3(block_threads(a.N)), args, grid_block_bytes<scalar_t>(a.K), c10::cuda::getCurrentCUDAStream());
  if (err == cudaSuccess) return true;
  (void)cudaGetLastError();  // clear it: the one-block kernel runs instead
  TORCH_WARN_ONCE("bart_sweep (CUDA): the launch of ", G, " blocks per chain was refused (", cudaGetErrorString(err),
                  "); one block per chain instead");
  return false;
}

// the grid sweep for the default cell adds and points per turn only (each variant is a kernel to build)
template <class scalar_t, bool kWarp, int kPoints>
void launch_chosen(const SweepArgs<scalar_t>& a, const BlockNormals& normals, int64_t bytes, at::Tensor value) {
  if constexpr (kWarp && kPoints == 4) {
    const int64_t G = grid_blocks<scalar_t, kWarp, kPoints>(a, grid_block_bytes<scalar_t>(a.K));
    if (G > 1 && launch_grid<scalar_t, kWarp, kPoints>(a, normals, value, G)) return;
  }
  launch<scalar_t, kWarp, kPoints>(a, normals, bytes);
}

// the variant the environment asks for: the cell adds (warp_cell_adds), the points per turn (block_points) and the
// blocks per chain (grid_blocks)
template <class scalar_t>
void launch_variant(const SweepArgs<scalar_t>& a, const BlockNormals& normals, int64_t bytes, at::Tensor value) {
  const bool warp = warp_cell_adds();
  if (block_points() == 4) {
    if (warp) launch_chosen<scalar_t, true, 4>(a, normals, bytes, value);
    else launch_chosen<scalar_t, false, 4>(a, normals, bytes, value);
  } else {
    if (warp) launch_chosen<scalar_t, true, 1>(a, normals, bytes, value);
    else launch_chosen<scalar_t, false, 1>(a, normals, bytes, value);
  }
}

at::Tensor bart_sweep_cuda(at::Tensor feature, at::Tensor cut, at::Tensor value, at::Tensor leaf_of, at::Tensor resid,
                           at::Tensor Xb, at::Tensor n_cuts, at::Tensor sigma2, at::Tensor u, at::Tensor z,
                           at::Tensor groups, at::Tensor ps_lut, at::Tensor log1m_ps, double tau2, double pg, double pp,
                           int64_t max_depth, bool use_likelihood, int64_t leaves_base, at::Tensor keys, int64_t kz) {
  TORCH_CHECK(feature.is_cuda(), "bart_sweep (CUDA): CUDA tensors only");
  const c10::cuda::CUDAGuard guard(feature.device());
  auto in = block_inputs("bart_sweep (CUDA)", feature, cut, value, leaf_of, resid, Xb, n_cuts, sigma2, u, z, groups,
                         ps_lut, log1m_ps, leaves_base, keys, kz);
  AT_DISPATCH_FLOATING_TYPES(value.scalar_type(), "bart_sweep_cuda", [&] {
    const SweepArgs<scalar_t> a =
        sweep_args<scalar_t>(in, feature, cut, value, leaf_of, resid, tau2, pg, pp, max_depth, use_likelihood);
    if (a.T == 0 || a.C == 0) return;
    const int64_t bytes = block_bytes<scalar_t>(a.K);
    int device = 0, optin = 0;
    C10_CUDA_CHECK(cudaGetDevice(&device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    TORCH_CHECK(bytes <= optin, "bart_sweep (CUDA): a chain's state for ", a.K, " heap slots takes ", bytes,
                " bytes of shared memory, more than this device's ", optin, "; lower max_depth");
    launch_variant<scalar_t>(a, in.normals, bytes, value);
  });
  return in.counts;
}

template <class scalar_t>
__global__ void __launch_bounds__(MAX_THREADS) gfr_kernel(GfrArgs<scalar_t> a, BlockUniforms u, BlockNormals z) {
  __shared__ GfrShared h;
  CudaBlock<false> b;
  gfr_sweep_chain(b, a, u, z, h, static_cast<int64_t>(blockIdx.x));
}

// One grow-from-root sweep in place (bart_gfr_blocks' contract; `threads` unused: the block size is
// block_threads(N))
void bart_gfr_blocks_cuda(at::Tensor feature, at::Tensor cut, at::Tensor value, at::Tensor leaf_of, at::Tensor resid,
                          at::Tensor Xb, at::Tensor n_cuts, at::Tensor sigma2, at::Tensor u, at::Tensor z,
                          at::Tensor groups, at::Tensor ps_lut, double tau2, int64_t max_depth, bool use_likelihood,
                          int64_t u_base, int64_t leaves_base, at::Tensor keys, int64_t max_bins, int64_t threads) {
  TORCH_CHECK(feature.is_cuda(), "bart_gfr_blocks (CUDA): CUDA tensors only");
  static_assert(MAX_THREADS <= GFR_MAX_THREADS, "the shared state holds a partial per thread");
  const c10::cuda::CUDAGuard guard(feature.device());
  auto g = gfr_block_inputs("bart_gfr_blocks (CUDA)", feature, cut, value, leaf_of, resid, Xb, n_cuts, sigma2, u, z,
                            groups, ps_lut, u_base, leaves_base, keys, max_bins);
  AT_DISPATCH_FLOATING_TYPES(value.scalar_type(), "bart_gfr_blocks_cuda", [&] {
    const GfrArgs<scalar_t> a = gfr_args<scalar_t>(g, feature, cut, value, leaf_of, resid, tau2, max_depth, use_likelihood);
    if (a.T == 0 || a.C == 0) return;
    gfr_kernel<scalar_t><<<static_cast<unsigned>(a.C), block_threads(a.N), 0, c10::cuda::getCurrentCUDAStream()>>>(
        a, g.uniforms, g.normals);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(torchtree, CUDA, m) {
  m.impl("bart_sweep", bart_sweep_cuda);
  m.impl("bart_gfr_blocks", bart_gfr_blocks_cuda);
}
