"""hydra/launcher=hpcdl: a multirun sweep as hpcdl jobs, Slurm job arrays or a local background runner.

    python my_app.py -m hydra/launcher=hpcdl hydra.launcher.cluster=slurm lr=0.1,0.01 seed=1,2,3
    python -m hpcdl.submit -m training.initial_learn_rate=0.1,0.01   # hpcdl's own app: this launcher by default

Under Hydra's basic sweeper the sweep returns as soon as the scheduler has every point (the sweep id is
printed); a sweeper that needs results (Optuna, Nevergrad, Ax, ...) or ``hydra.launcher.wait=true`` follows
the points and returns each one's JobReturn to Hydra. A bad setting is one ``error:`` line, exit status 2.
Discovery imports this module: it imports neither torch nor the rest of hpcdl.
"""

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher


@dataclass
class HpcdlLauncherConf:
    """hydra.launcher.* of hpcdl's launcher."""

    _target_: str = "hydra_plugins.hpcdl_launcher.hpcdl_launcher.HpcdlLauncher"
    cluster: str = "local"
    """The hpcdl cluster profile a user app's points run on (hpcdl's own app: each point's cluster section)."""
    resources: Dict[str, Any] = field(default_factory=dict)
    """cluster.KEY values over that profile's, e.g. {time: "00:10:00", gpus_per_node: 1}."""
    wait: Optional[bool] = None
    """Block until every point ended and return their JobReturns; null: only for a sweeper that needs results
    (any but Hydra's basic one)."""
    parallelism: Optional[int] = None
    """Slurm: at most this many tasks of each array at once (--array=...%k); locally: this many points at once.
    Default: as many as fit."""
    points_per_task: int = 1
    """Points packed into one Slurm array task, run there one per GPU (or CPU slot) at once."""
    poll_s: float = 2.0
    """With wait: at most this many seconds between looks at the points' folders, and between asking the
    scheduler for points that ended without recording it."""


ConfigStore.instance().store(group="hydra/launcher", name="hpcdl", node=HpcdlLauncherConf, provider="hpcdl")


class HpcdlLauncher(Launcher):
    """Hydra's Launcher interface over hpcdl's sweep submission (hpcdl.sweep.launch)."""

    def __init__(self, cluster: str = "local", resources: Optional[Dict[str, Any]] = None, wait: Optional[bool] = None,
                 parallelism: Optional[int] = None, points_per_task: int = 1, poll_s: float = 2.0) -> None:
        from omegaconf import OmegaConf

        self.cluster, self.wait, self.poll_s = cluster, wait, poll_s
        self.resources = dict(OmegaConf.to_container(resources) if OmegaConf.is_config(resources)
                              else resources or {})
        self.parallelism, self.points_per_task = parallelism, points_per_task
        self.config: Any = None
        self.hydra_context: Any = None
        self.task_function: Any = None
        self.sweep: Any = None
        self.profile: Any = None
        self.submitted: Dict[int, Any] = {}
        """Points of later batches submitted with the first (Hydra's basic sweeper without wait), by number."""

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        from hpcdl.sweep.points import install

        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        install(hydra_context.config_loader)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        from hpcdl.errors import HpcdlError
        from hpcdl.sweep.launch import launch

        try:
            return launch(self, job_overrides, initial_job_idx)
        except HpcdlError as e:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":  # hpcdl.submit -m sets it: it reports the error itself
                raise
            print(f"error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(2) from e
