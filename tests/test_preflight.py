"""Preflight on this machine: each check catches its fault (GPUs asked but absent, a store path that cannot be
written, a missing data root), and a job whose node fails is ended naming the node and the check."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import json
import os

import pytest

from hpcdl.distributed import preflight
from hpcdl.store import badnodes
from hpcdl.store.files import BAD_NODES
from hpcdl.gpus import gpu_count


def test_each_check_catches_its_fault_and_passes_a_healthy_node(tmp_path: Path) -> None:
    seen = gpu_count()
    assert preflight.check_gpus(seen + 1) == f"{seen + 1} GPU(s) asked per node, {seen} visible"
    assert preflight.check_writable(Path("/proc/self"), "the store").startswith("the store /proc/self is not writable")
    assert preflight.check_readable(tmp_path / "gone", "the data root") == \
        f"the data root {tmp_path / 'gone'} is missing on this node"
    assert preflight.check_scratch(least_gib=1e9).startswith("scratch ")
    started = time.monotonic()
    checks = {c.name: c for c in preflight.run_checks(tmp_path, str(tmp_path), gpus_asked=0)}
    assert time.monotonic() - started < 45
    assert {name for name, c in checks.items() if c.status == "passed"} >= {"store", "data", "scratch"}
    assert not any(c.failed for c in checks.values()), checks
    assert checks["gpus"].status == "skipped"
    assert list(tmp_path.iterdir()) == []  # the store's probe file is gone


def test_preflight_is_on_for_several_nodes_and_gpu_jobs_when_auto() -> None:
    assert preflight.wanted("auto", 2, 0, "cpu") and preflight.wanted("auto", 1, 1, "cpu")
    assert preflight.wanted("auto", 1, 0, "gpu") and not preflight.wanted("auto", 1, 0, "cpu")
    assert preflight.wanted("on", 1, 0, "cpu") and not preflight.wanted("off", 4, 8, "gpu")


def test_a_job_whose_data_root_is_missing_fails_in_preflight_naming_the_node(store: Path, digits_root: Path,
                                                                            tmp_path: Path) -> None:
    data = tmp_path / "data"
    subprocess.run(["cp", "-r", str(digits_root), str(data)], check=True)
    submitted = subprocess.run([sys.executable, "-m", "hpcdl.submit", f"data.root={data}", "cluster.preflight=on",
                                "training.verbose=false"], capture_output=True, text=True, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    subprocess.run(["rm", "-rf", str(data)], check=True)  # as a node that has not mounted it
    job_id = submitted.stdout.split()[2]
    waited = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "wait", job_id, "--timeout", "120"],
                            capture_output=True, text=True)
    assert waited.stdout.strip() == "FAILED"
    shown = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "show", job_id], capture_output=True, text=True).stdout
    node = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    assert f"node {node} failed preflight: data (the data root {data} is missing on this node)" in shown, shown
    assert f"preflight {node}: FAILED data" in shown and "store" in shown
    assert (store / job_id / "preflight-results" / f"{node}.preflight.json").is_file()


def test_a_failed_node_is_remembered_for_its_hold_and_another_users_writes_are_ignored(tmp_path: Path) -> None:
    badnodes.remember(tmp_path, "n2", "node n2 failed preflight: data", hold_s=60)
    badnodes.remember(tmp_path, "n1", "node n1 failed preflight: gpus", hold_s=0)  # 0: not remembered
    assert list(badnodes.remembered(tmp_path)) == ["n2"]
    assert badnodes.remembered(tmp_path, now=time.time() + 61) == {}
    with pytest.raises(ValueError, match="not a node name"):
        badnodes.remember(tmp_path, "n[1-2],n3", "x", 60)
    path = tmp_path / BAD_NODES.format(uid=os.getuid())
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    path.write_text(json.dumps({"n2": {"until": time.time() + 60}, "../x": {"until": time.time() + 60},
                                "n3": {"until": "soon"}}))
    assert list(badnodes.remembered(tmp_path)) == ["n2"]  # names and times checked one by one
    path.chmod(0o666)  # writable by others: anyone could have planted it
    assert badnodes.remembered(tmp_path) == {}
