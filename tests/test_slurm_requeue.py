"""Jobs Slurm queues again, on the real cluster: preempted, requeued by an operator, on a node that lost its
slurmd. Each goes on from its newest checkpoint with no iteration lost or repeated.

Slurm 22.05 holds a requeued job about 120 s before it may start again (../shared/SLURM-NOTES.md). The three
faults are made one after another in one fixture; once each job is seen held, the fixture lifts the hold as an
operator may (scontrol update StartTime=now). The hold is Slurm's scheduling, what follows it is hpcdl's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from hpcdl.lifecycle.job import Job
from tests.test_slurm import (_checkpoint_iterations, _cli, _iterations, _sacct_state, slurm_cluster,  # noqa: F401
                              slurm_setting, stopped_after)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]  # the fixture's three faults take 3-4 minutes


def _submit(digits_root: Path, name: str, *overrides: str) -> Job:
    done = _cli("hpcdl.submit", "cluster=slurm", f"data.root={digits_root}", "training.mini_batch_size=32",
                "cluster.time=00:10:00", "training.verbose=false", f"name={name}", *overrides)
    return Job.attach(done.stdout.split()[2])


def _wait_for(what: str, job: Job, ready: Any, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"{job.id}: no {what} in {timeout_s} s: {job.refresh().state} {job.error()}"
        time.sleep(0.2)


def _trains(job: Job) -> bool:
    metrics = job.folder / "metrics.jsonl"
    return metrics.is_file() and bool(metrics.read_text().strip())


def _node_state(node: str) -> str:
    return subprocess.run(["sinfo", "-h", "-n", node, "-o", "%t"], capture_output=True, text=True).stdout.strip()


def _preempted(digits_root: Path) -> tuple[Job, str]:
    """A job of the urgent partition (PriorityTier 10, GraceTime 20 s) preempts it: Slurm sends USR2, the ranks
    stop after the same iteration with a checkpoint and the job requeues itself. First, while no other job
    runs: the urgent job preempts every job of the debug partition."""
    job = _submit(digits_root, "preempted", "training.max_epochs=6", "cluster.max_requeues=1", "cluster.nodes=2",
                  "training.execution_environment=parallel")
    _wait_for("metrics", job, lambda: _trains(job))
    urgent = subprocess.run(["sbatch", "--parsable", "-p", "urgent", "-N", "2", "--exclusive", "-t", "2",
                             "-o", "/dev/null", "--wrap", "sleep 5"], capture_output=True, text=True, check=True)
    _wait_for("requeue", job, lambda: job.refresh().state in ("PENDING", "REQUEUED"), timeout_s=90)
    return job, urgent.stdout.strip()


def _requeued_by_an_operator(digits_root: Path) -> Job:
    """scontrol requeue of a running job: Slurm ends it (TERM, then KILL after KillWait) without a checkpoint."""
    job = _submit(digits_root, "operator-requeued", "training.max_epochs=80")  # ~25 s: it is running when requeued
    _wait_for("checkpoint", job, lambda: _checkpoint_iterations(job.folder))
    subprocess.run(["scontrol", "requeue", job.backend_id], check=True)
    # Slurm requeues a finished job too: one that ended first would run again only to find its result
    assert not (job.folder / "final.json").exists(), f"{job.id} ended before the requeue: {job.refresh().state}"
    return job


def _on_a_node_that_lost_its_slurmd(digits_root: Path, seen: dict[str, Any]) -> Job:
    """slurmd of n2 stopped (as systemctl stop does) under a two-node job: after SlurmdTimeout (30 s here) Slurm
    calls it NODE_FAIL and requeues the job; the rank left running on n2 loses its peer and fails. The job
    trains long enough to be running then; its next run is stopped by USR2 once it goes on (no requeue left),
    rather than trained to the end."""
    job = _submit(digits_root, "node-lost", "training.max_epochs=200", "cluster.nodes=2", "cluster.max_requeues=1",
                  "training.execution_environment=parallel")
    _wait_for("checkpoint", job, lambda: _checkpoint_iterations(job.folder))
    pid_file = Path(slurm_setting("SlurmdPidFile").replace("%n", "n2"))
    os.kill(int(pid_file.read_text()), signal.SIGTERM)
    try:
        _wait_for("NODE_FAIL", job, lambda: _sacct_state_of_first_run(job) == "NODE_FAIL", timeout_s=150)
        _wait_for("the orphan rank's note", job, lambda: "Slurm has queued the job again" in job.logs(1, "stderr"))
        _wait_for("listing as queued again", job, lambda: job.refresh().state not in ("RUNNING", "COMPLETING"))
        seen["state"], seen["reason"] = job.state, job.refresh().reason
    finally:  # n2 comes back (ReturnToService=2) for the other tests
        subprocess.run(["slurmd", "-f", slurm_setting("SLURM_CONF"), "-N", "n2"], check=True)
        _wait_for("n2 back", job, lambda: _node_state("n2") in ("idle", "mix", "alloc"))
    return job


def _released_from_the_hold(job: Job, timeout_s: float = 90) -> None:
    """Once squeue shows the requeued job held (PENDING, reason BeginTime), let it start now; nothing to do
    for a job whose next run has begun (its hold was over)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        queued = subprocess.run(["squeue", "-h", "-j", job.backend_id, "-o", "%T %r"], capture_output=True,
                                text=True).stdout.split()
        if queued == ["PENDING", "BeginTime"]:  # it may start meanwhile: then the update fails, and that is fine
            subprocess.run(["scontrol", "update", f"JobId={job.backend_id}", "StartTime=now"], capture_output=True)
            return
        if job.refresh().status.get("restarts", 0) >= 1 and queued[:1] != ["PENDING"]:
            return
        time.sleep(0.5)
    raise AssertionError(f"{job.id}: neither held by Slurm nor started again in {timeout_s} s ({queued})")


def _trains_again(job: Job) -> bool:
    """The job's next run has saved a checkpoint after the one it went on from (its metrics may still hold the
    last run's later records until it rewrites them)."""
    events = job.refresh().status.get("events")
    return bool(events) and max(_checkpoint_iterations(job.folder), default=0) > events[0]["iteration"]


def _sacct_state_of_first_run(job: Job) -> str:
    runs = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-o", "State", "-j", job.backend_id],
                          capture_output=True, text=True).stdout.splitlines()
    return runs[0] if len(runs) > 1 else ""


@pytest.fixture(scope="module")
def requeued(tmp_path_factory: pytest.TempPathFactory, digits_root: Path) -> Iterator[dict[str, Any]]:
    """The three jobs, each faulted once and released from Slurm's hold, then waited for until they end."""
    root = tmp_path_factory.mktemp("requeue")
    (root / "home").mkdir()
    jobs: dict[str, Job] = {}
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HPCDL_STORE", str(root / "store"))
        env.setenv("HOME", str(root / "home"))
        seen: dict[str, Any] = {}
        try:
            jobs["preempted"], urgent = _preempted(digits_root)
            jobs["operator"] = _requeued_by_an_operator(digits_root)
            jobs["node"] = _on_a_node_that_lost_its_slurmd(digits_root, seen)
            for job in jobs.values():
                _released_from_the_hold(job)
            _wait_for("its next run's training", jobs["node"], lambda: _trains_again(jobs["node"]), timeout_s=300)
            subprocess.run(["scancel", "--signal=USR2", jobs["node"].backend_id], check=True)
            ended = {name: job.wait(timeout=500) for name, job in jobs.items()}
            yield {**jobs, "urgent": urgent, "ended": ended, "node_listed": seen}
        finally:  # nothing left holding the nodes for the tests after
            subprocess.run(["scancel", *[job.backend_id for job in jobs.values()]], capture_output=True)


def _went_on_from_its_checkpoint(job: Job, *events: str, last: Optional[int] = None) -> dict[str, Any]:
    """The job's restart event (the first of ``events``, all it has), once it went on from its checkpoint to
    iteration ``last`` (its result's)."""
    status = job.refresh().status
    assert [e["event"] for e in status["events"]] == list(events) and status["restarts"] >= 1, status
    went_on = status["events"][0]["iteration"]
    assert went_on > 0 and f"Resumed from the checkpoint of iteration {went_on}" in job.logs(0)
    last = job.result()["iterations"] if last is None else last
    assert last > went_on and _iterations(job.folder) == list(range(1, last + 1))  # no gap, no repeat
    return status["events"][0]


def test_a_preempted_job_requeues_itself_and_goes_on_from_its_checkpoint(requeued: dict[str, Any]) -> None:
    job = requeued["preempted"]
    assert requeued["ended"]["preempted"] == "COMPLETED", job.error()
    assert _sacct_state(requeued["urgent"]) == "COMPLETED"
    _went_on_from_its_checkpoint(job, "requeued")


def test_a_job_requeued_by_an_operator_goes_on_from_its_newest_checkpoint(requeued: dict[str, Any]) -> None:
    job = requeued["operator"]
    assert requeued["ended"]["operator"] == "COMPLETED", job.error()
    assert _went_on_from_its_checkpoint(job, "restarted")["slurm"] == "REQUEUED"
    assert "restarted" in _cli("hpcdl.jobs", "show", job.id).stdout


def test_a_job_on_a_node_that_lost_its_slurmd_is_queued_again_and_goes_on(requeued: dict[str, Any]) -> None:
    """Never listed FAILED: the rank that outlived the run on n2 records nothing, the next run goes on."""
    job = requeued["node"]
    from hpcdl.lifecycle.states import QUEUED_AGAIN

    listed = requeued["node_listed"]
    assert listed["state"] in QUEUED_AGAIN and listed["reason"] == "queued again: it goes on from its newest checkpoint"
    assert requeued["ended"]["node"] == "STOPPED", job.error()
    event = _went_on_from_its_checkpoint(job, "restarted", "stopped", last=stopped_after(job))
    assert event["slurm"] == "NODE_FAIL (n2: Not responding)" and "failure" not in event  # sacctmgr's node event
    assert "Slurm has queued the job again: it goes on from its newest checkpoint" in job.logs(1, "stderr")
    assert "Slurm: NODE_FAIL (n2: Not responding)" in _cli("hpcdl.jobs", "show", job.id).stdout
    assert json.loads((job.folder / "final.json").read_text())["state"] == "STOPPED"
