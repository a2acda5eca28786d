"""python -m hpcdl.doctor: run the preflight checks on a fresh allocation of a profile and say what to change.

    python -m hpcdl.doctor cluster=slurm cluster.nodes=2 data.root=/data/images

Every node of the allocation checks itself (GPUs, NVML health, bf16 GEMM, HBM, the store, the data root,
scratch), then, once every node has, the nodes time an all-reduce across the allocation and judge its bus
bandwidth against cluster.preflight_busbw_gbps, as cluster.preflight does before a job's ranks meet; each
failed check is printed with the node and what to change. Exit status 0 when every node passed. A profile
with a login node (cluster.remote.host) runs the doctor there, through hpcdl's agent. When the checks have not ended within --timeout (or the doctor is
interrupted), the job is cancelled: no allocation is left behind.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn, Optional


def _interrupted(signum: int, _frame: Any) -> NoReturn:
    raise SystemExit(128 + signum)  # through the cancel below, as Ctrl-C is


def node_checks(data_root: Optional[str], gpus_asked: int, nodes: int, allreduce_mb: int,
                busbw_gbps: dict[str, float], backend: str) -> Optional[dict[str, Any]]:
    """One node's report, as the doctor's job gathers it from every rank (the node's first rank reports; the
    others return None): its own checks, then the all-reduce with the other nodes once every node has written
    its own (the preflight's steps; the store is probed in the doctor job's own folder)."""
    from hpcdl.cluster import backend_for
    from hpcdl.distributed import busbw, preflight
    from hpcdl.distributed.env import local_env, node_name

    if local_env().local_rank != 0:
        return None
    folder, runs = Path(os.environ["HPCDL_JOB_FOLDER"]), backend_for(backend)
    started, node = time.monotonic(), node_name()
    checks = preflight.run_checks(folder, data_root, gpus_asked)
    preflight.write_result(folder, node, checks, time.monotonic() - started, restarts=runs.this_run(),
                           slurm_job=runs.this_job())
    checks.append(busbw.check_allreduce(folder, node, nodes, allreduce_mb, busbw_gbps, gpus_asked > 0, runs)[0])
    return {"node": node, "seconds": round(time.monotonic() - started, 2), "checks": [asdict(c) for c in checks]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcdl.doctor", description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="cluster=NAME, cluster.KEY=VALUE, data.root=PATH")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds to wait for the checks, the allocation's wait included; then the job is "
                             "cancelled")
    args = parser.parse_args(argv)
    from hpcdl.errors import HpcdlError
    from hpcdl.remote.client import doctor_remote

    try:
        if (remote := doctor_remote(argv)) is not None:  # run on its login node
            return remote
    except HpcdlError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from hpcdl.config.compose import compose_config
    from hpcdl.doctor import node_checks  # by its module's name, not __main__'s: the ranks import it
    from hpcdl.lifecycle.submission import submit_job
    from hpcdl.plan import resolve_function

    config = compose_config(args.overrides)
    cluster = dataclasses.replace(config.cluster, preflight="off", snapshot=False)  # hpcdl alone runs: no code
    plan = dataclasses.replace(resolve_function(cluster, "doctor"), gather_results=True)
    for name in ("SIGTERM", "SIGHUP"):  # before sbatch: an interrupted submission leaves nothing either
        signal.signal(getattr(signal, name), _interrupted)
    job = submit_job(plan, overrides=args.overrides, payload=(node_checks, (
        config.data.root, cluster.gpus_per_node, cluster.nodes, cluster.preflight_allreduce_mb,
        dict(cluster.preflight_busbw_gbps), cluster.backend), {}))
    print(f"job {job.id}: checking {cluster.nodes} node(s) of profile {cluster.name} ...", flush=True)
    try:
        reports = {report["node"]: report for report in job.result(timeout=args.timeout) if report is not None}
    except (TimeoutError, KeyboardInterrupt, SystemExit) as e:
        ended = job.done()
        if not ended:
            job.cancel()
        said = f"no report within {args.timeout:g} s" if isinstance(e, TimeoutError) else "interrupted"
        print(f"error: {said}; job {job.id} " + ("had ended" if ended else "cancelled: no allocation is left"),
              file=sys.stderr, flush=True)
        if isinstance(e, TimeoutError):
            return 1
        raise
    return print_reports(reports)


def print_reports(reports: dict[str, dict[str, Any]]) -> int:
    """Each node's checks, what to change for each failed one and what to look at for each warning; the exit
    status: 1 when a check failed, else 0."""
    from hpcdl.distributed.preflight import ADVICE, WARNING_ADVICE

    failed = warned = 0
    for node, report in sorted(reports.items()):
        print(f"{node} ({report['seconds']:.1f} s)")
        for check in report["checks"]:
            print(f"  {check['name']:<9s} {check['status']:<8s} {check['detail']}")
            if check["status"] == "failed":
                failed += 1
                print(f"            change: {ADVICE[check['name']].replace('NODE', node)}")
            elif check["status"] == "warned" and check["name"] in WARNING_ADVICE:
                warned += 1
                print(f"            check: {WARNING_ADVICE[check['name']]}")
    print(f"{failed} failed check(s) on {len(reports)} node(s)")
    if warned:
        print(f"{warned} warning(s): slow on every node, no node to blame (see check: above)")
    return 1 if failed else 0


def cli() -> None:
    """Console-script entry point."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    cli()
