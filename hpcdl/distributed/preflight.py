"""Preflight: before the ranks meet, one rank per node checks the node (cluster.preflight).

Checks, each named in the result: the GPUs the job asked for are visible; NVML's health where pynvml answers
(uncorrected ECC errors, retired or remapped rows pending, throttling for a hardware reason, a PCIe link below its
maximum); no Xid event of a fault of the job's GPUs in the kernel log since boot, where it can be read; a bf16
matrix product at an expected fraction of the GPU's peak; most of each GPU's memory free of other processes and
an HBM write/read pattern over most of what is free; the store
and the data root readable and writable (the data root readable); node-local scratch free. GPU checks are skipped,
said so, without a GPU. The store is probed inside the job's own results folder, never in the store's root (whose
time of change makes the job index look again). Then the all-reduce across the allocation (hpcdl.distributed.busbw).
The node's result goes to ``preflight-results/NODE.preflight.json`` in the job folder. A node that fails is named
with its failed checks; the checks run within BUDGET_S in all, and one still running then fails the node. On
Slurm the first run of the job is queued again with that node excluded (the backend's ``requeue_excluding``),
recorded in the job's events; a second failure fails the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
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


HBM_SHARE = 0.8
"""The share of each GPU's free memory the HBM pattern covers (held at once, so that it spans the memory)."""
HBM_CHUNK_WORDS = 256 * 1024**2
"""The most words (int32) per allocation of the pattern, each compared at once (1 GiB)."""
HBM_FREE_LEAST = 0.9
"""The least share of each GPU's memory that must be free of other processes (a program left over from an
earlier job holding the rest makes this one run out of memory)."""
HBM_KEYS = (0x5A5A5A5A, -0x5A5A5A5B)
"""The patterns' keys: the word's index in its chunk XOR each (and the chunk's number), so that every bit is
written as 0 and as 1."""


def _chunk_key(key: int, number: int) -> int:
    """The key of chunk ``number``'s pattern, as a signed 32-bit value: each chunk's differs, so that memory read
    back from the wrong address does not match (a word's index within its chunk stays below 2**31)."""
    mixed = (key ^ (number * 0x01000193)) & 0xFFFFFFFF
    return mixed - (1 << 32) if mixed >= 1 << 31 else mixed


def check_hbm(share: float = HBM_SHARE, free_least: float = HBM_FREE_LEAST) -> Optional[str]:
    """``free_least`` of each GPU's memory is not held by another process, and a pattern written over ``share``
    of its free memory reads back unchanged, with every bit written both ways (two passes)."""
    torch = _cuda()
    problems = []
    torch.cuda.empty_cache()
    for index in range(torch.cuda.device_count()):
        device = f"cuda:{index}"
        free, total = torch.cuda.mem_get_info(device)
        others = total - free - torch.cuda.memory_reserved(device)  # with this process's CUDA context
        if others > (1 - free_least) * total:
            problems.append(f"GPU {index}: {others / 1024**3:.1f} of its {total / 1024**3:.1f} GiB held by other "
                            f"processes (more than {1 - free_least:.0%}: a program left over from an earlier job?)")
        words = int(free * share) // 4
        step = min(HBM_CHUNK_WORDS, max(1, words // 8))  # the rest of the free memory holds a slice to compare
        chunks = [torch.empty(min(step, words - start), device=device, dtype=torch.int32)
                  for start in range(0, words, step)]
        bad = 0
        for key in HBM_KEYS:
            for number, chunk in enumerate(chunks):
                torch.arange(chunk.numel(), device=device, dtype=torch.int32, out=chunk).bitwise_xor_(
                    _chunk_key(key, number))
            for number, chunk in enumerate(chunks):
                expected = torch.arange(chunk.numel(), device=device, dtype=torch.int32).bitwise_xor_(
                    _chunk_key(key, number))
                bad += int((chunk != expected).sum())
                del expected
        torch.cuda.synchronize(device)
        covered = sum(chunk.numel() for chunk in chunks) * 4 / 1024**3
        del chunks
        torch.cuda.empty_cache()
        if bad:
            problems.append(f"GPU {index}: {bad} word(s) of the memory pattern read back changed "
                            f"({covered:.1f} GiB written twice)")
    return "; ".join(problems) or None


XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+),? ?(.*)$")
"""The driver's line for an Xid event in the kernel log: ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., ...``."""
XID_NODE_FAULTS = {48: "double-bit ECC error", 61: "internal micro-controller breakpoint",
                   62: "internal micro-controller halt", 64: "ECC page retirement or row remapping failure",
                   74: "NVLink error", 79: "GPU has fallen off the bus", 95: "uncontained ECC error",
                   119: "GSP RPC timeout", 120: "GSP error", 122: "SPI PMU RPC read failure",
                   123: "SPI PMU RPC write failure", 140: "unrecovered ECC error"}
"""Xid events that tell of a fault of the GPU or its links, by NVIDIA's Xid catalogue; not a program's (13, 31,
43, 45) nor what the GPU recovered from (63 a row remapped, which NVML's pending rows tell; 92 a high corrected
ECC rate; 94 a contained ECC error, whose program was ended)."""


def kernel_log() -> list[str]:
    """The kernel's messages since boot (dmesg, else journalctl -k); SkipCheck where neither may be read here
    (kernel.dmesg_restrict for a user without CAP_SYSLOG)."""
    said = []
    for command in (["dmesg", "--notime"], ["journalctl", "-k", "-b", "-q", "--no-pager", "-o", "cat"]):
        if shutil.which(command[0]) is None:
            continue
        try:
            done = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=10)
        except (OSError, subprocess.TimeoutExpired) as e:
            said.append(f"{command[0]}: {e}")
            continue
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.splitlines()
        said.append(f"{command[0]}: {(done.stderr.strip() or 'nothing').splitlines()[-1]}")
    raise SkipCheck("the kernel log is not readable here (" + "; ".join(said or ["no dmesg or journalctl"]) + ")")


def pci_address(text: str) -> tuple[int, int, int]:
    """(domain, bus, device) of a PCI address as the driver or NVML writes it: ``0000:3B:00``,
    ``00000000:3b:00.0``."""
    domain, bus, device = text.split(".")[0].split(":")
    return int(domain, 16), int(bus, 16), int(device, 16)


def _of(address: str, gpus: Optional[set[tuple[int, int, int]]]) -> bool:
    """Whether PCI ``address`` is one of ``gpus`` (None: all); an address of another shape may be one of them."""
    try:
        return gpus is None or pci_address(address) in gpus
    except ValueError:
        return True


def xid_faults(lines: list[str], gpus: Optional[set[tuple[int, int, int]]] = None) -> Optional[str]:
    """The Xid events of GPU faults among kernel log ``lines``, counted by GPU (PCI address) and Xid, of the
    GPUs at PCI addresses ``gpus`` (None: of all); None when there are none."""
    counts: dict[tuple[str, int], int] = {}
    for line in lines:
        found = XID_LINE.search(line)
        if found is not None and int(found.group(2)) in XID_NODE_FAULTS and _of(found.group(1), gpus):
            key = (found.group(1).lower(), int(found.group(2)))
            counts[key] = counts.get(key, 0) + 1
    return "; ".join(f"GPU {pci}: Xid {xid} ({XID_NODE_FAULTS[xid]})" + (f" x{n}" if n > 1 else "")
                     for (pci, xid), n in sorted(counts.items())) or None


def visible_gpus() -> Optional[set[tuple[int, int, int]]]:
    """The PCI addresses of the GPUs this job sees (CUDA_VISIBLE_DEVICES, Slurm's cgroup); None where torch does
    not tell them."""
    torch = _cuda()
    try:
        return {(props.pci_domain_id, props.pci_bus_id, props.pci_device_id) for props in (
            torch.cuda.get_device_properties(index) for index in range(torch.cuda.device_count()))}
    except AttributeError:
        return None


def check_xid() -> Optional[str]:
    """No Xid event of a fault of one of the job's GPUs in the kernel log since boot, where it can be read (a
    node's other GPUs, another job's, are theirs)."""
    return xid_faults(kernel_log(), visible_gpus())


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


BUDGET_S = 45.0
"""The time a node's checks have in all: a check still running then (a wedged GPU, a hung filesystem) fails the
node, and the checks after it are skipped."""


def run_checks(job: Path, data_root: Optional[str], gpus_asked: int, budget_s: float = BUDGET_S) -> list[Check]:
    """Every check of this node, in order, within ``budget_s``; ``job``: the job folder (the store is probed
    inside it)."""
    checks: list[tuple[str, Callable[[], Optional[str]]]] = [
        ("gpus", lambda: check_gpus(gpus_asked)), ("nvml", check_nvml), ("xid", check_xid), ("gemm", check_gemm),
        ("hbm", check_hbm), ("store", lambda: check_store(job))]
    if data_root is not None and "://" not in data_root:
        checks.append(("data", lambda: check_readable(Path(data_root).expanduser(), "the data root")))
    checks.append(("scratch", check_scratch))
    with contextlib.suppress(ImportError):  # its import, seconds on a cold node, is not a check's time
        import torch  # noqa: F401
    return run_within(checks, budget_s)


def run_within(checks: list[tuple[str, Callable[[], Optional[str]]]], budget_s: float) -> list[Check]:
    """Run the named ``checks`` in order, each in a thread of its own: one still running when ``budget_s`` has
    passed since the first started is failed (it is left behind, a daemon thread) and the rest are skipped."""
    deadline = time.monotonic() + budget_s
    done: list[Check] = []
    for number, (name, check) in enumerate(checks):
        outcome: list[Check] = []
        started = time.monotonic()
        worker = threading.Thread(target=lambda: outcome.append(_run(name, check)), name=f"hpcdl-preflight-{name}",
                                  daemon=True)
        worker.start()
        worker.join(max(0.0, deadline - time.monotonic()))
        if outcome:
            done.append(outcome[0])
            continue
        if not worker.is_alive():  # it ended the thread itself (SystemExit, KeyboardInterrupt)
            done.append(Check(name, "failed", "ended without an outcome"))
            continue
        done.append(Check(name, "failed", f"still running after {time.monotonic() - started:.0f} s, past the "
                                          f"node's {budget_s:.0f} s for every check (a hung GPU or filesystem?)"))
        done += [Check(later, "skipped", f"no time left: {name} overran") for later, _ in checks[number + 1:]]
        break
    return done


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
    "hbm": "end what holds the GPU's memory (nvidia-smi lists the processes) or drain the node; a memory that "
           "does not hold the pattern: drain the node",
    "xid": "drain the node and have its GPU checked: the driver logged a GPU fault (Xid) since boot; a reboot "
           "clears the log once the GPU is fixed",
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

