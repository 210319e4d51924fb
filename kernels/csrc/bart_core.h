// The decisions of a BART tree update, shared by the CPU kernel (bart_update.cpp) and the CUDA one
// (bart_cuda.cu, through bart_block.h): the move and its node and rule drawn from the uniforms (propose),
// and, given the partial residual's sums per (leaf, side of the proposed rule), the Metropolis-Hastings
// decision with the leaf values integrated out, the new tree, where each (leaf, side) cell goes and the
// leaves' Gibbs draws (decide). Plain C++ over raw pointers: no torch, no allocation, host and device.
// torchtree.steps.bart_moves.tree_update is the reference and documents the model; the CPU kernel equals it
// bit for bit (tests/test_native.py), which holds these functions to it.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define TT_HD __host__ __device__
#else
#define TT_HD
#endif

namespace torchtree_bart {

constexpr int64_t LEAF = -1;
constexpr int64_t ABSENT = -2;
constexpr int GROW = 0, PRUNE = 1, CHANGE = 2;

// std::min / std::max's comparisons (the same operand returned on ties), on host and device
template <class T> TT_HD inline T lesser(T a, T b) { return b < a ? b : a; }
template <class T> TT_HD inline T greater(T a, T b) { return a < b ? b : a; }

// floor(u * count)-th index i < n with mask(i) (the reference's pick_nth): n - 1 when there is none
template <class Mask> TT_HD int64_t pick_nth(const Mask& mask, int64_t n, double u) {
  int64_t cnt = 0;
  for (int64_t i = 0; i < n; ++i) cnt += mask(i) ? 1 : 0;
  int64_t nth = static_cast<int64_t>(floor(u * static_cast<double>(cnt)));
  nth = lesser<int64_t>(nth, greater<int64_t>(cnt - 1, 0));
  int64_t before = 0, seen = 0;
  for (int64_t i = 0; i < n; ++i) {
    seen += mask(i) ? 1 : 0;
    if (seen <= nth) ++before;
  }
  return lesser<int64_t>(before, n - 1);
}

TT_HD inline double log_marginal(double n, double s, double s2, double tau2) {
  double v = s2 + n * tau2;
  return -0.5 * log(v / s2) + 0.5 * tau2 * s * s / (s2 * v);
}

TT_HD inline int64_t heap_depth(int64_t j) {
  int64_t d = 0;
  while ((j + 1) >> (d + 1)) ++d;
  return d;
}

// The split columns' availability without ancestors, built once per sweep from n_cuts [D] and, for a coded
// table, groups [D] (each split column's input column): a node's ancestors narrow the cut ranges of at most
// max_depth columns, so which columns are left to it, and the prior's draw among them, follow from these
// prefix counts and those few columns in O(max_depth log D) instead of passes over all D columns.
struct FeatureTables {
  int64_t D;
  const int64_t *n_cuts, *groups;  // groups: null for a plain table
  const int64_t* pre;              // [D + 1]: columns with a cut among the first d
  // coded tables: per input column g, its columns with a cut (gcount), the input columns with one among the
  // first g (gpre [D + 1]), and those columns in index order at order[gstart[g] ..]
  const int64_t *gcount, *gpre, *gstart, *order;
};

// int64 slots feature_tables needs
TT_HD inline int64_t feature_tables_size(int64_t D) { return 6 * D + 3; }

// the tables of n_cuts and groups (or null), written into buf (feature_tables_size(D) slots)
TT_HD inline FeatureTables feature_tables(int64_t D, const int64_t* n_cuts, const int64_t* groups, int64_t* buf) {
  FeatureTables t{D, n_cuts, groups, buf, nullptr, nullptr, nullptr, nullptr};
  int64_t* pre = buf;
  pre[0] = 0;
  for (int64_t d = 0; d < D; ++d) pre[d + 1] = pre[d] + (n_cuts[d] > 0 ? 1 : 0);
  if (!groups) return t;
  int64_t *gcount = buf + D + 1, *gpre = gcount + D, *gstart = gpre + D + 1, *order = gstart + D + 1,
          *fill = order + D;
  for (int64_t g = 0; g < D; ++g) gcount[g] = 0;
  for (int64_t d = 0; d < D; ++d) gcount[groups[d]] += n_cuts[d] > 0 ? 1 : 0;
  gpre[0] = 0, gstart[0] = 0;
  for (int64_t g = 0; g < D; ++g) {
    gpre[g + 1] = gpre[g] + (gcount[g] > 0 ? 1 : 0);
    gstart[g + 1] = gstart[g] + gcount[g];
    fill[g] = gstart[g];
  }
  for (int64_t d = 0; d < D; ++d)
    if (n_cuts[d] > 0) order[fill[groups[d]]++] = d;
  t.gcount = gcount, t.gpre = gpre, t.gstart = gstart, t.order = order;
  return t;
}

// the most ancestors a node has (max_depth <= 14)
constexpr int MAX_ANCESTORS = 16;

// a node's columns left without a cut by its ancestors (columns that have cuts): at most MAX_ANCESTORS
struct Exhausted {
  int n = 0;
  int64_t col[MAX_ANCESTORS];
  // how many lie at or below column d (in input column g only, when g >= 0)
  TT_HD int64_t upto(int64_t d, const int64_t* groups = nullptr, int64_t g = -1) const {
    int64_t c = 0;
    for (int i = 0; i < n; ++i) c += col[i] <= d && (g < 0 || groups[col[i]] == g) ? 1 : 0;
    return c;
  }
};

// smallest i in [0, n) with count(i) >= target, count non-decreasing (n - 1 if none)
template <class Count> TT_HD int64_t first_reaching(const Count& count, int64_t n, int64_t target) {
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (count(mid) >= target) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// pick_nth over the columns with a cut left (the prior's uniform column): D - 1 when there is none
TT_HD inline int64_t choose_column(const FeatureTables& t, const Exhausted& ex, double u) {
  const int64_t cnt = t.pre[t.D] - ex.n;
  if (cnt == 0) return t.D - 1;
  int64_t nth = static_cast<int64_t>(floor(u * static_cast<double>(cnt)));
  nth = lesser<int64_t>(nth, greater<int64_t>(cnt - 1, 0));
  return first_reaching([&](int64_t i) { return t.pre[i + 1] - ex.upto(i); }, t.D, nth + 1);
}

// choose_column of torchtree.model.feature_groups over the columns with a cut left: uniform input column,
// then uniform split column within it (0 when there is none)
TT_HD inline int64_t choose_grouped(const FeatureTables& t, const Exhausted& ex, double u) {
  // the input columns the exhausted columns leave without any
  Exhausted zero;
  for (int i = 0; i < ex.n; ++i) {
    const int64_t g = t.groups[ex.col[i]];
    bool seen = false;
    for (int z = 0; z < zero.n; ++z) seen = seen || zero.col[z] == g;
    if (!seen && t.gcount[g] - ex.upto(t.D, t.groups, g) == 0) zero.col[zero.n++] = g;
  }
  const int64_t n_groups = t.gpre[t.D] - zero.n;
  if (n_groups == 0) return 0;
  double s = u * static_cast<double>(n_groups);
  int64_t k = lesser<int64_t>(static_cast<int64_t>(floor(s)), greater<int64_t>(n_groups - 1, 0));
  const int64_t g = first_reaching([&](int64_t i) { return t.gpre[i + 1] - zero.upto(i); }, t.D, k + 1);
  double frac = lesser(greater(s - static_cast<double>(k), 0.0), 1.0 - 1e-12);
  const int64_t c = t.gcount[g] - ex.upto(t.D, t.groups, g);
  int64_t k2 = lesser<int64_t>(static_cast<int64_t>(floor(frac * static_cast<double>(c))), greater<int64_t>(c - 1, 0));
  const int64_t* cols = t.order + t.gstart[g];
  const int64_t q = first_reaching([&](int64_t i) { return i + 1 - ex.upto(cols[i], t.groups, g); }, t.gcount[g], k2 + 1);
  return cols[q];
}

// A tree update's proposal: the move, its node j (children cl, cr), the proposed rule (f_new, k_new) and
// the node's old one, the tree's leaves and prunable nodes, the features with a cut left to j (nav)
struct Proposal {
  int move;
  int64_t n_leaf, n_nog, j, depth, nav, f_new, k_new, cl, cr, f_old, k_old;
  int64_t lo_new, hi_new, lo_old, hi_old;  // the cut ranges left to j of f_new and f_old
  bool valid;
};

// The proposal of one tree [K slots; those from Ku on hold no node this update] from its uniforms u[0..5):
// the move by u[0], the node by u[1], the feature by u[2] (uniform among those with a cut left to j, or input
// column then split column for a coded table), the cut by u[3]. t: feature_tables of the sweep.
template <class feat_t>
TT_HD void propose(Proposal& p, const feat_t* feat, const feat_t* cut, int64_t K, int64_t Ku, const FeatureTables& t,
                   const double* u, double pg, double pp, int64_t max_depth) {
  const int64_t kint = (Ku - 1) / 2;
  p.move = u[0] < pg ? GROW : (u[0] < pg + pp ? PRUNE : CHANGE);
  auto is_leaf = [&](int64_t k) { return feat[k] == LEAF; };
  auto nog = [&](int64_t i) { return feat[i] >= 0 && feat[2 * i + 1] == LEAF && feat[2 * i + 2] == LEAF; };
  p.n_leaf = 0, p.n_nog = 0;
  for (int64_t k = 0; k < Ku; ++k) p.n_leaf += is_leaf(k) ? 1 : 0;
  for (int64_t i = 0; i < kint; ++i) p.n_nog += nog(i) ? 1 : 0;
  // with no node to prune or change the move is refused; j is then the reference's pick over all K
  // slots, (K - 1) / 2 - 1, whose ancestors decide the proposed rule (and so how the sums are split)
  p.j = p.move == GROW ? pick_nth(is_leaf, Ku, u[1]) : (p.n_nog ? pick_nth(nog, kint, u[1]) : (K - 1) / 2 - 1);
  const int64_t j = p.j;
  p.depth = heap_depth(j);
  // cut ranges left to j by its ancestors, for their columns (the others keep [0, n_cuts))
  int na = 0;
  int64_t col[MAX_ANCESTORS], lo[MAX_ANCESTORS], hi[MAX_ANCESTORS];
  for (int64_t l = 0; l < p.depth; ++l) {
    int64_t shift = p.depth - l;
    int64_t anc = ((j + 1) >> shift) - 1;
    int64_t below = ((j + 1) >> (shift - 1)) - 1;
    int64_t f = greater<int64_t>(feat[anc], 0), k = static_cast<int64_t>(cut[anc]);
    int i = 0;
    while (i < na && col[i] != f) ++i;
    if (i == na) col[na] = f, lo[na] = 0, hi[na] = t.n_cuts[f], ++na;
    if (below % 2 == 1) hi[i] = lesser(hi[i], k);
    else lo[i] = greater(lo[i], k + 1);
  }
  Exhausted ex;
  for (int i = 0; i < na; ++i)
    if (t.n_cuts[col[i]] > 0 && hi[i] - lo[i] <= 0) ex.col[ex.n++] = col[i];
  auto range = [&](int64_t f, int64_t& lo_f, int64_t& hi_f) {
    lo_f = 0, hi_f = t.n_cuts[f];
    for (int i = 0; i < na; ++i)
      if (col[i] == f) lo_f = lo[i], hi_f = hi[i];
  };
  p.nav = t.pre[t.D] - ex.n;
  p.f_new = t.groups ? choose_grouped(t, ex, u[2]) : choose_column(t, ex, u[2]);
  range(p.f_new, p.lo_new, p.hi_new);
  int64_t av_f = greater<int64_t>(p.hi_new - p.lo_new, 0);
  p.k_new = p.lo_new + static_cast<int64_t>(floor(u[3] * static_cast<double>(av_f)));
  bool grow_ok = p.move == GROW && p.nav > 0 && p.depth < max_depth;
  p.valid = grow_ok || (p.move != GROW && p.n_nog > 0);
  p.cl = lesser(2 * j + 1, K - 1), p.cr = lesser(2 * j + 2, K - 1);
  p.f_old = greater<int64_t>(feat[j], 0), p.k_old = static_cast<int64_t>(cut[j]);
  range(p.f_old, p.lo_old, p.hi_old);
}

// The decision on proposal p, given the partial residual's sums s_cell and counts n_cell per (leaf, side)
// cell [2 Ku] (cell 2 k + 1: leaf k's points left of the proposed rule; ignored, as zeros, without
// use_lik): accepts or refuses by u[4], writes the new tree (feat, cut, value [Ku]), leaves old_value [Ku]
// holding the values before and to [2 Ku] the leaf each cell's points go to, and draws every leaf's value
// from N(tau2 s / (s2 + n tau2), tau2 s2 / (s2 + n tau2)) with z(k) (rounded to scalar_t first). s_leaf,
// n_leaf: [Ku] scratch. Returns whether the move was accepted.
template <class scalar_t, class count_t, class feat_t, class idx_t, class Normals>
TT_HD bool decide(const Proposal& p, feat_t* feat, feat_t* cut, scalar_t* value, const scalar_t* s_cell,
                  const count_t* n_cell, bool use_lik, int64_t K, int64_t Ku, double s2, double tau2, double pg,
                  double pp, const double* u, const double* ps_lut, const double* log1m_ps, const Normals& z,
                  idx_t* to, scalar_t* old_value, double* s_leaf, double* n_leaf) {
  const int64_t j = p.j, cl = p.cl, cr = p.cr, depth = p.depth;
  for (int64_t k = 0; k < Ku; ++k) old_value[k] = value[k];
  // slots from Ku on hold no point (a refused move's j and children may lie there)
  auto S = [&](int64_t node, int side) {
    return node < Ku && use_lik ? static_cast<double>(s_cell[2 * node + side]) : 0.0;
  };
  auto Nn = [&](int64_t node, int side) {
    return node < Ku && use_lik ? static_cast<double>(n_cell[2 * node + side]) : 0.0;
  };
  double s_all = (S(j, 0) + S(cl, 0) + S(cr, 0)) + (S(j, 1) + S(cl, 1) + S(cr, 1));
  double n_all = (Nn(j, 0) + Nn(cl, 0) + Nn(cr, 0)) + (Nn(j, 1) + Nn(cl, 1) + Nn(cr, 1));
  double s_nl = S(j, 1) + S(cl, 1) + S(cr, 1), n_nl = Nn(j, 1) + Nn(cl, 1) + Nn(cr, 1);
  double ll_joined = log_marginal(n_all, s_all, s2, tau2);
  double ll_new = log_marginal(n_nl, s_nl, s2, tau2) + log_marginal(n_all - n_nl, s_all - s_nl, s2, tau2);
  double ll_old = log_marginal(Nn(cl, 0) + Nn(cl, 1), S(cl, 0) + S(cl, 1), s2, tau2) +
                  log_marginal(Nn(cr, 0) + Nn(cr, 1), S(cr, 0) + S(cr, 1), s2, tau2);

  double ps = ps_lut[depth];
  auto kids = [&](int64_t lo_f, int64_t hi_f, int64_t k) {
    bool left_avail = (p.nav - 1 + (k > lo_f ? 1 : 0)) > 0;
    bool right_avail = (p.nav - 1 + (hi_f > k + 1 ? 1 : 0)) > 0;
    double lc = log1m_ps[depth + 1];
    return (left_avail ? lc : 0.0) + (right_avail ? lc : 0.0);
  };
  double kids_new = kids(p.lo_new, p.hi_new, p.k_new), kids_old = kids(p.lo_old, p.hi_old, p.k_old);
  int64_t sib = lesser<int64_t>(greater<int64_t>(j % 2 == 1 ? j + 1 : j - 1, 0), K - 1);
  bool parent_was_nog = j > 0 && feat[sib] == LEAF;
  int64_t nog_after = p.n_nog + 1 - (parent_was_nog ? 1 : 0);
  double log_pg = log(pg), log_pp = log(pp);
  double log_split = log(ps) - log1p(-ps);
  double a_grow = log_split + kids_new + ll_new - ll_joined + log_pp - log(static_cast<double>(nog_after)) - log_pg +
                  log(static_cast<double>(p.n_leaf));
  double a_prune = -log_split - kids_old + ll_joined - ll_old + log_pg -
                   log(static_cast<double>(greater<int64_t>(p.n_leaf - 1, 1))) - log_pp +
                   log(static_cast<double>(greater<int64_t>(p.n_nog, 1)));
  double a_change = kids_new - kids_old + ll_new - ll_old;
  const int move = p.move;
  double log_a = move == GROW ? a_grow : (move == PRUNE ? a_prune : a_change);
  bool accept = p.valid && log(u[4]) < log_a;

  // the tree: node j's rule and its children's status (the reference's write order)
  bool acc_g = accept && move == GROW, acc_p = accept && move == PRUNE, acc_split = accept && move != PRUNE;
  int64_t fj = acc_p ? LEAF : (acc_split ? p.f_new : static_cast<int64_t>(feat[j]));
  int64_t kj = acc_split ? p.k_new : p.k_old;
  int64_t child = acc_g ? LEAF : (acc_p ? ABSENT : static_cast<int64_t>(feat[cl]));
  int64_t child_r = acc_g ? LEAF : (acc_p ? ABSENT : static_cast<int64_t>(feat[cr]));
  feat[cl] = static_cast<feat_t>(child);
  feat[cr] = static_cast<feat_t>(child_r);
  feat[j] = static_cast<feat_t>(fj);
  cut[j] = static_cast<feat_t>(kj);

  // where each (leaf, side) cell goes: cells of j, cl, cr by the move, the others stay
  for (int64_t k = 0; k < Ku; ++k) to[2 * k] = to[2 * k + 1] = static_cast<idx_t>(k);
  const int64_t pos[6] = {2 * j, 2 * j + 1, 2 * cl, 2 * cl + 1, 2 * cr, 2 * cr + 1};
  const int64_t kept[6] = {j, j, cl, cl, cr, cr}, grown[6] = {cr, cl, cl, cl, cr, cr},
                pruned[6] = {j, j, j, j, j, j}, changed[6] = {j, j, cr, cl, cr, cl};
  const int64_t* dst = !accept ? kept : (move == GROW ? grown : (move == PRUNE ? pruned : changed));
  for (int i = 0; i < 6; ++i)
    if (pos[i] < 2 * Ku) to[pos[i]] = static_cast<idx_t>(dst[i]);  // cells past Ku are empty
  for (int64_t k = 0; k < Ku; ++k) s_leaf[k] = 0.0, n_leaf[k] = 0.0;
  for (int64_t cell = 0; cell < 2 * Ku; ++cell) {
    s_leaf[to[cell]] += use_lik ? static_cast<double>(s_cell[cell]) : 0.0;
    n_leaf[to[cell]] += use_lik ? static_cast<double>(n_cell[cell]) : 0.0;
  }
  for (int64_t k = 0; k < Ku; ++k) {  // slots from Ku on are no leaf and keep their value 0
    if (feat[k] != LEAF) {
      value[k] = scalar_t(0);
      continue;
    }
    double v = s2 + n_leaf[k] * tau2;
    double mean = tau2 * s_leaf[k] / v;
    double sd = sqrt(tau2 * s2 / v);
    value[k] = static_cast<scalar_t>(mean + sd * static_cast<double>(static_cast<scalar_t>(z(k))));
  }
  return accept;
}

}  // namespace torchtree_bart
