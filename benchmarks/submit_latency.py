"""Submission latency on a Slurm cluster: hpcdl.submit against a hand-written sbatch script.

Both run the same training (the digits example, 2 epochs) on the same cluster. For each,
the time from the submit command to the job's first training step (its first metrics
record) and to its results (result.json). Runs alternate; medians are compared as
ratios hpcdl / hand-written (1.0 = as fast, below 1.0 = faster). Needs a running cluster
(bash slurm/cluster.sh up).

    python benchmarks/submit_latency.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpcdl.data.digits import digits_folder
from common import write_result  # benchmarks/common.py

POLL_S = 0.02


def _wait_for(path: Path, start: float, needle: str = "", timeout: float = 300) -> float:
    """Seconds from ``start`` until ``path`` exists (and holds ``needle``)."""
    while time.perf_counter() - start < timeout:
        if path.exists() and (not needle or needle in path.read_text(errors="replace")):
            return time.perf_counter() - start
        time.sleep(POLL_S)
    raise TimeoutError(f"{path} did not appear in {timeout} s")


def hpcdl_submit(args: list[str]) -> tuple[float, float]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hpcdl.submit", "cluster=slurm", *args],
                          capture_output=True, text=True, check=True)
    folder = Path(done.stdout.split("folder:")[1].split()[0])
    first = _wait_for(folder / "metrics.jsonl", start, '"kind": "iteration"')
    return first, _wait_for(folder / "result.json", start)


def handwritten(args: list[str], scratch: Path, n: int) -> tuple[float, float]:
    out = scratch / f"hand-{n}"
    script = scratch / f"hand-{n}.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH --job-name=handwritten\n#SBATCH --time=10\n#SBATCH --cpus-per-task=2\n"
        f"#SBATCH --output={out}.log\n"
        f"srun {shlex.quote(sys.executable)} -u -m hpcdl.run {' '.join(map(shlex.quote, args))} "
        f"training.output_dir={shlex.quote(str(out))}\n")
    start = time.perf_counter()
    subprocess.run(["sbatch", str(script)], capture_output=True, text=True, check=True)
    first = _wait_for(out / "metrics.jsonl", start, '"kind": "iteration"')
    return first, _wait_for(out / "result.json", start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/submit_latency.json")
    options = parser.parse_args()
    training = [f"data.root={digits_folder()}", "training.max_epochs=2", "training.verbose=false"]
    times: dict[str, list[tuple[float, float]]] = {"hpcdl": [], "handwritten": []}
    with tempfile.TemporaryDirectory(prefix="hpcdl-bench-") as scratch:
        for n in range(options.repeats):
            order = ("hpcdl", "handwritten") if n % 2 == 0 else ("handwritten", "hpcdl")
            for name in order:
                run = hpcdl_submit(training) if name == "hpcdl" else handwritten(training, Path(scratch), n)
                times[name].append(run)
    medians = {name: [statistics.median(t[i] for t in runs) for i in (0, 1)] for name, runs in times.items()}
    result = {"benchmark": "submit_latency", "repeats": options.repeats, "seconds": times,
              "median_first_step_s": {k: v[0] for k, v in medians.items()},
              "median_end_s": {k: v[1] for k, v in medians.items()},
              "ratio_first_step": medians["hpcdl"][0] / medians["handwritten"][0],
              "ratio_end": medians["hpcdl"][1] / medians["handwritten"][1]}
    for name, (first, end) in medians.items():
        print(f"{name:12s} first step {first:6.2f} s   results {end:6.2f} s")
    print(f"ratio hpcdl/hand-written: first step {result['ratio_first_step']:.3f}, end {result['ratio_end']:.3f}")
    write_result(options.out, result)


if __name__ == "__main__":
    main()
