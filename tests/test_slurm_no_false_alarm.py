"""Healthy runs raise no alarm: 20 two-rank training runs on the real Slurm cluster, one sweep (one job array of 20
points, one rank on each node), with preflight on and the heartbeat and hang watchers at 10 s. None may fail, be
taken for hung or lost, have a node fail or be excluded by its preflight, or show a straggler in jobs show.

The straggler flag keeps its defaults (20% over a 300 s window), which runs this short do not reach: at the 5 s
minimum window, 9 of 28 healthy runs here were flagged (a rank 25% to 3.5x slower than the other for 6 s to
1.1 min, rank 0 in 7 of them) while five helpers' jobs shared the machine's 2 cores (load 10 to 16)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from hpcdl.lifecycle.job import Job
from hpcdl.store.files import FAILURES, PREFLIGHT, STACKS
from hpcdl.lifecycle.pace_report import pace_lines
from tests.faults import cli
from tests.test_slurm import _cli, slurm_cluster  # noqa: F401 - the fixture

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]
POINTS = 20


def alarms(job: Job) -> list[str]:
    """What a finished point's records raise: its state, failures, stacks of a hang, preflight, stragglers."""
    found = [] if job.state == "COMPLETED" else [f"ended {job.last_seen_state}: {job.error()}"]
    found += [f"failure record {p.name}: {p.read_text()[:300]}" for p in sorted((job.folder / FAILURES).glob("*"))]
    if (job.folder / STACKS).exists():
        found.append("stacks were asked for (a hang's diagnosis)")
    results = {p.name: json.loads(p.read_text()) for p in sorted((job.folder / PREFLIGHT).glob("*"))}
    if len(results) != 2:
        found.append(f"preflight results of {sorted(results)}, not of both nodes")
    for name, result in results.items():
        failed = [f"{c['name']}: {c['detail']}" for c in result["checks"] if c["status"] == "failed"]
        if failed or result.get("excluded"):
            found.append(f"preflight {name}: {failed}, excluded {result.get('excluded')}")
    paces = [line for line in pace_lines(job.refresh()) if "x median" in line]
    if len(paces) != 2:
        found.append(f"the pace of {len(paces)} rank(s), not of both")
    found += [line.strip() for line in paces if "STRAGGLER" in line]
    return found


def test_twenty_healthy_two_rank_runs_raise_no_false_alarm(store: Path, digits_root: Path) -> None:
    started = time.monotonic()
    done = _cli("hpcdl.submit", "-m", "cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=1",
                "cluster.cpus_per_task=1", "cluster.mem=1000M", "cluster.time=00:10:00", "cluster.preflight=on",
                "cluster.heartbeat_timeout_s=10", "cluster.hang_timeout_s=10", "training.execution_environment=parallel",
                f"data.root={digits_root}", "training.max_epochs=1", "training.mini_batch_size=128",
                "training.verbose=false", f"training.seed=range({POINTS})")
    sweep = re.search(r"Submitted sweep (\S+): 20 point", done.stdout).group(1)
    waited = cli(Path.cwd(), "hpcdl.jobs", "wait", sweep, "--timeout", "480", timeout=540)
    assert waited.returncode == 0, waited.stdout[-2000:] + waited.stderr
    found = {n: alarms(Job.attach(f"{sweep}_{n}")) for n in range(POINTS)}
    assert not {n: said for n, said in found.items() if said}, found
    print(f"{POINTS} healthy 2-rank runs, no alarm, in {time.monotonic() - started:.0f} s")
