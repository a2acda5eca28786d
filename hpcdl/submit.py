"""python -m hpcdl.submit [overrides]: validate, store, submit, print the job id and return.

    python -m hpcdl.submit                                  # the example, on this machine (cluster=local)
    python -m hpcdl.submit cluster=slurm cluster.time=02:00:00 training.max_epochs=20
    python -m hpcdl.submit cluster=slurm dry_run=true       # print the sbatch script, submit nothing
    python -m hpcdl.submit wait=true                        # follow the job, then print its result
    python -m hpcdl.submit entry=mypkg.train:main           # your function on every rank, given the config
    python -m hpcdl.submit script=train.py -- --lr 0.1      # your script on every rank, with its arguments
    python -m hpcdl.submit -m training.initial_learn_rate=0.1,0.01  # a sweep: a job array (Slurm) or runner (local)
"""

from __future__ import annotations

import sys

from hpcdl.errors import HpcdlError
from hpcdl.store.states import COMPLETED

USAGE = __doc__


def main(argv: list[str]) -> int:
    """Submit the training job ``argv`` describes; 0 on success, 2 on a bad config, 1 if it failed."""
    from hpcdl.config.help import help_or_cfg

    if (answered := help_or_cfg(argv, USAGE)) is not None:
        return answered
    from hpcdl.remote.client import submit_remote

    try:  # a remote profile: composed and checked here, submitted through its login node
        if (submitted := submit_remote(argv)) is not None:
            return submitted
    except HpcdlError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if any(a in ("-m", "--multirun") for a in argv):
        from hpcdl.sweep.app import multirun

        try:
            return multirun(argv)
        except HpcdlError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    from hpcdl.cluster import backend_for
    from hpcdl.config.compose import compose_config
    from hpcdl.store.folders import store_root
    from hpcdl.lifecycle.submission import plan_job, submit_job

    try:
        overrides, script_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
            else (argv, [])
        config = compose_config(overrides)
        plan = plan_job(config, script_args)
        profile = plan.cluster
        if config.check_build and plan.kind == "train":
            from hpcdl.train.job import check_build

            check_build(config)
        if config.dry_run:
            from hpcdl.lifecycle.pools import on_pool

            plan = on_pool(plan, claim=False)[0]
            backend = backend_for(profile.backend)
            note = backend.check(plan, dry_run=True)
            print(backend.preview(plan, store_root(profile.store) / "<job id>"), end="")
            if note:
                print(f"# note: {note}")
            print(f"# {plan.world_size} worker(s); dry run: nothing was submitted")
            return 0
        job = submit_job(plan, overrides=overrides)
    except HpcdlError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    where = backend_for(profile.backend).describe(job.backend_id)
    print(f"Submitted job {job.id} ({where}) with profile {profile.name}\n"
          f"  folder:   {job.folder}\n"
          f"  progress: python -m hpcdl.jobs watch {job.id}\n"
          f"  logs:     python -m hpcdl.jobs logs {job.id} -f\n"
          f"  results:  python -m hpcdl.jobs fetch {job.id}")
    if not config.wait:
        return 0
    from hpcdl.lifecycle.follow import follow, format_result

    state = follow(job)
    if state != COMPLETED:
        print(f"job {job.id} ended {state}\n{job.error()}", file=sys.stderr)
        return 1
    print(format_result(plan.kind, job.result()))
    return 0


def cli() -> None:
    """Console-script entry point."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    cli()
