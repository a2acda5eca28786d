"""A third backend (hpcdl/cluster/spawn.py) is one module and one profile: found by name, run, judged, cancelled.

The spawn backend names a job 'PID@HOSTNAME' and judges it by that pid's command line, where the local backend
names it by pid, start time and host key: the same life from the login node, another state model.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hpcdl
from hpcdl.cluster import backend_for
from hpcdl.config import ClusterConfig
from hpcdl.errors import ConfigError
from tests.conftest import job_folders

ROOT = Path(__file__).resolve().parent.parent
SPAWN_FILES = {ROOT / "hpcdl" / "cluster" / "spawn.py", ROOT / "hpcdl" / "conf" / "cluster" / "spawn.yaml"}


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, check=check, timeout=300)


def add(a: int, b: int) -> int:
    return a + b


def test_a_function_job_runs_under_its_pid_and_host_name(store: Path) -> None:
    job = hpcdl.batch(add, 2, 40, cluster="spawn")
    assert re.fullmatch(rf"\d+@{re.escape(socket.gethostname())}", job.backend_id), job.backend_id
    assert job.result(timeout=120) == 42
    listing = _cli("hpcdl.jobs", "list").stdout
    assert job.id in listing and "COMPLETED" in listing and job.backend_id in listing


def test_a_running_job_is_judged_by_its_command_line_and_cancelled(store: Path) -> None:
    job = hpcdl.batch(time.sleep, 300, cluster="spawn")
    deadline = time.monotonic() + 60
    while job.refresh().status.get("state") != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.2)
    pid = int(job.backend_id.split("@")[0])
    assert str(job.folder) in Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    assert job.refresh().state == "RUNNING"
    assert _cli("hpcdl.jobs", "cancel", job.id).stdout.strip().endswith("state now CANCELLED")
    assert "state     CANCELLED  (cancelled with hpcdl)" in _cli("hpcdl.jobs", "show", job.id).stdout
    assert Path(f"/proc/{pid}/cmdline").exists() is False or Path(f"/proc/{pid}/cmdline").read_bytes() == b""


def test_a_job_killed_without_a_result_is_failed(store: Path) -> None:
    job = hpcdl.batch(os.kill, 0, signal.SIGKILL, cluster="spawn")  # pid 0: its own process group
    assert job.wait(timeout=60) == "FAILED"
    assert "ended without a result" in job.refresh().reason


def test_another_hosts_job_shows_its_last_recorded_state(store: Path) -> None:
    job = hpcdl.batch(add, 1, 1, cluster="spawn")
    assert job.wait(timeout=120) == "COMPLETED"
    record = job.refresh()
    record.manifest["backend_id"] = "1@another-host"
    assert backend_for("spawn").live_states([record]) == {record.id: None}


def test_a_scheduler_setting_is_refused_before_submission(store: Path) -> None:
    for profile in ("local", "spawn"):
        done = _cli("hpcdl.submit", f"cluster={profile}", "cluster.partition=gpu", "dry_run=true", check=False)
        assert done.returncode == 2
        assert f"cluster.partition: a Slurm setting, but cluster.backend={profile}" in done.stderr
    done = _cli("hpcdl.submit", "cluster=spawn", "cluster.nodes=2", check=False)
    assert done.returncode == 2 and "cluster.nodes: must be 1 with backend=spawn, got 2" in done.stderr
    assert job_folders(store) == []


def test_an_unknown_backend_is_a_clear_error_before_submission(store: Path) -> None:
    with pytest.raises(ConfigError, match="cluster.backend: 'pbs' is not allowed; choose one of local, slurm, spawn"):
        ClusterConfig(backend="pbs")
    for name, message in (("pbs", "'pbs' names no backend (a module hpcdl/cluster/pbs.py exporting BACKEND)"),
                          ("local.x", "'local.x' is not a backend's name"), ("__init__", "not a backend's name")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            backend_for(name)
    done = _cli("hpcdl.submit", "cluster.backend=pbs", check=False)
    assert done.returncode == 2 and "choose one of local, slurm, spawn" in done.stderr
    assert job_folders(store) == []


def test_nothing_but_its_module_and_profile_names_the_third_backend() -> None:
    named = [str(path.relative_to(ROOT)) for folder in ("hpcdl", "hydra_plugins") for path in (ROOT / folder).rglob("*")
             if path.is_file() and path.suffix in (".py", ".yaml") and path not in SPAWN_FILES
             and re.search(r"\bspawn\b", path.read_text())]
    assert named == []


def test_no_code_outside_the_backends_asks_which_backend_it_has() -> None:
    """No backend compared with a backend's name (backend == "slurm", profile.backend != "local", ...) outside
    hpcdl/cluster/."""
    names = {"local", "slurm", "spawn"}
    asked = []
    for path in [*(ROOT / "hpcdl").rglob("*.py"), *(ROOT / "hydra_plugins").rglob("*.py")]:
        if path.parent.name == "cluster":
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Compare) and "backend" in (ast.get_source_segment(source, node) or ""):
                constants = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)}
                if names & constants:
                    asked.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert asked == []


SWEEP_APP = '''
import time

import hydra


@hydra.main(version_base=None, config_path=".", config_name="config")
def main(cfg):
    time.sleep(cfg.nap)
    if cfg.x == 2:
        raise ValueError(f"point x={cfg.x} fails on purpose")
    return cfg.x * cfg.x


if __name__ == "__main__":
    main()
'''


def test_a_sweep_runs_its_points_under_one_spawned_runner_judged_by_its_command_line(store: Path,
                                                                                      tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("x: 0\nnap: 0\n")
    (tmp_path / "app.py").write_text(SWEEP_APP)
    done = subprocess.run([sys.executable, "app.py", "-m", "hydra/launcher=hpcdl", "hydra.launcher.cluster=spawn",
                           "hydra.launcher.parallelism=1", "x=0,1,2", "nap=2"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    found = re.search(r"Submitted sweep (\S+):", done.stdout)
    assert done.returncode == 0 and found, done.stdout + done.stderr
    sweep = found.group(1)
    record = hpcdl.Job.attach(sweep).refresh()
    assert backend_for("spawn").live_states([record]) == {sweep: "RUNNING"}  # one point at a time: 6 s at least
    waited = _cli("hpcdl.jobs", "wait", sweep, check=False).stdout
    assert waited.splitlines()[-1] == "FAILED" and "3 of 3 points done (2 COMPLETED, 1 FAILED)" in waited, waited
    runner = record.backend_id
    assert re.fullmatch(rf"\d+@{re.escape(socket.gethostname())}", runner), runner
    deadline = time.monotonic() + 30
    while backend_for("spawn").live_states([record]) and time.monotonic() < deadline:  # the runner ends after its
        time.sleep(0.2)  # last point
    assert backend_for("spawn").live_states([record]) == {}
    assert {hpcdl.Job.attach(f"{sweep}_{x}").refresh().backend_id for x in range(3)} == {runner}
    shown = _cli("hpcdl.jobs", "show", sweep).stdout
    for x in (0, 1):
        assert re.search(rf"^{x}\s+x={x}\s+COMPLETED\s.*\s{x * x}$", shown, re.M), shown
    assert f"point 2 ({sweep}_2) FAILED: rank 0: ValueError: point x=2 fails on purpose" in shown, shown
    assert re.search(rf"^{sweep}\s+\S+\s+spawn\s+FAILED\s", _cli("hpcdl.jobs", "list").stdout, re.M)
