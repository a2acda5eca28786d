"""python -m hpcdl.devices: the GPU table (MATLAB's gpuDeviceTable) and count."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from hpcdl.gpus import GpuInfo, cpu_count, gpu_table

def format_table(rows: list[GpuInfo]) -> str:
    """The table as text, one GPU a line."""
    header = ("Index", "Name", "TotalMemory(GiB)", "FreeMemory(GiB)", "ComputeCapability", "Utilization(%)")
    cells = [header] + [(str(r.index), r.name, f"{r.total_memory_gib:.1f}",
                         "" if r.free_memory_gib is None else f"{r.free_memory_gib:.1f}",
                         r.compute_capability, "" if r.utilization_pct is None else str(r.utilization_pct))
                        for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcdl.devices", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    args = parser.parse_args(argv)
    rows = gpu_table()
    if args.json:
        print(json.dumps({"gpus": [asdict(r) for r in rows], "gpu_count": len(rows), "cpu_count": cpu_count()}))
    elif rows:
        print(format_table(rows))
        print(f"{len(rows)} GPU(s); indices count from 0 (training.gpus=[0,2] uses the first and third)")
    else:
        print(f"No GPU visible to this process; {cpu_count()} CPU(s) available: "
              "training runs on the CPU (execution_environment=auto or cpu)")
    return 0


def cli() -> None:
    """Console-script entry point."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    cli()
