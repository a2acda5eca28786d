"""The tree documents itself: its sections, field docstrings, the CLI help and the README's option tables.

    python -m hpcdl.config.help                            # the option list, as the CLIs' --help shows it
    python -m hpcdl.config.help --markdown                 # every section as a Markdown table
    python -m hpcdl.config.help --markdown --write README.md   # regenerate README's tables in place
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import re
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any, Optional, Sequence

from hpcdl.config.compose import CONF_DIR, compose_config, config_dirs, default_target
from hpcdl.config.fields import type_name
from hpcdl.config.root import Config, sections
from hpcdl.config.targets import TARGET, TARGET_SECTIONS
from hpcdl.errors import HpcdlError

ROOT = "config"  # the root section ("") in headings and README markers
MARKERS = re.compile(r"(<!-- options:([\w.]+) -->\n).*?(<!-- /options:\2 -->)", re.DOTALL)
MARKDOWN_SPECIAL = re.compile(r"[|*]")  # a cell's end, emphasis (NCCL_*, UCX_*)
DEFAULT_WIDTH = 24  # defaults longer than this (cluster.export) push their doc right instead of every row


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's attribute docstring (the string literal on the line under it), read from the source."""
    (tree,) = ast.parse(textwrap.dedent(inspect.getsource(cls))).body
    docs = {}
    for statement, following in zip(tree.body, tree.body[1:]):  # type: ignore[attr-defined]
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            docs[statement.target.id] = inspect.cleandoc(following.value.value)
    return docs


def section_doc(path: str) -> str:
    """One line on section ``path``: the parent's docstring of the field that holds it (the class's for the root)."""
    parent, _, name = path.rpartition(".")
    doc = field_docs(sections()[parent])[name] if path else inspect.getdoc(Config) or ""
    return doc.splitlines()[0]


def option_rows(path: str, values: Config) -> list[tuple[str, str, str, str]]:
    """(name, type, value in ``values``, whole doc) of each option of section ``path``; subsections left out."""
    cls, section = sections()[path], values
    for name in filter(None, path.split(".")):
        section = getattr(section, name)
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    return [(name, type_name(hint), show(getattr(section, name)), docs[name])
            for name, hint in hints.items() if not dataclasses.is_dataclass(hint)]


def show(value: Any) -> str:
    """``value`` as it is written in YAML and in overrides: null, true, [1, 2], {k: v}."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(show(v) for v in value)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    return str(value) if value != "" else '""'


def config_groups() -> dict[str, list[str]]:
    """Each config group (cluster, data, ...) and its options: the YAML files in hpcdl/conf/ and the user's folders."""
    groups: dict[str, set[str]] = {}
    for folder in [CONF_DIR, *config_dirs()]:
        for group in (d for d in folder.iterdir() if d.is_dir()):
            groups.setdefault(group.name, set()).update(f.stem for f in group.glob("*.yaml"))
    return {name: sorted(choices) for name, choices in sorted(groups.items())}


def default_choices() -> dict[str, str]:
    """The option hpcdl/conf/config.yaml's defaults list picks in each group."""
    from omegaconf import OmegaConf

    entries = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"))["defaults"]  # type: ignore[index]
    return {k: v for entry in entries if isinstance(entry, dict) for k, v in entry.items()}


def help_text(usage: str, values: Config) -> str:
    """A CLI's --help: ``usage``, the config groups, then every option with its type, value in ``values`` and doc."""
    chosen = default_choices()
    lines = [usage.strip(), "",
             "Overrides are Hydra's: key=value sets an option, group=option picks a file, +key=value adds a",
             "mapping key (cluster.env, ...). --cfg job prints the composed config and exits; -h/--help this.",
             "", "Config groups (hpcdl/conf/, $HPCDL_CONFIG_DIR, ~/.config/hpcdl, the site's /etc/hpcdl; * marks the "
             "default):"]
    for group, choices in config_groups().items():
        lines.append(f"  {group:<10}" + ", ".join(c + "*" * (chosen.get(group) == c) for c in choices))
    lines += ["", "Options (key, type, value as composed with the overrides given, doc):"]
    for path in sections():
        rows = [(f"{path}.{name}".lstrip("."), *rest) for name, *rest in option_rows(path, values)]
        widths = [max(len(row[i]) for row in rows) for i in range(2)] + [
            min(DEFAULT_WIDTH, max(len(row[2]) for row in rows))]
        lines += ["", f"{path or ROOT}: {section_doc(path)}"]
        indent = " " * (2 + widths[0] + 2 + widths[1] + 2 + widths[2] + 2)  # the doc column: a doc's further lines
        lines += [f"  {key:<{widths[0]}}  {kind:<{widths[1]}}  {value:<{widths[2]}}  "
                  + doc.replace("\n", "\n" + indent) for key, kind, value, doc in rows]
    return "\n".join(lines)


def markdown_table(path: str) -> str:
    """Section ``path``'s options as a Markdown table, with the tree's defaults."""
    rows = ["| option | type | default | description |", "|---|---|---|---|"]
    for name, kind, value, doc in option_rows(path, Config()):
        escaped = MARKDOWN_SPECIAL.sub(r"\\\g<0>", " ".join(doc.split()))  # the whole doc, on the row's one line
        rows.append(f"| `{name}` | {kind} | `{value}` | {escaped} |")
    return "\n".join(rows) + "\n"


def markdown_tables(text: str) -> str:
    """``text`` with every table between ``<!-- options:SECTION -->`` markers regenerated."""
    def table(match: re.Match[str]) -> str:
        path = "" if match[2] == ROOT else match[2]
        if path not in sections():
            raise ValueError(f"options:{match[2]}: no such section; one of {', '.join(p or ROOT for p in sections())}")
        return match[1] + markdown_table(path) + match[3]

    return MARKERS.sub(table, text)


def help_or_cfg(argv: Sequence[str], usage: str) -> Optional[int]:
    """Answer -h/--help (the help) or --cfg job|all (the composed config as YAML) if ``argv`` asks; else None.

    Returns the exit code: 0, or 2 with the error on stderr for a bad override or ``--cfg hydra``
    (these CLIs compose with Hydra's compose API and run no Hydra application, so there is no hydra config).
    """
    rest: list[str] = []
    what, wants_help = None, False
    args = iter(argv)
    for arg in args:
        if arg in ("-h", "--help"):
            wants_help = True
        elif arg in ("--cfg", "-c") or arg.startswith("--cfg="):
            what = arg.partition("=")[2] or next(args, "")
        else:
            rest.append(arg)
    if not wants_help and what is None:
        return None
    try:
        if what not in (None, "job", "all"):
            raise HpcdlError(f"--cfg {what}: use --cfg job (or all); hpcdl runs no Hydra application, "
                             "so there is no hydra config to print")
        config = compose_config(rest)
    except HpcdlError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if wants_help:
        print(help_text(usage, config))
    else:
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(applying(config)), end="")
    return 0


def applying(config: Config) -> dict[str, Any]:
    """``config`` as a dict of what applies: a section with the user's ``_target_`` holds the target, the keys
    it keeps beside one and the target's arguments, not the built-in's options; a built-in one has no args."""
    shown = dataclasses.asdict(config)
    for name in TARGET_SECTIONS:
        section = getattr(config, name)
        if section._target_ == default_target(type(section)):
            shown[name].pop("args")
        else:
            kept = getattr(section, "KEPT_WITH_TARGET", ())
            shown[name] = {TARGET: section._target_, **{k: shown[name][k] for k in kept}, **section.args}
    return shown


def main(argv: list[str]) -> int:
    """python -m hpcdl.config.help [--markdown [--write FILE]]."""
    parser = argparse.ArgumentParser(prog="python -m hpcdl.config.help", description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="every section as a Markdown table")
    parser.add_argument("--write", type=Path, help="regenerate the tables between the markers in this file")
    args = parser.parse_args(argv)
    if args.write:
        args.write.write_text(markdown_tables(args.write.read_text()))
    elif args.markdown:
        print("\n".join(f"### {path or ROOT}\n\n{markdown_table(path)}" for path in sections()))
    else:
        return help_or_cfg(["--help"], __doc__) or 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
