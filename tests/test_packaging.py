"""hpcdl installed from its wheel, as most people install it, runs from any folder: configs are package data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_installed(site: Path, cwd: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """``command`` in ``cwd`` with the installed copy first on the path (ahead of the editable checkout)."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_wheel_copy_is_what_gets_imported(installed: Path, tmp_path: Path) -> None:
    done = run_installed(installed, tmp_path, sys.executable, "-c", "import hpcdl; print(hpcdl.__file__)")
    assert Path(done.stdout.strip()).is_relative_to(installed), done.stdout + done.stderr


def test_installed_wheel_submits_the_example_from_another_folder(installed: Path, tmp_path: Path,
                                                                  store: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run_installed(installed, elsewhere, sys.executable, "-m", "hpcdl.submit", "wait=true",
                         "training.max_epochs=1")  # the README's first command, one epoch to keep it short
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Primary config directory not found" not in done.stderr
    assert "stop_reason:         max-epochs" in done.stdout


@pytest.mark.parametrize(("script", "first_line"), [
    ("hpcdl-submit", "python -m hpcdl.submit [overrides]"),
    ("hpcdl-jobs", "usage: python -m hpcdl.jobs"),
    ("hpcdl-run", "python -m hpcdl.run [overrides]"),
])
def test_console_scripts_of_the_wheel_answer_help(installed: Path, tmp_path: Path, script: str,
                                                  first_line: str) -> None:
    done = run_installed(installed, tmp_path, str(installed / "bin" / script), "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(first_line)
