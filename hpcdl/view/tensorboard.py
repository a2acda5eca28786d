"""TensorBoard event files of a run, written with the tensorboard package's own EventFileWriter (no TensorFlow,
no torch): a scalar per number of each record (``train/KEY`` for iterations, ``validation/KEY``), and the run's
hyperparameters for the HParams dashboard. tensorboard is optional: without it a run says once how to get it."""

from __future__ import annotations

import math
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from hpcdl.store.files import EVENT_FILES, TENSORBOARD

Record = dict[str, Any]

INSTALL_HINT = "pip install tensorboard (or pip install 'hpcdl[test]')"
"""How to get the optional package that writes and shows event files."""
NOT_SCALARS = ("kind", "iteration", "epoch", "total", "time_s")
"""Fields of a record that place it (the step, the epoch) rather than measure it."""
HPARAM_METRICS = ("validation/accuracy", "validation/loss", "train/loss")
"""The scalars the HParams dashboard lists beside each run's hyperparameters (those a run has)."""

HPARAMS_SUFFIX = ".hparams"
"""The name ending of the event file holding a run's hyperparameters."""

_said = False


def available() -> bool:
    """Whether the tensorboard package can be imported here; said once on stderr when it cannot."""
    global _said
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        if not _said:
            print(f"[hpcdl] no TensorBoard event files: the tensorboard package is not installed ({INSTALL_HINT})",
                  file=sys.stderr, flush=True)
        _said = True
        return False
    return True


def scalar_tags(record: Record) -> dict[str, float]:
    """The scalars of one record: ``train/KEY`` or ``validation/KEY`` for each finite number it holds."""
    prefix = "validation" if record.get("kind") == "validation" else "train"
    return {f"{prefix}/{key}": float(value) for key, value in record.items()
            if key not in NOT_SCALARS and isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value)}


class EventLog:
    """One run's event file in ``logdir``, appended record by record (call from one thread)."""

    def __init__(self, logdir: Path, start_time: float, fresh: bool = False) -> None:
        """``fresh``: the run writes its whole history (a resumed trainer's too): event files of its scalars
        written before are removed first, so that no step is shown twice."""
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        logdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if fresh:
            for old in logdir.glob(EVENT_FILES):
                if not old.name.endswith(HPARAMS_SUFFIX) and old.is_file() and not old.is_symlink():
                    old.unlink()
        self.writer = EventFileWriter(str(logdir), flush_secs=5)
        self.start_time = start_time
        self.written: dict[str, int] = {}
        """How many records of each list have been written (the caller passes each whole list each time)."""

    def add(self, records: list[Record], stream: str = "") -> None:
        """Write the records of the list ``stream`` after those written already, then flush."""
        from tensorboard.compat.proto import event_pb2, summary_pb2

        for record in records[self.written.get(stream, 0):]:
            values = [summary_pb2.Summary.Value(tag=tag, simple_value=value)
                      for tag, value in scalar_tags(record).items()]
            if values and isinstance(record.get("iteration"), int):
                self.writer.add_event(event_pb2.Event(
                    wall_time=self.start_time + float(record.get("time_s") or 0.0), step=record["iteration"],
                    summary=summary_pb2.Summary(value=values)))
        self.written[stream] = len(records)
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


def hparam_value(value: Any) -> Any:
    """A hyperparameter as TensorBoard shows one: a number, a bool or a string."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def write_hparams(logdir: Path, hparams: Mapping[str, Any], start_time: float,
                  metrics: Iterable[str] = HPARAM_METRICS) -> None:
    """An event file in ``logdir`` holding the run's hyperparameters (the HParams dashboard's session start)
    and the experiment that names them and ``metrics``, in place of any written before."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    logdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for old in logdir.glob(EVENT_FILES + HPARAMS_SUFFIX):  # an earlier run's (before a resume or requeue)
        if old.is_file() and not old.is_symlink():
            old.unlink()
    start = plugin_data_pb2.SessionStartInfo(start_time_secs=start_time)
    infos = []
    for name, raw in hparams.items():
        value = hparam_value(raw)
        if isinstance(value, bool):
            start.hparams[name].bool_value = value
            kind = api_pb2.DATA_TYPE_BOOL
        elif isinstance(value, (int, float)):
            start.hparams[name].number_value = float(value)
            kind = api_pb2.DATA_TYPE_FLOAT64
        else:
            start.hparams[name].string_value = value
            kind = api_pb2.DATA_TYPE_STRING
        infos.append(api_pb2.HParamInfo(name=name, type=kind))
    experiment = api_pb2.Experiment(hparam_infos=infos, metric_infos=[
        api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag)) for tag in metrics])
    writer = EventFileWriter(str(logdir), filename_suffix=HPARAMS_SUFFIX)
    for tag, data in ((metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment)),
                      (metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=start))):
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(
            tag=tag, metadata=metadata.create_summary_metadata(data))])
        writer.add_event(event_pb2.Event(wall_time=start_time, summary=summary))
    writer.close()


def logdir_command(runs: Mapping[str, Path], host: str, user: str, port: int = 6006) -> str:
    """The command that shows ``runs`` (name -> event folder) in TensorBoard, and, since a login node seldom
    opens a port, the ssh line that forwards it to the user's own machine."""
    if len(runs) == 1:
        logdir = f"--logdir {shlex.quote(str(next(iter(runs.values()))))}"
    else:
        logdir = "--logdir_spec " + shlex.quote(",".join(f"{re.sub('[,:]', '_', name)}:{path}"  # its separators
                                                         for name, path in runs.items()))
    return (f"tensorboard {logdir} --port {port}\n"
            f"# from your own machine, then open http://localhost:{port}:\n"
            f"ssh -N -L {port}:localhost:{port} {user}@{host}")


def hparams_of(overrides: Iterable[str]) -> dict[str, Any]:
    """key=value overrides (Hydra's, '+' and '~' marks dropped) as hyperparameters, values parsed as numbers or
    booleans where they are ones."""
    found: dict[str, Any] = {}
    for override in overrides:
        key, sep, text = str(override).lstrip("+~").partition("=")
        if not sep:
            continue
        found[key] = _parsed(text)
    return found


TRAINER_HPARAMS = (("model", "name"), ("training", "solver"), ("training", "initial_learn_rate"),
                   ("training", "mini_batch_size"), ("training", "max_epochs"), ("training", "learn_rate_schedule"))
"""Options of a built-in training run shown as hyperparameters even when no override set them."""


def run_hparams(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A job's hyperparameters from its manifest: a built-in training run's main options, then its overrides
    (a sweep point's own, which name what its sweep varies)."""
    found: dict[str, Any] = {}
    if manifest.get("kind") == "train":
        config = (manifest.get("plan") or {}).get("config") or {}
        for section, key in TRAINER_HPARAMS:
            value = (config.get(section) or {}).get(key)
            if value is not None:
                found[f"{section}.{key}"] = value
    sweep = manifest.get("sweep")
    found.update(hparams_of(manifest.get("overrides") or []))
    if isinstance(sweep, dict):
        found.update(hparams_of(sweep.get("overrides") or []))
    return found


def _parsed(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def events_folder(folder: Path, rank: Optional[int] = None) -> Path:
    """Where a job's event files go: its TENSORBOARD folder, or a rank's own subfolder in it."""
    return folder / TENSORBOARD if rank is None else folder / TENSORBOARD / f"rank{rank}"
