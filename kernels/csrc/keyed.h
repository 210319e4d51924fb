// torchtree.core.random's keyed uniforms, bit for bit: SplitMix64 finalisers over (stream base, index, slot)
// in wrapping 64-bit integer arithmetic, the top 53 bits as a float64 in the open interval (0, 1).
// Host and device code (bart_cuda.cu draws a sweep's leaf normals from them).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define TT_KEYED_HD __host__ __device__
#else
#define TT_KEYED_HD
#endif

namespace torchtree_keyed {

TT_KEYED_HD inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

TT_KEYED_HD inline double keyed_uniform(uint64_t base, int64_t index, int64_t slot) {
  const uint64_t golden = 0x9E3779B97F4A7C15ULL;
  uint64_t z = mix64(static_cast<uint64_t>(index) * golden + base);
  uint64_t bits = mix64(z + static_cast<uint64_t>(slot) * golden + 0x632BE5ABULL) >> 11;
  double u = (static_cast<double>(bits) + 0.5) * (1.0 / 9007199254740992.0);
  const double top = 1.0 - 0x1p-53;  // the largest double below 1 (1 - epsilon / 2)
  return top < u ? top : u;         // std::min(u, top)
}

}  // namespace torchtree_keyed
