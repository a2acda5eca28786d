"""Held pools on the real test cluster (slurm/cluster.sh up): python -m hpcdl.pool holds one allocation, jobs
given cluster.pool run as steps of it with no new Slurm job, an idle pool releases itself, pool stop ends its
running jobs CANCELLED (withdrawn if Slurm refuses the stop), a job the pool cannot hold is refused before anything
is submitted, and the holder does not release a pool that a submission claimed as it decided to."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdl.cluster.slurm_pool import holder_script
from tests.conftest import job_folders
from tests.test_slurm import _sacct_state, slurm_cluster  # noqa: F401 - the fixture

pytestmark = pytest.mark.slurm


def _hpcdl(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, check=check,
                          timeout=300)


@pytest.fixture
def work(tmp_path: Path, store: Path) -> Path:
    """A user's folder with a quick script and a long one."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "quick.py").write_text("import os\nprint('step', os.environ['SLURM_JOB_ID'], os.environ['SLURM_STEP_ID'])\n")
    (folder / "long.py").write_text("import time\ntime.sleep(600)\n")
    return folder


def _start(work: Path, name: str, *settings: str) -> str:
    """Start the pool ``name``; its held Slurm job id."""
    done = _hpcdl(work, "hpcdl.pool", "start", "cluster=slurm", f"name={name}", *settings, "--wait", "240")
    assert "RUNNING" in done.stdout, done.stdout + done.stderr
    return done.stdout.split("(Slurm job ")[1].split(")")[0]


def _submit(work: Path, pool: str, *overrides: str) -> str:
    done = _hpcdl(work, "hpcdl.submit", "cluster=slurm", f"cluster.pool={pool}", *overrides)
    return done.stdout.split()[2]


def _steps(held: str) -> dict[str, str]:
    """sacct's steps of the held job: name (an hpcdl job id) -> state."""
    lines = subprocess.run(["sacct", "-n", "-P", "-o", "JobID,JobName,State", "-j", held], capture_output=True,
                           text=True, check=True).stdout.splitlines()
    return {name: state for step, name, state in (line.split("|") for line in lines)
            if "." in step and not step.endswith((".batch", ".extern"))}


def _pool_row(work: Path, name: str) -> list[str]:
    listing = _hpcdl(work, "hpcdl.pool", "list", "cluster=slurm").stdout
    return next(line.split() for line in listing.splitlines() if line.split()[0] == name)


def _wait_state(work: Path, job_id: str, wanted: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while (state := json.loads((Path(os.environ["HPCDL_STORE"]) / job_id / "status.json").read_text()
                               if (Path(os.environ["HPCDL_STORE"]) / job_id / "status.json").exists()
                               else "{}").get("state")) != wanted:
        assert time.monotonic() < deadline, f"job {job_id} is {state}, not {wanted}"
        time.sleep(0.2)


def test_a_pool_runs_three_jobs_as_steps_of_one_allocation(work: Path) -> None:
    held = _start(work, "three", "nodes=2", "time=00:10:00", "idle_timeout=02:00")
    try:
        jobs = [_submit(work, "three", "script=quick.py", "cluster.time=00:02:00") for _ in range(3)]
        for job in jobs:
            assert _hpcdl(work, "hpcdl.jobs", "wait", job, "--timeout", "120").stdout.strip() == "COMPLETED"
            assert _hpcdl(work, "hpcdl.jobs", "logs", job).stdout.startswith(f"step {held} ")
        steps = _steps(held)  # one Slurm job: the held one, each job a step of it, none a job of its own
        assert {job: steps.get(job) for job in jobs} == {job: "COMPLETED" for job in jobs}, steps
        listing = _hpcdl(work, "hpcdl.jobs", "list").stdout
        assert all("COMPLETED" in line and line.endswith(f"{held} (pool three)")
                   for line in listing.splitlines()[1:]), listing
        assert _pool_row(work, "three")[1:3] + _pool_row(work, "three")[-1:] == [held, "RUNNING", "3"]
    finally:
        _hpcdl(work, "hpcdl.pool", "stop", "three", "cluster=slurm", check=False)
    assert _pool_row(work, "three")[2] == "STOPPED"
    assert _sacct_state(held).startswith("CANCELLED")


def test_an_idle_pool_releases_its_allocation_itself(work: Path) -> None:
    held = _start(work, "idle", "time=00:10:00", "idle_timeout=00:10")
    job = _submit(work, "idle", "script=quick.py", "cluster.time=1")
    assert _hpcdl(work, "hpcdl.jobs", "wait", job, "--timeout", "120").stdout.strip() == "COMPLETED"
    ended = time.time()
    assert _sacct_state(held) == "COMPLETED"  # the holder ended itself: no scancel
    released = json.loads(next((Path(os.environ["HPCDL_STORE"]) / f".pools-{os.getuid()}").glob("idle.*/released.json"))
                          .read_text())
    assert released["idle_s"] == 10 and 5 <= released["at"] - ended <= 20, (released, ended)  # 10 s idle, 2 s polls
    assert _pool_row(work, "idle")[2] == "RELEASED"
    refused = _hpcdl(work, "hpcdl.submit", "cluster=slurm", "cluster.pool=idle", "script=quick.py", "cluster.time=1",
                     check=False)
    assert refused.returncode == 2 and "pool idle" in refused.stderr and "RELEASED, not running" in refused.stderr


def test_pool_stop_ends_its_running_job_cancelled(work: Path) -> None:
    held = _start(work, "stopped", "time=00:10:00")
    job = _submit(work, "stopped", "script=long.py", "cluster.time=5")
    _wait_state(work, job, "RUNNING")
    stopped = _hpcdl(work, "hpcdl.pool", "stop", "stopped", "cluster=slurm")
    assert f"cancelled its running job(s): {job}" in stopped.stdout
    final = json.loads((Path(os.environ["HPCDL_STORE"]) / job / "final.json").read_text())
    assert final["state"] == "CANCELLED" and "its pool stopped was stopped" in final["reason"]
    assert _sacct_state(held).startswith("CANCELLED") and _steps(held)[job].startswith("CANCELLED")
    listing = _hpcdl(work, "hpcdl.jobs", "list").stdout.splitlines()
    assert listing[1].split()[3] == "CANCELLED", listing


def test_a_job_the_pool_cannot_hold_is_refused_before_anything_is_submitted(work: Path, store: Path) -> None:
    held = _start(work, "short", "time=00:05:00")
    try:
        too_long = _hpcdl(work, "hpcdl.submit", "cluster=slurm", "cluster.pool=short", "script=quick.py",
                          "cluster.time=00:10:00", check=False)
        assert too_long.returncode == 2
        assert "error: cluster.time=00:10:00: pool short has 0:0" in too_long.stderr and "left" in too_long.stderr
        too_wide = _hpcdl(work, "hpcdl.submit", "cluster=slurm", "cluster.pool=short", "script=quick.py",
                          "cluster.time=1", "cluster.nodes=2", check=False)
        assert too_wide.returncode == 2 and "cluster.nodes=2: pool short holds 1 node(s)" in too_wide.stderr
        unknown = _hpcdl(work, "hpcdl.submit", "cluster=slurm", "cluster.pool=nosuch", "script=quick.py", check=False)
        assert unknown.returncode == 2 and "no pool 'nosuch'" in unknown.stderr
        assert job_folders(store) == [] and _steps(held) == {}  # nothing written, no step started
    finally:
        _hpcdl(work, "hpcdl.pool", "stop", "short", "cluster=slurm", check=False)


def test_a_sweep_runs_its_points_as_steps_and_its_cancel_leaves_the_pool(work: Path) -> None:
    held = _start(work, "sweep", "time=00:10:00", "tasks_per_node=2")
    try:
        done = _hpcdl(work, "hpcdl.submit", "-m", "cluster=slurm", "cluster.pool=sweep", "script=quick.py",
                      "cluster.time=1", "training.initial_learn_rate=0.1,0.2,0.3,0.4")
        sweep = done.stdout.split()[2].rstrip(":")
        assert f"as steps of Slurm job {held}, pool sweep" in done.stdout
        assert _hpcdl(work, "hpcdl.jobs", "wait", sweep, "--timeout", "120").stdout.strip().endswith("COMPLETED")
        points = [f"{sweep}_{n}" for n in range(4)]
        assert {p: _steps(held).get(p) for p in points} == {p: "COMPLETED" for p in points}
        long = _hpcdl(work, "hpcdl.submit", "-m", "cluster=slurm", "cluster.pool=sweep", "script=long.py",
                      "cluster.time=5", "training.initial_learn_rate=0.1,0.2").stdout.split()[2].rstrip(":")
        for n in range(2):
            _wait_state(work, f"{long}_{n}", "RUNNING")
        _hpcdl(work, "hpcdl.jobs", "cancel", long)
        assert {_steps(held).get(f"{long}_{n}", "").split()[0] for n in range(2)} == {"CANCELLED"}
        assert _pool_row(work, "sweep")[2:3] + _pool_row(work, "sweep")[-1:] == ["RUNNING", "6"]
    finally:
        _hpcdl(work, "hpcdl.pool", "stop", "sweep", "cluster=slurm", check=False)


def test_pool_stop_that_slurm_refuses_withdraws_the_cancel_it_recorded(work: Path, store: Path) -> None:
    _start(work, "refused", "time=00:10:00")
    try:
        job = _submit(work, "refused", "script=long.py", "cluster.time=5")
        _wait_state(work, job, "RUNNING")
        unreachable = {**os.environ, "SLURM_CONF": str(work / "no-such-slurm.conf")}  # scancel cannot reach Slurm
        refused = subprocess.run([sys.executable, "-m", "hpcdl.pool", "stop", "refused", "cluster=slurm"], cwd=work,
                                 env=unreachable, capture_output=True, text=True, timeout=120)
        assert refused.returncode != 0 and "scancel" in refused.stderr, refused.stdout + refused.stderr
        assert not (store / job / "final.json").exists()  # its CANCELLED withdrawn: the job runs on
        assert _pool_row(work, "refused")[2] == "RUNNING"
        assert json.loads((store / job / "status.json").read_text())["state"] == "RUNNING"
    finally:
        _hpcdl(work, "hpcdl.pool", "stop", "refused", "cluster=slurm", check=False)


def test_the_holder_goes_on_when_a_submission_claims_the_pool_as_it_announces_its_release(work: Path,
                                                                                         tmp_path: Path) -> None:
    """The holder's script, run as the held job runs it (its squeue asks the real cluster about a held job with no
    step), with a submission's touch of the use mark landing between its announcement and its second look: a
    DEBUG trap runs before each command and touches the mark once, right before that look."""
    held = _start(work, "race", "time=00:05:00")
    try:
        folder = tmp_path / "pool"
        folder.mkdir()
        script = folder / "holder.sh"
        script.write_text(holder_script(folder, 2))
        mark, touched = shlex.quote(str(folder / "last-used")), shlex.quote(str(tmp_path / "touched"))
        trap = (f"""if [[ $BASH_COMMAND == *'!= "$mark"'* && ! -e {touched} ]]; then """
                f"""[ -e {shlex.quote(str(folder / "releasing"))} ] && touch {mark} && : > {touched}; fi""")
        done = subprocess.run(["bash", "-c", f"set -T; trap {shlex.quote(trap)} DEBUG; . {shlex.quote(str(script))}"],
                              env={**os.environ, "SLURM_JOB_ID": held}, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        claimed_at = (folder / "last-used").stat().st_mtime
        assert (tmp_path / "touched").exists()  # the claim landed after the announcement, before the second look
        released = json.loads((folder / "released.json").read_text())
        assert released["at"] >= int(claimed_at) + 2, (released, claimed_at)  # it held on for a whole idle time
        assert not (folder / "releasing").exists()
    finally:
        _hpcdl(work, "hpcdl.pool", "stop", "race", "cluster=slurm", check=False)
