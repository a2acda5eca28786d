"""python -m hpcdl.doctor: run the preflight checks on a fresh allocation of a profile and say what to change.

    python -m hpcdl.doctor cluster=slurm cluster.nodes=2 data.root=/data/images

Every node of the allocation checks itself (GPUs, NVML health, bf16 GEMM, HBM, the store, the data root,
scratch) as cluster.preflight does before a job's ranks meet; each failed check is printed with the node and
what to change. Exit status 0 when every node passed. A profile with a login node (cluster.remote.host) runs
the doctor there, through hpcdl's agent. When the checks have not ended within --timeout (or the doctor is
interrupted), the job is cancelled: no allocation is left behind.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any, NoReturn


def _interrupted(signum: int, _frame: Any) -> NoReturn:
    raise SystemExit(128 + signum)  # through the cancel below, as Ctrl-C is


def _typed(value: str) -> Any:
    """An override's value as the profile takes it: a number, list or quoted string as JSON, else the text
    (16G, 0:10:00, 2gpu)."""
    try:
        return json.loads(value) if value[:1] in "0123456789[{\"" else value
    except ValueError:
        return value


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
    from hpcdl.distributed.preflight import ADVICE, node_report
    from hpcdl.lifecycle.submission import batch
    from hpcdl.store.folders import store_root

    config = compose_config(args.overrides)
    cluster = config.cluster
    resources = {o.split("=", 1)[0][len("cluster."):]: o.split("=", 1)[1] for o in args.overrides
                 if o.startswith("cluster.")}
    resources = {key: _typed(value) for key, value in resources.items()}
    job = batch(node_report, str(store_root(cluster.store)), config.data.root, cluster.gpus_per_node,
                cluster=cluster.name, name="doctor", all_ranks=True, **{"preflight": "off", "snapshot": False, **resources})  # hpcdl alone runs
    print(f"job {job.id}: checking {cluster.nodes} node(s) of profile {cluster.name} ...", flush=True)
    for name in ("SIGTERM", "SIGHUP"):
        signal.signal(getattr(signal, name), _interrupted)
    try:
        reports = {report["node"]: report for report in job.result(timeout=args.timeout)}
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
    failed = 0
    for node, report in sorted(reports.items()):
        print(f"{node} ({report['seconds']:.1f} s)")
        for check in report["checks"]:
            print(f"  {check['name']:<8s} {check['status']:<8s} {check['detail']}")
            if check["status"] == "failed":
                failed += 1
                print(f"           change: {ADVICE[check['name']].replace('NODE', node)}")
    print(f"{failed} failed check(s) on {len(reports)} node(s)")
    return 1 if failed else 0


def cli() -> None:
    """Console-script entry point."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    cli()
