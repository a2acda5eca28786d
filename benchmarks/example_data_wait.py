"""The data-wait share of the example's training steps (digits, small_cnn) by number of background workers.

Runs `python -m hpcdl.run` on the example with dispatch_in_background for each worker count and reads the
steady-state share (epochs after the first, once the workers run) from its metrics.jsonl.

    python benchmarks/example_data_wait.py --workers 0 2 4 8 [--device gpu]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import write_result


def steady_share(metrics: Path) -> float:
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steady = [r for r in records if r["kind"] == "iteration" and r["epoch"] > 1]
    return sum(r["data_wait_s"] for r in steady) / (steady[-1]["time_s"] - steady[0]["time_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--device", default="auto", help="training.execution_environment")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--out", default="benchmarks/results/example_data_wait.json")
    args = parser.parse_args()
    shares = {}
    for workers in args.workers:
        with tempfile.TemporaryDirectory() as folder:
            background = [f"training.dispatch_in_background={str(workers > 0).lower()}",
                          f"training.num_workers={workers}"]
            subprocess.run([sys.executable, "-m", "hpcdl.run", f"training.output_dir={folder}",
                            f"training.execution_environment={args.device}", f"training.max_epochs={args.epochs}",
                            "training.verbose=false", *background], check=True, capture_output=True)
            shares[workers] = steady_share(Path(folder) / "metrics.jsonl")
        print(f"{workers:3d} background workers: data wait {100 * shares[workers]:.2f}% of the step time")
    write_result(args.out, {"benchmark": "example_data_wait", **vars(args), "data_wait_share": shares})


if __name__ == "__main__":
    main()
