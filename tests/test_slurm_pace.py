"""Stragglers on the real Slurm cluster: a rank on n2 throttled by a busy loop is flagged, a healthy two-node run
is not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.pace_parts import write_slow_net
from tests.test_slurm import slurm_cluster  # noqa: F401

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.mark.parametrize("slow_rank", [1, -1])
def test_a_throttled_rank_on_another_node_is_a_straggler_and_a_healthy_run_has_none(
        store: Path, digits_root: Path, tmp_path: Path, slow_rank: int) -> None:
    user = write_slow_net(tmp_path / "user")
    submitted = _cli(user, "hpcdl.submit", "cluster=slurm", "cluster.nodes=2", f"data.root={digits_root}",
                     "training.execution_environment=parallel", "training.max_epochs=2", "training.mini_batch_size=16",
                     "training.verbose=false", "cluster.straggler_window_s=5", "cluster.time=00:10:00",
                     "model._target_=slownet.SlowNet", f"+model.slow_rank={slow_rank}", "+model.busy_s=0.03")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[2]
    assert _cli(user, "hpcdl.jobs", "wait", job_id, "--timeout", "300").stdout.strip() == "COMPLETED"
    shown = _cli(user, "hpcdl.jobs", "show", job_id).stdout
    ranks = {line.split()[1]: line for line in shown.splitlines() if line.startswith("  rank ")}
    assert len(ranks) == 2 and "effective " in shown, shown
    if slow_rank == 1:
        assert "STRAGGLER" in ranks["1"] and " n2 " in ranks["1"] and "STRAGGLER" not in ranks["0"], shown
    else:
        assert "STRAGGLER" not in shown, shown
