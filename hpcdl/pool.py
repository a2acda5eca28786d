"""python -m hpcdl.pool: hold an allocation as a pool, so that later jobs start in it with no queue wait.

    python -m hpcdl.pool start cluster=slurm nodes=1 tasks_per_node=2 time=00:30:00 idle_timeout=5 name=mypool
    python -m hpcdl.submit cluster=slurm cluster.pool=mypool cluster.time=00:10:00 data.root=/scratch/me/flowers wait=true
    python -m hpcdl.pool list cluster=slurm   # state, nodes, time left, idle timeout, jobs run on it
    python -m hpcdl.pool stop mypool cluster=slurm

start: the profile's settings (nodes=1 stands for cluster.nodes=1, time= for cluster.time=) are what the pool
holds; name= names it (default: pool); idle_timeout= (a Slurm time: MM, MM:SS, HH:MM:SS; default 15 minutes)
releases it once no job has run on it for that long. Jobs given cluster.pool=NAME run as steps of it, side by
side while they fit; one asking for more time than the pool has left is refused. stop releases it at once: its
running jobs end CANCELLED. cluster= picks the profile (and so the store) a command works with; with a remote
profile each command runs on its login node.
"""

from __future__ import annotations

import argparse
import sys

from hpcdl.errors import ConfigError, HpcdlError

DEFAULT_IDLE = "15"
"""The idle timeout of a pool started without one: 15 minutes."""
POOL_KEYS = ("name", "idle_timeout")


def _split(settings: list[str]) -> tuple[list[str], dict[str, str]]:
    """Hydra overrides of the profile (bare KEY=V stands for cluster.KEY=V) and the pool's own name= and
    idle_timeout=."""
    overrides, own = [], {}
    for item in settings:
        key, equals, value = item.partition("=")
        if not equals:
            raise ConfigError(f"{item!r}: give KEY=VALUE (cluster=slurm, nodes=2, time=01:00:00, name=mypool)")
        if key in POOL_KEYS:
            own[key] = value
        elif key == "cluster" or key.startswith(("cluster.", "+cluster.")):
            overrides.append(item)
        else:
            overrides.append(f"cluster.{item}")
    return overrides, own


def _profile(settings: list[str]):  # -> ClusterConfig, with the pool's own settings
    from hpcdl.config.compose import compose_config

    overrides, own = _split(settings)
    return compose_config(overrides).cluster, own


def _clock(seconds: int | None) -> str:
    if seconds is None:
        return ""
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def cmd_start(args: argparse.Namespace) -> int:
    from hpcdl.cluster import backend_for
    from hpcdl.config.cluster import time_limit_seconds
    from hpcdl.lifecycle.pools import start_pool

    profile, own = _profile(args.settings)
    try:
        idle_s = time_limit_seconds(own.get("idle_timeout", DEFAULT_IDLE))
    except ConfigError as e:
        raise ConfigError(str(e).replace("cluster.time", "idle_timeout", 1)) from None
    name = own.get("name", "pool")
    view = start_pool(profile, name, idle_s, args.wait)
    where = backend_for(profile.backend).describe(view.record.backend_id)
    print(f"Pool {name} started ({where}): {view.state}, {profile.nodes} node(s) x {profile.tasks_per_node} "
          f"task(s), {_clock(view.seconds_left) or profile.time} left, released after {_clock(idle_s)} idle\n"
          f"  run on it: python -m hpcdl.submit cluster={profile.name} cluster.pool={name} ...\n"
          f"  release:   python -m hpcdl.pool stop {name} cluster={profile.name}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from hpcdl.lifecycle.pools import list_pools

    profile, _ = _profile(args.settings)
    rows = [("NAME", "SCHEDULER ID", "STATE", "NODES", "TIME LEFT", "IDLE TIMEOUT", "JOBS")]
    for view in list_pools(profile):
        pool = view.record
        rows.append((pool.name, pool.backend_id, view.state, str(pool.profile["nodes"]), _clock(view.seconds_left),
                     _clock(pool.idle_timeout_s), str(len(pool.job_ids()))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from hpcdl.lifecycle.pools import stop_pool

    profile, _ = _profile(args.settings)
    pool, cancelled = stop_pool(profile, args.pool)
    print(f"Pool {pool.name} ({pool.backend_id}) released; "
          + (f"cancelled its running job(s): {', '.join(cancelled)}" if cancelled else "no job of it was running"))
    return 0


def parser() -> argparse.ArgumentParser:
    """The command line: start, list, stop."""
    top = argparse.ArgumentParser(prog="python -m hpcdl.pool", description=__doc__.splitlines()[0],
                                  formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    verbs = top.add_subparsers(dest="verb", required=True)
    start = verbs.add_parser("start", help="hold an allocation as a pool")
    start.add_argument("settings", nargs="*", help="cluster=NAME, nodes=N, time=HH:MM:SS, name=NAME, idle_timeout=T")
    start.add_argument("--wait", type=float, default=120, metavar="S",
                       help="seconds to wait for the pool to run (default 120); it keeps waiting in the queue after")
    start.set_defaults(run=cmd_start)
    listing = verbs.add_parser("list", help="your pools: state, time left, jobs run on them")
    listing.add_argument("settings", nargs="*", help="cluster=NAME: the profile whose store to read")
    listing.set_defaults(run=cmd_list)
    stop = verbs.add_parser("stop", help="release a pool now (its running jobs end CANCELLED)")
    stop.add_argument("pool", metavar="NAME", help="the pool's name or its scheduler id")
    stop.add_argument("settings", nargs="*", help="cluster=NAME: the profile whose store holds it")
    stop.set_defaults(run=cmd_stop)
    return top


def main(argv: list[str]) -> int:
    from hpcdl.remote.client import pool_remote

    args = parser().parse_args(argv)
    try:
        if (remote := pool_remote(argv)) is not None:  # a remote profile: the pool is held from its login node
            return remote
        return args.run(args)
    except HpcdlError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1


def cli() -> None:
    """Console-script entry point."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    cli()
