"""training: how to train, MATLAB's trainingOptions field by field."""

from __future__ import annotations

import math
from dataclasses import field
from typing import Any, Dict, List, Optional

from hpcdl.config.fields import check_types, options, require, require_choice
from hpcdl.config.targets import check_part
from hpcdl.errors import ConfigError

SOLVERS = ("sgdm", "adam", "rmsprop")
SCHEDULES = ("none", "piecewise", "cosine")
CLIPPING = ("none", "norm", "value")
SHUFFLES = ("once", "every-epoch", "never")
EXECUTION_ENVIRONMENTS = ("auto", "cpu", "gpu", "multi-gpu", "parallel")
PRECISIONS = ("float32", "bf16", "fp16")
LOSSES = ("crossentropy", "mse")
OUTPUT_NETWORKS = ("last-iteration", "best-validation-loss")
PLOTS = ("none", "training-progress")
FREQUENCY_UNITS = ("epoch", "iteration", "minute")
BATCH_SCALINGS = ("global", "per_worker")
LR_SCALINGS = ("none", "linear", "sqrt")
COMMS = ("torch", "mpi")
GPU_DECODES = ("auto", "on", "off")
SPEEDS = ("fast", "exact")

DEFAULT_LEARN_RATE = {"sgdm": 0.01, "adam": 0.001, "rmsprop": 0.001}
DEFAULT_SQUARED_GRADIENT_DECAY = {"sgdm": 0.0, "adam": 0.999, "rmsprop": 0.9}


def check_loss(loss: str, arguments: dict[str, Any]) -> None:
    """ConfigError unless ``loss`` is a built-in loss (without arguments), or the user's class or function
    that imports and takes ``arguments`` (a function also takes the output and the target first)."""
    if loss in LOSSES:
        if arguments:
            raise ConfigError(f"training.loss_args: the built-in loss {loss} takes none; got {sorted(arguments)}")
        return
    if "." not in loss.replace(":", "."):
        raise ConfigError(f"training.loss: {loss!r} is neither {' nor '.join(LOSSES)} nor a dotted path to your "
                          "own loss (torch.nn.CrossEntropyLoss, mypkg.losses:focal)")
    check_part(loss, arguments, "training.loss", inputs=2)


@options("training")
class TrainingOptions:
    """How to train: MATLAB's trainingOptions, field by field, in snake_case."""

    solver: str = "sgdm"
    """Optimizer: sgdm (SGD with momentum), adam or rmsprop."""
    initial_learn_rate: Optional[float] = None
    """Learning rate at iteration 0; null takes the solver's default (sgdm 0.01, adam/rmsprop 0.001)."""
    momentum: float = 0.9
    """sgdm only: contribution of the previous step, in [0, 1)."""
    gradient_decay_factor: float = 0.9
    """adam only: decay of the gradient moving average (beta1), in [0, 1)."""
    squared_gradient_decay_factor: Optional[float] = None
    """adam/rmsprop: decay of the squared-gradient average; null: adam 0.999, rmsprop 0.9."""
    epsilon: float = 1e-8
    """adam/rmsprop denominator offset, > 0."""
    l2_regularization: float = 1e-4
    """Weight of the L2 penalty added to the gradients (weight decay), >= 0."""
    learn_rate_schedule: str = "none"
    """none, piecewise (multiply by learn_rate_drop_factor every learn_rate_drop_period epochs) or cosine."""
    learn_rate_drop_factor: float = 0.1
    """piecewise: factor applied at each drop, in [0, 1]."""
    learn_rate_drop_period: int = 10
    """piecewise: epochs between drops, >= 1."""
    warmup_iterations: int = 0
    """Linear warm-up from 0 to the scheduled rate over this many iterations, >= 0."""
    gradient_clip: str = "none"
    """none, norm (rescale when the global L2 norm exceeds gradient_threshold) or value (clamp each entry)."""
    gradient_threshold: Optional[float] = None
    """Clipping threshold, > 0; required when gradient_clip is not none."""
    max_epochs: int = 30
    """Passes over the training data, >= 1."""
    mini_batch_size: int = 128
    """Observations per iteration, >= 1."""
    shuffle: str = "once"
    """once (before training), every-epoch or never."""
    loss: str = "crossentropy"
    """crossentropy (classification, reports accuracy), mse (regression), or your own loss as a dotted path:
    a class (torch.nn.CrossEntropyLoss, built with loss_args) or a function called as f(output, target,
    **loss_args). Accuracy is reported when the targets are class indices."""
    loss_args: Dict[str, Any] = field(default_factory=dict)
    """Arguments of your own loss (+training.loss_args.label_smoothing=0.1); empty for the built-in ones."""
    validation_frequency: int = 50
    """Iterations between validations, >= 1."""
    validation_patience: Optional[int] = None
    """Stop after this many validations without a lower validation loss; null never stops early."""
    output_network: str = "last-iteration"
    """Which weights train_network returns: last-iteration or best-validation-loss."""
    verbose: bool = True
    """Print the progress table on stdout."""
    verbose_frequency: int = 50
    """Iterations between table rows, >= 1."""
    plots: str = "none"
    """training-progress writes training-progress.png into output_dir (needed then) as training goes."""
    output_dir: Optional[str] = None
    """Folder for metrics.jsonl and the progress plot; null writes no files."""
    checkpoint_path: Optional[str] = None
    """Folder for checkpoints; training resumes from the newest complete one found there."""
    checkpoint_frequency: int = 1
    """Checkpoint every this many checkpoint_frequency_unit, >= 1."""
    checkpoint_frequency_unit: str = "epoch"
    """epoch (at the end of every N), iteration (every N) or minute (after the first iteration N minutes on)."""
    checkpoint_keep: int = 2
    """Checkpoints kept, newest first (a damaged newest one falls back to the one before), >= 1."""
    execution_environment: str = "auto"
    """auto (a GPU when one is usable, else the CPU), cpu, gpu, multi-gpu or parallel."""
    gpus: Optional[List[int]] = None
    """GPU indices to use, counted from 0 (MATLAB counts from 1); null: the first visible GPU (gpu) or all (multi-gpu)."""
    worker_load: Optional[List[float]] = None
    """Each worker's share of every mini-batch (MATLAB's WorkerLoad), one entry per worker; 0: no computation."""
    batch_scaling: str = "global"
    """global: mini_batch_size is split across workers; per_worker: each computing worker takes mini_batch_size."""
    lr_scaling: str = "none"
    """none, linear or sqrt: scale the learning rate by (global batch / lr_reference_batch) (Goyal et al., 2017)."""
    lr_reference_batch: Optional[int] = None
    """The batch the learning rate was tuned for; null: mini_batch_size."""
    dispatch_in_background: Optional[bool] = None
    """Read, decode and augment in worker processes ahead of the loop (MATLAB's DispatchInBackground); null:
    speed decides (fast: on for data read from files on a GPU)."""
    num_workers: Optional[int] = None
    """Background workers; null: the CPUs the scheduler gives the task (Slurm: cpus_per_task) less one."""
    prefetch_factor: int = 2
    """Batches each background worker prepares ahead, >= 1."""
    gpu_decode: str = "auto"
    """Decode JPEG files on the GPU (nvJPEG, batched), then crop, flip and augment there; workers only read bytes.
    auto: on when training on a GPU from an augmented datastore of mostly JPEG files; on; off (decode on the CPU)."""
    cpu_decode_share: float = 0.0
    """With GPU decoding, the share of JPEG files the background workers still decode and augment on the CPU,
    in [0, 1], spread evenly over the batches (for GPUs without JPEG engines and nodes with idle CPUs)."""
    device_prefetch: int = 2
    """Batches copied, decoded and augmented on a side CUDA stream ahead of the step, >= 0 (0: on the step's stream)."""
    comm: str = "torch"
    """Gradient all-reduce: torch (DDP over NCCL or gloo) or mpi (mpi4py, bucketed and overlapped with backward)."""
    speed: str = "fast"
    """fast: on a GPU, bf16 autocast (fp16 with a loss scaler where the GPU lacks bf16), channels-last for
    convolutional networks, TF32 for float32 matrix work, cuDNN autotuning, fused optimizers, background
    dispatch of file data, and torch.compile once the run is long enough for it to pay; on the CPU the same as
    exact. exact: float32 as MATLAB, none of these, so that a seeded run repeats bit for bit. The options
    precision, channels_last, compile and dispatch_in_background, when set, override what speed chooses."""
    precision: Optional[str] = None
    """float32 (as MATLAB), or bf16 / fp16 mixed precision (autocast); null: speed decides."""
    channels_last: Optional[bool] = None
    """Use the channels-last memory format for 4-D inputs and the model; null: speed decides."""
    compile: Optional[bool] = None
    """Compile the model with torch.compile; null: speed decides (fast: when the iterations left, timed over the
    first ones, save more than the compile is expected to cost)."""
    seed: Optional[int] = 0
    """Seed for weights, shuffling and dropout; null leaves the generators unseeded."""

    def __post_init__(self) -> None:
        check_types(self)
        for name, allowed in (
            ("solver", SOLVERS),
            ("learn_rate_schedule", SCHEDULES),
            ("gradient_clip", CLIPPING),
            ("shuffle", SHUFFLES),
            ("output_network", OUTPUT_NETWORKS),
            ("plots", PLOTS),
            ("checkpoint_frequency_unit", FREQUENCY_UNITS),
            ("execution_environment", EXECUTION_ENVIRONMENTS),
            ("speed", SPEEDS),
            ("batch_scaling", BATCH_SCALINGS),
            ("lr_scaling", LR_SCALINGS),
            ("comm", COMMS),
            ("gpu_decode", GPU_DECODES),
        ):
            require_choice(self, name, allowed)
        check_loss(self.loss, self.loss_args)
        if self.precision is not None:
            require_choice(self, "precision", PRECISIONS)
        require(self, "num_workers", self.num_workers is None or self.num_workers >= 0, ">= 0 or null")
        require(self, "device_prefetch", self.device_prefetch >= 0, ">= 0")
        require(self, "cpu_decode_share", 0 <= self.cpu_decode_share <= 1, "in [0, 1]")
        for name in ("max_epochs", "mini_batch_size", "validation_frequency", "verbose_frequency",
                     "checkpoint_frequency", "checkpoint_keep", "learn_rate_drop_period", "prefetch_factor"):
            require(self, name, getattr(self, name) >= 1, "a positive integer")
        lr = self.initial_learn_rate
        require(self, "initial_learn_rate", lr is None or (lr > 0 and math.isfinite(lr)),
                "a positive finite number or null")
        require(self, "momentum", 0 <= self.momentum < 1, "in [0, 1)")
        require(self, "gradient_decay_factor", 0 <= self.gradient_decay_factor < 1, "in [0, 1)")
        sq = self.squared_gradient_decay_factor
        require(self, "squared_gradient_decay_factor", sq is None or 0 <= sq < 1, "in [0, 1) or null")
        require(self, "epsilon", self.epsilon > 0, "> 0")
        require(self, "l2_regularization", self.l2_regularization >= 0, ">= 0")
        require(self, "learn_rate_drop_factor", 0 <= self.learn_rate_drop_factor <= 1, "in [0, 1]")
        require(self, "warmup_iterations", self.warmup_iterations >= 0, ">= 0")
        threshold = self.gradient_threshold
        require(self, "gradient_threshold", threshold is None or threshold > 0, "> 0 or null")
        if self.gradient_clip != "none" and threshold is None:
            raise ConfigError(
                f"training.gradient_threshold: required when training.gradient_clip={self.gradient_clip}"
            )
        patience = self.validation_patience
        require(self, "validation_patience", patience is None or patience >= 1, "a positive integer or null")
        reference = self.lr_reference_batch
        require(self, "lr_reference_batch", reference is None or reference >= 1, "a positive integer or null")
        load = self.worker_load
        if load is not None:
            require(self, "worker_load", len(load) > 0 and min(load) >= 0, "a non-empty list of shares >= 0")
            require(self, "worker_load", sum(load) > 0, "a list with at least one share above 0")
        if self.gpus is not None:
            require(self, "gpus", len(self.gpus) > 0 and min(self.gpus) >= 0, "a non-empty list of indices >= 0")
            require(self, "gpus", len(set(self.gpus)) == len(self.gpus), "a list without repeats")
            if self.execution_environment == "cpu":
                raise ConfigError("training.gpus: set, but training.execution_environment=cpu uses no GPU")

    @property
    def own_loss(self) -> bool:
        """Whether the loss is the user's (a dotted path) rather than a built-in one."""
        return self.loss not in LOSSES

    @property
    def learn_rate(self) -> float:
        """The initial learning rate, with the solver's default filled in."""
        return self.initial_learn_rate if self.initial_learn_rate is not None else DEFAULT_LEARN_RATE[self.solver]
