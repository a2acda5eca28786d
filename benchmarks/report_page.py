"""python -m hpcdl.jobs report over a 100-point sweep: seconds and size of the page, against the sweep's text
table (jobs show) over the same store.

Runs a real 2-point sweep of the digits example (8 epochs: 184 iterations, 10 validations, a 10x10 confusion
matrix per point) in a temporary store, then makes it a sweep of N points by copying its first point's folder
N-2 times (each copy its own id, number and learning rate), as a sweep of N such runs leaves the store. Times
the page's build in-process (the build alone) and the command in a fresh process (as a user types it).

    python benchmarks/report_page.py --points 100
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import write_result  # benchmarks/common.py


def real_sweep(env: dict[str, str]) -> str:
    """Submit and wait for a 2-point sweep of the digits example; its id."""
    done = subprocess.run([sys.executable, "-m", "hpcdl.submit", "-m", "training.initial_learn_rate=0.003,0.001",
                           "wait=true", "hydra.launcher.poll_s=0.5"], env=env, capture_output=True, text=True,
                          check=True, timeout=900)
    return re.search(r"Submitted sweep (\S+):", done.stdout).group(1)


def grow(store: Path, sweep: str, points: int) -> None:
    """Make ``sweep`` a sweep of ``points``: copies of its point 0, each with its own id, number and rate."""
    sweep_manifest = json.loads((store / sweep / "manifest.json").read_text())
    template = store / f"{sweep}_0"
    for num in range(2, points):
        folder = store / f"{sweep}_{num}"
        shutil.copytree(template, folder, symlinks=True)
        manifest = json.loads((folder / "manifest.json").read_text())
        override = f"training.initial_learn_rate={0.003 / (1 + num)}"
        manifest.update(id=folder.name, overrides=[override])
        manifest["sweep"] = {**manifest["sweep"], "num": num, "overrides": [override]}
        (folder / "manifest.json").write_text(json.dumps(manifest))
        sweep_manifest["points"].append(folder.name)
    (store / sweep / "manifest.json").write_text(json.dumps(sweep_manifest))


def timed(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=300)
    return time.perf_counter() - start


def measure(points: int, repeats: int, scratch: Path) -> dict[str, Any]:
    store = scratch / "store"
    env = {**os.environ, "HPCDL_STORE": str(store), "HOME": str(scratch)}
    start = time.perf_counter()
    sweep = real_sweep(env)
    sweep_s = time.perf_counter() - start
    grow(store, sweep, points)
    os.environ.update(HPCDL_STORE=str(store), HOME=str(scratch))
    from hpcdl.lifecycle.report_page import write_report

    page = scratch / "page.html"
    builds = []
    for _ in range(repeats):
        start = time.perf_counter()
        write_report(sweep, page)
        builds.append(time.perf_counter() - start)
    report = [sys.executable, "-m", "hpcdl.jobs", "report", sweep, "--to", str(page)]
    show = [sys.executable, "-m", "hpcdl.jobs", "show", sweep]
    commands = [timed(report, env) for _ in range(repeats)]
    shows = [timed(show, env) for _ in range(repeats)]
    startup = [timed([sys.executable, "-c", "import hpcdl.jobs"], env) for _ in range(repeats)]
    text = page.read_text()
    return {"points": points, "real_sweep_of_2_s": round(sweep_s, 1),
            "metrics_bytes_per_point": (store / f"{sweep}_0" / "metrics.jsonl").stat().st_size,
            "build_in_process_s": round(statistics.median(builds), 3), "builds_s": [round(b, 3) for b in builds],
            "jobs_report_command_s": round(statistics.median(commands), 3),
            "jobs_show_command_s": round(statistics.median(shows), 3),
            "python_import_hpcdl_jobs_s": round(statistics.median(startup), 3),
            "ratio_report_to_show": round(statistics.median(commands) / statistics.median(shows), 3),
            "page_bytes": len(text.encode()), "trial_rows": text.count('<tr id="row-'),
            "svg_curves": text.count("<svg"), "confusion_matrices": text.count('class="confusion"')}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "report_page.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpcdl-report-bench-") as scratch:
        result = measure(args.points, args.repeats, Path(scratch))
    print(json.dumps(result, indent=2))
    write_result(args.out, result)


if __name__ == "__main__":
    main()
