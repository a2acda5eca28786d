"""python -m hpcdl.run [overrides]: train in the foreground, into a run folder, and print the summary."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hpcdl.config.compose import compose_config
from hpcdl.errors import HpcdlError


def main(argv: list[str]) -> int:
    """Compose the config from ``argv`` overrides, train, print where the results are."""
    from hpcdl.config.help import help_or_cfg

    if (answered := help_or_cfg(argv, __doc__)) is not None:
        return answered
    try:
        config = compose_config(argv)
    except HpcdlError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from hpcdl.train.job import run_training  # torch is imported only once the config is good

    folder = Path(config.training.output_dir or Path("runs") / f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    from hpcdl.lifecycle.follow import format_summary

    print(format_summary(run_training(config, folder)))
    print(f"Results in {folder.resolve()}")
    return 0


def cli() -> None:
    """Console-script entry point."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    cli()
