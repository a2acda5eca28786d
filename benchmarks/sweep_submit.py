"""Sweeps on the local Slurm cluster: hpcdl's launcher against hydra-submitit-launcher, listing, packing.

In one run, with the runs of each comparison alternating:
  1. the same @hydra.main app, a sweep of --points trivial points, through hydra/launcher=hpcdl and through
     hydra/launcher=submitit_slurm (both one CPU and 1 GB a point): seconds from the command to the shell
     prompt (submitit blocks until every point ended; hpcdl returns once the array is queued) and to the
     last point's end;
  2. `python -m hpcdl.jobs list` with those sweeps in the store;
  3. --packed one-epoch training points of hpcdl's own app, packed 8 to an array task of 4 CPUs
     (hydra.launcher.points_per_task=8) against one array task of 1 CPU per point: seconds to all done.
Medians, best and spread are printed as ratios hpcdl / baseline and written to benchmarks/results/.

With --scale N [N ...] it measures large sweeps instead: a sweep of N points of the same app (points that do
nothing) on the local profile and, with --slurm, on the test cluster: seconds to the prompt, the submitting
process's CPU seconds and peak memory, then `jobs cancel SWEEP` (the same three); results in
benchmarks/results/sweep_scale.json.

    eval "$(bash slurm/cluster.sh env)"; python benchmarks/sweep_submit.py [--points 100] [--repeats 2]
    python benchmarks/sweep_submit.py --scale 2000 10000 [--slurm]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import write_result  # benchmarks/common.py

APP = '''
import hydra


@hydra.main(version_base=None, config_path=".", config_name="config")
def main(cfg):
    return cfg.x * cfg.x


if __name__ == "__main__":
    main()
'''


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} ... failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return elapsed, done.stdout


def _wait(sweep: str, env: dict[str, str], cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "hpcdl.jobs", "wait", sweep], cwd=cwd, env=env, check=True,
                   capture_output=True, timeout=1800)


def _sweep_id(stdout: str) -> str:
    return re.search(r"Submitted sweep (\S+):", stdout).group(1)


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "best": min(values), "spread": max(values) - min(values),
            "runs": values}


def _measured(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[dict[str, float], str]:
    """Run ``command``: its seconds, its own CPU seconds (user + system) and peak memory (os.wait4), its output."""
    with tempfile.TemporaryFile("w+") as out:
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(process.pid, 0)
        elapsed = time.perf_counter() - start
        out.seek(0)
        text = out.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(command[:4])} ... failed:\n{text[-3000:]}")
    return {"wall_s": round(elapsed, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_mb": round(usage.ru_maxrss / 1024, 1)}, text


def scale(sizes: list[int], slurm: bool, out: str) -> None:
    """Sweeps of ``sizes`` points that do nothing: to the prompt, then cancelled (time, CPU, peak memory)."""
    work = Path(tempfile.mkdtemp(prefix="hpcdl-sweep-scale-"))
    (work / "app.py").write_text(APP)
    (work / "config.yaml").write_text("x: 0\n")
    env = {**os.environ, "HPCDL_STORE": str(work / "store")}
    results = []
    for profile in ["local"] + (["slurm"] if slurm else []):
        for size in sizes:
            submitted, stdout = _measured([sys.executable, "app.py", "-m", "hydra/launcher=hpcdl",
                                           f"hydra.launcher.cluster={profile}", f"x=range({size})"], work, env)
            cancelled, said = _measured([sys.executable, "-m", "hpcdl.jobs", "cancel", _sweep_id(stdout)], work, env)
            row = {"profile": profile, "points": size, "to_prompt": submitted, "cancel": cancelled,
                   "cancel_said": said.strip()}
            if profile == "slurm":
                row["arrays"] = len(re.search(r"Slurm array\(s\) (\S+)", stdout).group(1).split(","))
            results.append(row)
            print(row, flush=True)
    write_result(out, {"benchmark": "sweep_scale", "machine": f"{os.cpu_count()} CPUs, shared", "runs": results})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, nargs="+", help="sweeps of these many points: to the prompt, cancel")
    parser.add_argument("--slurm", action="store_true", help="with --scale: on the test cluster too")
    parser.add_argument("--points", type=int, default=100)
    parser.add_argument("--packed", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.scale:
        scale(args.scale, args.slurm, args.out or "benchmarks/results/sweep_scale.json")
        return
    args.out = args.out or "benchmarks/results/sweep_submit.json"
    work = Path(tempfile.mkdtemp(prefix="hpcdl-sweep-bench-"))
    (work / "app.py").write_text(APP)
    (work / "config.yaml").write_text("x: 0\n")
    env = {**os.environ, "HPCDL_STORE": str(work / "store")}
    points = f"x=range({args.points})"
    hpcdl = [sys.executable, "app.py", "-m", "hydra/launcher=hpcdl", "hydra.launcher.cluster=slurm",
             "+hydra.launcher.resources={cpus_per_task: 1, mem: 1G}", points]
    submitit = [sys.executable, "app.py", "-m", "hydra/launcher=submitit_slurm", "hydra.launcher.cpus_per_task=1",
                "hydra.launcher.mem_gb=1", "hydra.launcher.timeout_min=30",
                f"hydra.launcher.submitit_folder={work}/submitit/%j", points]
    figures: dict[str, list[float]] = {"hpcdl_prompt_s": [], "hpcdl_all_done_s": [], "submitit_prompt_s": []}
    for repeat in range(args.repeats):
        for name in (("hpcdl", "submitit") if repeat % 2 == 0 else ("submitit", "hpcdl")):
            if name == "hpcdl":
                start = time.perf_counter()
                prompt, out = _run(hpcdl, work, env)
                _wait(_sweep_id(out), env, work)
                figures["hpcdl_prompt_s"].append(prompt)
                figures["hpcdl_all_done_s"].append(time.perf_counter() - start)
            else:
                figures["submitit_prompt_s"].append(_run(submitit, work, env)[0])
            print(name, {k: round(v[-1], 2) for k, v in figures.items() if v}, flush=True)
    listing = []
    for _ in range(5):
        listing.append(_run([sys.executable, "-m", "hpcdl.jobs", "list"], work, env)[0])
    training = [sys.executable, "-m", "hpcdl.submit", "-m", "cluster=slurm", "training.max_epochs=1",
                f"training.seed=range({args.packed})", "hydra.launcher.wait=true", "hydra.launcher.poll_s=0.5"]
    packing: dict[str, list[float]] = {"packed_s": [], "one_per_point_s": []}
    for repeat in range(args.repeats):
        for name in (("packed", "one") if repeat % 2 == 0 else ("one", "packed")):
            if name == "packed":
                packing["packed_s"].append(_run([*training, "cluster.cpus_per_task=4",
                                                 "hydra.launcher.points_per_task=8"], work, env)[0])
            else:
                packing["one_per_point_s"].append(_run([*training, "cluster.cpus_per_task=1"], work, env)[0])
            print(name, {k: round(v[-1], 2) for k, v in packing.items() if v}, flush=True)
    result = {
        "benchmark": "sweep_submit", "points": args.points, "packed_points": args.packed, "repeats": args.repeats,
        "cluster": "slurm/cluster.sh: 2 nodes x 4 CPUs on one 2-core machine",
        **{k: _stats(v) for k, v in {**figures, **packing}.items()}, "jobs_list_s": _stats(listing),
    }
    result["ratio_prompt_hpcdl_over_submitit"] = (result["hpcdl_prompt_s"]["median"]
                                                  / result["submitit_prompt_s"]["median"])
    result["ratio_all_done_hpcdl_over_submitit"] = (result["hpcdl_all_done_s"]["median"]
                                                    / result["submitit_prompt_s"]["median"])
    result["ratio_packed_over_one_per_point"] = (result["packed_s"]["median"]
                                                 / result["one_per_point_s"]["median"])
    write_result(args.out, result)
    for key in ("hpcdl_prompt_s", "submitit_prompt_s", "hpcdl_all_done_s", "jobs_list_s", "packed_s",
                "one_per_point_s"):
        print(f"{key:20s} median {result[key]['median']:7.2f}  best {result[key]['best']:7.2f}  "
              f"spread {result[key]['spread']:6.2f}")
    for key in ("ratio_prompt_hpcdl_over_submitit", "ratio_all_done_hpcdl_over_submitit",
                "ratio_packed_over_one_per_point"):
        print(f"{key:36s} {result[key]:.3f}")


if __name__ == "__main__":
    main()
