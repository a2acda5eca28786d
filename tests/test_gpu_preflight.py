"""Preflight's GPU checks on a GPU machine (skipped without CUDA): a healthy GPU passes them all in under 45 s.

    python -m pytest -q tests/test_gpu_preflight.py
"""

from __future__ import annotations

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
