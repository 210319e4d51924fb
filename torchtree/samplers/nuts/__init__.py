"""``HMC`` and ``NUTS`` samplers: batched chains on soft trees or on any potential.

Two ways in:

* ``NUTS(...).run(data, seed=..., monitor=...)`` samples the soft tree of one
  topology (``topology=`` or a full tree of ``depth=``) with ``n_chains`` chains and
  returns a :class:`~torchtree.model.soft_posterior.SoftTreePosterior` (optionally with a
  LAIS evidence estimate). It goes through :func:`torchtree.samplers.driver.run` (seed,
  device, monitors) with two steps: warm-up, then sampling;
* ``NUTS(...).sample(potential_and_grad, init, seed=...)`` samples any batched
  potential ``[B, P] -> ([B], [B, P])`` and returns an :class:`MCMCResult`.

Both run warm-up (Stan windows, per-chain dual averaging and diagonal mass matrix,
optional sharpness annealing ``h_init -> h_final``) and then sampling, all chains in
lockstep (see :mod:`torchtree.samplers.nuts.chains`); ``NUTS(asynchronous=True)`` samples with
each chain at its own pace instead (see :mod:`torchtree.steps.nuts_async`).
"""
from torchtree.samplers.nuts.config import NUTSConfig, ASYNC_DEFAULT
from torchtree.samplers.nuts.sampler import NUTS, HMC
from torchtree.samplers.nuts.state import MCMCResult, NUTSState

__all__ = ["ASYNC_DEFAULT", "HMC", "MCMCResult", "NUTS", "NUTSConfig", "NUTSState"]
