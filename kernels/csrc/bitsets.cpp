// Node bitsets of the move samplers (torchtree.model.target.TreeModel): popcounts and child bitsets in one
// pass over each row, instead of a chain of whole-tensor torch operations. The plain-torch references are
// torchtree.kernels.bitsets.count_bits and TreeModel.split_bits' torch route; every output is a bit
// operation or an integer count, so the results are equal (tests/test_native_bitsets.py).
//
// A bitset is a row of W int64 words: point i is bit (i % 64) of word i / 64.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace {

inline int64_t grain_rows(int64_t W) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(W, 1)); }

// counts [n, S] (S = masks' rows) of B & masks[k], or [n] (no masks) of B
at::Tensor bitset_counts(at::Tensor B, at::Tensor masks) {
  TORCH_CHECK(B.device().is_cpu() && B.scalar_type() == at::kLong && B.dim() == 2, "bitset_counts: B is int64 [n, W] on the CPU");
  auto Bc = B.contiguous();
  const int64_t n = Bc.size(0), W = Bc.size(1);
  const bool per_mask = masks.numel() > 0;
  auto Mc = per_mask ? masks.contiguous() : masks;
  if (per_mask) TORCH_CHECK(Mc.scalar_type() == at::kLong && Mc.dim() == 2 && Mc.size(1) == W, "bitset_counts: masks are int64 [S, W]");
  const int64_t S = per_mask ? Mc.size(0) : 1;
  auto out = per_mask ? at::empty({n, S}, Bc.options()) : at::empty({n}, Bc.options());
  const uint64_t* b = reinterpret_cast<const uint64_t*>(Bc.data_ptr<int64_t>());
  const uint64_t* m = per_mask ? reinterpret_cast<const uint64_t*>(Mc.data_ptr<int64_t>()) : nullptr;
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, n, grain_rows(W * S), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint64_t* row = b + r * W;
      if (!per_mask) {
        int64_t c = 0;
        for (int64_t w = 0; w < W; ++w) c += __builtin_popcountll(row[w]);
        o[r] = c;
        continue;
      }
      for (int64_t s = 0; s < S; ++s) {
        const uint64_t* mk = m + s * W;
        int64_t c = 0;
        for (int64_t w = 0; w < W; ++w) c += __builtin_popcountll(row[w] & mk[w]);
        o[r * S + s] = c;
      }
    }
  });
  return out;
}

// Child bitsets. Row i's parent is B[src[i]] (src empty: B[i]); left = parent & table[whole[i]], then
// the points pts[start[i] .. end[i]) that are in the parent are added (the split bucket's run of the
// rank order), and where right[i] the child is parent ^ left (the parent's other points).
at::Tensor split_bits(at::Tensor B, at::Tensor src, at::Tensor table, at::Tensor whole, at::Tensor start,
                      at::Tensor end, at::Tensor pts, at::Tensor right) {
  TORCH_CHECK(B.device().is_cpu() && B.scalar_type() == at::kLong && B.dim() == 2, "split_bits: B is int64 [n, W] on the CPU");
  TORCH_CHECK(table.scalar_type() == at::kLong && table.dim() == 2 && table.size(1) == B.size(1), "split_bits: table is int64 [R, W]");
  TORCH_CHECK(pts.scalar_type() == at::kInt, "split_bits: pts is int32");
  auto Bc = B.contiguous(), Tc = table.contiguous(), Pc = pts.contiguous();
  auto wc = whole.to(at::kLong).contiguous(), sc = start.to(at::kLong).contiguous(), ec = end.to(at::kLong).contiguous();
  auto rc = right.to(at::kBool).contiguous();
  const bool gather = src.numel() > 0;
  auto srcc = gather ? src.to(at::kLong).contiguous() : src;
  TORCH_CHECK(gather ? srcc.numel() == wc.numel() : wc.numel() == Bc.size(0), "split_bits: one parent per row");
  const int64_t n = wc.numel(), W = Bc.size(1), nB = Bc.size(0), R = Tc.size(0);
  auto out = at::empty({n, W}, Bc.options());
  const uint64_t* b = reinterpret_cast<const uint64_t*>(Bc.data_ptr<int64_t>());
  const uint64_t* t = reinterpret_cast<const uint64_t*>(Tc.data_ptr<int64_t>());
  uint64_t* o = reinterpret_cast<uint64_t*>(out.data_ptr<int64_t>());
  const int64_t *wh = wc.data_ptr<int64_t>(), *st = sc.data_ptr<int64_t>(), *en = ec.data_ptr<int64_t>();
  const int64_t* sr = gather ? srcc.data_ptr<int64_t>() : nullptr;
  const int32_t* p = Pc.data_ptr<int32_t>();
  const bool* rt = rc.data_ptr<bool>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = sr ? sr[i] : i;
    TORCH_CHECK(s >= 0 && s < nB && wh[i] >= 0 && wh[i] < R, "split_bits: row out of range");
  }
  at::parallel_for(0, n, grain_rows(W), [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      const uint64_t* par = b + (sr ? sr[i] : i) * W;
      const uint64_t* tab = t + wh[i] * W;
      uint64_t* row = o + i * W;
      for (int64_t w = 0; w < W; ++w) row[w] = par[w] & tab[w];
      for (int64_t k = st[i]; k < en[i]; ++k) {
        const uint64_t pt = static_cast<uint64_t>(p[k]);
        const uint64_t bit = uint64_t(1) << (pt & 63);
        row[pt >> 6] |= par[pt >> 6] & bit;
      }
      if (rt[i])
        for (int64_t w = 0; w < W; ++w) row[w] ^= par[w];
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchtree, m) {
  m.def("bitset_counts(Tensor B, Tensor masks) -> Tensor");
  m.def("split_bits(Tensor B, Tensor src, Tensor table, Tensor whole, Tensor start, Tensor end, Tensor pts, "
        "Tensor right) -> Tensor");
}

TORCH_LIBRARY_IMPL(torchtree, CPU, m) {
  m.impl("bitset_counts", bitset_counts);
  m.impl("split_bits", split_bits);
}
