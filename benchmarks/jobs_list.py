"""python -m hpcdl.jobs list over a store of N jobs: seconds per listing, against reading the manifests alone.

Writes N finished job folders (manifest, status, a metrics file) into a temporary store and
times the whole command in a fresh process (as a user types it), against a bare loop that
only opens and parses every manifest (the least any file-based store must do).

    python benchmarks/jobs_list.py [--jobs 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpcdl.store.folders import write_json
from common import write_result  # benchmarks/common.py


def make_store(root: Path, count: int) -> None:
    for n in range(count):
        folder = root / f"261202-{n:06d}-beef"
        folder.mkdir(parents=True)
        write_json(folder / "manifest.json", {
            "id": folder.name, "name": f"net{n}", "kind": "train", "profile": "slurm",
            "submitted_at": n, "backend_id": str(n),
            "plan": {"cluster": {"backend": "slurm"}, "config": {"training": {"max_epochs": 4}}}})
        write_json(folder / "status.json", {"state": "COMPLETED", "started_at": 0, "ended_at": 60})
        (folder / "metrics.jsonl").write_text("".join(
            json.dumps({"kind": "iteration", "epoch": 1 + i // 10, "iteration": i + 1, "loss": 1.0, "accuracy": 0.5})
            + "\n" for i in range(40)))


def bare_read(root: Path) -> float:
    start = time.perf_counter()
    for entry in os.scandir(root):
        json.loads(Path(entry.path, "manifest.json").read_text())
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/jobs_list.json")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpcdl-store-") as scratch:
        root = Path(scratch) / "store"
        make_store(root, options.jobs)
        env = {**os.environ, "HPCDL_STORE": str(root), "HOME": scratch}
        listing, bare, startup = [], [], []
        for _ in range(options.repeats):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "hpcdl.jobs", "list"], env=env, check=True, capture_output=True)
            listing.append(time.perf_counter() - start)
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import hpcdl.jobs"], env=env, check=True)
            startup.append(time.perf_counter() - start)
            bare.append(bare_read(root))
    result = {"benchmark": "jobs_list", "jobs": options.jobs, "list_s": statistics.median(listing),
              "python_startup_s": statistics.median(startup), "bare_manifest_read_s": statistics.median(bare)}
    result["ratio_list_minus_startup_to_bare"] = (result["list_s"] - result["python_startup_s"]) / result["bare_manifest_read_s"]
    print(f"jobs list over {options.jobs} jobs: {result['list_s']:.3f} s (python start-up {result['python_startup_s']:.3f} s, "
          f"bare manifest reads {result['bare_manifest_read_s']:.3f} s, "
          f"ratio {result['ratio_list_minus_startup_to_bare']:.2f})")
    write_result(options.out, result)


if __name__ == "__main__":
    main()
