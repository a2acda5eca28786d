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
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from hpcdl.cluster import backend_for
from hpcdl.errors import ConfigError, JobFailedError
from hpcdl.lifecycle.submission import plan_job
from hpcdl.plan import JobPlan, resolve_function
from hpcdl.store.files import FUNCTION_RESULT, HYDRA_TASK, RESULT
from hpcdl.store.folders import JobRecord, load_record, read_json, remove_job_folder
from hpcdl.store.safety import load_pickle
from hpcdl.store.states import COMPLETED
from hpcdl.sweep.hydra_task import run_point
from hpcdl.sweep.points import PlainPoint, hydra_files, install, task_config
from hpcdl.sweep.submit import Sweep, SweepOptions, SweepPoint, add_points, open_sweep
from hpcdl.sweep.waiting import BASIC_SWEEPER, cancelled_if_interrupted, follow_points, sweeper_target, waits_for_results


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
    """Check and submit one batch of points (Hydra's ``Launcher.launch``).

    Hydra's basic sweeper knows all its batches up front: at its first batch every point of every batch is
    checked before any is submitted, and without ``wait`` all of them go in at once as one submission (its
    later batches are answered from it). A sweeper that chooses points from results sends batch by batch.
    """
    from hydra.core.utils import JobReturn, configure_log, setup_globals

    setup_globals()
    config = launcher.config
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    if launcher.submitted:  # this batch went in with the first one
        return [_job_return(JobReturn, launcher.submitted.pop(initial_job_idx + index), None, None)
                for index in range(len(job_overrides))]
    waiting = waits_for_results(launcher.wait, sweeper_target(config))
    batches = _all_batches(launcher, job_overrides) if launcher.sweep is None else [job_overrides]
    points = _check(launcher, [overrides for batch in batches for overrides in batch], initial_job_idx)
    now = points if not waiting else points[:len(job_overrides)]
    ready = _submit_batch(launcher, now)
    with cancelled_if_interrupted(launcher.sweep.folder, waiting):
        _announce(launcher.sweep, ready, waiting)
        if not waiting:
            launcher.submitted = {point.num: point for point in ready[len(job_overrides):]}
            return [_job_return(JobReturn, point, None, None) for point in ready[:len(job_overrides)]]
        records = follow_points([load_record(launcher.sweep.folder.parent / p.id) for p in ready], launcher.poll_s)
    if hasattr(launcher.task_function, "hpcdl_script_args"):  # hpcdl.submit -m ... wait=true: the points' table
        from hpcdl.lifecycle.sweep_report import format_table, summary

        print(format_table(summary(records)), flush=True)
    composer = install(launcher.hydra_context.config_loader)
    return [_job_return(JobReturn, point, _placed(composer.compose(point.overrides), point, launcher), record)
            for point, record in zip(ready, records)]


def _all_batches(launcher: Any, first: Sequence[Sequence[str]]) -> list[Sequence[Sequence[str]]]:
    """Every batch of Hydra's basic sweeper when ``first`` is its first (it splits its points into batches of
    ``max_batch_size`` the same way each time), else ``first`` alone."""
    sweeper = launcher.config.hydra.sweeper
    if sweeper_target(launcher.config) != BASIC_SWEEPER:
        return [first]
    # Internal module, on purpose: Hydra's default sweeper has no public import path (its config target is this
    # one); its own split_arguments gives the batches exactly as it will give them, where a copy could drift.
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    arguments = [f"{key}={value}" for key, value in (sweeper.get("params") or {}).items()]
    arguments += list(launcher.config.hydra.overrides.task)
    parsed = OverridesParser.create(config_loader=launcher.hydra_context.config_loader).parse_overrides(arguments)
    batches = BasicSweeper.split_arguments(parsed, sweeper.get("max_batch_size"))
    return batches if [list(o) for o in batches[0]] == [list(o) for o in first] else [first]


@dataclass
class _Checked:
    """A point checked at submission: what its job needs, without its whole config (a sweep of 10,000 points
    would hold gigabytes)."""

    num: int
    overrides: tuple[str, ...]
    plan: JobPlan
    output_dir: str
    sweep_dir: str
    base: Optional[int]
    """Its base config (points.PlainPoint), or None: composed by Hydra, kept whole in ``config``."""
    config: Any = None
    id: str = ""


def _check(launcher: Any, job_overrides: list[Sequence[str]], first_num: int) -> list[_Checked]:
    """Every point composed and checked as a single submit would check it; nothing is written."""
    config = launcher.config
    own_app = hasattr(launcher.task_function, "hpcdl_script_args")
    composer = install(launcher.hydra_context.config_loader)
    composer.use(config)
    plans: dict[str, JobPlan] = {}
    profile = None if own_app else _launcher_profile(launcher)
    checked = []
    for index, overrides in enumerate(job_overrides):
        num = first_num + index
        base, sweep_config = composer.check(overrides)
        sweep_dir, output_dir = _place(sweep_config, num)
        if own_app:
            plan = _own_plan(sweep_config, launcher.task_function.hpcdl_script_args)
        else:
            name = str(sweep_config.hydra.job.name)
            plan = plans.get(name) or plans.setdefault(name, resolve_function(profile, name))
        checked.append(_Checked(num, tuple(overrides), plan, output_dir, sweep_dir, base,
                                None if base is not None or own_app else sweep_config))
    return checked


def _submit_batch(launcher: Any, checked: list[_Checked]) -> list[_Checked]:
    """Name the checked points after the sweep (opened at the first batch), hand them to the scheduler."""
    from omegaconf import OmegaConf, open_dict

    config = launcher.config
    own_app = hasattr(launcher.task_function, "hpcdl_script_args")
    options = SweepOptions(parallelism=launcher.parallelism, points_per_task=launcher.points_per_task)
    opened = launcher.sweep is None
    if opened:
        command = launcher.task_function.hpcdl_command if own_app else sys.argv[1:]
        launcher.sweep = open_sweep(checked[0].plan, _sweep_name(config, own_app), command, OmegaConf.to_yaml(config))
    sweep = launcher.sweep
    composer = install(launcher.hydra_context.config_loader)

    def point(check: _Checked) -> SweepPoint:
        check.id = f"{sweep.id}_{check.num}"
        if own_app:  # Hydra's record of the point goes into its job folder, which is its output folder
            sweep_config = composer.check(check.overrides)[1]
            _place(sweep_config, check.num)
            with open_dict(sweep_config.hydra):
                sweep_config.hydra.job.id = check.id
                sweep_config.hydra.sweep.dir = str(sweep.folder.parent)
                sweep_config.hydra.sweep.subdir = check.id
            check.output_dir = str(sweep.folder.parent / check.id)
            return SweepPoint(num=check.num, plan=check.plan, overrides=check.overrides,
                              hydra_files=hydra_files(sweep_config), output_dir=check.output_dir)
        if check.base is not None:
            task_point: Any = PlainPoint(check.base, check.overrides, check.num, check.id, check.sweep_dir)
        else:
            with open_dict(check.config.hydra):
                check.config.hydra.job.id = check.id
            task_point = check.config
        return SweepPoint(num=check.num, plan=check.plan, overrides=check.overrides, output_dir=check.output_dir,
                          payload=(run_point, (sweep.id, shared, task_point, os.getcwd()), {}))

    try:
        shared = None if own_app else _share_task(launcher, sweep, checked[0].num)
        add_points(sweep, [point(check) for check in checked], options)
    except BaseException:
        if opened and not sweep.manifest["points"]:  # nothing of the sweep is left behind
            remove_job_folder(sweep.folder)
            launcher.sweep = None
        raise
    return checked


def _share_task(launcher: Any, sweep: Sweep, first_num: int) -> str:
    """Store what every point of this batch shares (Hydra's context, the task, Hydra's global state, the base
    configs of its plain points) once in the sweep's folder; its file name."""
    import cloudpickle
    from hydra.core.singleton import Singleton

    from hpcdl.store.atomic import atomic_save

    name = HYDRA_TASK.format(num=first_num)
    bases = install(launcher.hydra_context.config_loader).bases
    shared = (_without_memory(launcher.hydra_context), launcher.task_function, Singleton.get_state(), bases)
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
    plan = plan_job(config, script_args)
    if config.check_build and plan.kind == "train":
        from hpcdl.train.job import check_build

        check_build(config)
    return plan


def _place(sweep_config: Any, num: int) -> tuple[str, str]:
    """Number the point and make its sweep folder absolute (its job may start elsewhere); (that folder, the
    point's output folder)."""
    from omegaconf import open_dict

    with open_dict(sweep_config.hydra):
        sweep_config.hydra.job.num = num
        sweep_config.hydra.sweep.dir = os.path.abspath(str(sweep_config.hydra.sweep.dir))
    sweep_dir = str(sweep_config.hydra.sweep.dir)
    return sweep_dir, os.path.join(sweep_dir, str(sweep_config.hydra.sweep.subdir))


def _placed(sweep_config: Any, point: _Checked, launcher: Any) -> Any:
    """A point's own config as its job ran it (for Hydra's JobReturn once it ended)."""
    from omegaconf import open_dict

    _place(sweep_config, point.num)
    with open_dict(sweep_config.hydra):
        sweep_config.hydra.job.id = point.id
        if hasattr(launcher.task_function, "hpcdl_script_args"):
            sweep_config.hydra.sweep.dir = str(launcher.sweep.folder.parent)
            sweep_config.hydra.sweep.subdir = point.id
    return sweep_config


def _without_memory(hydra_context: Any) -> Any:
    """Hydra's context with its config loader as Hydra made it (points.install's additions left out): what the
    nodes get is Hydra's own loader, unpatched."""
    from hydra.types import HydraContext

    loader = copy.copy(hydra_context.config_loader)
    for added in ("load_sweep_config", "hpcdl_composer"):
        loader.__dict__.pop(added, None)
    return HydraContext(config_loader=loader, callbacks=hydra_context.callbacks)


def _sweep_name(config: Any, own_app: bool) -> str:
    return str(config.get("name", "sweep")) if own_app else str(config.hydra.job.name)


def _announce(sweep: Sweep, records: list[Any], waiting: bool) -> None:
    handed = backend_for(sweep.manifest["plan"]["cluster"]["backend"]).describe_sweep(
        sweep.manifest.get("backend_id") or "-")
    print(f"Submitted sweep {sweep.id}: {len(records)} point(s) ({records[0].id} ...) as {handed}\n"
          f"  points:   python -m hpcdl.jobs show {sweep.id}\n"
          f"  results:  python -m hpcdl.jobs fetch {sweep.id}"
          + ("" if waiting else f"\n  wait:     python -m hpcdl.jobs wait {sweep.id}"), flush=True)


def _job_return(job_return: type, point: "_Checked", sweep_config: Any, record: Optional[JobRecord]) -> Any:
    """Hydra's JobReturn of a point: without waiting, COMPLETED with the point's job id as its value (Hydra's
    sweeper reads every value; its config is left out: 10,000 of them would hold gigabytes); once it ended,
    the task's own (FAILED ones carry the error), or for hpcdl's own app the training summary."""
    from hydra.core.utils import JobStatus

    if record is None:  # submitted, not waited for: the launch completed, its value is the point's job id
        result = job_return(overrides=list(point.overrides), working_dir=point.output_dir)
        result.status, result.return_value = JobStatus.COMPLETED, point.id
        return result

    if record is not None and record.manifest["kind"] == "function":
        try:
            returned = load_pickle(record.folder, FUNCTION_RESULT)
            if isinstance(returned, job_return):
                return returned
        except Exception:  # noqa: BLE001 - a point killed before it returned, or a result that cannot be read
            pass
    result = job_return(overrides=list(point.overrides), cfg=task_config(sweep_config), hydra_cfg=sweep_config,
                        working_dir=point.output_dir, task_name=str(sweep_config.hydra.job.name))
    if record.state == COMPLETED:
        result.status = JobStatus.COMPLETED
        result.return_value = read_json(record.folder / RESULT) if record.manifest["kind"] == "train" else None
    else:
        result.status = JobStatus.FAILED
        result.return_value = JobFailedError(f"point {point.num} ({record.id}) ended {record.state}: "
                                              f"{record.reason}", record.status.get("traceback", ""))
    return result


class _hydra_set_aside:
    """Compose hpcdl's own config inside a running Hydra app: its global state is set aside, then restored.

    Outside Hydra's public API, on purpose: hpcdl composes a user app's cluster profile with Hydra's public
    compose API (initialize_config_dir + compose), which refuses to start while an app holds GlobalHydra (a
    process-wide singleton) and sets JobRuntime's job name. No public call composes a second config tree inside
    a running app, so the app's GlobalHydra and job name are put aside and restored exactly as they were.
    """

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
