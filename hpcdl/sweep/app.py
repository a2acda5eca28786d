"""python -m hpcdl.submit -m ...: hpcdl's own app as a Hydra multirun through hydra/launcher=hpcdl.

Each point is composed and checked as a single submit would be (unknown keys, bad values, the user's
targets), then submitted with the others as one sweep; the command returns once the scheduler has them.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from hpcdl.errors import ConfigError


def multirun(argv: list[str]) -> int:
    """Run the sweep ``argv`` describes (``-m`` and Hydra's sweep syntax); Hydra's exit status."""
    import hydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from hpcdl.config.compose import CONF_DIR, config_error, register_configs, searchpath_overrides
    from hpcdl.config.targets import target_overrides
    from hpcdl.sweep.launch import own_app_task

    args = [a for a in argv if a not in ("-m", "--multirun")]
    overrides, script_args = (args[:args.index("--")], args[args.index("--") + 1:]) if "--" in args else (args, [])
    if any(o.lstrip("+").partition("=")[0] == "dry_run" and o.partition("=")[2].lower() == "true"
           for o in overrides):
        raise ConfigError("dry_run=true with -m: a sweep is previewed point by point; drop -m and give one "
                          "point's values to see its job script")
    waiting = [o for o in overrides if o.partition("=")[0] == "wait"]
    launcher = ["hydra/launcher=hpcdl"] + [f"hydra.launcher.wait={o.partition('=')[2]}" for o in waiting]
    register_configs()
    scratch = tempfile.mkdtemp(prefix="hpcdl-multirun-")  # Hydra's own multirun.yaml; the store keeps a copy
    saved_argv, saved_full_error = sys.argv, os.environ.get("HYDRA_FULL_ERROR")
    # Outside Hydra's public API, on purpose: hydra.main (the public way to run an app, multirun and launcher
    # plugins included) reads its overrides from sys.argv alone; the entry that takes them as an argument
    # (hydra._internal.utils._run_hydra) is internal. So sys.argv is set for the call and restored after it.
    sys.argv = ["hpcdl.submit", "-m", *launcher, f"hydra.sweep.dir={scratch}", "hydra.output_subdir=null",
                *searchpath_overrides(), *target_overrides(overrides)]
    os.environ["HYDRA_FULL_ERROR"] = "1"  # errors come out of Hydra as exceptions, reported as submit's own
    app = hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
    try:
        app(own_app_task(script_args, argv))()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    except (HydraException, OmegaConfBaseException) as e:
        raise config_error(e) from e
    finally:
        sys.argv = saved_argv
        if saved_full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved_full_error
        shutil.rmtree(scratch, ignore_errors=True)
    return 0
