"""Preflight on the real Slurm cluster: a node that fails its checks is named, excluded and the job queued again
once; failing again on the next node, the job fails naming that node. A healthy job passes with no alarm.

Slurm 22.05 holds a requeued job about 120 s; the test lifts the hold as an operator may (StartTime=now), once the
failed node is excluded (within that hold on a real cluster).
"""

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


def _submit(*overrides: str) -> Job:
    done = _cli("hpcdl.submit", "cluster=slurm", "cluster.preflight=on", "training.verbose=false",
                "cluster.time=00:10:00", "training.max_epochs=1", *overrides)
    return Job.attach(done.stdout.split()[2])


def test_a_node_without_the_data_root_is_excluded_and_the_job_requeued_once(store: Path, digits_root: Path,
                                                                         tmp_path: Path) -> None:
    data = tmp_path / "data"
    subprocess.run(["cp", "-r", str(digits_root), str(data)], check=True)
    job = _submit(f"data.root={data}", "name=preflight-data")
    subprocess.run(["rm", "-rf", str(data)], check=True)  # gone from every node: the next one fails as well
    deadline = time.monotonic() + 400
    while not job.refresh().final:
        assert time.monotonic() < deadline, job.refresh().state
        queued = subprocess.run(["squeue", "-h", "-j", job.backend_id, "-o", "%T %r"], capture_output=True,
                                text=True).stdout.split()
        excluded = "ExcNodeList=(null)" not in subprocess.run(["scontrol", "show", "job", job.backend_id],
                                                              capture_output=True, text=True).stdout
        if queued == ["PENDING", "BeginTime"] and excluded:  # lifted once the node is left out, as Slurm would
            subprocess.run(["scontrol", "update", f"JobId={job.backend_id}", "StartTime=now"], capture_output=True)
        time.sleep(1)
    results = {p.name.split(".")[0]: json.loads(p.read_text()) for p in (job.folder / "preflight-results").iterdir()}
    assert len(results) == 2, results  # one node, excluded; then the other
    first = next(r for r in results.values() if r["excluded"])
    second = next(r for r in results.values() if not r["excluded"])
    assert first["restarts"] == 0 and second["restarts"] == 1
    shown = _cli("hpcdl.jobs", "show", job.id).stdout
    assert job.refresh().state == "FAILED"
    assert f"node {second['node']} failed preflight: data (the data root {data} is missing" in shown, shown
    assert f"excluded: the job was queued again without {first['node']}" in shown, shown
    why = _cli("hpcdl.jobs", "why", job.id).stdout  # the failing node's record is the root cause
    assert f"PreflightFailed: node {second['node']} failed preflight: data (the data root {data}" in why, why
    excluded = subprocess.run(["scontrol", "show", "job", job.backend_id], capture_output=True, text=True).stdout
    assert f"ExcNodeList={first['node']}" in excluded
    assert sorted(badnodes.remembered(store)) == ["n1", "n2"]  # left out of this user's next jobs
    refused = _cli("hpcdl.submit", "cluster=slurm", f"data.root={digits_root}", check=False)
    assert refused.returncode != 0 and "left out: n1, n2, which failed a preflight" in refused.stderr, refused.stderr


def test_healthy_two_node_jobs_pass_preflight_with_no_false_alarm(store: Path, digits_root: Path) -> None:
    jobs = [_submit(f"data.root={digits_root}", f"name=preflight-ok-{n}", "cluster.nodes=2",
                    "training.execution_environment=parallel") for n in range(3)]
    for job in jobs:
        assert job.wait(300) == "COMPLETED", job.error()
        shown = _cli("hpcdl.jobs", "show", job.id).stdout
        assert shown.count(": passed in") == 2 and "FAILED" not in shown and "STRAGGLER" not in shown, shown


def test_the_doctor_checks_every_node_of_a_fresh_allocation_and_says_what_to_change(store: Path,
                                                                                   digits_root: Path) -> None:
    healthy = _cli("hpcdl.doctor", "cluster=slurm", "cluster.nodes=2", f"data.root={digits_root}")
    assert "n1 (" in healthy.stdout and "n2 (" in healthy.stdout, healthy.stdout
    assert "0 failed check(s) on 2 node(s)" in healthy.stdout, healthy.stdout
    assert healthy.stdout.count("allreduce passed   all-reduce bus bandwidth") == 2, healthy.stdout
    slowed = _cli("hpcdl.doctor", "cluster=slurm", "cluster.nodes=2", f"data.root={digits_root}",
                  "+cluster.env.HPCDL_PREFLIGHT_SLOW=n2:1.0", "+cluster.preflight_busbw_gbps.cpu=0.05",
                  "cluster.preflight_allreduce_mb=16", check=False)
    assert slowed.returncode == 1 and "1 failed check(s) on 2 node(s)" in slowed.stdout, slowed.stdout
    n2 = slowed.stdout[slowed.stdout.index("n2 ("):]
    assert "allreduce failed   all-reduce bus bandwidth" in n2 and "the other nodes waited for this one" in n2, n2
    assert "change: drain the node the others wait for" in n2 and "node n2 is slow" in slowed.stdout, slowed.stdout
    missing = _cli("hpcdl.doctor", "cluster=slurm", "cluster.nodes=2", f"data.root={digits_root}-gone", check=False)
    assert missing.returncode == 1 and "2 failed check(s) on 2 node(s)" in missing.stdout, missing.stdout
    assert missing.stdout.count("change: give data.root a path mounted on every node") == 2, missing.stdout
