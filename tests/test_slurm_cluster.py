"""`slurm/cluster.sh running` against the real cluster: yes for the cluster the tests use, no (at once) for a
state folder whose own slurmctld does not answer, whatever else answers or runs. tests/run-all.sh asks it."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from tests.test_slurm import slurm_cluster  # noqa: F401 - the fixture

pytestmark = pytest.mark.slurm

CLUSTER_SH = Path(__file__).resolve().parents[1] / "slurm" / "cluster.sh"


def _running(state: Path | None = None) -> int:
    env = dict(os.environ)
    if state is not None:
        env["HPCDL_SLURM_STATE"] = str(state)
    return subprocess.run(["bash", str(CLUSTER_SH), "running"], env=env, capture_output=True, timeout=10).returncode


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_running_says_yes_for_the_cluster_the_tests_use() -> None:
    assert _running() == 0


@pytest.mark.parametrize("pid_file, conf", [(False, None), (True, None), (False, "answering"), (True, "silent")])
def test_running_says_no_for_a_state_folder_whose_own_controller_does_not_answer(
        tmp_path: Path, pid_file: bool, conf: str | None) -> None:
    state = tmp_path / "state"
    (state / "run").mkdir(parents=True)
    (state / "etc").mkdir()
    if pid_file:  # a stale pid file naming a process that lives: this test's
        (state / "run" / "slurmctld.pid").write_text(f"{os.getpid()}\n")
    if conf:  # the config of the cluster that answers, or the same naming a port nobody listens on
        text = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")).read_text()
        if conf == "silent":
            text = re.sub(r"(?m)^SlurmctldPort=.*$", f"SlurmctldPort={_unused_port()}", text)
        (state / "etc" / "slurm.conf").write_text(text)
    assert _running(state) == 1
