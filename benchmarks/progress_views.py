"""What the run's views cost the training loop: train_network on the digits example with the progress plot and
TensorBoard events redrawn at every verbose row (verbose_frequency iterations) by their thread, against the
same run writing only its metrics file. Runs alternate; each in a fresh process (tensorboard blocked there
for the baseline).

    python benchmarks/progress_views.py --epochs 6 --frequency 10 --repeats 2
"""

from __future__ import annotations

import argparse
import json
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


def run(views: bool, epochs: int, frequency: int, folder: Path) -> dict:
    code = RUN.format(block="" if views else "sys.modules['tensorboard'] = None", epochs=epochs, frequency=frequency,
                      plots="training-progress" if views else "none", out=str(folder))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=1800)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--frequency", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "progress_views.json"))
    args = parser.parse_args()
    times: dict[str, list[float]] = {"views": [], "metrics_only": []}
    with tempfile.TemporaryDirectory(prefix="hpcdl-views-bench-") as scratch:
        for n in range(args.repeats):
            for label in ("metrics_only", "views") if n % 2 == 0 else ("views", "metrics_only"):
                result = run(label == "views", args.epochs, args.frequency, Path(scratch) / f"{label}-{n}")
                times[label].append(round(result["train_s"], 3))
    medians = {label: statistics.median(values) for label, values in times.items()}
    result = {"epochs": args.epochs, "verbose_frequency": args.frequency, "iterations": result["iterations"],
              "train_s": times, "median_train_s": medians,
              "ratio_views_to_metrics_only": round(medians["views"] / medians["metrics_only"], 3)}
    print(json.dumps(result, indent=2))
    write_result(args.out, result)


if __name__ == "__main__":
    main()
