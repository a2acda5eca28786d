"""python -m hpcdl.devices: the GPU table, or a clear word that there is none."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from hpcdl.devices import format_table
from hpcdl.gpus import GpuInfo, gpu_count


def _devices(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "hpcdl.devices", *args], check=True,
                          capture_output=True, text=True).stdout


def test_devices_reports_what_torch_sees() -> None:
    report = json.loads(_devices("--json"))
    assert report["gpu_count"] == gpu_count() == torch.cuda.device_count()
    assert report["cpu_count"] >= 1
    if report["gpu_count"] == 0:
        assert "No GPU visible to this process" in _devices()


def test_table_has_one_row_per_gpu_with_every_column() -> None:
    rows = [GpuInfo(0, "NVIDIA H200", 139.8, 139.1, "9.0", 0), GpuInfo(1, "NVIDIA H200", 139.8, 100.0, "9.0", None)]
    lines = format_table(rows).splitlines()
    assert lines[0].split() == ["Index", "Name", "TotalMemory(GiB)", "FreeMemory(GiB)", "ComputeCapability",
                                "Utilization(%)"]
    assert lines[1].split() == ["0", "NVIDIA", "H200", "139.8", "139.1", "9.0", "0"]
    assert lines[2].split() == ["1", "NVIDIA", "H200", "139.8", "100.0", "9.0"]
