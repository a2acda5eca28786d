"""A sweep's point configs without Hydra's per-point composition where no config group changes.

Hydra composes every point from scratch (defaults list, every config file, merges: about 0.3 s a point, most
of a large sweep's submission time). A point whose overrides differ from others' only in plain values
(``key=value`` where ``key`` is no config group: no ``+``, ``++``, ``~``, package, dict or ``hydra.`` key) gets
the same config as Hydra's by applying those values, in order, with Hydra's own call
(``OmegaConf.update(cfg, key, value, merge=True)``, ConfigLoaderImpl._apply_overrides_to_config) to a base
that Hydra composed once with the point's other overrides; ``hydra.overrides.task`` and
``hydra.job.override_dirname`` are set as Hydra sets them. Every other point, and any point whose values do not
apply (Hydra's own error is then wanted), is composed by Hydra.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from typing import Any, Optional, Sequence


@dataclass(frozen=True)
class PlainPoint:
    """A point rebuilt from a base config and its overrides (on the node as at submission)."""

    base: int
    """Which base of the sweep's (``PointComposer.bases``)."""
    overrides: tuple[str, ...]
    num: int
    job_id: str
    sweep_dir: str
    """The point's absolute hydra.sweep.dir."""


class PointComposer:
    """The configs of a sweep's points: Hydra composes one base per distinct set of structural overrides."""

    def __init__(self, loader: Any, master: Any, compose: Any) -> None:
        """``compose(master, overrides)``: Hydra's own ConfigLoader.load_sweep_config."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        self.loader, self.master, self.hydra_compose = loader, master, compose
        self.parser = OverridesParser.create(config_loader=loader)
        self.parsed: dict[str, Any] = {}
        self.base_index: dict[tuple[str, ...], int] = {}
        self.bases: list[Any] = []
        self.scratch: dict[int, Any] = {}

    def use(self, master: Any) -> None:
        """Compose for ``master`` from now on (the bases are of one master config)."""
        if master is not self.master:
            self.master, self.base_index, self.bases, self.scratch = master, {}, [], {}

    def _parse(self, line: str) -> Any:
        override = self.parsed.get(line)
        if override is None:
            override = self.parsed[line] = self.parser.parse_overrides([line])[0]
        return override

    def _is_plain(self, override: Any) -> bool:
        return not (override.is_delete() or override.is_add() or override.is_force_add() or override.is_hydra_override()
                    or override.package is not None or override.is_sweep_override()
                    or isinstance(override.value(), dict) or self.loader.repository.group_exists(override.key_or_group))

    def classify(self, overrides: Sequence[str]) -> Optional[tuple[tuple[str, ...], list[Any]]]:
        """(the structural overrides, the plain ones parsed) of a point; None when Hydra must compose it whole."""
        parsed = [self._parse(line) for line in overrides]
        plain = [o for o in parsed if self._is_plain(o)]
        structural = [o for o in parsed if not self._is_plain(o)]
        if {o.key_or_group for o in plain} & {o.key_or_group for o in structural}:
            return None  # a value and a structural override of one key: their order matters, Hydra decides
        return tuple(o.input_line for o in structural), plain

    def split(self, overrides: Sequence[str]) -> Optional[tuple[int, list[Any]]]:
        """(base, the plain overrides parsed) of a point, or None when Hydra must compose it whole."""
        classified = self.classify(overrides)
        if classified is None:
            return None
        structural, plain = classified
        if structural not in self.base_index:
            self.base_index[structural] = len(self.bases)
            self.bases.append(self.hydra_compose(self.master, list(structural)))
        return self.base_index[structural], plain

    def apply(self, config: Any, overrides: Sequence[str], plain: list[Any]) -> bool:
        """Hydra's changes of a point's plain values on a copy of its base; False if one does not apply."""
        # internal, on purpose: hydra.job.override_dirname as Hydra's loader sets it, by Hydra's own function
        from hydra._internal.config_loader_impl import get_overrides_dirname
        from omegaconf import OmegaConf, open_dict
        from omegaconf.errors import OmegaConfBaseException

        try:
            for override in plain:
                OmegaConf.update(config, override.key_or_group, override.value(), merge=True)
        except OmegaConfBaseException:
            return False
        app = [self._parse(line) for line in overrides]
        dirname = config.hydra.job.config.override_dirname
        with open_dict(config.hydra):
            config.hydra.overrides.task = list(overrides)
            config.hydra.job.override_dirname = get_overrides_dirname(
                overrides=app, kv_sep=dirname.kv_sep, item_sep=dirname.item_sep, exclude_keys=dirname.exclude_keys)
        return True

    def compose(self, overrides: Sequence[str]) -> Any:
        """A point's own config, as Hydra's load_sweep_config gives it."""
        split = self.split(overrides)
        if split is not None:
            config = copy.deepcopy(self.bases[split[0]])
            if self.apply(config, overrides, split[1]):
                return config
        return self.hydra_compose(self.master, list(overrides))

    def check(self, overrides: Sequence[str]) -> tuple[Optional[int], Any]:
        """(base or None, the point's config) for a point that need not be kept: a plain point's config is one
        working copy per base, valid until the next call (no copy of the whole config a point)."""
        split = self.split(overrides)
        if split is not None:
            base, plain = split
            scratch = self.scratch.get(base)
            if scratch is None:
                scratch = self.scratch[base] = copy.deepcopy(self.bases[base])
            if self.apply(scratch, overrides, plain):
                return base, scratch
            self.scratch.pop(base)  # left half-changed: copied afresh next time
        return None, self.hydra_compose(self.master, list(overrides))


def rebuild(bases: list[Any], point: PlainPoint, loader: Any) -> Any:
    """A plain point's config on the node, as it was checked at submission."""
    from omegaconf import open_dict

    composer = PointComposer(loader, None, None)
    classified = composer.classify(point.overrides)
    if classified is None:
        raise RuntimeError(f"internal: point {point.num} ({' '.join(point.overrides)}) is not a plain point here")
    config = bases[point.base]
    if not composer.apply(config, point.overrides, classified[1]):
        raise RuntimeError(f"internal: the overrides of point {point.num} do not apply to its base config")
    with open_dict(config.hydra):
        config.hydra.job.num, config.hydra.job.id, config.hydra.sweep.dir = point.num, point.job_id, point.sweep_dir
    return config


def install(loader: Any) -> PointComposer:
    """Compose a sweep's points through a PointComposer from now on (Hydra's sweepers check each batch by
    composing every point: Sweeper.validate_batch_is_legal, which drops each config).

    Outside Hydra's public API, on purpose: a Launcher gets only ``hydra_context.config_loader``, and Hydra's
    sweepers compose every point through its ``load_sweep_config`` (0.3 s a point: most of a 10,000-point sweep's
    submission). No plugin hook composes points another way, so this loader object (not the class: other apps
    in the process keep Hydra's) answers load_sweep_config through the composer, whose configs equal Hydra's
    (tests/test_sweeps.py holds a point's record to Hydra's). The nodes get the loader without it
    (launch._without_memory).
    """
    composer = getattr(loader, "hpcdl_composer", None)
    if composer is not None:
        return composer
    hydra_compose = loader.load_sweep_config
    composer = PointComposer(loader, None, hydra_compose)

    def load_sweep_config(master_config: Any, sweep_overrides: list[str]) -> Any:
        composer.use(master_config)
        # Hydra says nothing of why it composes: Sweeper.validate_batch_is_legal (hydra/plugins/sweeper.py, the
        # same in 1.3.2 and 1.3.8) composes every point of a batch only to see that it composes, and drops the
        # config; only its caller's name tells that call, and then no copy is kept for it
        if sys._getframe(1).f_code.co_name == "validate_batch_is_legal":
            return composer.check(sweep_overrides)[1]
        return composer.compose(sweep_overrides)

    loader.load_sweep_config = load_sweep_config
    loader.hpcdl_composer = composer
    return composer


def task_config(sweep_config: Any) -> Any:
    """The point's config without Hydra's node (what its task sees)."""
    from omegaconf import OmegaConf

    return OmegaConf.masked_copy(sweep_config, [key for key in sweep_config if key != "hydra"])


def hydra_files(sweep_config: Any) -> dict[str, str]:
    """Hydra's .hydra/ record of a point: its config, Hydra's config and its overrides."""
    from omegaconf import OmegaConf

    hydra = OmegaConf.to_yaml(sweep_config.hydra)
    return {"config.yaml": OmegaConf.to_yaml(task_config(sweep_config)),
            "hydra.yaml": "hydra:\n" + "".join(f"  {line}\n" for line in hydra.splitlines()),
            "overrides.yaml": OmegaConf.to_yaml(sweep_config.hydra.overrides.task)}
