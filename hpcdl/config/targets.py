"""Your own network and data by Hydra's convention: a section's ``_target_`` names a callable, its other keys
are the callable's arguments.

``model._target_=mypkg.nets.MyNet +model.depth=34`` trains ``MyNet(depth=34)``. The built-in networks and
datastores are themselves targets (the defaults). A target is imported and its arguments are bound to its
signature at submission, so an unimportable target or a misspelt argument is refused before anything runs.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from hpcdl.errors import ConfigError

TARGET_SECTIONS = ("model", "data")
"""The sections whose ``_target_`` may name the user's own code."""
TARGET = "_target_"
IMPORT_TIMEOUT_S = float(os.environ.get("HPCDL_IMPORT_TIMEOUT_S", "120"))
"""How long a user's module may take to import before it is refused ($HPCDL_IMPORT_TIMEOUT_S, seconds)."""


def _import(module_name: str, target: str, option: str) -> Any:
    """Import the user's ``module_name``: ConfigError when it raises anything (SystemExit and
    KeyboardInterrupt included: an import must not end the submission silently) or does not finish within
    IMPORT_TIMEOUT_S. The import runs in a thread so that a hanging one cannot hang the submission."""
    if module_name in sys.modules:
        return sys.modules[module_name]
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["module"] = importlib.import_module(module_name)
        except BaseException as e:  # noqa: B036 - the user's module may raise or exit anything on import
            outcome["error"] = e

    importer = threading.Thread(target=run, name=f"import {module_name}", daemon=True)
    importer.start()
    importer.join(IMPORT_TIMEOUT_S)
    if importer.is_alive():
        raise ConfigError(f"{option}: importing {module_name!r} for {target!r} did not finish within "
                          f"{IMPORT_TIMEOUT_S:g} s (does it wait for input, a lock or the network at import?)")
    error = outcome.get("error")
    if isinstance(error, SystemExit):
        raise ConfigError(f"{option}: importing {module_name!r} for {target!r} called sys.exit({error.code!r}); "
                          "a module must not exit when imported") from None
    if error is not None:
        raise ConfigError(f"{option}: cannot import {module_name!r} for {target!r}: "
                          f"{type(error).__name__}: {error}") from error
    return outcome["module"]


def locate(target: str, option: str) -> Callable[..., Any]:
    """The callable a dotted path (``pkg.mod.Name`` or ``pkg.mod:Name``) names; ConfigError with the import
    error when it does not import."""
    module_name, _, attribute = target.replace(":", ".").rpartition(".")
    if not module_name or not attribute or not all(part.isidentifier() for part in target.replace(":", ".").split(".")):
        raise ConfigError(f"{option}: {target!r} is not a dotted path such as mypkg.nets.MyNet")
    found = _import(module_name, target, option)
    if not hasattr(found, attribute):
        names = [n for n in dir(found) if not n.startswith("_")]
        close = difflib.get_close_matches(attribute, names, n=1)
        hint = f" (did you mean '{module_name}.{close[0]}'?)" if close else ""
        raise ConfigError(f"{option}: module {module_name!r} has no {attribute!r}{hint}")
    found = getattr(found, attribute)
    if not callable(found):
        raise ConfigError(f"{option}: {target!r} is a {type(found).__name__}, not a class or function")
    return found


def check_arguments(target: Callable[..., Any], arguments: Iterable[str], supplied: Sequence[str],
                    section: str) -> None:
    """ConfigError unless ``target`` accepts every key of ``arguments`` and gets every argument it requires,
    counting ``supplied`` (what hpcdl passes when the target takes it, such as num_classes)."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return  # a builtin without a signature: it will say so when called
    parameters = signature.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    named = [n for n, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    given = list(arguments)
    for key in given:
        if key not in named and not takes_any:
            close = difflib.get_close_matches(key, named, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{section}.{key}: {_name(target)} takes no argument {key!r}{hint}; "
                              f"it takes {', '.join(named) or 'none'}")
    missing = [n for n, p in parameters.items()
               if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
               and n not in given and n not in supplied]
    if missing:
        raise ConfigError(f"{section}: {_name(target)} needs {', '.join(missing)}; give "
                          + " ".join(f"+{section}.{n}=..." for n in missing))


def check_part(path: str, arguments: dict[str, Any], option: str, inputs: int) -> None:
    """ConfigError unless ``path`` imports as a class that takes ``arguments``, or as a function that takes
    ``inputs`` positional inputs and ``arguments`` as keywords (a loss, a transform)."""
    target = locate(path, option)
    if inspect.isclass(target):
        check_arguments(target, arguments, (), f"{option}_args")
        return
    try:
        names = list(inspect.signature(target).parameters)[:inputs]
    except (TypeError, ValueError):
        names = []
    check_arguments(target, arguments, names, f"{option}_args")


def build_part(path: str, arguments: dict[str, Any], option: str) -> Callable[..., Any]:
    """The class at ``path`` built with ``arguments``, or the function there given them as keywords."""
    target = locate(path, option)
    return target(**arguments) if inspect.isclass(target) else functools.partial(target, **arguments)


def supplied_arguments(target: Callable[..., Any], offered: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``offered`` (what hpcdl knows of the data) that ``target`` takes by name."""
    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return {}
    return {k: v for k, v in offered.items() if k in parameters}


def target_overrides(overrides: Sequence[str]) -> list[str]:
    """Overrides that set a section's ``_target_`` without choosing its group start that section empty.

    ``model._target_=mypkg.MyNet model.depth=34`` becomes ``~model +model._target_=mypkg.MyNet +model.depth=34``:
    the built-in network's keys (name, width) are not the user's network's arguments.
    """
    rewritten = list(overrides)
    for section in TARGET_SECTIONS:
        keys = {_key(o) for o in overrides}
        chooses_group = any(_key(o) == section for o in overrides)
        if f"{section}.{TARGET}" not in keys or chooses_group:
            continue
        prefix = f"{section}."
        rewritten = [f"+{o.lstrip('+')}" if _key(o).startswith(prefix) and not o.startswith("++") else o
                     for o in rewritten]
        rewritten.insert(0, f"~{section}")
    return rewritten


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _name(target: Callable[..., Any]) -> str:
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"


def check_entry(entry: str) -> str:
    """ConfigError unless ``entry`` (``pkg.mod:function``) imports and takes one argument, the config."""
    function = locate(entry, "entry")
    try:
        inspect.signature(function).bind(None)
    except TypeError:
        raise ConfigError(f"entry: {_name(function)}{inspect.signature(function)} must take one argument, "
                          "the config") from None
    except ValueError:
        pass  # no signature to read: it will say so when called
    return entry


def check_script(script: str) -> str:
    """The absolute path of ``script``; ConfigError unless it is a file."""
    path = Path(script).expanduser().absolute()
    if not path.is_file():
        raise ConfigError(f"script: {script} is not a file (looked for {path})")
    return str(path)
