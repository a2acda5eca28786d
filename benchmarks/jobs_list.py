"""python -m hpcdl.jobs list over a store of N jobs: seconds, CPU and peak memory per listing, against reading
the manifests alone.

Writes N ended job folders (manifest, final state, a metrics file of about 10 KB and the metrics summary
the run keeps beside it) into a temporary store, and times the command in a fresh process each time (as
a user types it): the first listing (no index yet: every folder is read and the index written), then
listings from the index (as typed: the newest 50; every job: --limit 0; --limit 20, --state FAILED, --since 1h;
median and best of --repeats),
against a bare loop that only opens and parses every manifest (the least any listing that reads the folders
must do).

    python benchmarks/jobs_list.py --jobs 10000 --jobs 100000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hpcdl.store.metrics import MetricsSummary
from common import write_result  # benchmarks/common.py

STATES = ("COMPLETED",) * 8 + ("FAILED", "CANCELLED")
LINKS = 50000


def metrics_text(n: int) -> str:
    """About 10 KB of a run's records: 60 iterations over 4 epochs and a validation per epoch."""
    records = []
    for i in range(1, 61):
        records.append({"kind": "iteration", "epoch": 1 + (i - 1) // 15, "iteration": i, "time_s": 0.25 * i,
                        "loss": 1.0 / i, "accuracy": 0.5 + i / 200, "learn_rate": 0.01,
                        "samples_per_s": 5000.0 + n % 100, "data_wait_s": 0.0012})
        if i % 15 == 0:
            records.append({"kind": "validation", "epoch": i // 15, "iteration": i, "time_s": 0.25 * i,
                            "loss": 1.0 / i, "accuracy": 0.6 + (n % 37) / 100})
    return "".join(json.dumps(r) + "\n" for r in records)


def make_store(root: Path, count: int) -> int:
    """``count`` ended jobs in ``root``; returns the size of one metrics file. The metrics and their summary
    are one run's, hard-linked into every folder (a listing never tells; the store is made in minutes, not
    an hour of writing a gigabyte on a shared disk)."""
    root.mkdir(mode=0o700, parents=True)
    now = time.time()
    text = metrics_text(0)
    summary = MetricsSummary()
    summary.add_lines(text.encode())
    for copy in range(count // LINKS + 1):  # a file has at most 65,000 links on ext4
        (root / f".metrics-{copy}.jsonl").write_text(text)
        (root / f".metrics-summary-{copy}.json").write_text(json.dumps(asdict(summary)))
    for n in range(count):
        folder = root / f"261202-{n // 60 % 10000:04d}{n % 60:02d}-{n // 600000:x}{n % 4096:03x}"
        folder.mkdir(mode=0o700)
        (folder / "manifest.json").write_text(json.dumps({
            "id": folder.name, "name": f"net{n}", "kind": "train", "profile": "slurm",
            "submitted_at": now - 2 * (count - n), "backend_id": str(1000 + n),
            "submitted_from": {"host": "login1", "cwd": "/home/ann/project"},
            "plan": {"cluster": {"backend": "slurm"}, "config": {"training": {"max_epochs": 4}}}}, indent=1))
        state = STATES[n % len(STATES)]
        (folder / "final.json").write_text(json.dumps({"state": state, "ended_at": now - 2 * (count - n) + 60}))
        (folder / "status.json").write_text(json.dumps({"state": "RUNNING", "started_at": now - 2 * (count - n)}))
        os.link(root / f".metrics-{n // LINKS}.jsonl", folder / "metrics.jsonl")
        os.link(root / f".metrics-summary-{n // LINKS}.json", folder / "metrics-summary.json")
    return len(text)


def run(command: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Wall seconds, CPU seconds and peak memory (MB) of one run of ``command`` (that child alone: wait4)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        process = subprocess.Popen(command, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        process.returncode = status  # reaped here: Popen must not wait for it again
        out.seek(0)
        err.seek(0)
        if status:
            raise RuntimeError(f"{' '.join(command)} failed: {err.read().decode()}")
        lines = out.read().count(b"\n")
    return {"wall_s": round(wall, 4), "cpu_s": round(usage.ru_utime + usage.ru_stime, 4),
            "peak_mb": round(usage.ru_maxrss / 1024, 1), "lines": lines}


def bare_read(root: Path) -> float:
    start = time.perf_counter()
    for entry in os.scandir(root):
        if not entry.name.startswith("."):
            json.loads(Path(entry.path, "manifest.json").read_text())
    return time.perf_counter() - start


def measure(count: int, repeats: int, scratch: Path) -> dict[str, Any]:
    root = scratch / f"store-{count}"
    start = time.perf_counter()
    metrics_bytes = make_store(root, count)
    made_s = time.perf_counter() - start
    env = {**os.environ, "HPCDL_STORE": str(root), "HOME": str(scratch)}
    listing = [sys.executable, "-m", "hpcdl.jobs", "list"]
    result: dict[str, Any] = {"jobs": count, "metrics_file_bytes": metrics_bytes, "store_made_s": round(made_s, 1)}
    result["first_listing_builds_index"] = run(listing, env)
    variants = {"as_typed": [], "every_job": ["--limit", "0"], "limit_20": ["--limit", "20"],
                "state_failed": ["--state", "FAILED"], "since_1h": ["--since", "1h"]}
    for label, extra in variants.items():
        runs = [run(listing + extra, env) for _ in range(repeats)]
        result[label] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        result[label]["best_wall_s"] = min(r["wall_s"] for r in runs)  # a shared machine: the least disturbed
        result[label]["best_cpu_s"] = min(r["cpu_s"] for r in runs)
    result["python_startup_s"] = statistics.median(
        run([sys.executable, "-c", "import hpcdl.jobs"], env)["wall_s"] for _ in range(repeats))
    result["bare_manifest_read_s"] = statistics.median(bare_read(root) for _ in range(repeats))
    result["ratio_list_every_job_to_bare"] = result["every_job"]["wall_s"] / result["bare_manifest_read_s"]
    shutil.rmtree(root)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, action="append", help="store sizes (default 10000 and 100000)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scratch", default="/var/tmp", help="where the store is made (not a tmpfs /tmp)")
    parser.add_argument("--out", default="benchmarks/results/jobs_list.json")
    options = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="hpcdl-store-", dir=options.scratch) as scratch:
        for count in options.jobs or [10000, 100000]:
            result = measure(count, options.repeats, Path(scratch))
            results.append(result)
            print(f"{count} jobs (metrics {result['metrics_file_bytes'] / 1024:.1f} KB each): "
                  f"first listing {result['first_listing_builds_index']['wall_s']:.2f} s; from the index: "
                  + ", ".join(f"{label} {result[label]['wall_s']:.3f} s wall (best {result[label]['best_wall_s']:.3f})"
                              f" {result[label]['cpu_s']:.3f} s CPU {result[label]['peak_mb']:.0f} MB"
                              for label in ("as_typed", "every_job", "limit_20", "state_failed", "since_1h"))
                  + f"; python start-up {result['python_startup_s']:.3f} s, bare manifest reads "
                    f"{result['bare_manifest_read_s']:.2f} s", flush=True)
    write_result(options.out, {"benchmark": "jobs_list", "host_cpus": os.cpu_count(), "results": results})


if __name__ == "__main__":
    main()
