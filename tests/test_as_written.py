"""Every example a user reads runs as written, on this machine: the README's code blocks and commands and the
example commands of every --help (see tests/written_examples.py for what is substituted or skipped, and why).
Those that need the test cluster run in tests/test_slurm_as_written.py."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from tests.written_examples import HELP_COMMANDS, SKIPPED, Workspace, help_examples, readme_examples, runs_here

TIMING = re.compile(r"\d\d:\d\d:\d\d")  # the progress table's elapsed time: the one thing a rerun may change


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, digits_root: Path) -> Workspace:
    """A user's folder and an empty store holding the jobs the placeholders stand for."""
    workspace = Workspace(tmp_path_factory.mktemp("as-written"), digits_root)
    completed = workspace.shell("python -m hpcdl.submit wait=true training.max_epochs=1 model=mlp")
    assert completed.returncode == 0, completed.stderr
    cancelled = workspace.shell("python -m hpcdl.submit training.max_epochs=1 model=mlp")
    workspace.ids["completed"], workspace.ids["cancelled"] = completed.stdout.split()[2], cancelled.stdout.split()[2]
    workspace.shell(f"python -m hpcdl.jobs cancel {workspace.ids['cancelled']}")
    workspace.cancelled.clear()  # jobs resume ID must make it complete
    sweep = workspace.shell("python -m hpcdl.submit -m training.max_epochs=1 model=mlp,small_cnn")
    assert sweep.returncode == 0, sweep.stderr
    return workspace


def test_every_readme_example_runs_as_written(workspace: Workspace) -> None:
    examples = [e for e in readme_examples() if runs_here(e) and "train_network(train_set" not in e.text]  # twice below
    failures = workspace.run_all(examples)
    failures += [f"job {job}: {state}" for job, state in workspace.settle().items()]
    assert not failures, "\n\n".join(failures)


def test_every_help_answers_and_the_commands_it_shows_run_as_written(workspace: Workspace) -> None:
    helps = {command: workspace.shell(command) for command in HELP_COMMANDS}
    failures = [f"{command}: exit {done.returncode}\n{done.stderr}" for command, done in helps.items()
                if done.returncode != 0 or not done.stdout]
    examples = help_examples({c: done.stdout for c, done in helps.items()})
    failures += workspace.run_all([e for e in examples if runs_here(e)])
    failures += [f"job {job}: {state}" for job, state in workspace.settle().items()]
    assert not failures, "\n\n".join(failures)


def test_the_readme_training_snippet_prints_the_same_twice(workspace: Workspace) -> None:
    (snippet,) = [e for e in readme_examples() if "train_network(train_set" in e.text]
    runs = [workspace.run(snippet) for _ in range(2)]
    for done in runs:
        assert done.returncode == 0, done.stderr
    first, second = (TIMING.sub("hh:mm:ss", done.stdout) for done in runs)
    assert "validation accuracy" in first and first == second


def test_each_skip_names_an_example_and_says_why() -> None:
    examples = readme_examples() + help_examples({})
    for key, reason in SKIPPED.items():
        assert reason and any(key in e.text for e in examples), f"stale skip {key!r}: no example has it"


def test_every_jobs_subcommand_is_shown_and_each_of_its_arguments_described() -> None:
    from hpcdl import jobs

    (verbs,) = [a for a in jobs.parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for verb, sub in verbs.choices.items():
        assert f"python -m hpcdl.jobs {verb} " in jobs.__doc__ or f"python -m hpcdl.jobs {verb}\n" in jobs.__doc__, verb
        for action in sub._actions:
            assert action.help, f"python -m hpcdl.jobs {verb}: {action.option_strings or action.dest} is not described"


def test_the_readme_main_command_and_each_console_scripts_help_run_from_the_wheel(
        installed: Path, tmp_path: Path, digits_root: Path) -> None:
    workspace = Workspace(tmp_path, digits_root, installed=installed)
    main = next(e for e in readme_examples() if "hpcdl.submit" in e.text)  # the README's first command
    done = workspace.run(main)
    assert done.returncode == 0 and "stop_reason:" in done.stdout, done.stderr
    for command in (c for c in HELP_COMMANDS if c.startswith("hpcdl-")):
        done = workspace.shell(f"command -v {command.split()[0]} && {command}")
        assert done.returncode == 0 and done.stdout.startswith(str(installed)), f"{command}: {done.stderr}"
