"""What the run's views cost the training loop: train_network on the digits example with the progress plot and
TensorBoard events redrawn at every verbose row (verbose_frequency iterations) by their thread, against the
same run writing only its metrics file, and (--before COMMIT) the plot as hpcdl drew it before, in the loop
(at each validation and every 10 s). Runs alternate; each in a fresh process (tensorboard blocked there for
the baseline).

    python benchmarks/progress_views.py --epochs 6 --frequency 10 --repeats 2 --before 1161ac9
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import write_result  # benchmarks/common.py

RUN = """
import json, sys
{block}
import hpcdl
from hpcdl.data.digits import digits_folder
store = hpcdl.ImageDatastore(digits_folder())
train, validation = store.split(0.2, seed=0)
hpcdl.seed_everything(0)
model = hpcdl.build_model("small_cnn", in_channels=1, num_classes=10)
options = hpcdl.TrainingOptions(solver="adam", max_epochs={epochs}, mini_batch_size=64, validation_frequency=20,
                                verbose=False, verbose_frequency={frequency}, plots="{plots}", output_dir={out!r})
model, info = hpcdl.train_network(train, model, options, validation_data=validation)
print(json.dumps({{"train_s": info.train_s, "iterations": info.history[-1]["iteration"]}}))
"""


def run(label: str, epochs: int, frequency: int, folder: Path, before: Path) -> dict:
    """One run: ``views`` (this tree), ``metrics_only`` (this tree, no plot, no tensorboard), ``before`` (the
    code in ``before``, its plot on)."""
    code = RUN.format(block="" if label != "metrics_only" else "sys.modules['tensorboard'] = None", epochs=epochs,
                      frequency=frequency, plots="none" if label == "metrics_only" else "training-progress",
                      out=str(folder))
    env = {**os.environ, "PYTHONPATH": str(before)} if label == "before" else None
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=1800,
                          env=env, cwd=before if label == "before" else None)
    return json.loads(done.stdout.splitlines()[-1])


def extract(commit: str, into: Path) -> Path:
    """hpcdl/ as it was at ``commit``, in ``into``."""
    archive = subprocess.run(["git", "archive", commit, "hpcdl"], cwd=Path(__file__).parent.parent, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--frequency", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--before", metavar="COMMIT", help="also time the plot as this commit drew it")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "progress_views.json"))
    args = parser.parse_args()
    labels = ["metrics_only", "views"] + (["before"] if args.before else [])
    times: dict[str, list[float]] = {label: [] for label in labels}
    with tempfile.TemporaryDirectory(prefix="hpcdl-views-bench-") as scratch:
        before = extract(args.before, Path(scratch)) if args.before else Path(scratch)
        for n in range(args.repeats):
            for label in labels if n % 2 == 0 else labels[::-1]:
                result = run(label, args.epochs, args.frequency, Path(scratch) / f"{label}-{n}", before)
                times[label].append(round(result["train_s"], 3))
    medians = {label: statistics.median(values) for label, values in times.items()}
    result = {"epochs": args.epochs, "verbose_frequency": args.frequency, "iterations": result["iterations"],
              "load_average_at_end": os.getloadavg()[0], "train_s": times, "median_train_s": medians,
              "ratio_views_to_metrics_only": round(medians["views"] / medians["metrics_only"], 3)}
    if args.before:
        result.update(before=args.before,
                      ratio_views_to_before=round(medians["views"] / medians["before"], 3))
    print(json.dumps(result, indent=2))
    write_result(args.out, result)


if __name__ == "__main__":
    main()
