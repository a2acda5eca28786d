"""Typed option dataclasses: unknown keys, wrong types and bad values raise ConfigError.

Every section of hpcdl's config is a keyword-only dataclass decorated with
``@options``. Its generated ``__init__`` rejects unknown keys with the list of
valid ones, and ``__post_init__`` checks each field's type against its
annotation before the section's own value rules run.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from typing import Any, Callable, Iterable, TypeVar

from hpcdl.errors import ConfigError

T = TypeVar("T")


def options(section: str) -> Callable[[type[T]], type[T]]:
    """Make ``cls`` a keyword-only dataclass whose errors name ``section.field``."""

    def wrap(cls: type[T]) -> type[T]:
        cls = dataclasses.dataclass(kw_only=True)(cls)
        cls._section = section  # type: ignore[attr-defined]
        generated_init = cls.__init__

        @functools.wraps(generated_init)
        def __init__(self: Any, **kwargs: Any) -> None:
            valid = [f.name for f in dataclasses.fields(cls)]
            for key in kwargs:
                if key not in valid:
                    raise ConfigError(unknown_key_message(section, key, valid))
            generated_init(self, **kwargs)

        cls.__init__ = __init__  # type: ignore[method-assign]
        return cls

    return wrap


def unknown_key_message(section: str, key: str, valid: Iterable[str]) -> str:
    """The message for an unknown option: the key, a close match and every valid key."""
    valid = sorted(valid)
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"{section}: unknown option '{key}'{hint}; valid options: {', '.join(valid)}"


def check_types(obj: Any) -> None:
    """Raise ConfigError for the first field whose value does not match its annotation."""
    hints = typing.get_type_hints(type(obj))
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if not _matches(value, hints[field.name]):
            raise ConfigError(
                f"{obj._section}.{field.name}: expected {type_name(hints[field.name])}, "
                f"got {value!r} ({type(value).__name__})"
            )


def _matches(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin is typing.Union:
        return any(_matches(value, a) for a in args)
    if hint is type(None):
        return value is None
    if origin in (list, tuple):
        return isinstance(value, (list, tuple)) and all(_matches(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            _matches(k, args[0]) and _matches(v, args[1]) for k, v in value.items()
        )
    if dataclasses.is_dataclass(hint):
        return isinstance(value, hint)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        return " or ".join(type_name(a) for a in args)
    if origin in (list, tuple):
        return f"a list of {type_name(args[0])}"
    if origin is dict:
        return f"a mapping of {type_name(args[0])} to {type_name(args[1])}"
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))


def require_choice(obj: Any, name: str, allowed: Iterable[str]) -> None:
    """Raise ConfigError unless field ``name`` is one of ``allowed``."""
    allowed = list(allowed)
    value = getattr(obj, name)
    if value not in allowed:
        raise ConfigError(
            f"{obj._section}.{name}: {value!r} is not allowed; choose one of {', '.join(allowed)}"
        )


def require(obj: Any, name: str, ok: bool, rule: str) -> None:
    """Raise ConfigError naming ``section.name`` and the ``rule`` it breaks unless ``ok``."""
    if not ok:
        raise ConfigError(f"{obj._section}.{name}: must be {rule}, got {getattr(obj, name)!r}")


def restore(cls: type[T], data: dict[str, Any]) -> T:
    """Section ``cls`` rebuilt from its stored dict WITHOUT its checks: for a tree that was checked when made.

    Keys the class lacks are ignored; fields the dict lacks take their defaults.
    """
    hints = typing.get_type_hints(cls)
    section = object.__new__(cls)
    for spec in dataclasses.fields(cls):  # type: ignore[arg-type]
        if spec.name in data:
            value = data[spec.name]
            if dataclasses.is_dataclass(hints[spec.name]) and isinstance(value, dict):
                value = restore(hints[spec.name], value)
        elif spec.default is not dataclasses.MISSING:
            value = spec.default
        else:
            value = spec.default_factory()  # type: ignore[misc]
        object.__setattr__(section, spec.name, value)
    return section
