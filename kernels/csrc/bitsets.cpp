// Node bitsets of the move samplers (torchtree.model.target.TreeModel): popcounts and child bitsets in one
// pass over each row, instead of a chain of whole-tensor torch operations. The plain-torch references are
// torchtree.kernels.bitsets.count_bits and TreeModel.split_bits' torch route; every output is a bit
// operation or an integer count, so the results are equal (tests/test_native_bitsets.py).
//
// A bitset is a row of W int64 words: point i is bit (i % 64) of word i / 64.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

namespace {

// Set bits of x & mask (or of x) over W words. The loop is compiled twice: inlined into a function built for
// the popcnt instruction (x86-64 CPUs since 2008, chosen at run time), and portable (where
// __builtin_popcountll calls a table routine in libgcc).
__attribute__((always_inline)) inline int64_t count_loop(const uint64_t* x, const uint64_t* mask, int64_t W) {
  int64_t c = 0;
  if (mask)
    for (int64_t w = 0; w < W; ++w) c += __builtin_popcountll(x[w] & mask[w]);
  else
    for (int64_t w = 0; w < W; ++w) c += __builtin_popcountll(x[w]);
  return c;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("popcnt"))) int64_t count_words_hw(const uint64_t* x, const uint64_t* mask, int64_t W) {
  return count_loop(x, mask, W);
}
inline bool has_popcnt() {
  static const bool ok = __builtin_cpu_supports("popcnt");
  return ok;
}
#endif

int64_t count_words(const uint64_t* x, const uint64_t* mask, int64_t W) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (has_popcnt()) return count_words_hw(x, mask, W);
#endif
  return count_loop(x, mask, W);
}

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
        o[r] = count_words(row, nullptr, W);
        continue;
      }
      for (int64_t s = 0; s < S; ++s) o[r * S + s] = count_words(row, m + s * W, W);
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

// Smallest and largest rank in column f[i] of the points of bitset B[i] (0, 0 for an empty one). A node of
// under W / 2 points reads its points' ranks. A larger one finds its first bucket (the first prefix table
// row meeting it) and its last (the first prefix row holding all of it) by binary search over the column's
// bucket prefix table; in a bucket of several values the node's points are looked up along the bucket's
// run of the rank order, from the start for the smallest rank and from the end for the largest.
std::vector<at::Tensor> extent_ranks(at::Tensor B, at::Tensor f, at::Tensor table, at::Tensor boff, at::Tensor n_buckets,
                                     at::Tensor bucket_first, at::Tensor bucket_last, at::Tensor run_start,
                                     at::Tensor run_end, at::Tensor pts, at::Tensor rank_flat, int64_t D) {
  TORCH_CHECK(B.device().is_cpu() && B.scalar_type() == at::kLong && B.dim() == 2, "extent_ranks: B is int64 [n, W] on the CPU");
  TORCH_CHECK(pts.scalar_type() == at::kInt && rank_flat.scalar_type() == at::kLong, "extent_ranks: pts int32, ranks int64");
  auto Bc = B.contiguous(), Tc = table.contiguous(), fc = f.to(at::kLong).contiguous();
  auto bo = boff.contiguous(), nb = n_buckets.contiguous(), bf = bucket_first.contiguous(), bl = bucket_last.contiguous();
  auto rs = run_start.contiguous(), re = run_end.contiguous(), Pc = pts.contiguous(), Rc = rank_flat.contiguous();
  const int64_t n = Bc.size(0), W = Bc.size(1);
  auto rlo = at::zeros({n}, fc.options()), rhi = at::zeros({n}, fc.options());
  const uint64_t* b = reinterpret_cast<const uint64_t*>(Bc.data_ptr<int64_t>());
  const uint64_t* t = reinterpret_cast<const uint64_t*>(Tc.data_ptr<int64_t>());
  const int64_t *ff = fc.data_ptr<int64_t>(), *bop = bo.data_ptr<int64_t>(), *nbp = nb.data_ptr<int64_t>();
  const int64_t *bfp = bf.data_ptr<int64_t>(), *blp = bl.data_ptr<int64_t>(), *rsp = rs.data_ptr<int64_t>(), *rep = re.data_ptr<int64_t>();
  const int32_t* pp = Pc.data_ptr<int32_t>();
  const int64_t* rank = Rc.data_ptr<int64_t>();
  int64_t *lo_out = rlo.data_ptr<int64_t>(), *hi_out = rhi.data_ptr<int64_t>();
  auto in_node = [](const uint64_t* row, int64_t pt) { return (row[pt >> 6] >> (pt & 63)) & 1; };
  at::parallel_for(0, n, grain_rows(W * 8), [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      const uint64_t* row = b + i * W;
      const int64_t d = ff[i];
      const int64_t c = count_words(row, nullptr, W);
      if (c == 0) continue;
      if (2 * c < W) {
        int64_t lo = INT64_MAX, hi = -1;
        for (int64_t w = 0; w < W; ++w) {
          for (uint64_t x = row[w]; x; x &= x - 1) {
            const int64_t rk = rank[(w * 64 + __builtin_ctzll(x)) * D + d];
            lo = std::min(lo, rk);
            hi = std::max(hi, rk);
          }
        }
        lo_out[i] = lo;
        hi_out[i] = hi;
        continue;
      }
      const int64_t base = bop[d], K = nbp[d];
      auto first_bucket = [&](bool within) {  // first k whose prefix row meets the node (or holds all of it)
        int64_t a = 0, z = K - 1;
        while (a < z) {
          const int64_t mid = (a + z) / 2;
          const uint64_t* tr = t + (base + mid) * W;
          bool ok = within;  // "meets": no word in common yet; "holds": no point outside yet
          for (int64_t w = 0; w < W; ++w) {
            const uint64_t x = row[w] & tr[w];
            if (!within && x) { ok = true; break; }
            if (within && x != row[w]) { ok = false; break; }
          }
          if (ok) z = mid;
          else a = mid + 1;
        }
        return base + a;
      };
      const int64_t rl = first_bucket(false), rh = first_bucket(true);
      int64_t lo = bfp[rl], hi = blp[rh];
      if (blp[rl] > bfp[rl])
        for (int64_t k = rsp[rl]; k < rep[rl]; ++k)
          if (in_node(row, pp[k])) { lo = rank[static_cast<int64_t>(pp[k]) * D + d]; break; }
      if (blp[rh] > bfp[rh])
        for (int64_t k = rep[rh] - 1; k >= rsp[rh]; --k)
          if (in_node(row, pp[k])) { hi = rank[static_cast<int64_t>(pp[k]) * D + d]; break; }
      lo_out[i] = lo;
      hi_out[i] = hi;
    }
  });
  return {rlo, rhi};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchtree, m) {
  m.def("bitset_counts(Tensor B, Tensor masks) -> Tensor");
  m.def("extent_ranks(Tensor B, Tensor f, Tensor table, Tensor boff, Tensor n_buckets, Tensor bucket_first, "
        "Tensor bucket_last, Tensor run_start, Tensor run_end, Tensor pts, Tensor rank_flat, int D) -> Tensor[]");
  m.def("split_bits(Tensor B, Tensor src, Tensor table, Tensor whole, Tensor start, Tensor end, Tensor pts, "
        "Tensor right) -> Tensor");
}

TORCH_LIBRARY_IMPL(torchtree, CPU, m) {
  m.impl("bitset_counts", bitset_counts);
  m.impl("extent_ranks", extent_ranks);
  m.impl("split_bits", split_bits);
}
