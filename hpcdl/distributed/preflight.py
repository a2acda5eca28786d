"""Preflight: before the ranks meet, one rank per node checks the node (cluster.preflight).

Checks, each named in the result: the GPUs the job asked for are visible; NVML's health where pynvml answers
(uncorrected ECC errors, retired or remapped rows pending, throttling for a hardware reason, a PCIe link below its
maximum); a bf16 matrix product at an expected fraction of the GPU's peak; an HBM write/read pattern; the store
and the data root readable and writable (the data root readable); node-local scratch free. GPU checks are skipped,
said so, without a GPU. The store is probed inside the job's own results folder, never in the store's root (whose
time of change makes the job index look again). Then the all-reduce across the allocation (hpcdl.distributed.busbw).
The node's result goes to ``preflight-results/NODE.preflight.json`` in the job folder. A node that fails is named
with its failed checks; on Slurm the first run of the job is queued again with that node excluded
(the backend's ``requeue_excluding``), recorded in the job's events; a second failure fails the job.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from hpcdl.store.atomic import atomic_write_text, make_folder
from hpcdl.store.badnodes import NODE_NAME
from hpcdl.store.files import PREFLIGHT, PREFLIGHT_NODE

SCRATCH_MIN_GIB = 1.0
"""Free space node-local scratch ($TMPDIR, else /tmp) must have."""
GEMM_FRACTION = 0.5
"""The least share of the GPU's bf16 dense peak a large matrix product must reach."""
BF16_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "GH200": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}
"""Dense bf16 peak by GPU name part (SXM figures; PCIe parts are slower and reach the fraction all the same)."""


@dataclass
class Check:
    """One check's outcome: passed, failed (with what was found), warned (a fault of no single node) or skipped
    (why)."""

    name: str
    status: str
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "failed"


def _run(name: str, check: Callable[[], Optional[str]]) -> Check:
    """``check`` returns None when it passed, a sentence when it failed; SkipCheck skips it."""
    try:
        problem = check()
    except SkipCheck as e:
        return Check(name, "skipped", str(e))
    except Exception as e:  # a check that cannot run on this node is a failed check, said as it is
        return Check(name, "failed", f"{type(e).__name__}: {e}")
    return Check(name, "passed" if problem is None else "failed", problem or "")


class SkipCheck(Exception):
    """The check does not apply here (no GPU, no NVML)."""


def check_gpus(asked: int) -> Optional[str]:
    """The GPUs asked for per node are visible."""
    from hpcdl.gpus import gpu_count

    seen = gpu_count()
    if asked == 0:
        raise SkipCheck(f"no GPUs asked ({seen} visible)")
    return None if seen >= asked else f"{asked} GPU(s) asked per node, {seen} visible"


def check_nvml() -> Optional[str]:
    """NVML's health of every GPU: uncorrected ECC, pending retired pages or remapped rows, hardware throttling,
    PCIe link below its maximum."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:
        raise SkipCheck(f"NVML not available ({type(e).__name__})") from e
    problems = []
    hardware = (getattr(pynvml, "nvmlClocksThrottleReasonHwSlowdown", 0x8)
                | getattr(pynvml, "nvmlClocksThrottleReasonHwThermalSlowdown", 0x40)
                | getattr(pynvml, "nvmlClocksThrottleReasonHwPowerBrakeSlowdown", 0x80))
    for index in range(pynvml.nvmlDeviceGetCount()):
        gpu = pynvml.nvmlDeviceGetHandleByIndex(index)
        queries = {
            "uncorrected ECC errors": lambda: pynvml.nvmlDeviceGetTotalEccErrors(
                gpu, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
            "retired pages pending": lambda: pynvml.nvmlDeviceGetRetiredPagesPendingStatus(gpu),
            "remapped rows pending": lambda: pynvml.nvmlDeviceGetRemappedRows(gpu)[2],
            "remapping failed": lambda: pynvml.nvmlDeviceGetRemappedRows(gpu)[3],
            "hardware throttling": lambda: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(gpu) & hardware,
        }
        for what, query in queries.items():
            try:
                if query():
                    problems.append(f"GPU {index}: {what}")
            except pynvml.NVMLError:  # not supported on this GPU
                continue
        try:
            link = (pynvml.nvmlDeviceGetCurrPcieLinkGeneration(gpu), pynvml.nvmlDeviceGetCurrPcieLinkWidth(gpu))
            most = (pynvml.nvmlDeviceGetMaxPcieLinkGeneration(gpu), pynvml.nvmlDeviceGetMaxPcieLinkWidth(gpu))
            if link[1] < most[1]:  # the generation drops at idle to save power; the width does not
                problems.append(f"GPU {index}: PCIe link x{link[1]} below its x{most[1]}")
        except pynvml.NVMLError:
            pass
    return "; ".join(problems) or None


def _cuda() -> Any:
    import torch

    if not torch.cuda.is_available():
        raise SkipCheck("no CUDA GPU")
    return torch


def check_gemm(fraction: float = GEMM_FRACTION) -> Optional[str]:
    """A bf16 matrix product of 8192 on each visible GPU reaches ``fraction`` of its peak (where known)."""
    torch = _cuda()
    problems = []
    for index in range(torch.cuda.device_count()):
        name = torch.cuda.get_device_name(index)
        a = torch.randn(8192, 8192, device=f"cuda:{index}", dtype=torch.bfloat16)
        for _ in range(3):
            a @ a
        torch.cuda.synchronize(index)
        start, repeats = time.perf_counter(), 20
        for _ in range(repeats):
            a @ a
        torch.cuda.synchronize(index)
        tflops = 2 * 8192**3 * repeats / (time.perf_counter() - start) / 1e12
        peak = next((value for part, value in BF16_PEAK_TFLOPS.items() if part in name), None)
        if peak is not None and tflops < fraction * peak:
            problems.append(f"GPU {index} ({name}): bf16 GEMM {tflops:.0f} TFLOP/s, below {fraction:.0%} of "
                            f"its {peak:.0f}")
    return "; ".join(problems) or None


def check_hbm(gib: float = 1.0) -> Optional[str]:
    """A pattern written to ``gib`` GiB of each GPU's memory reads back unchanged."""
    torch = _cuda()
    problems = []
    for index in range(torch.cuda.device_count()):
        count = int(gib * 1024**3 // 4)
        pattern = torch.arange(count, device=f"cuda:{index}", dtype=torch.int32) ^ 0x5A5A5A5A
        copy = pattern.clone()
        if not torch.equal(copy, pattern) or not torch.equal(copy ^ 0x5A5A5A5A, torch.arange(
                count, device=f"cuda:{index}", dtype=torch.int32)):
            problems.append(f"GPU {index}: memory pattern read back changed")
        del pattern, copy
        torch.cuda.empty_cache()
    return "; ".join(problems) or None


def check_writable(folder: Path, what: str) -> Optional[str]:
    """A file can be written to ``folder``, read back and removed."""
    if not folder.is_dir():
        return f"{what} {folder} is missing on this node"
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".preflight-", delete=True) as probe:
            probe.write(b"hpcdl preflight\n")
            probe.flush()
            probe.seek(0)
            if probe.read() != b"hpcdl preflight\n":
                return f"{what} {folder}: a file read back changed"
    except OSError as e:
        return f"{what} {folder} is not writable: {e.strerror or e}"
    return None


def check_store(job: Path) -> Optional[str]:
    """The store is writable from this node: probed in the job folder's PREFLIGHT folder (made here)."""
    try:
        probe = make_folder(job / PREFLIGHT)
    except OSError as e:
        return f"the store {job.parent} is not writable: {e.strerror or e}"
    return check_writable(probe, "the store")


def check_readable(folder: Path, what: str) -> Optional[str]:
    """``folder`` exists and can be listed."""
    if not folder.is_dir():
        return f"{what} {folder} is missing on this node"
    try:
        next(os.scandir(folder), None)
    except OSError as e:
        return f"{what} {folder} is not readable: {e.strerror or e}"
    return None


def check_scratch(least_gib: float = SCRATCH_MIN_GIB) -> Optional[str]:
    """Node-local scratch ($TMPDIR, else /tmp) has ``least_gib`` free."""
    scratch = os.environ.get("TMPDIR") or "/tmp"
    free = shutil.disk_usage(scratch).free / 1024**3
    return None if free >= least_gib else f"scratch {scratch} has {free:.1f} GiB free, under {least_gib:g} GiB"


def run_checks(job: Path, data_root: Optional[str], gpus_asked: int) -> list[Check]:
    """Every check of this node, in order; ``job``: the job folder (the store is probed inside it)."""
    checks = [_run("gpus", lambda: check_gpus(gpus_asked)), _run("nvml", check_nvml), _run("gemm", check_gemm),
              _run("hbm", check_hbm), _run("store", lambda: check_store(job))]
    if data_root is not None and "://" not in data_root:
        checks.append(_run("data", lambda: check_readable(Path(data_root).expanduser(), "the data root")))
    checks.append(_run("scratch", check_scratch))
    return checks


def write_result(folder: Path, node: str, checks: list[Check], seconds: float, **fields: Any) -> Path:
    """This node's result in the job folder; ValueError for a node name that is not a plain name."""
    if not NODE_NAME.match(node):
        raise ValueError(f"node name {node!r} is not a plain name")
    path = make_folder(folder / PREFLIGHT) / PREFLIGHT_NODE.format(node=node)
    atomic_write_text(path, json.dumps({"node": node, "at": time.time(), "seconds": round(seconds, 2),
                                        "checks": [asdict(c) for c in checks], **fields}, indent=1) + "\n")
    return path


ADVICE = {
    "gpus": "ask for what the nodes have (cluster.gpus_per_node, cluster.partition, cluster.constraint), or drain "
            "the node (scontrol update NodeName=NODE State=DRAIN Reason=...)",
    "nvml": "drain the node and have its GPU checked (ECC, row remapping, throttling or PCIe link)",
    "gemm": "drain the node: its GPU computes below its rate (clocks, power, cooling)",
    "hbm": "drain the node: its GPU memory does not hold a pattern",
    "store": "set cluster.store to a folder every node can write (a shared filesystem)",
    "data": "give data.root a path mounted on every node (or a URL the nodes can read)",
    "scratch": "free node-local scratch, or point TMPDIR at a larger local disk (cluster.env.TMPDIR)",
    "allreduce": "drain the node the others wait for, or check the interconnect and the profile's network settings "
                 "(cluster.network: interfaces, HCAs, GDR level) and cluster.preflight_busbw_gbps",
}
"""What to change where a check fails (python -m hpcdl.doctor)."""
WARNING_ADVICE = {
    "allreduce": "check the interconnect and the profile's network settings (cluster.network: interfaces, HCAs, GDR "
                 "level: NCCL_DEBUG=INFO in cluster.env shows what NCCL chose), or set cluster.preflight_busbw_gbps "
                 "to what this network reaches",
}
"""What to look at where a check warns (python -m hpcdl.doctor): a low figure no single node is to blame for."""


def failure_words(node: str, checks: list[Check]) -> str:
    """'node n2 failed preflight: data (the data root /x is missing on this node)'."""
    failed = [f"{c.name} ({c.detail})" for c in checks if c.failed]
    return f"node {node} failed preflight: {'; '.join(failed)}"


def wanted(setting: str, nodes: int, gpus_per_node: int, device: str) -> bool:
    """cluster.preflight: on, off, or auto (on for several nodes and for GPU jobs)."""
    return setting == "on" or setting == "auto" and (nodes > 1 or gpus_per_node > 0 or device == "gpu")

