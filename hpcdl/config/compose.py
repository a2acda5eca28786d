"""Compose the config from conf/ and Hydra overrides into a validated Config object."""

from __future__ import annotations

import dataclasses
import os
import typing
from pathlib import Path
from typing import Any, Optional, Sequence

from hpcdl.config import Config
from hpcdl.config.fields import unknown_key_message
from hpcdl.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def user_config_dirs() -> list[Path]:
    """Folders of the user's own profiles and groups: $HPCDL_CONFIG_DIR, then ~/.config/hpcdl."""
    candidates = [os.environ.get("HPCDL_CONFIG_DIR"), Path.home() / ".config" / "hpcdl"]
    return [Path(c).expanduser().resolve() for c in candidates if c and Path(c).expanduser().is_dir()]


def register_configs() -> None:
    """Put the root schema into Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="hpcdl_schema", node=Config)


def _unknown_key(error: BaseException) -> Optional[str]:
    """A clear message when ``error`` (or its cause) is OmegaConf's unknown-key error."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    while error is not None:
        if isinstance(error, (ConfigAttributeError, ConfigKeyError)) and getattr(error, "full_key", None):
            *parents, key = str(error.full_key).split(".")
            from hpcdl.config.help import sections  # help reads compose's folders: imported here, not above

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
    for key in node.keys():
        if key not in hints:
            raise ConfigError(unknown_key_message(section or "config", str(key), hints))
        if dataclasses.is_dataclass(hints[key]):
            refuse_unknown_keys(node[key], hints[key], f"{section}.{key}".lstrip("."))


def compose_config(overrides: Sequence[str] = (), config_dir: Path = CONF_DIR) -> Config:
    """Compose ``config.yaml`` with ``overrides`` and validate every section; ConfigError if bad."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            search = [f"file://{d}" for d in user_config_dirs()]
            extra = [f"hydra.searchpath=[{','.join(search)}]"] if search else []
            composed = compose("config", overrides=extra + list(overrides))
        refuse_unknown_keys(composed, Config)
        return OmegaConf.to_object(composed)  # runs every section's __post_init__ checks
    except ConfigError:
        raise
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        inner = e.__cause__ if isinstance(e.__cause__, ConfigError) else None
        if inner is not None:
            raise inner from e
        raise ConfigError(_unknown_key(e) or _describe(e)) from e


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
