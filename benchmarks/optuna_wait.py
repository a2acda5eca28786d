"""An Optuna study on the local Slurm cluster: hydra/launcher=hpcdl against hydra-submitit-launcher.

The same @hydra.main app and the same study (Hydra's Optuna sweeper, seeded TPE sampler, --trials trials asked
--batch at a time, one CPU and 1 GB a trial) through each launcher; hpcdl without any wait setting (it waits
because the sweeper needs the trials' values). Seconds from the command to its end, runs alternating; each run
must report the study's best value. Medians, best and spread, and the ratio hpcdl / submitit, printed and
written to benchmarks/results/.

    export SLURM_CONF=/var/tmp/hpcdl-slurm/etc/slurm.conf; python benchmarks/optuna_wait.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from common import write_result  # benchmarks/common.py

APP = '''
import hydra


@hydra.main(version_base=None, config_path=".", config_name="config")
def main(cfg):
    return (cfg.x - 3) ** 2


if __name__ == "__main__":
    main()
'''
CONFIG = '''
defaults:
  - override hydra/sweeper: optuna
  - _self_
x: 0
hydra:
  sweeper:
    sampler:
      seed: 0
    direction: minimize
    n_trials: {trials}
    n_jobs: {batch}
    params:
      x: range(0, 10)
'''


def _study(command: list[str], work: Path, env: dict[str, str], sweep_dir: Path) -> float:
    """Seconds the study took; RuntimeError unless it ended with a best value."""
    start = time.perf_counter()
    done = subprocess.run([*command, f"hydra.sweep.dir={sweep_dir}"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=1800)
    elapsed = time.perf_counter() - start
    results = sweep_dir / "optimization_results.yaml"
    if done.returncode != 0 or not results.is_file():
        raise RuntimeError(f"{' '.join(command[:4])} ... failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    if "best_value" not in yaml.safe_load(results.read_text()):
        raise RuntimeError(f"{results}: no best value")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--batch", type=int, default=2, help="trials asked at once (the sweeper's n_jobs)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/optuna_wait.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hpcdl-optuna-bench-"))
    (work / "app.py").write_text(APP)
    (work / "config.yaml").write_text(CONFIG.format(trials=args.trials, batch=args.batch))
    env = {**os.environ, "HPCDL_STORE": str(work / "store")}
    commands = {
        "hpcdl": [sys.executable, "app.py", "-m", "hydra/launcher=hpcdl", "hydra.launcher.cluster=slurm",
                  "+hydra.launcher.resources={cpus_per_task: 1, mem: 1G}"],
        "submitit": [sys.executable, "app.py", "-m", "hydra/launcher=submitit_slurm", "hydra.launcher.cpus_per_task=1",
                     "hydra.launcher.mem_gb=1", "hydra.launcher.timeout_min=30",
                     f"hydra.launcher.submitit_folder={work}/submitit/%j"],
    }
    seconds: dict[str, list[float]] = {name: [] for name in commands}
    for repeat in range(args.repeats):
        for name in (("hpcdl", "submitit") if repeat % 2 == 0 else ("submitit", "hpcdl")):
            seconds[name].append(_study(commands[name], work, env, work / f"{name}-{repeat}"))
            print(f"{name:9s} {seconds[name][-1]:6.2f} s", flush=True)
    result = {"benchmark": "optuna_wait", "trials": args.trials, "batch": args.batch, "repeats": args.repeats,
              "cluster": "slurm/cluster.sh: 2 nodes x 4 CPUs on one 2-core machine",
              **{f"{name}_s": {"median": statistics.median(v), "best": min(v), "spread": max(v) - min(v), "runs": v}
                 for name, v in seconds.items()}}
    result["ratio_hpcdl_over_submitit"] = result["hpcdl_s"]["median"] / result["submitit_s"]["median"]
    write_result(args.out, result)
    for name in commands:
        figures = result[f"{name}_s"]
        print(f"{name:9s} median {figures['median']:6.2f}  best {figures['best']:6.2f}  spread {figures['spread']:5.2f}")
    print(f"ratio hpcdl / submitit: {result['ratio_hpcdl_over_submitit']:.3f}")


if __name__ == "__main__":
    main()
