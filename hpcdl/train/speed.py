"""training.speed: what ``fast`` turns on for this run's device and network, and why; ``exact`` keeps float32.

Every choice is made once, when training starts (the compile: once the first iterations are timed), printed
and recorded in the run's TrainingInfo. An option the user set (precision, channels_last, compile,
dispatch_in_background) always wins over the preset.
"""

from __future__ import annotations

import copy
import dataclasses
import getpass
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn

from hpcdl.config import TrainingOptions
from hpcdl.errors import FolderGoneError
from hpcdl.store.atomic import atomic_write_text
from hpcdl.data.batches import TensorPair

ASSUMED_COMPILE_S = 60.0
"""The compile's cost before one was timed here: ResNet-50 took 40-70 s on an H200 (torch 2.11)."""
ASSUMED_COMPILE_GAIN = 0.25
"""The share of an eager bf16 step the compile saves: 0.27 for ResNet-50 on the H200 (4,640 -> 6,400 images/s)."""
TIMED_FROM, TIMED_TO = 5, 25
"""Iterations (of this run) between which the eager step is timed for the compile decision."""
COMPILE_TIMES = "hpcdl-compile-seconds.json"
"""Beside the inductor cache: the compile time measured per network, for the next run's estimate."""


@dataclass(frozen=True)
class SpeedChoice:
    """How this run trains, as speed and the user's own options decided it."""

    precision: str
    channels_last: bool
    compile: Optional[bool]
    """None: decided after the first iterations are timed (CompileDecision)."""
    dispatch_in_background: bool
    tf32: bool
    cudnn_benchmark: bool
    fused_optimizer: bool
    reasons: tuple[str, ...]

    def record(self) -> dict[str, Any]:
        """The choices as TrainingInfo and result.json keep them."""
        return {**{k: v for k, v in dataclasses.asdict(self).items() if k != "reasons"},
                "reasons": list(self.reasons)}


def _convolutional(model: nn.Module) -> bool:
    return any(isinstance(m, (nn.Conv2d, nn.LazyConv2d)) for m in model.modules())


def _half_dtype() -> str:
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def choose_speed(options: TrainingOptions, device: torch.device, model: nn.Module, data: Any) -> SpeedChoice:
    """The run's precision, layout, compile, dispatch and backend settings, with the reason for each."""
    fast = options.speed == "fast" and device.type == "cuda"
    reasons = [f"speed={options.speed}" + ("" if device.type == "cuda" or options.speed == "exact"
                                            else ": on the CPU as exact")]

    def pick(name: str, preset: Any, why: str) -> Any:
        value = getattr(options, name)
        if value is not None:
            reasons.append(f"{name}={value} (set)")
            return value
        if fast:
            reasons.append(f"{name}={preset if preset is not None else 'after the first iterations'} ({why})")
        return preset

    conv, files = _convolutional(model), not isinstance(data, TensorPair)
    return SpeedChoice(
        precision=pick("precision", _half_dtype() if fast else "float32",
                       "autocast; fp16 with a loss scaler where the GPU lacks bf16"),
        channels_last=pick("channels_last", fast and conv,
                           "a convolutional network" if conv else "no convolutions"),
        compile=pick("compile", None if fast else False, "when the iterations left pay for it"),
        dispatch_in_background=pick("dispatch_in_background", fast and files,
                                    "data read from files" if files else "data in memory"),
        tf32=fast, cudnn_benchmark=fast, fused_optimizer=fast, reasons=tuple(reasons))


def resolved(options: TrainingOptions, choice: SpeedChoice) -> TrainingOptions:
    """``options`` with the choices filled in, for the code that reads them (compile stays None until decided);
    a copy, not validated again (a rank runs its plan's options as they were checked at submission)."""
    filled = copy.copy(options)
    filled.precision, filled.channels_last = choice.precision, choice.channels_last
    filled.compile, filled.dispatch_in_background = choice.compile, choice.dispatch_in_background
    return filled


def apply_backend_settings(choice: SpeedChoice) -> Callable[[], None]:
    """Turn on TF32 for float32 matrix work and cuDNN autotuning as chosen; returns what restores the process's
    own settings (called when the run ends)."""
    matmul, conv, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn.conv, torch.backends.cudnn
    new_api = hasattr(matmul, "fp32_precision") and hasattr(conv, "fp32_precision")
    saved_precisions = (matmul.fp32_precision, conv.fp32_precision) if new_api else (matmul.allow_tf32,
                                                                                      cudnn.allow_tf32)
    saved_benchmark = cudnn.benchmark
    if choice.tf32:
        if new_api:  # torch >= 2.9: allow_tf32 is deprecated there
            matmul.fp32_precision = conv.fp32_precision = "tf32"
        else:
            matmul.allow_tf32 = cudnn.allow_tf32 = True
    if choice.cudnn_benchmark:
        cudnn.benchmark = True

    def restore() -> None:
        cudnn.benchmark = saved_benchmark
        if new_api:
            matmul.fp32_precision, conv.fp32_precision = saved_precisions
        else:
            matmul.allow_tf32, cudnn.allow_tf32 = saved_precisions

    return restore


def _compile_times_file() -> Path:
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or (
        Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}")
    return Path(cache) / COMPILE_TIMES


def _network_key(model: nn.Module) -> str:
    return f"{type(model).__name__}:{sum(p.numel() for p in model.parameters() if not _lazy(p))}"


def _lazy(parameter: torch.Tensor) -> bool:
    return isinstance(parameter, nn.parameter.UninitializedParameter)


def _known_compile_s(key: str) -> Optional[float]:
    """The compile time an earlier run measured for this network; None when none did (or the file is bad)."""
    try:
        value = json.loads(_compile_times_file().read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else None


def _note_compile_s(key: str, seconds: float) -> None:
    """Keep the measured compile time for the next run's estimate (best effort: a cache, not a record)."""
    path = _compile_times_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            times = json.loads(path.read_text())
            times = times if isinstance(times, dict) else {}
        except (OSError, ValueError):
            times = {}
        times[key] = round(seconds, 2)
        atomic_write_text(path, json.dumps(times))
    except (OSError, FolderGoneError):
        pass


class CompileDecision:
    """With compile left to speed: time the eager step over the first iterations, then compile if the
    iterations left would save more than the compile costs (the cost measured by an earlier run of this network,
    else assumed)."""

    def __init__(self, choice: SpeedChoice, model: nn.Module, device: torch.device, say: bool = True) -> None:
        self.pending = choice.compile is None
        self.key, self.device, self.say = _network_key(model), device, say
        self.start = self.planned = 0
        self.started_at = self.step_s = 0.0
        self.compiling_since: Optional[float] = None
        self.record: dict[str, Any] = {}
        """What was decided and why, for TrainingInfo.speed."""

    def plan(self, start: int, planned: int) -> None:
        """The run goes from iteration ``start`` (a resume's) to ``planned``."""
        self.start, self.planned = start, planned

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def due(self, iteration: int) -> Optional[bool]:
        """After ``iteration``: whether this rank would compile now; None while there is nothing to decide."""
        if not self.pending:
            return None
        done = iteration - self.start
        if done == TIMED_FROM:
            self.started_at = self._now()
        if done < TIMED_TO:
            return None
        self.pending = False
        self.step_s = (self._now() - self.started_at) / (TIMED_TO - TIMED_FROM)
        left = self.planned - iteration
        cost = _known_compile_s(self.key)
        estimate = cost if cost is not None else ASSUMED_COMPILE_S
        saved = left * self.step_s * ASSUMED_COMPILE_GAIN
        reason = (f"{left} iterations left at {self.step_s * 1000:.1f} ms would save about {saved:.0f} s against "
                  f"a compile of {estimate:.0f} s ({'measured by an earlier run' if cost is not None else 'assumed'})")
        self.record = {"compile": False, "compile_reason": reason}
        return saved > estimate

    def decided(self, compiles: bool, iteration: int) -> None:
        """The ranks' joint decision at ``iteration``: noted, said, and (compiling) the compile timed from now."""
        self.record["compile"] = compiles
        if compiles:
            self.record["compiled_at_iteration"] = iteration
            self.compiling_since = time.perf_counter()
        if self.say:
            print(f"[hpcdl] speed: compile {'now' if compiles else 'skipped'}: {self.record['compile_reason']}",
                  flush=True)

    def first_compiled_step_done(self) -> None:
        """Note the compile's cost (the first compiled step less an eager one) for the next run's estimate."""
        if self.compiling_since is not None:
            seconds = self._now() - self.compiling_since - self.step_s
            self.record["compile_s"] = round(seconds, 2)
            _note_compile_s(self.key, seconds)
            self.compiling_since = None
