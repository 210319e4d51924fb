"""Asynchronous batched NUTS (torchtree.steps.nuts_async): moments of a Gaussian, the
same transition distribution as the lockstep nuts_step (two-sample tests), draw-for-draw
agreement with a direct per-chain transcription of nuts_step, per-chain pacing and tick
count, live-chain compaction, edge cases, and the wiring through chains.draw, NUTS and
DCC."""
import math

import pytest
import torch
from scipy import stats as sps

from torchtree.monitor import Monitor
from torchtree.soft import NUTS
from torchtree.samplers.nuts.chains import ChainState, draw, make_kernel
from torchtree.steps.hmc import HMCState, hmc_init, leapfrog
from torchtree.steps.nuts import nuts_step
from torchtree.steps.nuts_async import nuts_draw_async

ALPHA = 1e-3  # significance level of the two-sample tests


MEAN = torch.tensor([0.0, 1.0, -2.0, 3.0, 0.5], dtype=torch.float64)
SD = torch.tensor([0.1, 1.0, 3.0, 0.5, 10.0], dtype=torch.float64)


def gaussian(x, rows=None):
    z = (x - MEAN) / SD
    return 0.5 * (z * z).sum(-1), z / SD


B_BANANA = 1.0


def banana(x, rows=None):
    """x0 ~ N(0, 1), x1 | x0 ~ N(B (x0^2 - 1), 0.5^2): curved, depth varies a lot."""
    r = (x[:, 1] - B_BANANA * (x[:, 0] ** 2 - 1)) / 0.5
    U = 0.5 * x[:, 0] ** 2 + 0.5 * r * r
    g0 = x[:, 0] - r / 0.5 * 2 * B_BANANA * x[:, 0]
    g1 = r / 0.5
    return U, torch.stack([g0, g1], 1)


def banana_draws(n, g):
    x0 = torch.randn(n, generator=g, dtype=torch.float64)
    x1 = B_BANANA * (x0**2 - 1) + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)
    return torch.stack([x0, x1], 1)


@pytest.mark.slow
def test_gaussian_moments_from_a_bad_start():
    # 64 chains started 5 sd away, different step sizes per chain, no adaptation:
    # after burn-in, means and variances match within 5 between-chain standard errors.
    B, T, burn = 64, 300, 50
    g = torch.Generator().manual_seed(0)
    init = (MEAN + 5 * SD).expand(B, 5).clone()
    eps = 0.3 + 0.6 * torch.rand(B, generator=g, dtype=torch.float64)
    inv_mass = (SD * SD).expand(B, 5).clone()
    state, out = nuts_draw_async(hmc_init(init, gaussian), gaussian, eps, inv_mass, T, generator=g,
                                 max_tree_depth=8, compact=0.0)
    x = out.positions[burn:]  # [T - burn, B, 5]
    assert out.positions.shape == (T, B, 5) and torch.isfinite(x).all()
    cm, cv = x.mean(0), x.var(0)  # per-chain means and variances
    se_m, se_v = cm.std(0) / math.sqrt(B), cv.std(0) / math.sqrt(B)
    assert ((cm.mean(0) - MEAN).abs() < 5 * se_m).all(), (cm.mean(0), MEAN, se_m)
    # per-chain sample variances are biased by the autocorrelation (O(1/T)): +2%
    assert ((cv.mean(0) - SD**2).abs() < 5 * se_v + 0.02 * SD**2).all(), (cv.mean(0), SD**2, se_v)
    # the final state is each chain's last draw
    assert torch.equal(state.position, out.positions[-1])
    assert torch.allclose(state.potential, out.potential[-1])
    assert int(out.is_divergent.sum()) == 0
    assert (out.accept_prob > 0).all() and (out.accept_prob <= 1).all()


@pytest.mark.parametrize("max_tree_depth", [3, 10])
def test_same_transition_distribution_as_lockstep(max_tree_depth):
    # Exact draws in, one transition each: per chain, async and lockstep apply the
    # same kernel, so tree depths, step counts, U-turn flags and the positions after
    # the transition have the same distribution (chains are independent, so the
    # tests' p-values are valid). Depth 3 exercises the depth cap.
    n = 3000
    g = torch.Generator().manual_seed(1)
    x = banana_draws(n, g)
    eps = torch.full((n,), 0.15, dtype=torch.float64)
    inv_mass = torch.ones(n, 2, dtype=torch.float64)
    s0 = hmc_init(x, banana)
    ga, gl = torch.Generator().manual_seed(2), torch.Generator().manual_seed(3)
    _, out = nuts_draw_async(s0, banana, eps, inv_mass, 2, generator=ga, max_tree_depth=max_tree_depth)
    lock = []
    s = s0
    for _ in range(2):
        s, info = nuts_step(s, banana, eps, inv_mass, gl, max_tree_depth=max_tree_depth)
        lock.append((s.position, info))
    for t in range(2):
        pos_l, info_l = lock[t]
        # tree depth: chi-square test of homogeneity on the depth histogram
        da, dl = out.tree_depth[t], info_l.tree_depth
        levels = sorted(set(da.tolist()) | set(dl.tolist()))
        table = [[int((da == v).sum()) for v in levels], [int((dl == v).sum()) for v in levels]]
        table = [[a, b] for a, b in zip(*table) if a + b >= 10]
        if len(table) > 1:
            assert sps.chi2_contingency(list(zip(*table)))[1] > ALPHA, table
        assert sps.ks_2samp(out.n_steps[t].numpy(), info_l.n_steps.numpy()).pvalue > ALPHA
        assert sps.ks_2samp(out.accept_prob[t].numpy(), info_l.accept_prob.numpy()).pvalue > ALPHA
        ta, tl = int(out.is_turning[t].sum()), int(info_l.is_turning.sum())
        if 0 < ta + tl < 2 * n:
            assert sps.chi2_contingency([[ta, n - ta], [tl, n - tl]])[1] > ALPHA
        for d in range(2):
            assert sps.ks_2samp(out.positions[t, :, d].numpy(), pos_l[:, d].numpy()).pvalue > ALPHA
        # the jump of each chain: sensitive to the trajectory length and to how the
        # draw is picked along it, which exact-draw marginals cannot see
        prev_a = x if t == 0 else out.positions[t - 1]
        prev_l = x if t == 0 else lock[t - 1][0]
        ja, jl = (out.positions[t] - prev_a).norm(dim=1), (pos_l - prev_l).norm(dim=1)
        assert sps.ks_2samp(ja.numpy(), jl.numpy()).pvalue > ALPHA
        # and both still follow the target: x0 ~ N(0, 1)
        assert sps.kstest(out.positions[t, :, 0].numpy(), "norm").pvalue > ALPHA
    if max_tree_depth == 3:
        assert (out.tree_depth <= 3).all() and (out.n_steps <= 7).all()
        assert (out.tree_depth == 3).float().mean() > 0.2  # the cap was hit


def student(x, rows=None, nu=3.0):
    """Multivariate Student-t: heavy tails, trajectory lengths vary between transitions."""
    r2 = (x * x).sum(-1)
    c = nu + x.shape[1]
    return 0.5 * c * torch.log1p(r2 / nu), (c / (nu + r2)).unsqueeze(1) * x


def _turning(rho, a, b):
    return ((rho * a).sum(-1) <= 0) | ((rho * b).sum(-1) <= 0)


def reference_async(state, pot, eps, inv_mass, T, g, K):
    """Direct transcription of ``nuts_step``'s per-chain logic with per-chain step
    counters and per-level bookkeeping tensors ``[B, K, P]`` updated under masks,
    drawing random numbers in the same order as ``nuts_draw_async`` (compact=0,
    thin=1); a differential reference for its packed, table-driven loop."""
    B, P = state.position.shape
    dt = state.position.dtype

    def w(m, a, b):
        return torch.where(m.reshape(m.shape + (1,) * (a.dim() - 1)), a, b)

    def sel(m, a, b):
        return tuple(w(m, x, y) for x, y in zip(a, b))

    active = inv_mass > 0
    sqrt_m = torch.where(active, inv_mass.clamp(min=1e-300).rsqrt(), torch.zeros_like(inv_mass))

    def momentum():
        z = torch.randn(B, P, generator=g, dtype=dt)
        return z * sqrt_m, 0.5 * (z * z * active.to(dt)).sum(-1)

    p0, k0 = momentum()
    fwd = torch.rand(B, generator=g, dtype=dt) < 0.5
    sample = (state.position, state.potential, state.grad)
    U0, K0 = state.potential, k0
    plus = minus = cur = prop = sample
    p_plus = p_minus = p = rho = p0
    log_w = torch.zeros(B, dtype=dt)
    j = torch.zeros(B, dtype=torch.long)
    n_steps, sum_acc = torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=dt)
    diverged, turning = torch.zeros(B, dtype=torch.bool), torch.zeros(B, dtype=torch.bool)
    skip = ~torch.isfinite(U0 + K0)
    count, live = torch.zeros(B, dtype=torch.long), torch.ones(B, dtype=torch.bool)
    eps_dir = torch.where(fwd, eps, -eps)
    n = torch.zeros(B, dtype=torch.long)
    cum = torch.zeros(B, P, dtype=dt)
    s_log_w = torch.full((B,), -float("inf"), dtype=dt)
    s_valid = torch.ones(B, dtype=torch.bool)
    cum_before, p_first_k, ps_first_k, p_end_k, ps_end_k = (torch.zeros(B, K, P, dtype=dt) for _ in range(5))
    out = {k: [[None] * B for _ in range(T)] for k in ("pos", "steps", "depth", "div", "turn", "acc")}
    skipping = bool(skip.any())
    while bool(live.any()):
        stepping = live & ~skip
        st, p = leapfrog(HMCState(*cur), p, eps_dir, inv_mass, pot)
        cur = tuple(st)
        u = torch.rand(3, B, generator=g, dtype=dt)
        ps = inv_mass * p
        dH = torch.nan_to_num((U0 + K0) - (cur[1] + 0.5 * (p * ps).sum(-1)), nan=-float("inf"))
        n_steps += stepping
        sum_acc += torch.where(stepping, torch.exp(dH.clamp(max=0.0)), torch.zeros_like(dH))
        div = stepping & (dH < -1000.0)
        diverged |= div
        new_lw = torch.logaddexp(s_log_w, dH)
        prop = sel(u[0] < torch.exp(dH - new_lw), cur, prop)
        s_log_w = new_lw
        turn = torch.zeros(B, dtype=torch.bool)
        for k in range(K):  # level 0: the subtree's first point
            start = (n % (1 << k) == 0) if k else (n == 0)
            cum_before[:, k] = w(start, cum, cum_before[:, k])
            p_first_k[:, k] = w(start, p, p_first_k[:, k])
            ps_first_k[:, k] = w(start, ps, ps_first_k[:, k])
        cum = cum + p
        for k in range(1, K):
            end = (n + 1) % (1 << k) == 0
            t = _turning(cum - cum_before[:, k], ps_first_k[:, k], ps)
            if k >= 2:
                rho_left = cum_before[:, k - 1] - cum_before[:, k]
                rho_right = cum - cum_before[:, k - 1]
                t |= _turning(rho_left + p_first_k[:, k - 1], ps_first_k[:, k], ps_first_k[:, k - 1])
                t |= _turning(p_end_k[:, k - 1] + rho_right, ps_end_k[:, k - 1], ps)
            turn |= end & t
        for k in range(1, K):
            end = (n + 1) % (1 << k) == 0
            p_end_k[:, k], ps_end_k[:, k] = w(end, p, p_end_k[:, k]), w(end, ps, ps_end_k[:, k])
        bad = stepping & (div | turn)
        s_valid = s_valid & ~bad
        n = n + stepping
        sub_end = stepping & (bad | (n == (1 << j)))
        slow = skipping or bool(sub_end.any())
        # merge (nuts_step)
        ok = sub_end & s_valid
        take = ok & (u[1] < torch.exp(s_log_w - log_w))
        sample = sel(take, prop, sample)
        far, adj = w(fwd, p_minus, p_plus), w(fwd, p_plus, p_minus)
        rho_new = rho + cum
        mturn = _turning(rho_new, inv_mass * far, ps)
        mturn |= _turning(rho + p_first_k[:, 0], inv_mass * far, ps_first_k[:, 0])
        mturn |= _turning(adj + cum, inv_mass * adj, ps)
        ext_p, ext_m = ok & fwd, ok & ~fwd
        plus, p_plus = sel(ext_p, cur, plus), w(ext_p, p, p_plus)
        minus, p_minus = sel(ext_m, cur, minus), w(ext_m, p, p_minus)
        rho = w(ok, rho_new, rho)
        log_w = torch.where(ok, torch.logaddexp(log_w, s_log_w), log_w)
        turning |= (ok & mturn) | (sub_end & ~s_valid & ~diverged)
        j = j + sub_end
        done = sub_end & (~s_valid | mturn | (j >= K))
        emit = done | (skip & live)
        for b in emit.nonzero().flatten().tolist():
            c = int(count[b])
            out["pos"][c][b] = sample[0][b].clone()
            out["steps"][c][b], out["depth"][c][b] = int(n_steps[b]), int(j[b])
            out["div"][c][b], out["turn"][c][b] = bool(diverged[b]), bool(turning[b])
            out["acc"][c][b] = float(sum_acc[b] / max(int(n_steps[b]), 1))
        count = count + emit
        live = count < T
        if not slow:
            continue
        new = emit & live
        p0, k0 = momentum()
        U0, K0 = torch.where(new, sample[1], U0), torch.where(new, k0, K0)
        plus, minus = sel(new, sample, plus), sel(new, sample, minus)
        p_plus, p_minus, rho = w(new, p0, p_plus), w(new, p0, p_minus), w(new, p0, rho)
        log_w, j = log_w.masked_fill(new, 0.0), j.masked_fill(new, 0)
        n_steps, sum_acc = n_steps.masked_fill(new, 0), sum_acc.masked_fill(new, 0.0)
        diverged, turning = diverged & ~new, turning & ~new
        ns = (sub_end & ~done) | new
        fwd = torch.where(ns, u[2] < 0.5, fwd)
        cur = sel(ns, sel(fwd, plus, minus), cur)
        p = w(ns, w(fwd, p_plus, p_minus), p)
        eps_dir = torch.where(ns, torch.where(fwd, eps, -eps), eps_dir)
        eps_dir = torch.where(live, eps_dir, torch.zeros_like(eps_dir))
        n, cum = n.masked_fill(ns, 0), w(ns, torch.zeros_like(cum), cum)
        s_log_w, s_valid = s_log_w.masked_fill(ns, -float("inf")), s_valid | ns
        n = n.masked_fill(emit & ~live, 0)
        skipping = skipping and bool((skip & live).any())
    return out


@pytest.mark.parametrize("case", ["student", "gauss_cap"])
def test_matches_a_direct_transcription_draw_for_draw(case):
    # Same random numbers, same decisions: every trajectory length, depth, U-turn
    # and divergence flag and every draw agree with the reference, which keeps
    # nuts_step's per-level running sums instead of the packed state, transition
    # tables and step history. Student-t at this step size also exercises the
    # straddling checks (they change ~0.2% of its trajectories).
    g = torch.Generator().manual_seed(11)
    if case == "student":
        B, P, T, K, pot = 1500, 2, 3, 10, student
        x = torch.randn(B, P, generator=g, dtype=torch.float64) * 2
        eps = 0.1 + 0.1 * torch.rand(B, generator=g, dtype=torch.float64)
        inv_mass = torch.ones(B, P, dtype=torch.float64)
    else:
        B, P, T, K, pot = 200, 5, 4, 3, gaussian
        x = MEAN + SD * torch.randn(B, P, generator=g, dtype=torch.float64)
        x[7] = float("inf")  # a chain that never moves
        eps = torch.exp(torch.randn(B, generator=g, dtype=torch.float64))
        eps[:5] = 30.0  # divergent
        inv_mass = (SD * SD).expand(B, P).clone()
        inv_mass[3:9, 2] = 0.0  # a frozen coordinate
    s0 = hmc_init(x, pot)
    _, out = nuts_draw_async(s0, pot, eps, inv_mass, T, generator=torch.Generator().manual_seed(12),
                             max_tree_depth=K, compact=0.0)
    ref = reference_async(s0, pot, eps, inv_mass, T, torch.Generator().manual_seed(12), K)
    assert out.n_steps.tolist() == ref["steps"]
    assert out.tree_depth.tolist() == ref["depth"]
    assert out.is_turning.tolist() == ref["turn"] and out.is_divergent.tolist() == ref["div"]
    pos_ref = torch.stack([torch.stack(r) for r in ref["pos"]])
    assert torch.allclose(out.positions, pos_ref, atol=1e-10, rtol=0, equal_nan=True)
    assert torch.allclose(out.accept_prob, torch.tensor(ref["acc"], dtype=torch.float64), atol=1e-12)
    if case == "gauss_cap":
        assert out.is_divergent[:, :5].all() and (out.n_steps[:, 7] == 0).all()
        assert (out.tree_depth == K).any() and (out.positions[:, 3:7, 2] == x[3:7, 2]).all()


def test_each_chain_paces_itself_and_ticks_beat_lockstep():
    # Two groups of chains with a 10x different step size on a Student-t (whose
    # trajectory lengths vary with the radius): every chain makes exactly T
    # transitions, the tick count is the longest chain's total number of leapfrog
    # steps, and that is below the lockstep cost of the same draws.
    B, T = 8, 40
    g = torch.Generator().manual_seed(4)
    init = torch.randn(B, 5, generator=g, dtype=torch.float64)
    eps = torch.tensor([0.05] * 4 + [0.5] * 4, dtype=torch.float64)
    inv_mass = torch.ones(B, 5, dtype=torch.float64)
    _, out = nuts_draw_async(hmc_init(init, student), student, eps, inv_mass, T, generator=g, max_tree_depth=10)
    assert out.n_steps.shape == (T, B)
    assert (out.n_steps >= 1).all() and (out.tree_depth >= 1).all()  # every slot written
    assert (out.n_steps == 2 ** out.tree_depth - 1).logical_or(out.is_turning).all()
    per_chain = out.n_steps.sum(0)
    assert out.n_ticks == int(per_chain.max())
    slow, fast = per_chain[:4].float().mean(), per_chain[4:].float().mean()
    assert slow > 4 * fast  # the small step size really makes longer trajectories
    # lockstep waits for the deepest chain of every transition (a lower bound of its
    # cost, which pays whole doublings)
    assert out.n_ticks < int(out.n_steps.max(1).values.sum())
    assert out.n_rows <= out.n_ticks * B


def test_compaction_gives_identical_chains():
    # Finished chains either integrate in place with the batch (compact=0) or are
    # left out of the potential calls (compact=1); same random numbers, same draws.
    scales = torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=torch.float64).repeat(3)
    calls = []

    def pot(x, rows=None):
        s = scales if rows is None else scales[rows]
        calls.append(x.shape[0])
        z = x / s.unsqueeze(-1)
        return 0.5 * (z * z).sum(-1), z / s.unsqueeze(-1)

    outs = []
    for compact in (0.0, 1.0):
        g = torch.Generator().manual_seed(5)
        init = torch.randn(12, 3, generator=g, dtype=torch.float64)
        eps = 0.05 + 0.5 * torch.rand(12, generator=g, dtype=torch.float64)
        calls.clear()
        st, out = nuts_draw_async(hmc_init(init, pot), pot, eps, torch.ones(12, 3, dtype=torch.float64), 25,
                                  generator=g, max_tree_depth=7, compact=compact)
        outs.append((st, out, list(calls)))
    (s0, o0, c0), (s1, o1, c1) = outs
    assert torch.allclose(o0.positions, o1.positions, atol=1e-12, rtol=0)
    assert torch.equal(o0.n_steps, o1.n_steps) and torch.equal(o0.tree_depth, o1.tree_depth)
    assert torch.allclose(s0.position, s1.position, atol=1e-12, rtol=0)
    assert o0.n_ticks == o1.n_ticks
    assert o0.n_rows == o0.n_ticks * 12 and o1.n_rows < o0.n_rows
    assert min(c1) < 12 and min(c0) == 12  # compaction really left finished chains out


def test_divergence_depth_cap_and_non_finite_start():
    g = torch.Generator().manual_seed(6)
    init = MEAN.expand(9, 5).clone() + 0.1
    init[8] = float("nan")  # potential NaN -> +inf: no step, unchanged state
    eps = torch.tensor([50.0] * 4 + [1e-4] * 4 + [0.5], dtype=torch.float64)
    st, out = nuts_draw_async(hmc_init(init, gaussian), gaussian, eps, torch.ones(9, 5, dtype=torch.float64), 3,
                              generator=g, max_tree_depth=4)
    assert out.is_divergent[:, :4].all() and not out.is_divergent[:, 4:].any()
    assert (out.tree_depth[:, 4:8] == 4).all() and (out.n_steps[:, 4:8] == 15).all()  # cap: 2^4 - 1 steps
    assert (out.accept_prob[:, :4] < 0.1).all()
    assert (out.n_steps[:, 8] == 0).all() and (out.tree_depth[:, 8] == 0).all()
    assert torch.isnan(out.positions[:, 8]).all() and torch.isnan(st.position[8]).all()
    assert torch.isfinite(out.positions[:, :8]).all()


def test_depth_one_and_thinning():
    g = torch.Generator().manual_seed(7)
    init = MEAN + SD * torch.randn(6, 5, generator=g, dtype=torch.float64)
    inv_mass = (SD * SD).expand(6, 5).clone()
    eps = torch.full((6,), 0.5, dtype=torch.float64)
    _, out = nuts_draw_async(hmc_init(init, gaussian), gaussian, eps, inv_mass, 5, generator=g, max_tree_depth=1)
    assert (out.n_steps == 1).all() and (out.tree_depth == 1).all()
    # thin=3 keeps transitions 2, 5, 8 of the 9 run: same chains as thin=1
    runs = []
    for thin in (1, 3):
        gg = torch.Generator().manual_seed(8)
        _, o = nuts_draw_async(hmc_init(init, gaussian), gaussian, eps, inv_mass, 9, generator=gg, thin=thin)
        runs.append(o)
    assert runs[1].positions.shape == (3, 6, 5)
    assert torch.equal(runs[1].positions, runs[0].positions[2::3])
    assert torch.equal(runs[1].n_steps, runs[0].n_steps[2::3])


class _Rec(Monitor):
    # a Monitor: the chain loops check their monitor with as_monitor (an object with only
    # on_step used to be accepted there and nowhere else)
    def __init__(self):
        super().__init__()
        self.steps = []

    def on_step(self, step, d):
        self.steps.append((step, d))


def test_draw_wiring_thinning_and_monitor():
    g = torch.Generator().manual_seed(9)
    B = 6
    init = MEAN + SD * torch.randn(B, 5, generator=g, dtype=torch.float64)
    ch = ChainState(hmc_init(init, gaussian), torch.full((B,), 0.5, dtype=torch.float64), (SD * SD).expand(B, 5))
    k = make_kernel("nuts", max_tree_depth=6)
    mon = _Rec()
    ch2, tr = draw(k, gaussian, ch, 4, generator=g, thin=2, monitor=mon, step_offset=100, asynchronous=True)
    assert tr.positions.shape == (4, B, 5) and tr.n_steps.shape == (4, B) and tr.tree_depth.dtype == torch.long
    assert tr.is_divergent.dtype == torch.bool
    assert [s for s, _ in mon.steps] == list(range(100, 108))  # every iteration, in order
    assert all(d["hmc/phase"] == "sample" and 0 <= d["hmc/accept"] <= 1 for _, d in mon.steps)
    assert torch.equal(ch2.state.position, tr.positions[-1])
    # HMC kernels ignore the option (lockstep)
    _, tr_h = draw(make_kernel("hmc", n_leapfrog=3), gaussian, ch, 3, generator=g, asynchronous=True)
    assert (tr_h.n_steps == 3).all()


def test_nuts_sampler_option():
    g = torch.Generator().manual_seed(10)
    init = MEAN + SD * torch.randn(8, 5, generator=g, dtype=torch.float64)
    res = {}
    for a in (True, False):
        r = NUTS(n_samples=60, n_warmup=60, max_tree_depth=6, asynchronous=a).sample(gaussian, init, seed=3)
        res[a] = r
        assert r.samples.shape == (60, 8, 5)
    assert not torch.equal(res[True].samples, res[False].samples)
    # same warm-up (lockstep), so the same adapted step sizes
    assert torch.equal(res[True].chains.step_size, res[False].chains.step_size)
    for r in res.values():
        x = r.samples
        assert ((x.mean((0, 1)) - MEAN).abs() < 0.5 * SD).all()


@pytest.mark.slow
def test_soft_tree_rows_compaction_and_samplers():
    # The soft-tree potential's ``rows`` path: compaction leaves draws unchanged
    # (float64), and NUTS.run / DCC run end to end with asynchronous sampling.
    from torchtree.datasets.synthetic import wu
    from torchtree.soft import DCC

    Xtr, ytr, Xte, yte = wu(n_per_group=20, seed=0)
    sampler = NUTS(n_chains=8, n_samples=15, n_warmup=30, depth=2, sharpness=0.1, max_tree_depth=6,
                   dtype=torch.float64, asynchronous=True)
    model = sampler.model((Xtr, ytr), generator=torch.Generator().manual_seed(0))
    s0 = hmc_init(model.theta.data, model.potential_and_grad)
    eps = torch.full((8,), 0.02, dtype=torch.float64) * torch.arange(1, 9, dtype=torch.float64)
    inv_mass = model.coord_mask.to(torch.float64)
    outs = [nuts_draw_async(s0, model.potential_and_grad, eps, inv_mass, 6, generator=torch.Generator().manual_seed(1),
                            max_tree_depth=6, compact=c)[1] for c in (0.0, 1.0)]
    assert torch.allclose(outs[0].positions, outs[1].positions, atol=1e-9, rtol=0)
    assert torch.equal(outs[0].n_steps, outs[1].n_steps) and outs[1].n_rows < outs[0].n_rows
    post = sampler.run((Xtr, ytr), seed=0)
    assert post.info["grad_evals"] > 0 and math.isfinite(float(torch.as_tensor(post.predict(Xte)).mean()))
    dcc = DCC(n_iterations=2, n_initial=10, n_chains=4, n_samples=5, n_warmup=15, n_parallel=2, activation_threshold=2,
              max_depth=2, h_init=0.2, h_final=0.1, max_tree_depth=4, asynchronous=True)
    post = dcc.run((Xtr, ytr), seed=0)
    assert math.isfinite(post.log_evidence) and post.info["grad_evals"] > 0
    # a checkpoint of an asynchronous run does not resume a lockstep one
    kw = dict(n_iterations=2, max_depth=2, h_init=0.2, h_final=0.1)
    # (the fingerprint is the driver's: DCCConfig's result settings, the data and the seed)
    from torchtree.samplers import driver

    fp = [driver.checkpointer(DCC(**kw, asynchronous=a, checkpoint="unused.ckpt"), post.data, {}, 0, None).fingerprint
          for a in (False, True)]
    assert fp[0] != fp[1]
