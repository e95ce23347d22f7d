"""The sampler registry: sampler name -> builder of the Optuna sampler an agent's `sampler:` asks for.

A plain dict (as every registry of the tuner); an unknown name is a ConfigError listing the valid names.
Builders import Optuna themselves, so reading SAMPLER_NAMES (spec validation) costs no Optuna import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tuner.errors import ConfigError

if TYPE_CHECKING:
    import optuna

    from tuner.search.space import SearchSpace
    from tuner.spec import SamplerSpec

SamplerBuilder = Callable[["SamplerSpec", "SearchSpace"], "optuna.samplers.BaseSampler"]


def _startup(spec: SamplerSpec) -> dict[str, Any]:
    return {} if spec.n_startup_trials is None else {"n_startup_trials": spec.n_startup_trials}


def _with_design(spec: SamplerSpec, space: SearchSpace,
                 build: Callable[[dict[str, Any]], optuna.samplers.BaseSampler]) -> optuna.samplers.BaseSampler:
    """`build(startup kwargs)`, behind the Sobol initial design when the spec asks for one."""
    if spec.initial_design != "sampler":
        from tuner.search.design import DesignThenSampler

        n = 10 if spec.n_startup_trials is None else spec.n_startup_trials
        return DesignThenSampler(space, build({"n_startup_trials": 0}), n_design=n, seed=spec.seed,
                                 around_defaults=spec.initial_design != "sobol",
                                 sweep_groups=spec.initial_design == "group-sweep")
    return build(_startup(spec))


def _tpe(spec: SamplerSpec, space: SearchSpace) -> optuna.samplers.BaseSampler:
    import optuna

    extra: dict[str, Any] = {"multivariate": True, "group": True} if spec.multivariate else {}
    if spec.n_ei_candidates is not None:
        extra["n_ei_candidates"] = spec.n_ei_candidates
    return _with_design(spec, space, lambda kw: optuna.samplers.TPESampler(seed=spec.seed, **kw, **extra))


def _auto(spec: SamplerSpec, space: SearchSpace) -> optuna.samplers.BaseSampler:
    """The default: every allowed joint choice of the constraint-tied categorical knobs (the parallel layout) at
    the defaults, then Sobol points around the defaults, then multivariate group TPE alternating with local
    steps from the incumbent (the nearest to feasible while nothing is); chosen on the scenario suite of
    experiments/search-suite (the options an agent gives override the design's size and kind)."""
    import optuna

    from tuner.search.design import DesignThenSampler, group_sweep

    design = "group-sweep" if spec.initial_design == "sampler" else spec.initial_design
    n = spec.n_startup_trials
    if n is None:  # the whole sweep, then a few Sobol points around the defaults
        n = (len(group_sweep(space, spec.seed)) if design == "group-sweep" else 0) + AUTO_SOBOL_POINTS
    extra: dict[str, Any] = {}
    if spec.n_ei_candidates is not None:
        extra["n_ei_candidates"] = spec.n_ei_candidates
    tpe = optuna.samplers.TPESampler(seed=spec.seed, n_startup_trials=0, multivariate=True, group=True, **extra)
    local = AUTO_LOCAL_EVERY if spec.local_every is None else spec.local_every
    return DesignThenSampler(space, tpe, n_design=n, seed=spec.seed, around_defaults=design != "sobol",
                             sweep_groups=design == "group-sweep", local_every=local,
                             guided=spec.model_guided, coordinate=AUTO_COORDINATE)


# after the design, every second proposal of the default sampler is a local step from the incumbent
AUTO_LOCAL_EVERY = 2
# Sobol points around the defaults after the layout sweep
AUTO_SOBOL_POINTS = 2
# the model-guided local steps start with the coordinate search around the incumbent (tuner.search.coordinate)
AUTO_COORDINATE = True


def default_resample(spec: SamplerSpec) -> int:
    """How many constraint-breaking proposals per trial are resampled when the agent does not say."""
    return AUTO_RESAMPLE if spec.name == "auto" else 0


AUTO_RESAMPLE = 50


def _nsga2(spec: SamplerSpec, space: SearchSpace) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.NSGAIISampler(seed=spec.seed)


def _gp(spec: SamplerSpec, space: SearchSpace) -> optuna.samplers.BaseSampler:
    import optuna

    return _with_design(spec, space, lambda kw: optuna.samplers.GPSampler(seed=spec.seed, **kw))


def _random(spec: SamplerSpec, space: SearchSpace) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.RandomSampler(seed=spec.seed)


def _qmc(spec: SamplerSpec, space: SearchSpace) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.QMCSampler(qmc_type="sobol", scramble=True, seed=spec.seed)


def _grid(spec: SamplerSpec, space: SearchSpace) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.GridSampler({p.name: p.grid() for p in space.params}, seed=spec.seed)


SAMPLERS: dict[str, SamplerBuilder] = {
    "tpe": _tpe,
    "nsga2": _nsga2,
    "gp": _gp,
    "random": _random,
    "qmc": _qmc,
    "grid": _grid,
    "auto": _auto,
}
SAMPLER_NAMES: tuple[str, ...] = tuple(SAMPLERS)


def make_sampler(spec: SamplerSpec, space: SearchSpace) -> optuna.samplers.BaseSampler:
    """The Optuna sampler `spec` names, built for `space`."""
    try:
        build = SAMPLERS[spec.name]
    except KeyError:
        raise ConfigError(f"unknown sampler {spec.name!r}; valid: {', '.join(SAMPLER_NAMES)}",
                          field="sampler.name") from None
    return build(spec, space)
