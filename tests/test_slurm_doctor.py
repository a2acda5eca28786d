"""The job doctor on the real Slurm cluster (slurm/cluster.sh up): injected faults across two nodes, each with
what `jobs why` prints (root cause first), and how long after the fault the verdict was there."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hpcdl.store.files import FAILURE, FAILURES, MANIFEST, STACKS
from tests.faults import cli, heartbeat_of, root_line, submit, verdict_after, wait_for, write_faults
from tests.test_slurm import _launched_with, slurm_cluster  # noqa: F401 - the fixture

pytestmark = pytest.mark.slurm
ON_SLURM = ("cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=2", "cluster.time=00:10:00",
            "cluster.mem=1000M", "cluster.heartbeat_timeout_s=5")


def _record(folder: Path, rank: int) -> dict:
    return json.loads((folder / FAILURES / FAILURE.format(rank=rank)).read_text())


def test_an_exception_on_rank_1_of_4_is_the_root_cause_on_slurm(store: Path, tmp_path: Path) -> None:
    user = write_faults(tmp_path / "user")
    job_id = submit(user, "entry=faults:raise_on_rank_1", *ON_SLURM, "cluster.collective_timeout_s=10")
    folder = store / job_id
    why, _ = verdict_after(user, folder, job_id, time.time())
    assert root_line(why).startswith("root cause: rank 1 on n1 (pid ") and \
        root_line(why).endswith("ValueError: rank 1 fails on purpose"), why
    assert 'faults.py", line 21, in raise_on_rank_1' in why, why
    wait_for(lambda: (folder / FAILURES / FAILURE.format(rank=0)).is_file(), 120, "rank 0 timed out")
    why = cli(user, "hpcdl.jobs", "why", job_id).stdout
    assert root_line(why).endswith("ValueError: rank 1 fails on purpose"), why
    assert "rank 0 on n1" in why.split("victims (")[1] and "imed out" in why.split("victims (")[1], why
    assert _record(folder, 0)["time"] - _record(folder, 1)["time"] > 9
    assert "cause     rank 1 on n1" in cli(user, "hpcdl.jobs", "show", job_id).stdout


def test_a_rank_killed_with_kill_9_on_slurm_is_named_from_sruns_words(store: Path, tmp_path: Path) -> None:
    user = write_faults(tmp_path / "user")
    job_id = submit(user, "entry=faults:steps_forever", *ON_SLURM)
    folder = store / job_id
    wait_for(lambda: heartbeat_of(folder, 3).get("steps", 0) > 2, 180, "rank 3 made steps")
    beat = heartbeat_of(folder, 3)
    killed = time.time()
    os.kill(beat["pid"], signal.SIGKILL)
    why, ended_s = verdict_after(user, folder, job_id, killed)
    assert root_line(why) == f"root cause: rank 3 on {beat['host']} (pid {beat['pid']}): Signal: Killed (srun)", why
    assert ended_s < 30, ended_s
    print(f"slurm kill -9: the job ended (and the verdict was there) {ended_s:.1f} s after the kill")


def test_a_rank_sleeping_before_an_all_reduce_on_slurm_is_named_with_its_stack(
        store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAULT_NAP_S", "600")
    user = write_faults(tmp_path / "user")
    job_id = submit(user, "entry=faults:steps_forever", *ON_SLURM, "cluster.hang_timeout_s=5",
                    "cluster.collective_timeout_s=120", "cluster.export=[FAULT_NAP_S]")
    folder = store / job_id
    wait_for(lambda: heartbeat_of(folder, 2).get("steps", 0) >= 5, 180, "rank 2 reached its nap")
    napping = time.time()
    why, ended_s = verdict_after(user, folder, job_id, napping)
    assert root_line(why).startswith("root cause: rank 2 on n2 (pid ") and "Hang: not in the collective" in why, why
    assert "in nap_before_all_reduce" in why and "ranks 0,1,3: waiting in all_reduce" in why, why
    assert len(list((folder / STACKS).glob("rank*.json"))) == 4
    assert ended_s < 30, ended_s
    print(f"slurm hang: the verdict and the job's end {ended_s:.1f} s after the nap began (hang_timeout_s=5)")


def test_a_script_rank_sleeping_before_an_all_reduce_on_slurm_is_named_with_its_stack(store: Path,
                                                                                    tmp_path: Path) -> None:
    """A 2-rank script (one rank a node) that reports its steps with hpcdl.report; rank 1 naps before an all-reduce."""
    user = write_faults(tmp_path / "user")
    job_id = submit(user, "script=stepping_script.py", *ON_SLURM, "cluster.tasks_per_node=1",
                    "cluster.hang_timeout_s=5", "cluster.collective_timeout_s=90")
    folder = store / job_id
    wait_for(lambda: heartbeat_of(folder, 1).get("steps", 0) >= 5, 180, "rank 1 reached its nap")
    napping = time.time()
    why, ended_s = verdict_after(user, folder, job_id, napping)
    host = heartbeat_of(folder, 1)["host"]
    assert root_line(why).startswith(f"root cause: rank 1 on {host} (pid ") and "Hang: not in the collective" in why, why
    assert 'stepping_script.py", line 10, in nap_before_all_reduce' in why, why
    assert "rank 0: waiting in all_reduce" in why and "OUTLIER rank 1" in why, why
    assert ended_s < 40, ended_s
    print(f"slurm script hang: the verdict and the job's end {ended_s:.1f} s after the nap began (hang_timeout_s=5)")


def test_jobs_stacks_reaches_every_rank_on_both_nodes(store: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAULT_NAP_S", "600")
    user = write_faults(tmp_path / "user")
    job_id = submit(user, "entry=faults:steps_forever", *ON_SLURM, "cluster.export=[FAULT_NAP_S]")
    folder = store / job_id
    try:
        wait_for(lambda: heartbeat_of(folder, 2).get("steps", 0) >= 5, 180, "rank 2 reached its nap")
        shown = cli(user, "hpcdl.jobs", "stacks", job_id)
        assert shown.returncode == 0 and f"job {job_id}: stacks of 4 of 4 rank(s)" in shown.stdout, shown
        assert "--- ranks 0,1,3 (waiting in all_reduce) ---" in shown.stdout, shown.stdout
        assert "--- OUTLIER rank 2 ---" in shown.stdout and "in nap_before_all_reduce" in shown.stdout, shown.stdout
        hosts = {json.loads(p.read_text())["host"] for p in (folder / STACKS).glob("rank*.json")}
        assert hosts == {"n1", "n2"}, hosts
    finally:
        cli(user, "hpcdl.jobs", "cancel", job_id)


def test_a_scripts_own_traceback_is_the_verdict_on_slurm(store: Path, tmp_path: Path) -> None:
    user = write_faults(tmp_path / "user")
    job_id = submit(user, "script=failing_script.py", *ON_SLURM, "cluster.collective_timeout_s=10")
    why, _ = verdict_after(user, store / job_id, job_id, time.time())
    assert root_line(why).startswith("root cause: rank 1 on n1") and \
        root_line(why).endswith("ValueError: bad value 7 on purpose"), why
    assert 'failing_script.py", line 8, in check' in why and "[rank1]" not in why, why


def test_an_mpi_rank_killed_with_kill_9_on_slurm_is_named(store: Path, tmp_path: Path, digits_root: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    extra = _launched_with("mpi", monkeypatch)
    job_id = submit(tmp_path, *ON_SLURM, "cluster.tasks_per_node=1", "training.execution_environment=parallel",
                    "training.comm=mpi", f"data.root={digits_root}", "training.max_epochs=1000",
                    "training.mini_batch_size=16", "training.verbose=false", *extra)
    folder = store / job_id
    wait_for(lambda: heartbeat_of(folder, 1).get("steps", 0) > 2, 180, "rank 1 trained")
    beat = heartbeat_of(folder, 1)
    killed = time.time()
    os.kill(beat["pid"], signal.SIGKILL)
    why, ended_s = verdict_after(tmp_path, folder, job_id, killed)
    assert root_line(why).startswith(f"root cause: rank 1 on {beat['host']} (pid {beat['pid']})") and \
        "Signal: signal 9 (Killed) (mpirun)" in root_line(why), why
    print(f"slurm mpi kill -9: the job ended {ended_s:.1f} s after the kill")


def test_a_doctor_that_times_out_on_slurm_leaves_no_job_in_the_queue(store: Path, tmp_path: Path) -> None:
    done = cli(tmp_path, "hpcdl.doctor", "cluster=slurm", "cluster.nodes=2", "--timeout", "1")
    assert done.returncode == 1 and "error: no report within 1 s; job " in done.stderr, (done.stdout, done.stderr)
    job_id = re.search(r"^job (\S+): checking 2 node", done.stdout, re.M).group(1)
    slurm_id = json.loads((store / job_id / MANIFEST).read_text())["backend_id"]

    def queued() -> str:
        return subprocess.run(["squeue", "-h", "-j", slurm_id, "-o", "%T"], capture_output=True, text=True).stdout

    wait_for(lambda: queued().strip() == "", 30, f"Slurm job {slurm_id} left the queue")
    assert cli(tmp_path, "hpcdl.jobs", "wait", job_id, "--timeout", "30").stdout.strip() == "CANCELLED"

