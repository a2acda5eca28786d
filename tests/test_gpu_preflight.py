"""Preflight's GPU checks on a GPU machine (skipped without CUDA): a healthy GPU passes them all in under 45 s.

    python -m pytest -q tests/test_gpu_preflight.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hpcdl.distributed import preflight

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_a_healthy_gpu_node_passes_every_check_in_under_45_s(tmp_path: Path) -> None:
    started = time.monotonic()
    checks = {c.name: c for c in preflight.run_checks(tmp_path, str(tmp_path), torch.cuda.device_count())}
    seconds = time.monotonic() - started
    print({name: (c.status, c.detail) for name, c in checks.items()}, f"{seconds:.1f} s")
    assert seconds < 45
    assert all(checks[name].status == "passed" for name in ("gpus", "gemm", "hbm", "store", "data", "scratch")), checks
    assert checks["nvml"].status in ("passed", "skipped"), checks["nvml"]
    assert checks["xid"].status in ("passed", "skipped"), checks["xid"]  # skipped where the kernel log is closed


def test_asking_for_more_gpus_than_the_node_has_fails_the_gpu_check() -> None:
    check = preflight._run("gpus", lambda: preflight.check_gpus(torch.cuda.device_count() + 1))
    assert check.failed and "visible" in check.detail


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs nvidia-smi")
def test_the_gpus_the_xid_check_looks_at_are_those_nvidia_smi_places_at_their_pci_addresses() -> None:
    listed = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"], capture_output=True,
                            text=True, check=True).stdout.split()
    seen = preflight.visible_gpus()
    print("visible GPUs at", sorted(seen or ()), "nvidia-smi:", listed)
    assert seen is not None and len(seen) == torch.cuda.device_count()
    assert seen <= {preflight.pci_address(address) for address in listed}


HOLDER = """
import sys, time, torch
free, total = torch.cuda.mem_get_info()
held = torch.empty(int(total * float(sys.argv[1])) // 4, dtype=torch.int32, device="cuda")
print("held", flush=True)
time.sleep(120)
"""


def test_gpu_memory_another_process_holds_fails_the_hbm_check_naming_how_much() -> None:
    """A program left over from an earlier job holding 20% of the GPU: this job would run out of memory."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "0.2"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        check = preflight._run("hbm", preflight.check_hbm)
    finally:
        holder.kill()
        holder.wait()
    print(check)
    assert check.failed and "GPU 0: " in check.detail and "GiB held by other processes (more than 10%" in check.detail
