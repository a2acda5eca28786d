"""A job on a held pool against a fresh sbatch job: seconds from submit to the job's first line (issue 26's target:
a job on a held pool reaches its first step within 2 s of submit).

Starts a pool on the test Slurm cluster (python -m hpcdl.pool start), then submits the same one-line script job
by the command line a user types, in turn on the pool (cluster.pool) and as a job of its own (sbatch through the
queue), each waited for before the next. Timed from launching python -m hpcdl.submit to: its prompt, and the
script's first line on the node (it writes time.time()). Medians are compared as a ratio pool / fresh.
Needs the test cluster (slurm/cluster.sh up).

    python benchmarks/pool_start.py [--repeats 5]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402  benchmarks/common.py

SCRIPT = "import sys, time\nopen(sys.argv[1], 'w').write(repr(time.time()))\n"


def hpcdl(*args: str, env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", *args], env=env, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr}")
    return done.stdout


def one(overrides: list[str], mark: Path, env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(seconds to the prompt, seconds to the script's first line) of one submission, waited for."""
    start_wall, start = time.time(), time.perf_counter()
    out = hpcdl("hpcdl.submit", "cluster=slurm", "script=job.py", "cluster.time=2", *overrides, "--", str(mark),
                env=env, cwd=cwd)
    prompt = time.perf_counter() - start
    job = out.split()[2]
    hpcdl("hpcdl.jobs", "wait", job, "--timeout", "300", env=env, cwd=cwd)
    return prompt, float(mark.read_text()) - start_wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/pool_start.json")
    options = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="hpcdl-bench-pool-"))
    (scratch / "job.py").write_text(SCRIPT)
    env = {**os.environ, "HPCDL_STORE": str(scratch / "store")}
    hpcdl("hpcdl.pool", "start", "cluster=slurm", "name=bench", "time=00:20:00", "idle_timeout=02:00",
          "--wait", "600", env=env, cwd=scratch)
    times: dict[str, list[float]] = {"pool_prompt": [], "pool_first_line": [], "fresh_prompt": [],
                                     "fresh_first_line": []}
    try:
        for n in range(options.repeats):
            for kind, overrides in (("pool", ["cluster.pool=bench"]), ("fresh", [])):
                prompt, first = one(overrides, scratch / f"{kind}-{n}", env, scratch)
                times[f"{kind}_prompt"].append(prompt)
                times[f"{kind}_first_line"].append(first)
    finally:
        hpcdl("hpcdl.pool", "stop", "bench", "cluster=slurm", env=env, cwd=scratch)
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {"benchmark": "pool_start", "repeats": options.repeats, "load_average": os.getloadavg(),
              "cpus": os.cpu_count(), "seconds": times, "median_s": medians,
              "ratio_first_line_pool_over_fresh": medians["pool_first_line"] / medians["fresh_first_line"]}
    for name, value in medians.items():
        print(f"{name:18s} {value:6.3f} s")
    print(f"submit to the job's first line: pool {medians['pool_first_line']:.2f} s, fresh sbatch "
          f"{medians['fresh_first_line']:.2f} s (ratio pool/fresh {result['ratio_first_line_pool_over_fresh']:.2f})")
    write_result(options.out, result)


if __name__ == "__main__":
    main()
