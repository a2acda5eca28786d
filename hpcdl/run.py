"""python -m hpcdl.run [overrides]: train in the foreground, into a run folder, and print the summary."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from hpcdl.config.compose import compose_config
from hpcdl.errors import ConfigError, HpcdlError
from hpcdl.plan import resolve


def main(argv: list[str]) -> int:
    """Compose the config from ``argv`` overrides, resolve its plan, train, print where the results are."""
    from hpcdl.config.help import help_or_cfg

    if (answered := help_or_cfg(argv, __doc__)) is not None:
        return answered
    try:
        plan = resolve(compose_config(argv), runs_here=True)  # the plan a job would run, on this machine's GPUs
        if plan.kind != "train" or plan.world_size > 1:
            raise ConfigError(f"python -m hpcdl.run trains in this one process; this is a {plan.kind} job of "
                              f"{plan.world_size} rank(s): submit it with python -m hpcdl.submit")
    except HpcdlError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from hpcdl.train.job import run_training  # torch is imported only once the plan is good

    os.environ.update(plan.environment)  # what a job's backend gives its ranks (network, the profile's env)
    config = plan.config
    folder = Path(config.training.output_dir or Path("runs") / f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    from hpcdl.lifecycle.follow import format_summary

    print(format_summary(run_training(plan, folder)))
    print(f"Results in {folder.resolve()}")
    return 0


def cli() -> None:
    """Console-script entry point."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    cli()
