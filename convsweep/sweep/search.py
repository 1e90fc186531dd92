"""Which of a job's valid settings it measures, and in what order: the whole grid, a seeded random sample
chosen up front, or a model-guided search that asks Optuna's sampler for the next settings as the measured
ones come back (`search: {strategy: tpe, budget: N, seed: S}` in experiments.yaml).

The guided strategies see only the valid settings: the restrictions and the layers' shapes have pruned the
grid first (convsweep.sweep.config.choose_settings). Each tunable of each conv layer is an ordinal dimension (the
position of its value among the values the valid settings take), so a sampler learns that BLOCK 256 lies
between 128 and 512. A proposal that is not a valid setting, or one already measured, is told to the sampler
as failed and replaced by the unmeasured valid setting nearest it (fewest dimensions changed, then the
smallest moves). A setting that fails or comes out wrong is told as failed, never as a time. Several
settings are proposed at once (Optuna's constant liar keeps them apart) so that they compile in parallel.

The same Search answers `convsweep replay` from a stored grid's medians, with no GPU.
"""
from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from convsweep.base.errors import ConfigError

UP_FRONT = ("grid", "random")  # the settings are chosen before any is measured
GUIDED = ("tpe", "genetic")  # Optuna's TPE and NSGA-II samplers, asked as settings are measured
STRATEGIES = (*UP_FRONT, *GUIDED)
COMPILE_AHEAD = 4  # settings proposed (and compiled in parallel) at once: replayed on the H100's 1,250-setting
# grid, TPE came within 2% of the best in 156 of 160 searches at 4, 148 at 8 (docs/search.md)


def budget(search: dict, valid: int) -> int:
    """How many of `valid` settings the search measures: `budget` (a number, or "P%" of them, at least one),
    or `max_settings` (its older name, random's); all of them for the grid, or where the budget is larger."""
    asked = search.get("budget", search.get("max_settings"))
    if asked is None:
        return valid
    if isinstance(asked, str):  # "20%": the schema has checked its form
        return max(1, min(valid, valid * int(asked.rstrip("%")) // 100))
    return min(asked, valid)


def is_guided(search: dict) -> bool:
    return search["strategy"] in GUIDED


def check(search: dict, where: str) -> None:
    """One ConfigError line for a search the schema lets through but that cannot run."""
    strategy = search["strategy"]
    if strategy == "grid" and set(search) != {"strategy"}:
        extra = sorted(set(search) - {"strategy"})[0]
        raise ConfigError(f"{where}.{extra}: the grid strategy measures every setting and takes no {extra}")
    if strategy != "grid":
        if "budget" in search and "max_settings" in search:
            raise ConfigError(f"{where}: budget and max_settings are one thing (max_settings is budget's older "
                              "name): give one")
        if "budget" not in search and "max_settings" not in search:
            raise ConfigError(f"{where}.budget: the {strategy} strategy needs a budget (settings to measure)")
        if "max_settings" in search and strategy != "random":
            raise ConfigError(f"{where}.max_settings: the {strategy} strategy takes budget")


def up_front(search: dict, valid: int) -> list[int]:
    """The indices (grid order) of the valid settings an up-front search measures: all, or a seeded sample of
    `budget` of them; every one for a guided search, whose candidates they are."""
    n = budget(search, valid)
    if search["strategy"] == "random" and n < valid:
        return sorted(random.Random(search["seed"]).sample(range(valid), n))
    return list(range(valid))


class Search:
    """A guided search over `candidates` (each a setting: conv layer -> {tunable: value}): `propose(k)` gives up
    to k indices to measure next, `tell(index, layer_ms)` the op time of each conv layer each came back with
    (None: failed, wrong or suspect), until `budget` settings are measured or none is left. `order` holds the
    proposals as made.

    `groups` are the layers whose tunables move together (the job's grid entries: one for a variant's grid that
    ties its layers, one per layer where each is tuned on its own). Each group is a sampler of its own, told
    its own layers' op times: a setting's time is its layers' times added up, and a layer's time depends on
    its own tunables alone, so a 24 x 24 space is searched as two of 24, each measurement teaching both."""

    def __init__(self, candidates: Sequence[dict[str, dict]], strategy: str, budget: int, seed: int,
                 groups: Sequence[Sequence[str]] | None = None):
        import numpy as np  # here, not above: the planner reads this module's names without numpy
        import optuna

        if strategy not in GUIDED:
            raise ConfigError(f"search.strategy: {strategy!r} is not a guided strategy ({', '.join(GUIDED)})")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self.candidates, self.budget = list(candidates), min(budget, len(candidates))
        self.dimensions, self.codes = _ordinal_codes(self.candidates)
        self._index = {tuple(code): i for i, code in enumerate(self.codes.tolist())}
        layers = list(dict.fromkeys(layer for params in self.candidates for layer in params))
        self.groups = [list(g) for g in groups] if groups else [layers]
        # Each group's dimensions (their columns of codes) and its sampler; a group with none has nothing to learn.
        self._studies = []
        with warnings.catch_warnings():  # constant_liar and multivariate are marked experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            for n, group in enumerate(self.groups):
                columns = [d for d, name in enumerate(self.dimensions) if name.split(".", 1)[0] in group]
                if columns:
                    study = optuna.create_study(direction="minimize",
                                                sampler=_sampler(optuna, strategy, seed + n, self.budget))
                    distributions: dict[str, optuna.distributions.BaseDistribution] = {
                        self.dimensions[d]: optuna.distributions.IntDistribution(
                        0, int(self.codes[:, d].max())) for d in columns}
                    self._studies.append((group, columns, study, distributions))
        self._np, self._rng = np, np.random.default_rng(seed)
        self._pending: dict[int, list | None] = {}  # proposed, not yet told: index -> its trials (None: stand-ins)
        self.taken = np.zeros(len(self.candidates), dtype=bool)
        self.order: list[int] = []
        self._proposal: dict[int, int] = {}

    @property
    def done(self) -> bool:
        return len(self.order) >= self.budget

    @property
    def proposed(self) -> list[int]:
        """The settings proposed so far, in that order (measured, or waiting to be)."""
        return self.order

    def propose(self, k: int = COMPILE_AHEAD) -> list[int]:
        """Up to k settings not measured nor pending, fewer as the budget runs out; [] when it has."""
        out: list[int] = []
        while len(out) < k and not self.done and not self.taken.all():
            code = self._np.zeros(len(self.dimensions), dtype=self.codes.dtype)
            trials: list | None  # None where a stand-in replaces the sampler's proposal
            trials = []
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", self._optuna.exceptions.ExperimentalWarning)
                for _, columns, study, distributions in self._studies:
                    trial = study.ask(distributions)
                    code[columns] = [trial.params[self.dimensions[d]] for d in columns]
                    trials.append(trial)
            index = self._index.get(tuple(code.tolist()))
            if index is None or self.taken[index]:  # not a valid setting, or one measured already
                for (_, _, study, _), trial in zip(self._studies, trials):
                    study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
                index, trials = self._nearest(code), None
            self.taken[index] = True
            self._pending[index] = trials
            self._proposal[index] = len(self.order)
            self.order.append(index)
            out.append(index)
        return out

    def proposal_of(self, index: int) -> int | None:
        """Where `index` came in the order of proposals (0 first)."""
        return self._proposal.get(index)

    def add_measured(self, index: int, layer_ms: dict[str, float] | None) -> None:
        """A setting measured before (a resumed job): counted against the budget and told, never proposed."""
        self.taken[index] = True
        self._pending[index] = None
        self._proposal[index] = len(self.order)
        self.order.append(index)
        self.tell(index, layer_ms)

    def tell(self, index: int, layer_ms: dict[str, float] | None) -> None:
        """Setting `index` measured: each conv layer's op time (lower is better), or None where it failed, came
        out wrong or is suspect. Each group's sampler is told its own layers' time added up."""
        trials = self._pending.pop(index)
        state = self._optuna.trial.TrialState
        for n, (group, columns, study, distributions) in enumerate(self._studies):
            value = sum(layer_ms[layer] for layer in group if layer in layer_ms) if layer_ms else None
            told = state.COMPLETE if value is not None else state.FAIL
            if trials is not None:
                study.tell(trials[n], value, state=told)
            else:
                params = {self.dimensions[d]: int(self.codes[index, d]) for d in columns}
                study.add_trial(self._optuna.trial.create_trial(params=params, distributions=distributions,
                                                                value=value, state=told))

    def _nearest(self, code) -> int:
        """The unmeasured candidate with the fewest dimensions off `code`, then the smallest moves; ties drawn."""
        free = (~self.taken).nonzero()[0]
        diff = abs(self.codes[free] - code) if self.dimensions else 0 * self.codes[free, :1]
        score = (diff > 0).sum(axis=1) * (int(self.codes.max(initial=0)) + 1) * max(1, len(self.dimensions)) \
            + diff.sum(axis=1)
        best = free[score == score.min()]
        return int(best[self._rng.integers(len(best))])


class UpFront:
    """The settings chosen before measuring (grid, random) as proposals: all of them at once, told nothing."""

    def __init__(self, todo: Sequence[int]):
        self._todo: list[int] | None = list(todo)
        self.budget = len(self._todo)
        self.proposed = list(todo)  # all of them, from the start

    def propose(self, k: int = COMPILE_AHEAD) -> list[int]:
        todo, self._todo = self._todo or [], None
        return todo

    def tell(self, index: int, value: dict[str, float] | None) -> None:
        pass

    def proposal_of(self, index: int) -> int | None:
        return None


def proposals(candidates: Sequence[dict[str, dict]], search: dict, todo: Sequence[int],
              told: Sequence[tuple[int, dict[str, float] | None]] = (),
              groups: Sequence[Sequence[str]] | None = None) -> Search | UpFront:
    """What a job measures next: `todo` (indices of candidates not measured yet) all at once for an up-front
    search; for a guided one, its proposals among them, the measurements of a resumed job (`told`: index and
    layer op times, in the order proposed) counted first. Each setting in the budget at most once."""
    if not is_guided(search):
        return UpFront(todo)
    guided = Search(candidates, search["strategy"], budget(search, len(candidates)), search["seed"], groups)
    for index, value in told:
        guided.add_measured(index, value)
    left = set(todo)
    for index in range(len(candidates)):
        if index not in left:
            guided.taken[index] = True  # measured before (told above) or not this job's to measure
    return guided


def objective(status: str, op_time_ms: dict[str, float | None] | None) -> dict[str, float] | None:
    """What a strategy is told of a measured setting: each conv layer's op time, their sum being compare's Op
    Time; None, a failure, for a setting that failed, came out wrong, or whose time the integrity checks doubt."""
    times = dict(op_time_ms or {})
    if status != "ok" or not times or any(t is None for t in times.values()):
        return None
    return {layer: float(cast(float, t)) for layer, t in times.items()}


def _sampler(optuna, strategy: str, seed: int, budget: int):
    if strategy == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                          n_startup_trials=max(4, min(10, budget // 5)))
    return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, budget // 5)))


def _ordinal_codes(candidates: Sequence[dict[str, dict]]) -> tuple[list[str], Any]:
    """The dimensions ('conv1.BLOCK', ... those with more than one value among the candidates) and each
    candidate's position in each, as an integer matrix."""
    import numpy as np

    values: dict[str, set] = {}
    for params in candidates:
        for layer, tunables in params.items():
            for name, value in (tunables or {}).items():
                values.setdefault(f"{layer}.{name}", set()).add(value)
    ordered = {name: sorted(seen, key=_order) for name, seen in values.items() if len(seen) > 1}
    dimensions = sorted(ordered)
    position = {name: {value: k for k, value in enumerate(ordered[name])} for name in dimensions}
    codes = np.array([[position[name][_value(params, name)] for name in dimensions] for params in candidates],
                     dtype=np.int64).reshape(len(candidates), len(dimensions))
    return dimensions, codes


def _value(params: dict[str, dict], dimension: str) -> Any:
    layer, name = dimension.split(".", 1)
    return (params.get(layer) or {}).get(name)


def _order(value: Any) -> tuple:
    """Numbers by value, then anything else by its text (a tunable's values are numbers or words)."""
    return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))


@dataclass(frozen=True)
class Outcome:
    """One search's course over a known grid: the indices in the order measured, and after how many of them
    the best so far first came within `tolerance` of the grid's best (None: never, within the budget)."""

    order: list[int]
    reached_after: int | None
    best_found: float | None


def run(candidates: Sequence[dict[str, dict]], measured: Callable[[int], dict[str, float] | None], search: dict,
        tolerance: float = 0.02, target: float | None = None,
        groups: Sequence[Sequence[str]] | None = None) -> Outcome:
    """Run `search` over `candidates`, measuring by `measured(index)` (each layer's op time; None: failed), as a
    job does but with no GPU: the order it measures in, and when it came within `tolerance` of `target` (the
    grid's best Op Time)."""
    if is_guided(search):
        guided = Search(candidates, search["strategy"], budget(search, len(candidates)), search["seed"], groups)
        order: list[int] = []
        while batch := guided.propose():
            for index in batch:
                guided.tell(index, measured(index))
            order += batch
    else:
        order = up_front(search, len(candidates))
    best, reached = None, None
    for n, index in enumerate(order, start=1):
        layer_ms = measured(index)
        value = sum(layer_ms.values()) if layer_ms else None
        if value is not None and (best is None or value < best):
            best = value
        if reached is None and target is not None and best is not None and best <= target * (1 + tolerance):
            reached = n
    return Outcome(order, reached, best)
