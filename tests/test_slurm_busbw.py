"""Preflight's all-reduce across a real two-node Slurm allocation (gloo): healthy jobs pass it within the 45 s
the whole preflight may take, and a node whose contribution an injection slows (HPCDL_PREFLIGHT_SLOW) is named,
failed and excluded, the job queued again without it."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from hpcdl.lifecycle.job import Job
from hpcdl.store import badnodes
from tests.test_slurm import _cli, slurm_cluster  # noqa: F401

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

EXPECTED = "+cluster.preflight_busbw_gbps.cpu=0.05"
"""GB/s: gloo between the two nodes of this machine makes several times that, even with the machine busy."""


def _submit(digits_root: Path, name: str, *overrides: str) -> Job:
    done = _cli("hpcdl.submit", "cluster=slurm", "cluster.preflight=on", "training.verbose=false",
                "cluster.time=00:10:00", "training.max_epochs=1", "cluster.nodes=2",
                "training.execution_environment=parallel", f"data.root={digits_root}", f"name={name}", EXPECTED,
                "cluster.preflight_allreduce_mb=16", *overrides)
    return Job.attach(done.stdout.split()[2])


def _results(job: Job) -> dict[str, dict]:
    folder = job.folder / "preflight-results"
    return {p.name.split(".")[0]: json.loads(p.read_text()) for p in folder.iterdir()} if folder.is_dir() else {}


def _allreduce(result: dict) -> dict:
    return next(c for c in result["checks"] if c["name"] == "allreduce")


def test_healthy_two_node_jobs_pass_the_all_reduce_within_45_s(store: Path, digits_root: Path) -> None:
    for n in range(2):
        job = _submit(digits_root, f"busbw-ok-{n}")
        assert job.wait(300) == "COMPLETED", job.error()
        results = _results(job)
        assert sorted(results) == ["n1", "n2"], results
        for node, result in results.items():
            check = _allreduce(result)
            assert check["status"] == "passed" and "expected 0.05" in check["detail"], (node, check)
            assert result["busbw_gbps"] > 0.05 and result["seconds"] < 45, result
            print(f"{node}: preflight {result['seconds']:.1f} s, all-reduce {result['busbw_gbps']:.2f} GB/s")
        shown = _cli("hpcdl.jobs", "show", job.id).stdout
        assert shown.count(": passed in") == 2 and "all-reduce" in shown and "WARNING" not in shown, shown


def test_a_node_whose_all_reduce_is_slowed_is_named_and_excluded(store: Path, digits_root: Path) -> None:
    job = _submit(digits_root, "busbw-slow", "+cluster.env.HPCDL_PREFLIGHT_SLOW=n2:1.0")
    try:
        deadline = time.monotonic() + 300
        while "ExcNodeList=n2" not in subprocess.run(["scontrol", "show", "job", job.backend_id],
                                                      capture_output=True, text=True).stdout:
            assert time.monotonic() < deadline and not job.refresh().final, (job.refresh().state, _results(job))
            time.sleep(1)
        while len(_results(job)) < 2 or not _results(job)["n2"].get("excluded"):
            assert time.monotonic() < deadline, _results(job)
            time.sleep(0.5)
        results = _results(job)
        slow, other = _allreduce(results["n2"]), _allreduce(results["n1"])
        assert slow["status"] == "failed" and "under the expected 0.05; the other nodes waited for this one" in \
            slow["detail"], slow
        assert other["status"] == "passed" and "node n2 is slow" in other["detail"], other
        assert results["n2"]["seconds"] < 45 and results["n2"]["busbw_gbps"] < 0.04, results["n2"]
        assert sorted(badnodes.remembered(store)) == ["n2"]
        shown = _cli("hpcdl.jobs", "show", job.id).stdout
        assert "preflight n2: FAILED allreduce (all-reduce bus bandwidth" in shown, shown
        assert "excluded: the job was queued again without n2" in shown, shown
    finally:
        _cli("hpcdl.jobs", "cancel", job.id, check=False)
