"""Search strategies over the enumerated points of a space: ``grid``, ``random`` and ``bo``.

All three share one small interface (:class:`Searcher`): ``ask(n)`` proposes up to n indices into
the space's point list that were never proposed before, ``tell(indices, losses)`` reports their
losses (``None`` for infeasible points). Working on the enumerated list is how infeasible
combinations are "filtered before asking": nothing outside the valid points can be proposed.

``bo`` is Bayesian optimisation with scikit-optimize's pieces: the points are encoded as skopt
dimensions (log2 of the mesh and batch sizes as reals, schedule, recompute etc. as categoricals)
and transformed once as skopt's :class:`skopt.Optimizer` would, skopt's default surrogate (GP,
random forest or extra trees; :func:`skopt.utils.cook_estimator`) is fitted to what was told, and
expected improvement (:func:`skopt.acquisition.gaussian_ei`) is maximised over the
not-yet-proposed valid points — exact acquisition maximisation over a finite set instead of
skopt's sampling of the unconstrained box. The first ``n_initial`` proposals are
uniform random (seeded). Batches use the "constant liar" of skopt's ``ask(n_points, "cl_min")``
(Ginsbourger et al. 2010): after each pick the point is told with the best loss so far, the model
refitted, and the next point chosen.

Infeasible points (out of memory, a broken constraint found only by simulating) are handled by
constrained expected improvement (Gardner et al., ICML 2014; Gelbart et al., UAI 2014): the loss
surrogate is fitted on feasible points only, a seeded extra-trees classifier estimates each
candidate's probability of being feasible, and the acquisition is EI × P(feasible). Telling the
surrogate a penalty value instead (what we did first) puts artificial cliffs into the loss
landscape: with a fifth of the points infeasible the GP then needed more than 60 evaluations on
the test landscape, against 26 without infeasible points; with the classifier it needs 25 (median
of 5 seeds). The GP is the default surrogate: the tree surrogates (``rf``, ``et``) are noisier on
the smooth landscapes the simulator produces (``et`` missed the optimum within 60 evaluations for
4 of 5 seeds on the same test landscape).

Cost: a sweep asks once per proposal, and a GP fit plus the acquisition over 10⁴ points is what a
long sweep spends its time on, not the simulations. So the surrogates run on one BLAS thread,
the GP's predictive variance is a matrix product (:class:`_Posterior`), the acquisition is cached
while the data the GP was fitted to does not change (out-of-memory proposals, which cost no
simulation, do not change it; the cache is exact), and the feasibility classifier is fitted once
per set of told results, not once per pick of a batch (the picks of a batch see the same labels;
only the classifier's seed differs from a per-pick refit). On the search-quality landscape
(``benchmarks/tune_search_quality.py``) the proposals with one pick per batch are the per-pick
refit's, seed for seed, and the median evaluations to the target with two picks per batch match.

Points that cannot fit are refused before they are proposed when the caller passes a ``screen``
(the sweep passes the memory model's refusal, :func:`mindpipe.tuner.evaluate.screen`): ``bo``
walks on in the acquisition's order past every refused point, and ends the ask after
:data:`WALK` refusals so that the classifier, told about them, steers the next ask. On a space
where most plans are out of memory (Llama 3 70B on 64 H100 with ``--search cp``: 35,148 points,
about 97 % of the proposals refused) a 60-simulation sweep went from 425 s to 56 s, with the
same best plan (``benchmarks/tune_sweep_speed.py``), because a refusal costs a memory check
(milliseconds) instead of a classifier fit, an acquisition and an evaluation round.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
from mindpipe.traces.errors import ContractError
from mindpipe.tuner.keys import POINT_KEYS, Point

OPTIMIZERS = ("bo", "random", "grid")
SURROGATES = ("gp", "rf", "et")
_LOG_KEYS = ("tp", "pp", "dp", "cp", "micro_batch_size", "global_batch_size", "virtual_stages")
_ACQ_CACHE_SIZE = 8  # acquisitions kept: one per pick of a batch (constant liar) is what gets reused
WALK = 64  # refusals by the screen one ask may walk past before the classifier is refitted


Screen = Callable[[int], bool]
"""Says, cheaply and for sure, that a point cannot be feasible (True: refused, never proposed)."""


class Searcher(Protocol):
    """Proposes points of a finite space and learns from their losses."""

    def ask(self, n: int, screen: Screen | None = None) -> list[int]:
        """Up to ``n`` indices never proposed before (fewer when the space runs out, or when ``bo``
        ended a long walk past refused points: ask again). A point ``screen`` refuses is used
        up without being proposed; the caller tells its loss (None) before the next ask."""
        ...

    def tell(self, indices: Sequence[int], losses: Sequence[float | None]) -> None:
        """Report losses (None = infeasible) of proposed indices."""
        ...


class GridSearch:
    """Every point in enumeration order."""

    def __init__(self, size: int) -> None:
        self._order = list(range(size))
        self._next = 0

    def ask(self, n: int, screen: Screen | None = None) -> list[int]:
        """The next ``n`` points in order that ``screen`` does not refuse."""
        out: list[int] = []
        while len(out) < n and self._next < len(self._order):
            i = self._order[self._next]
            self._next += 1
            if screen is None or not screen(i):
                out.append(i)
        return out

    def tell(self, indices: Sequence[int], losses: Sequence[float | None]) -> None:
        """Grid search does not learn."""


class RandomSearch(GridSearch):
    """Points in a seeded uniform random order, without repetition."""

    def __init__(self, size: int, seed: int) -> None:
        super().__init__(size)
        self._order = [int(i) for i in np.random.default_rng(seed).permutation(size)]


def encode_points(points: Sequence[Point]) -> tuple[list[Any], list[str], list[list[Any]]]:
    """skopt dimensions, the encoded keys, and each point encoded (constant keys dropped)."""
    from skopt.space import Categorical, Real

    dims: list[Any] = []
    keys: list[str] = []
    for key in POINT_KEYS:
        values = sorted({p[key] for p in points}, key=lambda v: (str(type(v)), v))
        if len(values) < 2:
            continue
        keys.append(key)
        if key in _LOG_KEYS:
            logs = [math.log2(v) for v in values]
            dims.append(Real(min(logs), max(logs), name=key))
        elif key == "zero_stage":
            dims.append(Real(float(min(values)), float(max(values)), name=key))
        else:
            dims.append(Categorical([str(v) for v in values], name=key))
    rows = []
    for p in points:
        row: list[Any] = []
        for key in keys:
            v = p[key]
            row.append(math.log2(v) if key in _LOG_KEYS else float(v) if key == "zero_stage" else str(v))
        rows.append(row)
    return dims, keys, rows


class _Posterior:
    """A fitted skopt GP's ``predict(X, return_std=True)``, with the variance's quadratic form as a
    matrix product: skopt sums ``k·K⁻¹·k`` with a three-operand einsum, which does not use BLAS and
    dominated the acquisition over 10⁴ candidates. Same formula (Rasmussen & Williams eq. 2.26)."""

    def __init__(self, gp: Any) -> None:
        self.gp = gp

    def predict(self, x: np.ndarray, return_std: bool = False) -> Any:
        """Posterior mean (and standard deviation) at ``x``, in the units of the told losses."""
        gp = self.gp
        k = gp.kernel_(x, gp.X_train_)
        mean = k @ gp.alpha_ * gp.y_train_std_ + gp.y_train_mean_
        if not return_std:
            return mean
        var = gp.kernel_.diag(x) - np.einsum("ij,ij->i", k @ gp.K_inv_, k)
        return mean, np.sqrt(np.maximum(var, 0.0) * gp.y_train_std_**2)


class BayesSearch:
    """Bayesian optimisation over a finite point list (module docstring)."""

    def __init__(self, points: Sequence[Point], seed: int, surrogate: str = "gp", n_initial: int = 10,
                 xi: float = 0.01, gp_restarts: int = 0) -> None:
        if surrogate not in SURROGATES:
            raise ContractError("--surrogate", None, f"{surrogate!r} is not one of {', '.join(SURROGATES)}")
        if n_initial < 1:
            raise ContractError("--initial-points", None, f"{n_initial} must be >= 1")
        self.seed, self.surrogate, self.n_initial, self.xi = seed, surrogate, n_initial, xi
        self.gp_restarts = gp_restarts
        self.dims, self.keys, self.rows = encode_points(points)
        self._remaining = list(range(len(points)))
        self._rng = np.random.default_rng(seed)
        self._told: list[tuple[int, float | None]] = []
        self._asked = 0
        self._rounds = 0
        self._pool_t: np.ndarray | None = None
        # Caches (exact): the acquisition over the whole pool for the data the surrogate was fitted
        # to, and P(feasible) for the number of results told (it is fitted on told results only).
        self._acq: dict[Any, np.ndarray] = {}
        self._pf: tuple[int, np.ndarray] | None = None

    def _pool(self) -> np.ndarray:
        """Every point in the surrogate's coordinates (skopt's Optimizer transform: normalised for the GP)."""
        if self._pool_t is None:  # the transform depends only on the dimensions: do it once
            from skopt.space import Space
            from skopt.utils import normalize_dimensions

            dims = normalize_dimensions(self.dims) if self.surrogate == "gp" else self.dims
            self._pool_t = np.asarray(Space(dims).transform(self.rows), dtype=float)
        return self._pool_t

    def _feasible(self) -> tuple[list[int], list[float]]:
        pairs = [(i, y) for i, y in self._told if y is not None]
        return [i for i, _ in pairs], [float(y) for _, y in pairs]

    def _acquisition(self, idx: list[int], ys: list[float]) -> np.ndarray:
        """Expected improvement of every pool point under the surrogate fitted to (idx, ys)."""
        from skopt.acquisition import gaussian_ei
        from skopt.utils import cook_estimator

        self._rounds += 1
        seed = self.seed * 1_000_003 + self._rounds
        # A GP without restarts fits the same model whatever its seed, so the cache may skip the
        # refit when only infeasible results (which it is not fitted on) came in; tree surrogates
        # are seeded per round and refitted.
        key = (tuple(idx), tuple(ys), None if self.surrogate == "gp" and not self.gp_restarts else seed)
        if key in self._acq:
            return self._acq[key]
        extra = {"n_restarts_optimizer": self.gp_restarts} if self.surrogate == "gp" else {}
        # skopt's default surrogates (cook_estimator), fitted as skopt's Optimizer.tell does.
        est = cook_estimator(self.surrogate.upper(), space=self.dims, random_state=seed, **extra)
        pool = self._pool()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(pool[idx], ys)
            model = _Posterior(est) if self.surrogate == "gp" else est
            ei = np.asarray(gaussian_ei(pool, model, y_opt=float(min(ys)), xi=self.xi))
        if len(self._acq) >= _ACQ_CACHE_SIZE:
            self._acq.pop(next(iter(self._acq)))
        self._acq[key] = ei
        return ei

    def _p_feasible(self) -> np.ndarray:
        """Probability that each pool point is feasible (1 where nothing infeasible was seen)."""
        if self._pf is not None and self._pf[0] == len(self._told):
            return self._pf[1]
        labels = [y is not None for _, y in self._told]
        pool = self._pool()
        if all(labels):
            pf = np.ones(len(pool))
        else:
            from sklearn.ensemble import ExtraTreesClassifier

            clf = ExtraTreesClassifier(n_estimators=100, min_samples_leaf=3,
                                       random_state=self.seed * 7919 + self._rounds)
            clf.fit(pool[[i for i, _ in self._told]], labels)
            pf = np.asarray(clf.predict_proba(pool)[:, list(clf.classes_).index(True)])
        self._pf = (len(self._told), pf)
        return pf

    def ask(self, n: int, screen: Screen | None = None) -> list[int]:
        """Random picks until ``n_initial`` were proposed, then expected improvement (with lies).

        A pick ``screen`` refuses is dropped and the next is taken: the next random one, or the
        next in the acquisition's order, for at most :data:`WALK` refusals per ask — then the ask
        ends early so that the feasibility classifier learns from them before walking on.
        """
        from threadpoolctl import threadpool_limits

        out: list[int] = []
        feasible = any(y is not None for _, y in self._told)
        refused = 0
        # The surrogates work on at most a few hundred points: BLAS threads only add synchronisation
        # (5x slower fits on a busy 2-core machine), so they run on one.
        with threadpool_limits(limits=1):
            while len(out) < n and self._remaining and refused < WALK:
                if self._asked < self.n_initial or not feasible or not self.dims:
                    i = self._remaining.pop(int(self._rng.integers(len(self._remaining))))
                    if screen is not None and screen(i):
                        refused += 1
                        continue
                else:
                    passed, pick = self._best_candidate(out, screen, WALK - refused)
                    refused += len(passed)
                    if passed:
                        gone = set(passed)
                        self._remaining = [j for j in self._remaining if j not in gone]
                    if pick is None:
                        break
                    self._remaining.remove(pick)
                    i = pick
                out.append(i)
                self._asked += 1
        return out

    def _best_candidate(self, pending: list[int], screen: Screen | None = None,
                        walk: int = 1) -> tuple[list[int], int | None]:
        """The pick in the acquisition's order and the pool indices ``screen`` refused before it
        (no pick when ``walk`` of them were refused)."""
        idx, ys = self._feasible()
        # Constant liar: pending picks of this batch count as already at the best loss.
        idx, ys = idx + pending, ys + [min(ys)] * len(pending)
        ei = self._acquisition(idx, ys)
        remaining = np.asarray(self._remaining)
        score = ei[remaining] * self._p_feasible()[remaining]
        if screen is None:
            return [], int(remaining[int(np.argmax(score))])
        passed: list[int] = []
        # Stable: equal scores in the order of the pool, so the first pick is argmax's.
        for k in np.argsort(-score, kind="stable")[:walk]:
            i = int(remaining[k])
            if not screen(i):
                return passed, i
            passed.append(i)
        return passed, None

    def tell(self, indices: Sequence[int], losses: Sequence[float | None]) -> None:
        """Record losses; the surrogate is refitted at the next ask."""
        self._told += list(zip(indices, losses, strict=True))


def make_searcher(name: str, points: Sequence[Point], seed: int, *, surrogate: str = "gp",
                  n_initial: int = 10) -> Searcher:
    """The named searcher over ``points``.

    Raises:
        ContractError: unknown optimizer or surrogate.
    """
    if name == "grid":
        return GridSearch(len(points))
    if name == "random":
        return RandomSearch(len(points), seed)
    if name == "bo":
        return BayesSearch(points, seed, surrogate=surrogate, n_initial=n_initial)
    raise ContractError("--optimizer", None, f"{name!r} is not one of {', '.join(OPTIMIZERS)}")


__all__ = ["OPTIMIZERS", "SURROGATES", "WALK", "BayesSearch", "GridSearch", "RandomSearch", "Screen", "Searcher",
           "encode_points", "make_searcher"]
