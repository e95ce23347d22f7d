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

    from tuner.space import SearchSpace
    from tuner.spec import SamplerSpec

SamplerBuilder = Callable[["SamplerSpec", "SearchSpace"], "optuna.samplers.BaseSampler"]


def _startup(spec: SamplerSpec) -> dict[str, Any]:
    return {} if spec.n_startup_trials is None else {"n_startup_trials": spec.n_startup_trials}


def _tpe(spec: SamplerSpec, space: SearchSpace) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.TPESampler(seed=spec.seed, **_startup(spec))


def _nsga2(spec: SamplerSpec, space: SearchSpace) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.NSGAIISampler(seed=spec.seed)


def _gp(spec: SamplerSpec, space: SearchSpace) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.GPSampler(seed=spec.seed, **_startup(spec))


def _random(spec: SamplerSpec, space: SearchSpace) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.RandomSampler(seed=spec.seed)


def _grid(spec: SamplerSpec, space: SearchSpace) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.GridSampler({p.name: p.grid() for p in space.params}, seed=spec.seed)


SAMPLERS: dict[str, SamplerBuilder] = {
    "tpe": _tpe,
    "nsga2": _nsga2,
    "gp": _gp,
    "random": _random,
    "grid": _grid,
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
