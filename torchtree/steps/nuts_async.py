"""Asynchronous batched NUTS: every chain runs its own sequence of transitions.

:func:`torchtree.steps.nuts.nuts_step` advances all chains in lockstep, so every
transition costs the *deepest* chain's trajectory while chains that stopped early
wait. Here there is no barrier between transitions. Time is counted in *ticks*; a
tick is one batched leapfrog step (one ``potential_and_grad`` call) for every chain
that still owes draws. Each chain carries its own place in the NUTS recursion
(doubling ``j``, step ``n`` inside the current subtree of ``2**j`` steps); when its
subtree ends the chain merges it into its trajectory, and when its trajectory ends
the chain emits its draw and starts its next transition (fresh momentum, new
trajectory) on the very next tick. ``T`` transitions then cost
``max_b sum_t n_steps[t, b]`` ticks instead of at least ``sum_t max_b n_steps[t, b]``.

Each chain runs exactly the algorithm of ``nuts_step``: multinomial NUTS;
progressive multinomial sampling inside a subtree; biased progressive sampling
between trajectory and subtree (Betancourt 2017, App. A.3.2); the generalised
no-U-turn criterion on every sub-subtree, on the merged trajectory and on the two
"straddling" spans of Stan >= 2.26; the same divergence and depth rules. Only the
order in which random numbers are drawn differs, so the two samplers agree in
distribution, not draw for draw.

Implementation. Chains are small (tens of parameters), so a tick costs mostly the
fixed overhead of each tensor operation, not arithmetic; the loop is written to
keep the number of operations per tick low:

* *Hot* state, which changes on every step (the subtree's current point, momentum
  and momentum sum, its multinomial candidate, subtree log weight, acceptance and
  step counters), is kept in separate tensors. A tick in which no chain's subtree
  ends (most ticks once few chains are left) updates only these.
* *Cold* state (trajectory ends, the transition's draw, trajectory momentum sum and
  log weight, potential and kinetic energy at the transition's start, doubling and
  subtree counters, signed step size) is packed into ``V [B, 10, P]`` and
  ``S [B, 15]``. When some subtree ends, everything that can happen to a chain
  (subtree ended, subtree's candidate taken as the draw, direction of the subtree,
  transition ended, chain owes more transitions, direction of the next subtree) is a
  6-bit *case code*; a table built once (:func:`_transition_tables`) gives, per
  case, the source of every state slot among the old state and the tick's new
  values, so all masked updates are two row gathers.
* Instead of per-level running sums updated under masks, each chain records, for
  every step ``n`` of its current subtree, the momentum sums before and after the
  step and the step's ``M^-1 p`` (a history ``[B, 2**(K-1), 3, P]``). Every span a
  U-turn check of the blocks ending at step ``n`` needs is a difference of two
  recorded sums, so one gather (row indices tabulated by ``n``) feeds all checks.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, NamedTuple, Optional, Tuple

import torch

from torchtree.steps.hmc import HMCState, PotentialAndGrad

__all__ = ["AsyncNUTSDraws", "nuts_draw_async"]


class AsyncNUTSDraws(NamedTuple):
    """Kept transitions of :func:`nuts_draw_async`, ``S = n_transitions // thin``.

    Attributes
    ----------
    positions : Tensor [S, B, P], the draw each chain emitted
    potential : Tensor [S, B]
    accept_prob : Tensor [S, B], mean ``min(1, exp(H0 - H))`` over the trajectory
    is_divergent : BoolTensor [S, B]
    tree_depth : LongTensor [S, B], doublings of the trajectory
    n_steps : LongTensor [S, B], leapfrog steps of the trajectory
    energy : Tensor [S, B], Hamiltonian at the start of the transition
    is_turning : BoolTensor [S, B], stopped by a U-turn
    n_ticks : int, batched leapfrog steps taken (potential-and-gradient calls)
    n_rows : int, rows evaluated over all calls (``n_ticks * B`` without compaction)
    """

    positions: torch.Tensor
    potential: torch.Tensor
    accept_prob: torch.Tensor
    is_divergent: torch.Tensor
    tree_depth: torch.Tensor
    n_steps: torch.Tensor
    energy: torch.Tensor
    is_turning: torch.Tensor
    n_ticks: int
    n_rows: int


# ---- packed cold state and the tick's new values ----------------------------------
# vectors: V [B, 10, P]
_QP, _GP, _PP = 0, 1, 2  # trajectory end forward in time: position, gradient, momentum
_QM, _GM, _PM = 3, 4, 5  # trajectory end backward in time
_QS, _GS = 6, 7  # the transition's draw so far
_RHO, _ZV = 8, 9  # trajectory momentum sum; zeros
_NVC = 10
# new values appended after V for a gather; the first six are also the slots the
# hot vectors (current point, gradient, momentum, subtree sum, candidate) come from
_QN, _GN, _PN, _CUMN, _QXN, _GXN, _RHON, _P0N = range(_NVC, _NVC + 8)
# scalars: S [B, 15]
_UP, _UM, _US = 0, 1, 2  # potentials at _QP, _QM, _QS
_U0, _K0 = 3, 4  # H0 = U0 + K0: potential and kinetic energy at the transition's start
_LW, _J = 5, 6  # trajectory log weight; doublings done
_N, _LEN, _EPS = 7, 8, 9  # steps taken in the subtree, its length 2**j, signed step size
_ZERO, _ONE, _NEGINF, _EPSP, _EPSM = 10, 11, 12, 13, 14  # constants (per chain: +-step size)
_NSC = 15
# new scalars; the first five are also the slots of the hot scalars (potential at
# the current point, subtree log weight, acceptance sum, steps, candidate's potential)
_UN, _SLWN, _SACCN, _NSTN, _UXN, _LWM, _JN, _NN, _LEN2, _K0N = range(_NSC, _NSC + 10)

# case-code bits
_SE, _TK, _FW, _EM, _LV, _FN = (1 << i for i in range(6))


def _transition_tables() -> Tuple[torch.Tensor, torch.Tensor]:
    """Source of every state slot, for each of the 64 case codes.

    Bits of the code (per chain, per tick): ``_SE`` the subtree ended (full length,
    U-turn inside, or divergence); ``_TK`` the trajectory took the subtree's
    candidate as its draw; ``_FW`` the subtree was built forward in time; ``_EM``
    the transition ended (draw emitted); ``_LV`` the chain owes more transitions;
    ``_FN`` direction of the next subtree. Output slots: ``V``'s 10 then the 6 hot
    vectors; ``S``'s 15 then the 5 hot scalars. Assignments follow ``nuts_step`` in
    order and compose (a source is looked up through the sources assigned before).

    Returns
    -------
    (LongTensor [64, 16], LongTensor [64, 20]), indices into
    ``cat([V, new vectors])`` and ``cat([S, new scalars])``.
    """
    # hot outputs: vectors Q, G, PC (momentum), CUM, QX, GX; scalars UC, SLW, SACC, NST, UX
    Q, G, PC, CUM, QX, GX = range(_NVC, _NVC + 6)
    UC, SLW, SACC, NST, UX = range(_NSC, _NSC + 5)
    vt, st = [], []
    for code in range(64):
        se, tk, fw, em, lv, fn = (bool(code & b) for b in (_SE, _TK, _FW, _EM, _LV, _FN))
        # identity: cold slots keep their value, hot slots take the tick's new value
        v, s = list(range(_NVC + 6)), list(range(_NSC + 5))
        s[_N] = _NN
        if se:
            s[_J] = _JN
            if tk:  # biased progressive sampling between trajectory and subtree
                v[_QS], v[_GS], s[_US] = _QXN, _GXN, _UXN
            if not em:  # valid subtree, no U-turn: it extends the trajectory
                q, g, p, u = (_QP, _GP, _PP, _UP) if fw else (_QM, _GM, _PM, _UM)
                v[q], v[g], v[p], s[u] = _QN, _GN, _PN, _UN
                v[_RHO], s[_LW] = _RHON, _LWM
        new = em and lv
        if new:  # next transition: trajectory = the draw, fresh momentum
            for q, g, p, u in ((_QP, _GP, _PP, _UP), (_QM, _GM, _PM, _UM)):
                v[q], v[g], v[p], s[u] = v[_QS], v[_GS], _P0N, s[_US]
            v[_RHO] = _P0N
            s[_U0], s[_K0] = s[_US], _K0N
            s[_LW] = s[_J] = s[SACC] = s[NST] = _ZERO
        if (se and not em) or new:  # next subtree starts at the end it extends
            q, g, p, u = (_QP, _GP, _PP, _UP) if fn else (_QM, _GM, _PM, _UM)
            v[Q], v[G], v[PC], s[UC] = v[q], v[g], v[p], s[u]
            v[CUM] = _ZV
            s[SLW], s[_N] = _NEGINF, _ZERO
            s[_LEN] = _ONE if new else _LEN2
            s[_EPS] = _EPSP if fn else _EPSM
        elif em:  # no transition left: integrate with step 0, i.e. stay put
            s[_EPS], s[_N] = _ZERO, _ZERO
        vt.append(v)
        st.append(s)
    return torch.tensor(vt, dtype=torch.long), torch.tensor(st, dtype=torch.long)


_TABLES = _transition_tables()


@lru_cache(maxsize=None)
def _level_tables(K: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """History rows and masks of the sub-subtree U-turn checks, by subtree step.

    For step ``n < 2**(K-1)`` and level ``k = 1..K-1``, the block of ``2**k`` steps
    ending at ``n`` starts at ``s = n + 1 - 2**k`` and its second half at
    ``m = n + 1 - 2**(k-1)``. With ``cb``/``ca`` the momentum sums before/after a
    step and ``ps`` its ``M^-1 p``, the three spans are

    * the block: ``ca[n] - cb[s]``, checked against ``ps[s]`` and ``ps[n]``;
    * first half plus the second half's first point: ``ca[m] - cb[s]``, against
      ``ps[s]`` and ``ps[m]``;
    * the first half's last point plus the second half: ``ca[n] - cb[m-1]``,
      against ``ps[m-1]`` and ``ps[n]`` (the last two only for ``k >= 2``).

    Returns
    -------
    rows : LongTensor [2**(K-1), K-1, 10], ``step * 3 + field`` (field 0 = cb,
        1 = ca, 2 = ps) of ``ca[n], ca[m], ca[n], cb[s], cb[s], cb[m-1], ps[s],
        ps[m], ps[m-1], ps[n]``, clamped into range where the block does not end
        at ``n`` (those checks are masked)
    mask : BoolTensor [2**(K-1), K-1, 12], the ``3 spans x 4 vectors`` dot products
        that count at step ``n``
    """
    rows, mask = [], []
    for n in range(1 << (K - 1)):
        r, mk = [], []
        for k in range(1, K):
            s, m = max(n + 1 - (1 << k), 0), max(n + 1 - (1 << (k - 1)), 0)
            m1 = max(m - 1, 0)
            r.append([3 * n + 1, 3 * m + 1, 3 * n + 1, 3 * s, 3 * s, 3 * m1,  # ca, ca, ca, cb, cb, cb
                      3 * s + 2, 3 * m + 2, 3 * m1 + 2, 3 * n + 2])  # ps
            blk = (n + 1) % (1 << k) == 0
            strad = blk and k >= 2
            mk.append([blk, False, False, blk, strad, strad, False, False, False, False, strad, strad])
        rows.append(r)
        mask.append(mk)
    return torch.tensor(rows, dtype=torch.long), torch.tensor(mask, dtype=torch.bool)


# merged-trajectory checks: spans (whole trajectory, trajectory + subtree's first
# point, old adjacent end + subtree) x vectors M^-1 p of (far end, adjacent end,
# subtree's last point, subtree's first point), as in nuts_step
_MERGE_MASK = torch.tensor([[1, 0, 1, 0], [1, 0, 0, 1], [0, 1, 1, 0]], dtype=torch.bool)


def nuts_draw_async(
    state: HMCState,
    potential_and_grad: PotentialAndGrad,
    step_size: torch.Tensor,
    inv_mass: torch.Tensor,
    n_transitions: int,
    *,
    generator: Optional[torch.Generator] = None,
    max_tree_depth: int = 10,
    max_energy_error: float = 1000.0,
    compact: float = 0.5,
    thin: int = 1,
    on_transition: Optional[Callable[[int, torch.Tensor], None]] = None,
    stop: Optional[Callable[[], bool]] = None,
) -> Tuple[HMCState, AsyncNUTSDraws]:
    """Run ``n_transitions`` NUTS transitions per chain, each chain at its own pace.

    Parameters
    ----------
    state : HMCState, position [B, P] with its potential [B] and gradient [B, P]
    potential_and_grad : callable [R, P] -> ([R], [R, P])
        Called once per tick. Once fewer than ``compact * B`` chains still owe
        draws it is called as ``potential_and_grad(theta_subset, rows)``
        (``rows``: LongTensor [R] of batch rows, as ``SoftTrees.potential_and_grad``
        accepts); with ``compact=0`` it is always called on the whole batch.
    step_size : Tensor [B]
    inv_mass : Tensor [B, P], diagonal inverse mass (0 freezes a coordinate)
    n_transitions : int, transitions per chain
    generator : torch.Generator, optional
    max_tree_depth : int, at most ``2**max_tree_depth - 1`` leapfrog steps per transition
    max_energy_error : float, divergence threshold on ``H - H0``
    compact : float in [0, 1], see ``potential_and_grad``; 0 = always the whole batch
    thin : int, keep transitions ``thin - 1, 2 thin - 1, ...`` of every chain
    on_transition : callable ``(t, stats)``, optional
        Called with ``t = 0, 1, ...`` once *every* chain has finished its
        transition ``t`` (``t = 0`` comes after the slowest chain's first
        transition, as after the first iteration of a lockstep loop); ``stats`` is
        a Tensor [4] of sums over chains for that transition: acceptance,
        divergences, tree depth, leapfrog steps.
    stop : callable () -> bool, optional
        Asked after every tick; True ends the run there (a time budget). Only the
        transitions *every* chain finished are kept (``S`` = that count // ``thin``),
        and each chain's state is then its last kept draw (gradient recomputed; the
        input state when none was kept).

    Returns
    -------
    (HMCState, AsyncNUTSDraws)
        Each chain's state after its last transition, and the kept transitions.

    Notes
    -----
    Memory: besides the outputs, the step history takes ``B * 2**(max_tree_depth-1)
    * 3 * P`` numbers (``nuts_step`` needs ``O(max_tree_depth * B * P)``), e.g. 20 MB
    for 32 chains of 100 parameters at depth 10 in float32.
    """
    B, P = state.position.shape
    dev, dt = state.position.device, state.position.dtype
    T, thin = int(n_transitions), max(1, int(thin))
    S = T // thin
    K = max(1, int(max_tree_depth))  # subtree depths 0..K-1 use check levels 1..K-1
    NH = 1 << (K - 1)  # longest subtree
    ar = torch.arange(B, device=dev)
    S_t = torch.tensor(S, device=dev)  # the dump slot of the outputs
    vt, st = (t.to(dev) for t in _TABLES)
    vbase = (ar * (_NVC + 8)).unsqueeze(1)
    sbase = (ar * (_NSC + 10)).unsqueeze(1)
    bits = torch.tensor([_SE, _TK, _FW, _EM, _LV, _FN], dtype=torch.long, device=dev)
    lv_rows, lv_mask = (t.to(dev) for t in _level_tables(K))
    lv_top = lv_mask.any(-1).sum(-1)  # [NH]: highest level of a block ending at step n
    hbase = (ar * (3 * NH)).view(B, 1, 1)
    merge_mask = _MERGE_MASK.to(dev)
    inv_mass = inv_mass.to(dt)
    active = inv_mass > 0
    sqrt_mass = torch.where(active, torch.rsqrt(torch.where(active, inv_mass, torch.ones_like(inv_mass))), 0.0)
    activef = active.to(dt)
    im_col = inv_mass.unsqueeze(1)

    # Outputs are written per chain at its own transition index; the extra slot S
    # receives the writes of chains that emitted nothing (a scatter needs no sync).
    out_pos = torch.zeros(B, S + 1, P, dtype=dt, device=dev)
    out_sc = torch.zeros(B, S + 1, 7, dtype=dt, device=dev)  # potential, acc, div, depth, steps, H0, turning
    stat_buf = torch.zeros(T + 1, 4, dtype=dt, device=dev) if on_transition is not None else None

    def result(final: HMCState, n_ticks: int, n_rows: int, kept: int = S):
        o = out_sc[:, :kept].transpose(0, 1)
        return final, AsyncNUTSDraws(
            out_pos[:, :kept].transpose(0, 1), o[..., 0], o[..., 1], o[..., 2] > 0, o[..., 3].long(),
            o[..., 4].long(), o[..., 5], o[..., 6] > 0, n_ticks, n_rows,
        )

    if T <= 0 or B == 0:
        return result(state, 0, 0)

    # ---- initial state: every chain at the start of a transition and its first subtree
    z = torch.randn(B, P, generator=generator, dtype=dt, device=dev)
    p = z * sqrt_mass
    k0 = 0.5 * (z * z * activef).sum(-1)  # p^T M^-1 p / 2 without forming it
    fwd = torch.rand(B, generator=generator, dtype=dt, device=dev) < 0.5
    q, g, U = state.position.to(dt), state.grad.to(dt), state.potential.to(dt)
    eps = step_size.to(dt)
    V = torch.stack([q, g, p, q, g, p, q, g, p, torch.zeros_like(q)], 1)
    zeros, ones, neg_inf = torch.zeros_like(U), torch.ones_like(U), torch.full_like(U, -float("inf"))
    Sc = torch.stack([U, U, U, U, k0, zeros, zeros, zeros, ones, torch.where(fwd, eps, -eps),
                      zeros, ones, neg_inf, eps, -eps], 1)
    # hot state
    cum = torch.zeros_like(q)  # momentum sum of the subtree so far
    qg_x, ux = torch.stack([q, g], 1), U  # the subtree's candidate (position, gradient; potential)
    slw = neg_inf  # log weight of the subtree
    sacc, nst = torch.zeros_like(U), torch.zeros_like(U)  # acceptance sum, steps of the transition
    n_sub = torch.zeros(B, dtype=torch.long, device=dev)  # steps taken in the subtree
    s_valid = torch.ones(B, dtype=torch.bool, device=dev)
    diverged = torch.zeros(B, dtype=torch.bool, device=dev)
    turning = torch.zeros(B, dtype=torch.bool, device=dev)
    hist = torch.zeros(B, NH, 3, P, dtype=dt, device=dev)  # per subtree step: sum before, sum after, M^-1 p
    hist_flat = hist.view(B * NH * 3, P)

    def derived(Sc):
        """Per-subtree constants of the leapfrog and energy (change only on a gather)."""
        e = Sc[:, _EPS : _EPS + 1]
        return 0.5 * e, e * inv_mass, Sc[:, _U0] + Sc[:, _K0], Sc[:, _LEN].long()

    half, eim, H0, len_ = derived(Sc)
    # A non-finite starting energy ends a transition without any step (as in
    # nuts_step). A chain's draw always has a finite potential unless it started
    # at a non-finite one, so this is fixed per chain: it emits its unchanged state
    # once per tick.
    skip = ~torch.isfinite(H0)
    count = torch.zeros(B, dtype=torch.long, device=dev)  # transitions finished
    live = torch.ones(B, dtype=torch.bool, device=dev)  # still owes transitions
    stepping = live & ~skip
    stepf, step_l = stepping.to(dt), stepping.long()  # pre-cast: no type promotion per tick
    skipping = bool(skip.any())  # some live chain emits on every tick
    n_live, n_ticks, n_rows, reported = B, 0, 0, 0

    while n_live > 0:
        # ---- one batched leapfrog step (velocity Verlet, as hmc.leapfrog) ---------
        p_half = p - half * g
        q = q + eim * p_half
        if n_live < compact * B:
            # only chains that still owe draws pay for a gradient; finished chains
            # integrate with step 0, so their cached potential and gradient are exact
            idx = live.nonzero().squeeze(1)
            u_sub, g_sub = potential_and_grad(q.index_select(0, idx), idx)
            U = U.index_copy(0, idx, u_sub.to(dt))
            g = g.index_copy(0, idx, g_sub.to(dt))
            n_rows += int(idx.numel())
        else:
            U, g = potential_and_grad(q)
            n_rows += B
        U = torch.nan_to_num(U, nan=float("inf"))  # non-finite potential: +inf, never accepted
        p = p_half - half * g
        n_ticks += 1
        u = torch.rand(3, B, generator=generator, dtype=dt, device=dev)

        # ---- the new point inside the subtree (as in nuts._build_subtree) ---------
        ps = inv_mass * p
        dH = torch.nan_to_num(H0 - (U + 0.5 * (p * ps).sum(-1)), nan=-float("inf"))
        sacc = sacc + stepf * torch.exp(dH.clamp(max=0.0))
        nst = nst + stepf
        div = stepping & (dH < -max_energy_error)
        slw = torch.logaddexp(slw, dH)
        ti = u[0] < torch.exp(dH - slw)  # progressive multinomial sampling
        qg_x = torch.where(ti.view(B, 1, 1), torch.stack([q, g], 1), qg_x)
        ux = torch.where(ti, U, ux)
        cum_new = cum + p
        hist.index_put_((ar, n_sub), torch.stack([cum, cum_new, ps], 1))
        cum = cum_new
        # sub-subtree checks of the blocks ending at this step, only up to the
        # highest level any chain ends (often none or level 1)
        bad = div
        L = int((lv_top.index_select(0, n_sub) * step_l).max()) if K > 1 else 0
        if L > 0:
            G = hist_flat.index_select(0, (lv_rows[n_sub, :L] + hbase).view(-1)).view(B, L, 10, P)
            spans = G[:, :, 0:3] - G[:, :, 3:6]  # [B, L, 3, P]
            dots = torch.matmul(spans, G[:, :, 6:10].transpose(-1, -2)).view(B, L, 12)
            turn = ((dots <= 0) & lv_mask[n_sub, :L]).view(B, -1).any(1)
            bad = div | (stepping & turn)
        n_sub = n_sub + step_l
        se = stepping & (bad | (n_sub == len_))
        if not skipping and not bool(se.any()):
            continue  # no subtree ended: only the hot state changed

        # ---- subtree ended: merge into the trajectory (as in nuts_step) -----------
        sv_n = s_valid & ~bad
        div_t = diverged | div
        ok = se & sv_n
        lw = Sc[:, _LW]
        take = ok & (u[1] < torch.exp(slw - lw))  # biased progressive sampling
        fwd1 = fwd.unsqueeze(1)
        far = torch.where(fwd1, V[:, _PM], V[:, _PP])  # old end away from the subtree
        adj = torch.where(fwd1, V[:, _PP], V[:, _PM])  # old end touching it
        rho = V[:, _RHO]
        rho_n = rho + cum
        h0 = hist[:, 0]  # the subtree's first point: (0, p, M^-1 p)
        spans = torch.stack([rho_n, rho + h0[:, 1], adj + cum], 1)
        vecs = torch.cat([torch.stack([far, adj], 1) * im_col, torch.stack([ps, h0[:, 2]], 1)], 1)
        mturn = ((torch.bmm(spans, vecs.transpose(1, 2)) <= 0) & merge_mask).view(B, -1).any(1)
        jn = Sc[:, _J] + se.to(dt)
        turn_t = turning | (ok & mturn) | (se & ~sv_n & ~div_t)
        done = se & (~sv_n | mturn | (jn >= K))

        # ---- transition ended: emit the draw, maybe start the next ----------------
        emit = done | (skip & live)
        c_old = count
        count = count + emit
        live = count < T
        new = emit & live
        ns = (se & ~done) | new  # starts a subtree next tick
        fn = u[2] < 0.5
        code = (torch.stack([se, take, fwd, emit, live, fn], 1) * bits).sum(1)
        z = torch.randn(B, P, generator=generator, dtype=dt, device=dev)
        k0 = 0.5 * (z * z * activef).sum(-1)
        new_v = torch.cat([V, torch.stack([q, g, p, cum], 1), qg_x, torch.stack([rho_n, z * sqrt_mass], 1)], 1)
        out_v = new_v.view(-1, P).index_select(0, (vt[code] + vbase).view(-1)).view(B, _NVC + 6, P)
        new_s = torch.cat([Sc, torch.stack([U, slw, sacc, nst, ux, torch.logaddexp(lw, slw), jn,
                                            n_sub.to(dt), 2.0 * Sc[:, _LEN], k0], 1)], 1)
        out_s = new_s.view(-1).index_select(0, (st[code] + sbase).view(-1)).view(B, _NSC + 5)
        # per-chain record of the ended transition (statistics before the reset)
        acc = sacc / nst.clamp(min=1.0)
        rec = torch.stack([out_s[:, _US], acc, div_t.to(dt), jn, nst, H0, turn_t.to(dt)], 1)
        if thin == 1:
            slot = torch.where(emit, c_old, S_t)
        else:
            slot = torch.where(emit & (count % thin == 0), count // thin - 1, S_t)
        out_pos.index_put_((ar, slot), out_v[:, _QS])
        out_sc.index_put_((ar, slot), rec)
        if stat_buf is not None:
            stat_buf.index_add_(0, torch.where(emit, c_old, T), rec[:, 1:5])
        # unpack
        V, Sc = out_v[:, :_NVC], out_s[:, :_NSC]
        q, g, p, cum = out_v[:, _NVC : _NVC + 4].unbind(1)
        qg_x = out_v[:, _NVC + 4 :]
        U, slw, sacc, nst, ux = out_s[:, _NSC : _NSC + 5].unbind(1)
        n_sub = Sc[:, _N].long()
        half, eim, H0, len_ = derived(Sc)
        fwd = torch.where(ns, fn, fwd)
        s_valid = sv_n | ns
        diverged = div_t & ~new
        turning = turn_t & ~new
        stepping = live & ~skip
        stepf, step_l = stepping.to(dt), stepping.long()
        n_live = int(live.sum())
        skipping = skipping and bool((skip & live).any())
        if on_transition is not None:
            lo = int(count.min())
            while reported < lo:
                on_transition(reported, stat_buf[reported])
                reported += 1
        if stop is not None and n_live > 0 and stop():
            kept = int(count.min()) // thin
            if kept == 0:
                return result(state, n_ticks, n_rows, 0)
            last = out_pos[:, kept - 1].contiguous()
            u_last, g_last = potential_and_grad(last)
            return result(HMCState(last, u_last.to(dt), g_last.to(dt)), n_ticks, n_rows, kept)

    final = HMCState(out_v[:, _QS].contiguous(), out_s[:, _US].contiguous(), out_v[:, _GS].contiguous())
    return result(final, n_ticks, n_rows)
