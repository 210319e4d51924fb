// keyed_uniforms: torchtree.core.random.keyed_uniforms (several streams in one pass) as one compiled CPU
// pass, bit for bit (keyed.h); the reference is some twenty int64 tensor operations per call.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "keyed.h"

namespace {

// bases [K] int64 (each stream's derived seed), index and slot [n] int64 -> [K, n] float64
at::Tensor keyed_uniforms(at::Tensor bases, at::Tensor index, at::Tensor slot) {
  TORCH_CHECK(bases.dim() == 1 && bases.scalar_type() == at::kLong, "bases: int64 [K]");
  TORCH_CHECK(index.scalar_type() == at::kLong && slot.scalar_type() == at::kLong, "index and slot: int64");
  TORCH_CHECK(index.numel() == slot.numel(), "index and slot: one slot per index");
  auto bc = bases.contiguous(), ic = index.contiguous().view(-1), sc = slot.contiguous().view(-1);
  const int64_t K = bc.numel(), n = ic.numel();
  auto out = at::empty({K, n}, ic.options().dtype(at::kDouble));
  const int64_t *b = bc.data_ptr<int64_t>(), *ix = ic.data_ptr<int64_t>(), *sl = sc.data_ptr<int64_t>();
  double* o = out.data_ptr<double>();
  at::parallel_for(0, n, 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t k = 0; k < K; ++k) {
      const uint64_t base = static_cast<uint64_t>(b[k]);
      for (int64_t i = i0; i < i1; ++i) o[k * n + i] = torchtree_keyed::keyed_uniform(base, ix[i], sl[i]);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchtree, m) { m.def("keyed_uniforms(Tensor bases, Tensor index, Tensor slot) -> Tensor"); }

TORCH_LIBRARY_IMPL(torchtree, CPU, m) { m.impl("keyed_uniforms", keyed_uniforms); }
