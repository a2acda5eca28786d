"""The login side of hpcdl's Hydra launcher: every point checked, then the sweep submitted at once.

Two kinds of app: hpcdl's own (``python -m hpcdl.submit -m``), whose points are hpcdl jobs composed and
checked like any submit (built-in trainer or the user's entry/script); and a user's ``@hydra.main`` app,
whose points run its task function on the cluster through Hydra's run_job. Under Hydra's basic sweeper
``launch`` returns as soon as the scheduler has the points (each JobReturn holds its point's job id); with
``wait``, or a sweeper that needs results (hpcdl.sweep.waiting), it follows them and returns each point's
JobReturn, FAILED ones with their error.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from typing import Any, Callable, Optional, Sequence

from hpcdl.errors import ConfigError, JobFailedError
from hpcdl.plan import JobPlan, resolve, resolve_function
from hpcdl.store.files import FUNCTION_RESULT, RESULT
from hpcdl.store.folders import JobRecord, read_json, remove_job_folder
from hpcdl.store.safety import load_pickle
from hpcdl.sweep.hydra_task import run_point
from hpcdl.sweep.submit import Sweep, SweepOptions, SweepPoint, add_points, open_sweep
from hpcdl.sweep.waiting import cancelled_if_interrupted, follow_points, sweeper_target, waits_for_results


def own_app_task(script_args: Sequence[str], command: Sequence[str]) -> Callable[[Any], None]:
    """The task function of hpcdl's own app (``python -m hpcdl.submit -m``): never called, for the launcher
    submits each point as an hpcdl job; it carries the arguments after ``--`` for a script's points, and
    the user's command line for the sweep's record."""

    def train_point(config: Any) -> None:
        raise RuntimeError("hpcdl's sweep points are submitted by hydra/launcher=hpcdl, never run in place")

    train_point.hpcdl_script_args = tuple(script_args)  # type: ignore[attr-defined]
    train_point.hpcdl_command = list(command)  # type: ignore[attr-defined]
    return train_point


def launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[Any]:
    """Check and submit one batch of points (Hydra's ``Launcher.launch``); the sweep record grows per batch."""
    from hydra.core.utils import JobReturn, configure_log, setup_globals

    options = SweepOptions(parallelism=launcher.parallelism, points_per_task=launcher.points_per_task)
    setup_globals()
    config = launcher.config
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    own_app = hasattr(launcher.task_function, "hpcdl_script_args")
    waiting = waits_for_results(launcher.wait, sweeper_target(config))
    profile = None if own_app else _launcher_profile(launcher)
    points, configs = [], []
    for index, overrides in enumerate(job_overrides):
        num = initial_job_idx + index
        sweep_config = composed_sweep_config(launcher.hydra_context.config_loader, config, overrides)
        _place(sweep_config, num)
        plan = _own_plan(sweep_config, launcher.task_function.hpcdl_script_args) if own_app else resolve_function(
            profile, str(sweep_config.hydra.job.name))
        points.append(SweepPoint(num=num, plan=plan, overrides=tuple(overrides)))
        configs.append(sweep_config)
    opened = launcher.sweep is None
    if opened:
        from omegaconf import OmegaConf

        command = launcher.task_function.hpcdl_command if own_app else sys.argv[1:]
        launcher.sweep = open_sweep(points[0].plan, _sweep_name(config, own_app), command,
                                    OmegaConf.to_yaml(config))
    try:
        records, ready = _submit_batch(launcher, launcher.sweep, points, configs, options, own_app)
    except BaseException:
        if opened and not launcher.sweep.manifest["points"]:  # nothing of the sweep is left behind
            remove_job_folder(launcher.sweep.folder)
            launcher.sweep = None
        raise
    with cancelled_if_interrupted(launcher.sweep.folder, waiting):
        _announce(launcher.sweep, records, waiting)
        finished = follow_points(records, launcher.poll_s) if waiting else [None] * len(records)
    if waiting and own_app:  # python -m hpcdl.submit -m ... wait=true ends with the points' table
        from hpcdl.store.sweeps import format_table, summary

        print(format_table(summary(finished)), flush=True)
    return [_job_return(JobReturn, point, cfg, record) for point, cfg, record in zip(ready, configs, finished)]


def _submit_batch(launcher: Any, sweep: Sweep, points: list[SweepPoint], configs: list[Any],
                  options: SweepOptions, own_app: bool) -> tuple[list[JobRecord], list[SweepPoint]]:
    """Name the checked points after the sweep, record them with Hydra's files, hand them to the scheduler."""
    shared = None if own_app else _share_task(launcher, sweep, points[0].num)
    ready = []
    for point, sweep_config in zip(points, configs):
        from omegaconf import open_dict

        with open_dict(sweep_config.hydra):
            sweep_config.hydra.job.id = f"{sweep.id}_{point.num}"
            if own_app:  # Hydra's record of the point goes into its job folder
                sweep_config.hydra.sweep.dir = str(sweep.folder.parent)
                sweep_config.hydra.sweep.subdir = sweep_config.hydra.job.id
        payload = None if own_app else (run_point, (sweep.id, shared, sweep_config, os.getcwd()), {})
        ready.append(SweepPoint(num=point.num, plan=point.plan, overrides=point.overrides,
                                hydra_files=_hydra_files(sweep_config), output_dir=_output_dir(sweep_config),
                                payload=payload))
    return add_points(sweep, ready, options), ready


REMEMBERED_CONFIGS = 2000
"""At most this many sweep configs composed while Hydra validates a batch are kept for launch to use."""


def remember_sweep_configs(loader: Any) -> None:
    """Keep the sweep configs Hydra's sweeper composes to validate a batch, so that launch does not compose
    each point twice (composition is most of a large sweep's submission time)."""
    if hasattr(loader, "hpcdl_composed"):
        return
    compose = loader.load_sweep_config
    loader.hpcdl_composed = {}

    def load_sweep_config(master_config: Any, sweep_overrides: list[str]) -> Any:
        config = compose(master_config, sweep_overrides)
        if len(loader.hpcdl_composed) < REMEMBERED_CONFIGS:
            loader.hpcdl_composed[(id(master_config), tuple(sweep_overrides))] = config
        return config

    loader.load_sweep_config = load_sweep_config


def composed_sweep_config(loader: Any, master_config: Any, overrides: Sequence[str]) -> Any:
    """A point's sweep config: the one Hydra composed while validating the batch, else composed now."""
    key = (id(master_config), tuple(overrides))
    remembered = getattr(loader, "hpcdl_composed", {}).pop(key, None)
    if remembered is not None:
        return remembered
    composed = loader.load_sweep_config(master_config, list(overrides))
    getattr(loader, "hpcdl_composed", {}).pop(key, None)  # composed for this point alone: not kept
    return composed


def _share_task(launcher: Any, sweep: Sweep, first_num: int) -> str:
    """Store what every point of this batch shares (Hydra's context, the task, Hydra's global state) once in
    the sweep's folder; its file name."""
    import cloudpickle
    from hydra.core.singleton import Singleton

    from hpcdl.store.atomic import atomic_save

    name = f"hydra-task-{first_num}.pkl"
    shared = (_without_memory(launcher.hydra_context), launcher.task_function, Singleton.get_state())
    atomic_save(sweep.folder / name, lambda f: cloudpickle.dump(shared, f))
    return name


def _launcher_profile(launcher: Any) -> Any:
    """The cluster profile of a user app's points, composed at the launcher's first batch."""
    if getattr(launcher, "profile", None) is None:
        launcher.profile = _profile(launcher.cluster, launcher.resources)
    return launcher.profile


def _profile(cluster: str, resources: dict[str, Any]) -> Any:
    """The cluster profile ``cluster`` with ``resources`` (cluster.KEY values) for a user app's points."""
    from hpcdl.config.compose import compose_config

    overrides = [f"cluster={cluster}"] + [f"cluster.{k}={json.dumps(v)}" for k, v in resources.items()]
    try:
        with _hydra_set_aside():
            return compose_config(overrides).cluster
    except ConfigError as e:
        raise ConfigError(f"hydra.launcher (cluster={cluster}, resources={resources}): {e}") from e


def _own_plan(sweep_config: Any, script_args: Sequence[str]) -> JobPlan:
    """The checked plan of one point of hpcdl's own app, as ``python -m hpcdl.submit`` would make it."""
    from hpcdl.config.compose import config_from_composed

    config = config_from_composed(sweep_config)
    plan = resolve(config, script_args=script_args)
    if config.check_build and plan.kind == "train":
        from hpcdl.train.job import check_build

        check_build(config)
    return plan


def _place(sweep_config: Any, num: int) -> None:
    """Number the point and make its output folder absolute (its job may start elsewhere)."""
    from omegaconf import open_dict

    with open_dict(sweep_config.hydra):
        sweep_config.hydra.job.num = num
        sweep_config.hydra.sweep.dir = os.path.abspath(str(sweep_config.hydra.sweep.dir))


def _output_dir(sweep_config: Any) -> str:
    return os.path.join(str(sweep_config.hydra.sweep.dir), str(sweep_config.hydra.sweep.subdir))


def _without_memory(hydra_context: Any) -> Any:
    """Hydra's context with its config loader as Hydra made it (remember_sweep_configs' additions left out)."""
    from hydra.types import HydraContext

    loader = copy.copy(hydra_context.config_loader)
    for added in ("load_sweep_config", "hpcdl_composed"):
        loader.__dict__.pop(added, None)
    return HydraContext(config_loader=loader, callbacks=hydra_context.callbacks)


def _task_config(sweep_config: Any) -> Any:
    """The point's config without Hydra's node (what its task sees)."""
    from omegaconf import OmegaConf

    return OmegaConf.masked_copy(sweep_config, [key for key in sweep_config if key != "hydra"])


def _hydra_files(sweep_config: Any) -> dict[str, str]:
    """Hydra's .hydra/ record of a point: its config, Hydra's config and its overrides."""
    from omegaconf import OmegaConf

    hydra = OmegaConf.to_yaml(sweep_config.hydra)
    return {"config.yaml": OmegaConf.to_yaml(_task_config(sweep_config)),
            "hydra.yaml": "hydra:\n" + "".join(f"  {line}\n" for line in hydra.splitlines()),
            "overrides.yaml": OmegaConf.to_yaml(sweep_config.hydra.overrides.task)}


def _sweep_name(config: Any, own_app: bool) -> str:
    return str(config.get("name", "sweep")) if own_app else str(config.hydra.job.name)


def _announce(sweep: Sweep, records: list[JobRecord], waiting: bool) -> None:
    where = sweep.manifest.get("backend_id") or "-"
    backend = sweep.manifest["plan"]["cluster"]["backend"]
    handed = f"Slurm array(s) {where}" if backend == "slurm" else f"a background runner on {os.uname().nodename}"
    print(f"Submitted sweep {sweep.id}: {len(records)} point(s) ({records[0].id} ...) as {handed}\n"
          f"  points:   python -m hpcdl.jobs show {sweep.id}\n"
          f"  results:  python -m hpcdl.jobs fetch {sweep.id}"
          + ("" if waiting else f"\n  wait:     python -m hpcdl.jobs wait {sweep.id}"), flush=True)


def _job_return(job_return: type, point: SweepPoint, sweep_config: Any, record: Optional[JobRecord]) -> Any:
    """Hydra's JobReturn of a point: without waiting, COMPLETED with the point's job id as its value (Hydra's
    sweeper reads every value); once it ended, the task's own (FAILED ones carry the error), or for hpcdl's
    own app the training summary."""
    point_id = str(sweep_config.hydra.job.id)
    from hydra.core.utils import JobStatus

    if record is not None and record.manifest["kind"] == "function":
        try:
            returned = load_pickle(record.folder, FUNCTION_RESULT)
            if isinstance(returned, job_return):
                return returned
        except Exception:  # noqa: BLE001 - a point killed before it returned, or a result that cannot be read
            pass
    task = _task_config(sweep_config)
    result = job_return(overrides=list(point.overrides), cfg=task, hydra_cfg=sweep_config,
                        working_dir=point.output_dir, task_name=str(sweep_config.hydra.job.name))
    if record is None:  # submitted, not waited for: the launch completed, its value is the point's job id
        result.status, result._return_value = JobStatus.COMPLETED, f"{point_id}"
        return result
    if record.state == "COMPLETED":
        result.status = JobStatus.COMPLETED
        result._return_value = read_json(record.folder / RESULT) if record.manifest["kind"] == "train" else None
    else:
        result.status = JobStatus.FAILED
        result._return_value = JobFailedError(f"point {point.num} ({record.id}) ended {record.state}: "
                                              f"{record.reason}", record.status.get("traceback", ""))
    return result


class _hydra_set_aside:
    """Compose hpcdl's own config inside a running Hydra app: its global state is set aside, then restored."""

    def __enter__(self) -> None:
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.utils import JobRuntime

        self.hydra = GlobalHydra.instance().hydra
        self.runtime = copy.deepcopy(JobRuntime.instance().conf)  # the job's name: composing sets "app"
        GlobalHydra.instance().clear()

    def __exit__(self, *exc: object) -> None:
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.utils import JobRuntime

        GlobalHydra.instance().clear()
        if self.hydra is not None:
            GlobalHydra.instance().initialize(self.hydra)
        JobRuntime.instance().conf = self.runtime
