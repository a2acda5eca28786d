"""Preflight on this machine: each check catches its fault (GPUs asked but absent, a store path that cannot be
written, a missing data root), and a job whose node fails is ended naming the node and the check."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpcdl.distributed import busbw, preflight
from hpcdl.distributed.env import free_port
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
    job = tmp_path / "job"
    job.mkdir()
    started = time.monotonic()
    checks = {c.name: c for c in preflight.run_checks(job, str(tmp_path), gpus_asked=0)}
    assert time.monotonic() - started < 45
    assert {name for name, c in checks.items() if c.status == "passed"} >= {"store", "data", "scratch"}
    assert not any(c.failed for c in checks.values()), checks
    assert checks["gpus"].status == "skipped"
    assert [p.name for p in job.iterdir()] == ["preflight-results"]  # the store's probe file is gone
    assert list((job / "preflight-results").iterdir()) == []


XID_LOG = """\
NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024
NVRM: Xid (PCI:0000:3b:00): 13, pid=2142, name=python, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)
NVRM: Xid (PCI:0000:3b:00): 31, pid=2142, name=python, Ch 00000008, intr 00000000. MMU Fault
NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
NVRM: GPU at PCI:0000:86:00: GPU-5b3a0c1e-1f0a-2b3c-4d5e-6f7a8b9c0d1e
NVRM: Xid (PCI:0000:3B:00): 94, pid=2142, name=python, Contained: SM (0x1). RST: No, D-RST: No
NVRM: Xid (PCI:0000:3b:00): 94, pid=2150, name=python, Contained: SM (0x1). RST: No, D-RST: No
NVRM: Xid (PCI:0000:3B:00): 95, pid=2150, name=python, Uncontained: FBHUB. RST: Yes, D-RST: No
NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
"""


def test_the_xid_check_names_each_gpu_fault_of_the_kernel_log_and_not_a_programs_own() -> None:
    """The driver's Xid lines as the kernel logs them: 79 (fallen off the bus, twice, the PCI address in either
    case) and 95 (uncontained ECC) are faults of the GPU; 13 and 31 are a program's (an exception, a bad
    address), 94 a contained ECC error the GPU recovered from."""
    assert preflight.xid_faults(XID_LOG.splitlines()) == \
        "GPU 0000:3b:00: Xid 95 (uncontained ECC error); GPU 0000:86:00: Xid 79 (GPU has fallen off the bus) x2"
    assert preflight.xid_faults([line for line in XID_LOG.splitlines() if any(
        f": {xid}," in line for xid in (13, 31, 94))]) is None


def test_the_xid_check_counts_the_events_of_the_jobs_own_gpus_only() -> None:
    """A node's other GPU, another job's, fell off the bus: not a fault of this job's GPU (NVML's and the
    driver's ways of writing the address are one)."""
    own = {preflight.pci_address("00000000:3B:00.0")}
    assert own == {preflight.pci_address("0000:3b:00")} == {(0, 0x3B, 0)}
    assert preflight.xid_faults(XID_LOG.splitlines(), own) == "GPU 0000:3b:00: Xid 95 (uncontained ECC error)"
    assert preflight.xid_faults(XID_LOG.splitlines(), {preflight.pci_address("0000:87:00")}) is None
    odd = "NVRM: Xid (PCI:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."  # no domain: maybe ours
    assert preflight.xid_faults([odd], own) == "GPU 3b:00: Xid 79 (GPU has fallen off the bus)"


@pytest.mark.skipif(os.getuid() != 0 or shutil.which("dmesg") is None,
                    reason="reads the kernel log as root and as another user")
def test_the_kernel_log_is_read_where_it_may_be_and_the_xid_check_is_skipped_where_not(tmp_path: Path) -> None:
    """As root this machine's own kernel log is read (its boot messages); a user without CAP_SYSLOG under
    kernel.dmesg_restrict=1 gets a skipped check that says why, not a pass."""
    try:
        lines = preflight.kernel_log()
    except preflight.SkipCheck as e:  # a container without CAP_SYSLOG: not even root may read it
        pytest.skip(str(e))
    assert len(lines) > 10, lines  # the boot's messages at least
    if Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() != "1":
        pytest.skip("kernel.dmesg_restrict is 0 here: every user may read the kernel log")
    user = "hpcdl-other"
    if subprocess.run(["id", user], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-m", user], check=True, capture_output=True)
    account = pwd.getpwnam(user)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # this process's code, run as the other user
        try:
            os.setgroups([])
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
            try:
                said = f"read {len(preflight.kernel_log())} lines"
            except preflight.SkipCheck as e:
                said = f"skipped: {e}"
            os.write(write_end, said.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        said = answer.read().decode()
    os.waitpid(child, 0)
    assert said.startswith("skipped: the kernel log is not readable here (dmesg: "), said
    assert "not permitted" in said, said


def test_a_check_still_running_at_the_nodes_budget_fails_the_node_and_the_rest_are_skipped() -> None:
    """A check that never returns (a wedged GPU's kernel, a hung mount) fails at the budget, naming itself; the
    checks before it keep their outcome, those after it are skipped; the whole is done within the budget."""
    released = threading.Event()
    started = time.monotonic()
    checks = preflight.run_within([("store", lambda: None), ("gemm", lambda: released.wait(60) and None),
                                   ("scratch", lambda: None)], budget_s=2.0)
    took = time.monotonic() - started
    released.set()
    assert [(c.name, c.status) for c in checks] == [("store", "passed"), ("gemm", "failed"), ("scratch", "skipped")]
    assert checks[1].detail.startswith("still running after 2 s, past the node's 2 s for every check"), checks[1]
    assert checks[2].detail == "no time left: gemm overran"
    assert 2.0 <= took < 3.0, took
    assert preflight.failure_words("n2", checks).startswith("node n2 failed preflight: gemm (still running")
    ended = preflight.run_within([("gemm", lambda: sys.exit(3)), ("scratch", lambda: None)], budget_s=5.0)
    assert [(c.name, c.status, c.detail) for c in ended] == [("gemm", "failed", "ended without an outcome"),
                                                             ("scratch", "passed", "")]


def test_a_job_s_preflight_leaves_the_store_root_unchanged_and_skips_the_all_reduce_on_one_node(
        store: Path, digits_root: Path) -> None:
    for preflight_setting in ("off", "on"):  # the first makes the store's caches and index
        submitted = subprocess.run([sys.executable, "-m", "hpcdl.submit", f"data.root={digits_root}",
                                    f"cluster.preflight={preflight_setting}", "training.verbose=false",
                                    "training.max_epochs=1"], capture_output=True, text=True, timeout=120)
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.split()[2]
        before = store.stat().st_mtime_ns  # the job index rescans the store when it changes
        waited = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "wait", job_id, "--timeout", "120"],
                                capture_output=True, text=True)
        assert waited.stdout.strip() == "COMPLETED", waited
    assert store.stat().st_mtime_ns == before, sorted(p.name for p in store.iterdir())
    node = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    result = json.loads((store / job_id / "preflight-results" / f"{node}.preflight.json").read_text())
    assert {c["name"]: (c["status"], c["detail"]) for c in result["checks"]}["allreduce"] == ("skipped", "one node")


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
    why = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "why", job_id], capture_output=True, text=True).stdout
    assert f"PreflightFailed: node {node} failed preflight: data (the data root {data} is missing" in why, why


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


TIME_ALLREDUCE = """
import json, sys
from dataclasses import asdict
from hpcdl.distributed import busbw
index, port, node = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
print(json.dumps(asdict(busbw.time_allreduce(index, 2, "127.0.0.1", port, 16, node, gpu=False))))
"""


def _time_two_nodes(slow: str = "") -> busbw.Timing:
    """Two processes, nodes a and b, time the preflight's all-reduce over gloo; ``slow``: the injection."""
    port, env = free_port(), {**os.environ, busbw.SLOW_NODE: slow}
    ranks = [subprocess.Popen([sys.executable, "-c", TIME_ALLREDUCE, str(i), str(port), node], env=env,
                              stdout=subprocess.PIPE, text=True) for i, node in enumerate("ab")]
    outputs = [rank.communicate(timeout=120)[0] for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), outputs
    timings = [busbw.Timing(**json.loads(output)) for output in outputs]
    assert timings[0].busbw_gbps == timings[1].busbw_gbps and timings[0].nodes == ["a", "b"]
    return timings[0]


def test_an_all_reduce_slowed_on_one_node_fails_that_node_alone_and_a_healthy_one_passes() -> None:
    healthy = _time_two_nodes()
    expected = 0.05  # GB/s: gloo over loopback on a busy 2-core machine makes several times that
    assert healthy.device == "cpu" and healthy.busbw_gbps > expected, healthy
    assert [busbw.judge(healthy, i, expected)[0] for i in (0, 1)] == ["passed", "passed"]
    slowed = _time_two_nodes("b:0.5")  # b's contribution 0.5 s late in each all-reduce
    assert slowed.busbw_gbps < 0.8 * expected and slowed.waited[0] > slowed.waited[1] + 2, slowed
    status, detail = busbw.judge(slowed, 1, expected)
    assert status == "failed" and "under the expected 0.05; the other nodes waited for this one" in detail, detail
    status, detail = busbw.judge(slowed, 0, expected)
    assert status == "passed" and "node b is slow" in detail, detail


def test_a_low_bandwidth_no_node_stands_out_in_warns_and_no_expected_figure_is_not_judged() -> None:
    even = busbw.Timing(busbw_gbps=1.0, seconds=2.0, waited=[1.9, 1.8, 1.95], nodes=["a", "b", "c"],
                        device="NVIDIA H100 80GB HBM3")
    assert busbw.expected_for({"H100": 40.0, "H100 80GB": 45.0, "cpu": 1.0}, even.device) == 45.0
    assert busbw.expected_for({"A100": 20.0}, even.device) is None
    assert [busbw.judge(even, i, 40.0)[0] for i in range(3)] == ["warned"] * 3
    assert busbw.judge(even, 0, 1.2) == ("passed", "all-reduce bus bandwidth 1.00 GB/s, expected 1.2")
    assert busbw.judge(even, 0, None)[0] == "passed" and "not judged" in busbw.judge(even, 0, None)[1]
