"""The README's and the --help's examples that name cluster=slurm run as written on the real test cluster (with
the placeholders, shrinking overrides and skips of tests/written_examples.py); the README's sweep block runs whole,
its jobs commands against the sweep it submitted."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_slurm import slurm_cluster  # noqa: F401  (the cluster must answer)
from tests.written_examples import HELP_COMMANDS, Workspace, help_examples, needs_slurm, readme_examples, skip_reason

pytestmark = pytest.mark.slurm


def test_every_slurm_example_runs_as_written_on_the_test_cluster(tmp_path: Path, digits_root: Path) -> None:
    workspace = Workspace(tmp_path, digits_root)
    helps = {command: workspace.shell(command).stdout for command in HELP_COMMANDS if "submit" in command or "pool" in command}
    examples = [e for e in readme_examples() + help_examples(helps)
                if not skip_reason(e) and (needs_slurm(e) or "SWEEP_ID" in e.text)]
    assert any("SWEEP_ID" in e.text for e in examples) and any("my_app.py" in e.text for e in examples)
    failures = workspace.run_all(examples)
    failures += [f"job {job}: {state}" for job, state in workspace.settle().items()]
    assert not failures, "\n\n".join(failures)
