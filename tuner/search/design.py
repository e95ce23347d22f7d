"""A space-filling, constraint-honouring initial design, then a model-based sampler.

`DesignThenSampler(space, then, n_design, seed)` proposes its first `n_design` configurations from a scrambled
Sobol sequence over the whole search space (one dimension per parameter, conditions applied as the study asks
them), skipping every point whose configuration breaks a declared constraint, so no start-up trial is spent on
a configuration that would never be deployed. Trials with fixed parameters (the enqueued baseline) are not
design trials and do not use up the design. After the design, `then` (TPE) proposes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

if TYPE_CHECKING:
    from tuner.search.space import Param, SearchSpace

# system attribute of a design trial: its index in the constraint-filtered design
from tuner.search.points import LOCAL_FACTORS, point_to_config, with_defaults

DESIGN_ATTR = "tuner:design"
# the most Sobol points examined to find the next one that honours the constraints
MAX_SKIPPED = 10_000


def constrained_groups(space: SearchSpace, max_combinations: int = 256) -> list[list[str]]:
    """Groups of unconditional categorical/bool parameters that a declared constraint ties together (a
    constraint reading only such parameters, two or more); groups sharing a parameter are merged. A group
    with more than `max_combinations` joint choices is left out."""
    finite = {p.name for p in space.params if p.spec.type in ("categorical", "bool") and p.when is None}
    groups: list[set[str]] = []
    for c in space.constraints:
        names = c.names & set(space.by_name)
        if len(names) < 2 or not names <= finite or c.names - names - set(space.fixed) - set(space.facts):
            continue
        merged = set(names)
        for g in [g for g in groups if g & merged]:
            merged |= g
            groups.remove(g)
        groups.append(merged)
    order = [p.name for p in space.params]
    out = []
    for g in groups:
        n = 1
        for name in g:
            n *= len(_choices(space.by_name[name]))
        if n <= max_combinations:
            out.append(sorted(g, key=order.index))
    return out


def _choices(p: Param) -> list[Any]:
    return [False, True] if p.spec.type == "bool" else list(p.spec.choices or [])


def group_sweep(space: SearchSpace, seed: int | None) -> list[dict[str, Any]]:
    """Every constraint-honouring joint choice of each constrained group, the other knobs at their defaults,
    in an order shuffled by `seed`; the baseline itself left out (it runs anyway)."""
    import itertools
    import random

    configs: list[dict[str, Any]] = []
    base = space.defaults()
    for group in constrained_groups(space):
        for combo in itertools.product(*(_choices(space.by_name[n]) for n in group)):
            cfg = with_defaults(space, dict(zip(group, combo, strict=True)))
            if cfg != base and cfg not in configs and not space.violations(cfg):
                configs.append(cfg)
    random.Random(seed).shuffle(configs)
    return configs


class SpaceDesign:
    """The constraint-honouring scrambled Sobol design of a space: `config(i)` is its i-th configuration."""

    def __init__(self, space: SearchSpace, seed: int | None, *, around_defaults: bool = False,
                 sweep_groups: bool = False) -> None:
        from scipy.stats import qmc

        self.space = space
        self.around_defaults = around_defaults
        d = len(space.params) * (2 if around_defaults else 1)
        self._sobol = qmc.Sobol(d=d, scramble=True, seed=seed)
        self._configs: list[dict[str, Any]] = group_sweep(space, seed) if sweep_groups else []
        self.skipped = 0  # points dropped for breaking a constraint

    def config(self, index: int) -> dict[str, Any]:
        while len(self._configs) <= index:
            for _ in range(MAX_SKIPPED):
                # one point at a time keeps the sequence's order; Sobol balance holds best at powers of two
                cfg = point_to_config(self.space, self._sobol.random(1)[0], around_defaults=self.around_defaults)
                if not self.space.violations(cfg):
                    self._configs.append(cfg)
                    break
                self.skipped += 1
            else:
                raise ValueError(f"no configuration of {MAX_SKIPPED} design points honours the constraints "
                                 f"of {self.space.source}")
        return self._configs[index]


# the factors a numeric parameter is moved by in a local step from the incumbent: a log-scaled range (spanning
# decades: batch sizes, token budgets) by up to 8x either way, a linear one by up to 25%
LOCAL_FACTORS_LOG = (0.125, 0.25, 0.5, 2.0, 4.0, 8.0)
# system attribute of a local trial: the configuration it was given
LOCAL_ATTR = "tuner:local"


def neighbour(space: SearchSpace, config: dict[str, Any], rng: Any) -> dict[str, Any]:
    """`config` with one parameter (two, one time in three) moved: another choice of a categorical or bool, a
    numeric one times a factor of LOCAL_FACTORS_LOG or LOCAL_FACTORS (clipped to its range); conditions
    re-applied."""
    active = [p for p in space.params if p.name in config]
    if not active:
        return dict(config)
    out = dict(config)
    for p in rng.sample(active, min(len(active), 2 if rng.random() < 1 / 3 else 1)):
        s = p.spec
        if s.type in ("categorical", "bool"):
            others = [c for c in _choices(p) if c != out.get(p.name)]
            if others:
                out[p.name] = rng.choice(others)
            continue
        assert s.low is not None and s.high is not None
        v = float(out.get(p.name, p.default)) * rng.choice(LOCAL_FACTORS_LOG if s.log else LOCAL_FACTORS)
        v = min(max(v, s.low), s.high)
        out[p.name] = int(round(v)) if s.type == "int" else float(v)
    return with_defaults(space, out)


def incumbent(study: Study) -> FrozenTrial | None:
    """The best feasible complete trial of a single-objective study; while none is feasible, the one nearest to
    feasible (smallest sum of positive constraint values; a pruned trial counts, told with its partial
    measurement's); None without a complete or pruned trial with a config."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
            if t.values and isinstance(t.user_attrs.get("config"), dict)
            and t.user_attrs.get("duplicate_of") is None]
    if not done or len(study.directions) != 1:
        return None
    sign = 1.0 if study.directions[0].name == "MAXIMIZE" else -1.0

    def violation(t: FrozenTrial) -> float:
        return sum(v for v in t.constraints.values() if v > 0)

    feasible = [t for t in done if violation(t) <= 0]
    if feasible:
        return max(feasible, key=lambda t: (sign * t.values[0], -t.number))
    return min(done, key=lambda t: (violation(t), t.number))


class DesignThenSampler(BaseSampler):
    """`n_design` trials from SpaceDesign, then `then` (which sees every trial, design ones included).

    local_every k > 0: after the design, every k-th trial is a local step from the incumbent (`neighbour` of
    the best feasible trial, or of the nearest to feasible while none is), one that no trial had and that breaks
    no constraint; the others are `then`'s. guided: the local step is the surrogate's pick (tuner.search.surrogate);
    coordinate (with guided): the coordinate search's next move first (tuner.search.coordinate), its screening
    moves on every trial until each knob has been moved, the surrogate's pick when no move is pending."""

    def __init__(self, space: SearchSpace, then: BaseSampler, n_design: int, seed: int | None, *,
                 around_defaults: bool = False, sweep_groups: bool = False, local_every: int = 0,
                 guided: bool = False, coordinate: bool = False) -> None:
        import random

        self._space = space
        self._design = SpaceDesign(space, seed, around_defaults=around_defaults, sweep_groups=sweep_groups)
        self._then = then
        self._n_design = n_design
        self._seed = seed
        self._local_every = local_every
        self._guided = guided
        self._coordinate = coordinate and guided
        self._rng = random.Random(seed)
        self._assigned: dict[int, int] = {}  # trial id -> design index, for trials this process asked
        self._local: dict[int, dict[str, Any]] = {}  # trial id -> the local step's configuration

    @property
    def then(self) -> BaseSampler:
        return self._then

    def _design_index(self, study: Study, trial: FrozenTrial) -> int | None:
        idx = self._assigned.get(trial._trial_id, trial.system_attrs.get(DESIGN_ATTR))
        return idx if isinstance(idx, int) else None

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._then.before_trial(study, trial)
        if "fixed_params" in trial.system_attrs:  # enqueued (the baseline): its values are given
            return
        used = [t.system_attrs[DESIGN_ATTR] for t in study.get_trials(deepcopy=False)
                if t.number != trial.number and isinstance(t.system_attrs.get(DESIGN_ATTR), int)]
        if len(used) >= self._n_design:
            self._maybe_local(study, trial)
            return
        index = max(used, default=-1) + 1
        study._storage.set_trial_system_attr(trial._trial_id, DESIGN_ATTR, index)
        # the trial object the sampler is handed next was read before this attribute was written
        self._assigned[trial._trial_id] = index

    def _maybe_local(self, study: Study, trial: FrozenTrial) -> None:
        """Make `trial` a local step from the incumbent when its turn has come and one is found (with
        `coordinate`, a screening move of tuner.search.coordinate takes every turn, TPE's too)."""
        if self._local_every <= 0:
            return
        done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        proposals = [t for t in done if not t.user_attrs.get("rejected") and not t.user_attrs.get("screened")
                     and t.user_attrs.get("duplicate_of") is None]
        turn = len(proposals) % self._local_every == 0
        if not turn and not self._coordinate:
            return
        best = incumbent(study)
        if best is None:
            return
        base = {p.name: best.params[p.name] for p in self._space.params if p.name in best.params}
        seen = [t.params for t in study.get_trials(deepcopy=False) if t.number != trial.number]
        if self._guided:
            from tuner.search.surrogate import observed_of, rank

            sign = 1.0 if study.directions[0].name == "MAXIMIZE" else -1.0
            observed = observed_of(done, sign, self._space)
            if self._coordinate:
                from tuner.search import coordinate

                move = coordinate.step(self._space, observed, self._rng, seen=seen, seed=self._seed or 0,
                                       max_tier=coordinate.EXPAND if turn else coordinate.SCREEN)
                if move is not None:
                    self._give(study, trial, move.config)
                    return
                if not turn:
                    return
            cfg = rank(self._space, observed, self._rng, seen=seen, seed=self._seed or 0)
            if cfg is not None:
                self._give(study, trial, cfg)
                return
        for _ in range(30):
            cfg = neighbour(self._space, base, self._rng)
            if cfg != base and cfg not in seen and not self._space.violations(cfg):
                self._give(study, trial, cfg)
                return

    def _give(self, study: Study, trial: FrozenTrial, cfg: dict[str, Any]) -> None:
        """`trial` is a local step: `cfg` is its configuration."""
        self._local[trial._trial_id] = cfg
        study._storage.set_trial_system_attr(trial._trial_id, LOCAL_ATTR, True)

    def _given(self, study: Study, trial: FrozenTrial) -> dict[str, Any] | None:
        """The configuration the design or a local step gives `trial` (None: `then` samples it)."""
        index = self._design_index(study, trial)
        if index is not None:
            return self._design.config(index)
        return self._local.get(trial._trial_id)

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if self._given(study, trial) is not None:
            return {}
        return self._then.infer_relative_search_space(study, trial)

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if self._given(study, trial) is not None:
            return {}
        return self._then.sample_relative(study, trial, search_space)

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        cfg = self._given(study, trial)
        if cfg is not None:
            if param_name in cfg and param_distribution._contains(param_distribution.to_internal_repr(
                    cfg[param_name])):
                return cfg[param_name]
        return self._then.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self._then.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._then.reseed_rng()

