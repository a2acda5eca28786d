"""On the node: one point of a user's Hydra app, run as Hydra runs a job (run_job), in the point's job.

Hydra's global state (config store, plugins, OmegaConf resolvers) arrives as the submitting process had it.
The point works in the submitting folder (imports come from the code snapshot first) and writes Hydra's
outputs where ``hydra.sweep.dir``/``subdir`` say; Hydra's record of it (.hydra/) goes into its job folder too.
A point of plain values gets its config rebuilt from its base as at submission (hpcdl.sweep.points). A task that raises ends its job FAILED with its traceback;
its JobReturn (status FAILED) is kept as the job's result, for Hydra's returns.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def run_point(sweep_id: str, shared: str, point: Any, submit_cwd: str) -> Any:
    """Run the task on the point's config (``point``: the config, or a PlainPoint) through Hydra's run_job;
    returns its JobReturn.

    ``shared`` names the file in the sweep's folder that holds what the batch's points share: Hydra's
    context, the task function, Hydra's global state and the base configs of plain points (read as every job
    file is: hpcdl.store.safety).
    """
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobStatus, run_job, setup_globals

    from hpcdl.reporting import save_result
    from hpcdl.store.atomic import atomic_write_text, make_folder
    from hpcdl.store.files import HYDRA_RECORD
    from hpcdl.store.safety import check_job_key, load_pickle
    from hpcdl.sweep.points import PlainPoint, hydra_files, rebuild

    check_job_key(sweep_id)
    folder = Path(os.environ["HPCDL_JOB_FOLDER"])
    hydra_context, task_function, singleton_state, bases = load_pickle(folder.parent / sweep_id, shared)
    Singleton.set_state(singleton_state)  # Hydra's global state, carried as its own launchers carry it
    setup_globals()
    os.chdir(submit_cwd)
    sweep_config = rebuild(bases, point, hydra_context.config_loader) if isinstance(point, PlainPoint) else point
    record = make_folder(folder / HYDRA_RECORD)
    for name, text in hydra_files(sweep_config).items():
        atomic_write_text(record / name, text)
    returned = run_job(hydra_context=hydra_context, task_function=task_function, config=sweep_config,
                       job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    if returned.status == JobStatus.FAILED:
        save_result(returned)
        # the task's own exception, as JobReturn.return_value would raise it, without the line that property
        # writes to stderr first (the point's stderr holds the traceback already)
        raise returned._return_value
    return returned
