"""Credentials travel by name, never by value: the rules that keep them out of scripts, manifests and logs.

A job that needs a token lists its variable in ``cluster.secrets``; the value goes from the submitting
shell to the ranks through the scheduler's environment (Slurm's ``--export=NAME``, the local process
environment) and is never written to a file. Any other option that names a credential-like variable, or
that holds the value of a secret from this shell, is refused before anything is submitted.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Iterable, Mapping, Optional

from hpcdl.errors import ConfigError

SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MIN_SECRET_LENGTH = 8
"""Shorter values (0, true, a port) are too common to be told apart from a secret's."""


def is_secret(name: str) -> bool:
    """True for variable names that may hold credentials: they never enter scripts or the store."""
    return any(word in name.upper() for word in SECRET_WORDS)


def check_variable_names(names: Iterable[str], option: str) -> None:
    """ConfigError unless every name is a shell variable name that does not look like a credential."""
    for name in names:
        if not VARIABLE_NAME.match(name):
            raise ConfigError(f"{option}: {name!r} is not a variable name (letters, digits, _; not a digit first)")
        if is_secret(name):
            raise ConfigError(f"{option}: {name} looks like a secret (its name holds one of "
                              f"{', '.join(SECRET_WORDS)}); secrets never go into job scripts or the store: "
                              f"pass it by name with cluster.secrets: [{name}]")


def check_single_line(value: Optional[str], option: str) -> None:
    """ConfigError when ``value`` holds a control character (a newline would add lines to a job script)."""
    if value is not None and any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ConfigError(f"{option}: {value!r} holds a control character (newline, tab, ...); not allowed")


def check_secrets_set(names: Iterable[str], environ: Optional[Mapping[str, str]] = None) -> None:
    """ConfigError for a declared secret that the submitting shell does not have."""
    environ = os.environ if environ is None else environ
    missing = [name for name in names if not environ.get(name)]
    if missing:
        raise ConfigError(f"cluster.secrets: {', '.join(missing)} not set in this shell; export "
                          f"{'it' if len(missing) == 1 else 'them'} before submitting (the value travels by name)")


def check_no_secret_values(tree: Any, where: str, declared: Iterable[str],
                           environ: Optional[Mapping[str, str]] = None) -> None:
    """ConfigError naming the option when any string in ``tree`` (dataclasses, dicts, lists) holds the value
    of a declared secret or of a credential-like variable of the submitting shell."""
    environ = os.environ if environ is None else environ
    names = set(declared) | {name for name in environ if is_secret(name)}
    values = {environ[name]: name for name in sorted(names)
              if len(environ.get(name, "")) >= MIN_SECRET_LENGTH}
    if not values:
        return
    for option, text in _strings(tree, where):
        for value, name in values.items():
            if value in text:
                raise ConfigError(f"{option}: holds the value of {name} from this shell; a secret never goes "
                                  f"into job scripts, manifests or logs: list {name} in cluster.secrets and "
                                  "leave its value out")


def _strings(tree: Any, where: str) -> Iterable[tuple[str, str]]:
    """Every string (keys too) in ``tree`` with the dotted option name it sits at."""
    if isinstance(tree, str):
        yield where, tree
    elif dataclasses.is_dataclass(tree):
        for field in dataclasses.fields(tree):
            yield from _strings(getattr(tree, field.name), f"{where}.{field.name}".lstrip("."))
    elif isinstance(tree, Mapping):
        for key, value in tree.items():
            yield from _strings(key, f"{where} (a key)")
            yield from _strings(value, f"{where}.{key}".lstrip("."))
    elif isinstance(tree, (list, tuple)):
        for n, value in enumerate(tree):
            yield from _strings(value, f"{where}[{n}]")
