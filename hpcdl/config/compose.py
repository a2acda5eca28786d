"""Compose the config from hpcdl/conf/ and Hydra overrides into a validated Config object."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import typing
from pathlib import Path
from typing import Any, Optional, Sequence

from hpcdl.config.root import Config, sections
from hpcdl.config.fields import unknown_key_message
from hpcdl.config.targets import TARGET, TARGET_SECTIONS, target_overrides
from hpcdl.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"  # package data: found beside the package wherever installed


def user_config_dirs() -> list[Path]:
    """Folders of the user's own profiles and groups: $HPCDL_CONFIG_DIR, then ~/.config/hpcdl."""
    candidates = [os.environ.get("HPCDL_CONFIG_DIR"), Path.home() / ".config" / "hpcdl"]
    return [Path(c).expanduser().resolve() for c in candidates if c and Path(c).expanduser().is_dir()]


SITE_DIR = Path("/etc/hpcdl")
"""Where an admin installs the site's profiles (cluster/NAME.yaml) and groups; $HPCDL_SITE_DIR moves it."""


def site_config_dir() -> Optional[Path]:
    """The site's folder of profiles and groups ($HPCDL_SITE_DIR, else /etc/hpcdl), when there is one."""
    folder = Path(os.environ.get("HPCDL_SITE_DIR") or SITE_DIR).expanduser()
    return folder.resolve() if folder.is_dir() else None


def config_dirs() -> list[Path]:
    """Every folder of profiles and groups beside hpcdl's own, first found first: the user's, then the site's."""
    site = site_config_dir()
    return [*user_config_dirs(), *([site] if site is not None and site not in user_config_dirs() else [])]


def profile_file(name: str) -> Optional[Path]:
    """The YAML file of cluster profile ``name`` that composition picks (the user's first), or None."""
    for folder in [*config_dirs(), CONF_DIR]:
        path = folder / "cluster" / f"{name}.yaml"
        if path.is_file():
            return path
    return None


def register_configs() -> None:
    """Put the root schema into Hydra's ConfigStore (idempotent).

    The sections that may name the user's code (model, data) are open in the root, so that a user's target
    brings its own keys; the built-in choices extend their section's schema (``defaults: [schema]``).
    """
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="hpcdl_schema", node=_hydra_root())
    hints = typing.get_type_hints(Config)
    for name in TARGET_SECTIONS:
        store.store(group=name, name="schema", node=hints[name])


@functools.cache
def _hydra_root() -> type:
    """Config's fields for Hydra, with the target sections typed Any."""
    hints, spec = typing.get_type_hints(Config), []
    for field in dataclasses.fields(Config):
        if field.name in TARGET_SECTIONS:
            spec.append((field.name, Any, dataclasses.field(default=None)))
        elif field.default is not dataclasses.MISSING:
            spec.append((field.name, hints[field.name], dataclasses.field(default=field.default)))
        else:
            spec.append((field.name, hints[field.name], dataclasses.field(default_factory=field.default_factory)))
    return dataclasses.make_dataclass("HydraRoot", spec)


def default_target(section: type) -> Optional[str]:
    """The built-in ``_target_`` of a section class, or None when it has no target."""
    found = [f.default for f in dataclasses.fields(section) if f.name == TARGET]
    return found[0] if found else None


def build_section(section: type, values: Any) -> Any:
    """Section ``section`` from composed ``values`` (a dict, or the section already built), checked.

    A user's ``_target_`` takes every other key as its argument (those the section keeps beside a target,
    such as data.validation_fraction, excepted); the built-in target takes the section's own options.
    """
    if values is None or isinstance(values, section):
        return section() if values is None else values
    target = values.get(TARGET, default_target(section))
    if target != default_target(section):
        kept = getattr(section, "KEPT_WITH_TARGET", ())
        return section(**{TARGET: target, **{k: v for k, v in values.items() if k in kept}},
                       args={k: v for k, v in values.items() if k != TARGET and k not in kept})
    hints = typing.get_type_hints(section)
    return section(**{k: build_section(hints[k], v) if k in hints and dataclasses.is_dataclass(hints[k]) else v
                      for k, v in values.items()})


def _unknown_key(error: BaseException) -> Optional[str]:
    """A clear message when ``error`` (or its cause) is OmegaConf's unknown-key error."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    while error is not None:
        if isinstance(error, (ConfigAttributeError, ConfigKeyError)) and getattr(error, "full_key", None):
            *parents, key = str(error.full_key).split(".")
            section = sections().get(".".join(parents))
            if section is not None:
                names = [f.name for f in dataclasses.fields(section)]
                return unknown_key_message(".".join(parents) or "config", key, names)
        error = error.__cause__ or error.__context__
    return None


def refuse_unknown_keys(node: Any, schema: type, section: str = "") -> None:
    """ConfigError for the first key of ``node`` that ``schema`` lacks (Hydra's ``+key=`` adds any key).

    Mapping fields (env, sbatch_extra, network.extra) take any key; nested sections are checked in turn.
    """
    hints = typing.get_type_hints(schema)
    if default_target(schema) not in (None, node.get(TARGET, default_target(schema))):
        return  # the user's target: its keys are its arguments, checked against its signature
    for key in node.keys():
        if key not in hints:
            raise ConfigError(unknown_key_message(section or "config", str(key), hints))
        if dataclasses.is_dataclass(hints[key]) and node[key] is not None:
            refuse_unknown_keys(node[key], hints[key], f"{section}.{key}".lstrip("."))


def compose_config(overrides: Sequence[str] = (), config_dir: Path = CONF_DIR) -> Config:
    """Compose ``config.yaml`` with ``overrides`` and validate every section; ConfigError if bad."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            composed = compose("config", overrides=searchpath_overrides() + target_overrides(overrides))
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise config_error(e) from e
    return config_from_composed(composed)


def searchpath_overrides() -> list[str]:
    """The Hydra override that adds the user's and the site's profile folders to the config search path (none
    without any)."""
    search = [f"file://{d}" for d in config_dirs()]
    return [f"hydra.searchpath=[{','.join(search)}]"] if search else []


def config_from_composed(composed: Any) -> Config:
    """The checked Config of a composed DictConfig (its ``hydra`` node, if any, left out); ConfigError if bad."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    try:
        if "hydra" in composed:
            composed = composed.copy()
            with open_dict(composed):
                del composed["hydra"]
        refuse_unknown_keys(composed, Config)
        root = OmegaConf.to_object(composed)  # runs every typed section's __post_init__ checks
        values = {field.name: getattr(root, field.name) for field in dataclasses.fields(root)}
        hints = typing.get_type_hints(Config)
        for name in TARGET_SECTIONS:
            values[name] = build_section(hints[name], values[name])
        return Config(**values)
    except ConfigError:
        raise
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise config_error(e) from e


def config_error(error: BaseException) -> ConfigError:
    """The ConfigError to raise for a Hydra or OmegaConf error: the section's own, or a clear message."""
    if isinstance(error.__cause__, ConfigError):
        return error.__cause__
    return ConfigError(_unknown_key(error) or _missing_choice(error) or _describe(error))


def _missing_choice(error: BaseException) -> Optional[str]:
    """A clear message, with a close match, when ``error`` (or its cause) is Hydra's missing group option."""
    from hydra.errors import MissingConfigException

    while error is not None:
        if isinstance(error, MissingConfigException) and error.options and "/" in (error.missing_cfg_file or ""):
            group, _, name = str(error.missing_cfg_file).rpartition("/")
            return choice_message(group, name, [o for o in error.options if o != "schema"])
        error = error.__cause__ or error.__context__
    return None


def choice_message(group: str, name: str, choices: Sequence[str]) -> str:
    """The message for a config group option that does not exist: a close match and every option."""
    close = difflib.get_close_matches(name, choices, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{group}={name}: no such option in group {group}{hint}; options: {', '.join(choices)}"


def _describe(error: BaseException) -> str:
    """Hydra's message with the first line of its cause (which names the bad value)."""
    message = str(error).strip()
    cause = error.__cause__
    if cause is not None and str(cause).strip() and str(cause).strip() not in message:
        message += ": " + str(cause).strip().splitlines()[0]
    return message


def config_to_dict(config: Any) -> dict[str, Any]:
    """A plain, JSON-ready dict of a Config (or any section)."""
    return dataclasses.asdict(config)
