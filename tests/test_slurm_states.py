"""True states of Slurm jobs (slurm/cluster.sh up): SUBMITTING while sbatch has not answered, a final
state recorded once, the last recorded state when Slurm cannot be asked."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
import pytest

import hpcdl
from hpcdl.cluster.slurm import SlurmBackend
from hpcdl.lifecycle.job import Job
from tests.test_slurm import (_cli, _queue, _sacct_state, slurm_cluster,  # noqa: F401 - the fixture
                              slurm_setting, wait_running)
from tests.test_states import _row, held_submission

pytestmark = pytest.mark.slurm


def square(x: float) -> float:
    return x * x


def test_a_slurm_job_being_submitted_is_listed_submitting(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    submit = lambda: hpcdl.batch(square, 3.0, cluster="slurm", time="00:05:00")  # noqa: E731
    with held_submission(store, monkeypatch, SlurmBackend(), submit) as (job_id, submitted):
        listing = _cli("hpcdl.jobs", "list")
        assert _row(listing.stdout, job_id)[3] == "SUBMITTING", listing.stdout
        assert not (store / job_id / "final.json").exists()
    assert submitted[0].result(timeout=180) == 9.0
    assert _row(_cli("hpcdl.jobs", "list").stdout, job_id)[3] == "COMPLETED"


def test_a_cancelled_slurm_job_keeps_the_state_recorded_first(store: Path) -> None:
    job = hpcdl.batch(time.sleep, 600, cluster="slurm", time="00:15:00")
    wait_running(job)
    assert _cli("hpcdl.jobs", "cancel", job.id).stdout.strip().endswith("state now CANCELLED")
    recorded = (job.folder / "final.json").read_text()
    assert json.loads(recorded)["state"] == "CANCELLED"
    assert _sacct_state(job.backend_id).startswith("CANCELLED")
    assert job.backend_id not in _queue()
    assert _row(_cli("hpcdl.jobs", "list").stdout, job.id)[3] == "CANCELLED"
    assert (job.folder / "final.json").read_text() == recorded
    shown = _cli("hpcdl.jobs", "show", job.id).stdout  # srun's 'Job step aborted' is no error of a cancelled job
    assert "state     CANCELLED  (cancelled with hpcdl)" in shown and "error" not in shown and "srun" not in shown


def test_a_pending_slurm_job_shows_slurms_reason_and_has_no_logs_yet(store: Path, digits_root: Path) -> None:
    submitted = _cli("hpcdl.submit", "cluster=slurm", "cluster.time=00:05:00", "+cluster.sbatch_extra.begin=now+3600",
                     f"data.root={digits_root}")
    job = Job.attach(submitted.stdout.split()[2])  # it may start in an hour: it pends till then
    try:
        deadline = time.monotonic() + 60
        while _row(listing := _cli("hpcdl.jobs", "list").stdout, job.id)[3:5] != ["PENDING", "(BeginTime)"]:
            assert time.monotonic() < deadline, listing
            time.sleep(0.5)
        shown = _cli("hpcdl.jobs", "show", job.id).stdout
        assert "state     PENDING (BeginTime)" in shown and "progress  not started" in shown, shown
        assert "error" not in shown and "logs      " not in shown
        logs = _cli("hpcdl.jobs", "logs", job.id)
        assert logs.stdout == "" and "has written nothing to its stdout: it has not started yet" in logs.stderr
    finally:
        _cli("hpcdl.jobs", "cancel", job.id)
    assert job.backend_id not in _queue()


def wait_for_file(path: str, value: str) -> str:
    """Return ``value`` once ``path`` exists (at most 5 minutes)."""
    deadline = time.monotonic() + 300
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.2)
    return value


def test_a_job_running_through_a_slurmctld_restart_finishes_and_lists_right(store: Path, tmp_path: Path) -> None:
    """While slurmctld is down a listing shows the recorded state and settles nothing; the job finishes."""
    pid_file = Path(slurm_setting("SlurmctldPidFile"))
    repo = Path(__file__).resolve().parents[1]
    go_on = tmp_path / "go-on"
    job = hpcdl.batch(wait_for_file, str(go_on), "through", cluster="slurm", time="00:10:00")
    wait_running(job)
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, 15)
        while Path(f"/proc/{pid}").exists():
            time.sleep(0.2)
        listing = _cli("hpcdl.jobs", "list", check=False)  # the controller is down: the recorded state
        assert listing.returncode == 0 and _row(listing.stdout, job.id)[3] == "RUNNING", listing.stderr
        assert "scheduler could not be asked" in _cli("hpcdl.jobs", "show", job.id).stdout
        assert not (job.folder / "final.json").exists()  # nothing is settled on a listing that could not ask
    finally:  # the same slurmctld again, from its saved state; the job ends only after that
        try:
            subprocess.run(["bash", str(repo / "slurm" / "cluster.sh"), "up"], check=True, capture_output=True,
                           timeout=120)
        finally:
            go_on.touch()
    assert int(pid_file.read_text()) != pid
    assert job.wait(timeout=120) == "COMPLETED" and job.result() == "through"
    assert _row(_cli("hpcdl.jobs", "list").stdout, job.id)[3] == "COMPLETED"
    assert _sacct_state(job.backend_id) == "COMPLETED"


def test_a_job_slurm_has_requeued_itself_is_told_from_one_that_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcdl.cluster import backend_for

    slurm = backend_for("slurm")  # a rank's questions, asked here with the job's variables set

    jobs = [subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 60"], capture_output=True,
                           text=True, check=True).stdout.strip() for _ in range(2)]

    def seen_from(job: str, run: int) -> bool:
        monkeypatch.setenv("SLURM_JOB_ID", job)
        monkeypatch.setenv("SLURM_RESTART_COUNT", str(run))
        return slurm.requeued_since_start()

    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["squeue", "-h", "-j", ",".join(jobs), "-o", "%T"], capture_output=True,
                             text=True).stdout.split() != ["RUNNING", "RUNNING"]:
            assert time.monotonic() < deadline
            time.sleep(0.5)
        subprocess.run(["scontrol", "requeue", jobs[0]], check=True)  # as a preemption's requeue does
        assert seen_from(jobs[0], 0)
        assert not seen_from(jobs[1], 0)  # still this run
        assert not seen_from(jobs[0], 1)  # the run Slurm started again
        while slurm.how_run_ended(0) != "REQUEUED":  # the accounting record of the first run comes a little later
            assert time.monotonic() < deadline + 30, slurm.how_run_ended(0)
            time.sleep(0.5)
        assert slurm.how_run_ended(5) is None
    finally:
        subprocess.run(["scancel", *jobs], check=True)
