"""On the node: one point of a user's Hydra app, run as Hydra runs a job (run_job), in the point's job.

Hydra's global state (config store, plugins, OmegaConf resolvers) arrives as the submitting process had it.
The point works in the submitting folder (imports come from the code snapshot first) and writes Hydra's
outputs where ``hydra.sweep.dir``/``subdir`` say. A task that raises ends its job FAILED with its traceback;
its JobReturn (status FAILED) is kept as the job's result, for Hydra's returns.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def run_point(sweep_id: str, shared: str, sweep_config: Any, submit_cwd: str) -> Any:
    """Run the task on the point's config through Hydra's run_job; returns its JobReturn.

    ``shared`` names the file in the sweep's folder that holds what the batch's points share: Hydra's
    context, the task function and Hydra's global state (read as every job file is: hpcdl.store.safety).
    """
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobStatus, run_job, setup_globals

    from hpcdl.reporting import save_result
    from hpcdl.store.safety import check_job_key, load_pickle

    check_job_key(sweep_id)
    hydra_context, task_function, singleton_state = load_pickle(
        Path(os.environ["HPCDL_JOB_FOLDER"]).parent / sweep_id, shared)
    Singleton.set_state(singleton_state)
    setup_globals()
    os.chdir(submit_cwd)
    returned = run_job(hydra_context=hydra_context, task_function=task_function, config=sweep_config,
                       job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    if returned.status == JobStatus.FAILED:
        save_result(returned)
        raise returned._return_value
    return returned
