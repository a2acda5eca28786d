"""python -m hpcdl.profiles: the cluster profiles this machine finds, and one checked against its live cluster.

    python -m hpcdl.profiles list                # each profile: where it comes from (yours, the site's, built in)
    python -m hpcdl.profiles check slurm         # the cluster's partitions and limits, the profile checked there
    python -m hpcdl.profiles check slurm cluster.nodes=2   # with overrides

Profiles are YAML files cluster/NAME.yaml in, first found first: $HPCDL_CONFIG_DIR, ~/.config/hpcdl, the site's
folder an admin installs ($HPCDL_SITE_DIR, else /etc/hpcdl), then hpcdl's own. A profile with a remote block is
checked on its login node.
"""

from __future__ import annotations

import argparse
import sys

from hpcdl.errors import HpcdlError


def cmd_list(args: argparse.Namespace) -> int:
    from hpcdl.lifecycle.profiles import found_profiles

    rows = [("NAME", "FROM", "BACKEND", "LOGIN NODE", "FILE")]
    rows += [(p.name, p.source + (f" (hides {', '.join(p.hides)})" if p.hides else ""), p.backend,
              p.host or "", str(p.path)) for p in found_profiles()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from hpcdl.lifecycle.profiles import check_profile
    from hpcdl.remote.client import check_remote

    if (checked := check_remote([f"cluster={args.name}", *args.overrides])) is not None:
        return checked  # checked on its login node
    lines, problem = check_profile([f"cluster={args.name}", *args.overrides])
    print("\n".join(lines))
    if problem:
        print(f"problem: {problem}", file=sys.stderr)
        return 1
    print(f"ok: the cluster can run what profile {args.name} asks for")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m hpcdl.profiles", description=__doc__.splitlines()[0],
                                  formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    verbs = top.add_subparsers(dest="verb", required=True)
    verbs.add_parser("list", help="the profiles found, and where").set_defaults(run=cmd_list)
    check = verbs.add_parser("check", help="check a profile against its live cluster")
    check.add_argument("name", metavar="NAME", help="the profile's name (cluster=NAME)")
    check.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="cluster.* overrides (cluster.nodes=2)")
    check.set_defaults(run=cmd_check)
    return top


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except HpcdlError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def cli() -> None:
    """Console-script entry point."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    cli()
