"""train_network: MATLAB's trainNetwork for a PyTorch module, read top to bottom."""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional, Sequence

import numpy as np
import torch
from torch import nn

from hpcdl.config import TrainingOptions
from hpcdl.data.batches import as_dataset, classes_of
from hpcdl.data.images import BadImageError
from hpcdl.data.encoded import use_gpu_decode
from hpcdl.data.loader import BatchLoader
from hpcdl.distributed import heartbeat, pace
from hpcdl.distributed.context import DistContext, init_context
from hpcdl.distributed.env import discover
from hpcdl.distributed.shares import RankShares, resolve_ranks, shares
from hpcdl.errors import ConfigError
from hpcdl.train.checkpoint import CheckpointClock, RunState, restore_run, save_run
from hpcdl.train.datawait import Wait, WaitClock
from hpcdl.train.lazy import materialize_lazy_modules
from hpcdl.train.device import choose_device
from hpcdl.train.progress import Callback, Progress, TrainingInfo
from hpcdl.train.schedule import learn_rate_at
from hpcdl.train.settings import RunSettings, run_settings
from hpcdl.train.speed import CompileDecision, SpeedChoice, apply_backend_settings, choose_speed, resolved
from hpcdl.train.stopping import StopRequested, stop_requested, warn_if_signal_too_late
from hpcdl.train.validation import BestValidation
from hpcdl.train.steps import (autocast, clip_gradients, correct_count, evaluate_totals, make_loss, make_optimizer,
                               reports_accuracy, validation_record)


def seed_everything(seed: Optional[int]) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) so that a run repeats; None leaves them."""
    if seed is not None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)


def epoch_order(options: TrainingOptions, count: int, epoch: int, shuffle_seed: int) -> torch.Tensor:
    """The order of observations in 0-based ``epoch``: fixed, shuffled once, or shuffled per epoch."""
    if options.shuffle == "never":
        return torch.arange(count)
    generator = torch.Generator()
    generator.manual_seed(shuffle_seed if options.shuffle == "once" else shuffle_seed * 100_003 + epoch)
    return torch.randperm(count, generator=generator)


def epoch_chunks(order: torch.Tensor, batch: int, context: DistContext) -> tuple[list[torch.Tensor], list[int]]:
    """This rank's indices of each global batch, and each global batch's size.

    Global batches too small to give every computing worker a sample are skipped by all ranks.
    """
    local, totals = [], []
    for chunk in order.split(batch):
        if sum(shares(len(chunk), context.loads)) == 0:
            continue
        local.append(context.local_chunk(chunk))
        totals.append(len(chunk))
    return local, totals


def _check_inputs(options: Any, has_validation: bool, output_dir: Optional[str | Path]) -> None:
    if not isinstance(options, TrainingOptions):
        raise ConfigError(f"options: expected hpcdl.TrainingOptions, got {type(options).__name__}")
    if options.plots != "none" and not (options.output_dir or output_dir):
        raise ConfigError("training.output_dir: required when training.plots=training-progress")
    if options.validation_patience is not None and not has_validation:
        raise ConfigError("training.validation_patience: set, but no validation_data was given")
    if options.output_network == "best-validation-loss" and not has_validation:
        raise ConfigError("training.output_network=best-validation-loss: needs validation_data")


@dataclass
class Step:
    """One optimisation step: forward, loss, backward, the gradient exchange, the update."""

    model: nn.Module
    forward: Optional[nn.Module]
    """The model as trained: wrapped for the gradient exchange, compiled if asked."""
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    cast: Callable[[], ContextManager]
    context: DistContext
    options: TrainingOptions
    compiling: Optional[CompileDecision] = None
    """With compile left to speed: when to compile the forward, decided once the first iterations are timed."""
    exchange: Optional[WaitClock] = None
    """Several workers: marks the backward and gradient exchange, where a rank waits for slower peers (pace)."""

    @property
    def compiles_next(self) -> bool:
        """Whether the next step is the first compiled one (torch.compile runs inside it)."""
        return self.compiling is not None and self.compiling.compiling_since is not None

    def compile_if_due(self, iteration: int) -> None:
        """Compile the forward at the iteration speed's decision names (every computing rank at once)."""
        if self.compiling is None:
            return
        self.compiling.first_compiled_step_done()
        wanted = self.compiling.due(iteration)
        if wanted is None:
            return
        compiles = self.context.agree(wanted)
        if compiles:
            self.forward = torch.compile(self.forward)
        self.compiling.decided(compiles, iteration)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, total: int, learn_rate: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Train on this rank's (x, y) of a global batch of ``total``; returns the loss and the outputs."""
        for group in self.optimizer.param_groups:
            group["lr"] = learn_rate
        with self.cast():
            out = self.forward(x)
            loss = self.loss_fn(out, y)
        self.optimizer.zero_grad(set_to_none=True)
        began = self.exchange.mark() if self.exchange else None
        self.scaler.scale(loss * self.context.loss_scale(len(y), total)).backward()
        self.context.finish_gradients()
        if began is not None:
            pace.exchanged(Wait(began, self.exchange.mark()))
        if self.options.gradient_clip != "none":
            self.scaler.unscale_(self.optimizer)
            clip_gradients(self.model, self.options)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss, out


def environment_words(options: TrainingOptions, context: DistContext, info: TrainingInfo) -> str:
    """The execution environment and devices in words, for the progress plot's info panel."""
    workers = context.env.world_size
    return f"{options.execution_environment}, {workers} worker{'s' if workers > 1 else ''}: {info.device}"


def make_step(model: nn.Module, options: TrainingOptions, learn_rate: float, context: DistContext,
              device: torch.device, speed: SpeedChoice, compiling: CompileDecision) -> Step:
    """The step of ``model`` (already on ``device``) with the options' solver, loss and precision (resolved by
    ``speed``); ``compiling`` decides a compile left open."""
    forward = context.wrap(model)
    return Step(model=model, forward=torch.compile(forward) if options.compile else forward,
                optimizer=make_optimizer(model, options, learn_rate, fused=speed.fused_optimizer),
                scaler=torch.amp.GradScaler(device.type, enabled=options.precision == "fp16"),
                loss_fn=make_loss(options), cast=autocast(options, device), context=context, options=options,
                compiling=compiling if compiling.pending else None,
                exchange=WaitClock(device) if context.distributed else None)


class Validation:
    """Validation of the run's model on this rank's share of the validation data, summed over ranks."""

    def __init__(self, data: Optional[Any], step: Step, options: TrainingOptions, device: torch.device,
                 memory_format: torch.memory_format) -> None:
        self.data, self.step, self.options = data, step, options
        self.device, self.memory_format = device, memory_format
        self.indices = step.context.local_chunk(torch.arange(len(data))) if data is not None else None

    def due(self, iteration: int) -> bool:
        """Whether the run validates after ``iteration``."""
        return self.data is not None and iteration % self.options.validation_frequency == 0

    def __call__(self, epoch: int, state: RunState) -> dict[str, Any]:
        """Validate now; the result counts toward the best validation of ``state``."""
        with heartbeat.between_steps():  # the sum too: a rank with less to validate waits in it for the others
            totals = self.step.context.all_sum(evaluate_totals(self.step.forward, self.data, self.indices,
                                                               self.options, self.device, self.memory_format))
        result = {"epoch": epoch, "iteration": state.iteration, **validation_record(totals, self.options)}
        state.best.note(result["loss"], self.step.model)
        return result


def run_epochs(step: Step, loader: BatchLoader, validation: Validation, progress: Progress, state: RunState,
               settings: RunSettings, train_size: int, per_epoch: int) -> str:
    """Train from ``state`` to the end (or an early stop); returns why training stopped."""
    options, context = step.options, step.context
    clock = CheckpointClock(options.checkpoint_frequency_unit if settings.checkpoint_path else None,
                            options.checkpoint_frequency)
    waits = WaitClock(loader.device)
    for epoch in range(state.iteration // per_epoch, options.max_epochs):
        order = epoch_order(options, train_size, epoch, state.shuffle_seed)
        chunks, totals = epoch_chunks(order, settings.global_batch, context)
        skip = state.iteration - epoch * per_epoch  # batches done before a resume
        batches = waits.timed(loader.epoch(chunks[skip:], epoch))
        for (loaded, waited), total in zip(batches, totals[skip:]):
            if loaded is None:  # every file of this batch was unreadable and skipped
                if context.distributed:
                    raise BadImageError("a whole mini-batch of unreadable images: the other workers would wait")
                state.iteration += 1
                continue
            x, y = loaded
            learn_rate = learn_rate_at(options, state.iteration, per_epoch, settings.learn_rate)
            with heartbeat.between_steps() if step.compiles_next else contextlib.nullcontext():
                loss, out = step(x, y, total, learn_rate)  # compiling: no hang however long it takes
            heartbeat.stepped()
            state.iteration += 1
            step.compile_if_due(state.iteration)
            progress.step(epoch + 1, state.iteration, learn_rate, loss,
                          correct_count(out, y, reports_accuracy(options, out, y)), len(y), waited)
            stop = progress.end_iteration(validation(epoch + 1, state) if validation.due(state.iteration) else None)
            if progress.callbacks and context.distributed:
                stop = context.any_true(stop, x.device)  # a stop asked on any worker stops them all
            if clock.due_after_iteration(state.iteration):
                checkpoint(step, state, progress, settings, clock)
            if settings.checkpoint_path and context.agree(stop_requested()):  # every rank stops here
                checkpoint(step, state, progress, settings, clock)
                raise StopRequested(state.iteration)
            if stop or state.best.exhausted(options.validation_patience):
                return "callback" if stop else "validation-patience"
        if clock.due_after_epoch(epoch):
            checkpoint(step, state, progress, settings, clock)
    return "max-epochs"


def checkpoint(step: Step, state: RunState, progress: Progress, settings: RunSettings,
               clock: CheckpointClock) -> None:
    """Flush the records (every rank), then let the lead worker save the run."""
    with heartbeat.between_steps():
        progress.flush()
        if step.context.lead:
            device = next(step.model.parameters()).device
            start = time.perf_counter()
            save_run(settings.checkpoint_path, state, progress.elapsed(), step.model, step.optimizer, step.scaler,
                     device, progress.info, step.options.checkpoint_keep)
            progress.info.checkpoint_s = round(time.perf_counter() - start, 3)
            pace.aside(progress.info.checkpoint_s)
            warn_if_signal_too_late(progress.info.checkpoint_s)
        step.context.agree(False)  # the others wait here for the lead's save, not in the next step's collective
    clock.saved()


def train_network(data: Any, model: nn.Module, options: Optional[TrainingOptions] = None, *,
                  validation_data: Any = None, callbacks: Sequence[Callback] = (),
                  output_dir: Optional[str | Path] = None, checkpoint_path: Optional[str | Path] = None,
                  ranks: Optional[RankShares] = None) -> tuple[nn.Module, TrainingInfo]:
    """Train ``model`` on ``data`` (a Dataset of (x, y) or an (x, y) tensor pair).

    Returns the trained network and a TrainingInfo with every iteration's and
    validation's record. Each callback receives the iteration record (with the
    validation result, if one was computed) and stops training by returning True.
    ``output_dir`` and ``checkpoint_path`` stand in for the options' when those are unset.
    ``ranks``: the workers' loads, global batch and learning rate as a job's plan resolved them (run_training
    passes them); None: resolved here by the same rules for the ranks this process finds.
    """
    options = options if options is not None else TrainingOptions()
    _check_inputs(options, validation_data is not None, output_dir)
    train_set = as_dataset(data, "data")
    val_set = as_dataset(validation_data, "validation_data") if validation_data is not None else None
    choice = choose_device(options)
    device = choice.device
    seed_everything(options.seed)
    speed = choose_speed(options, device, model, train_set)
    options = resolved(options, speed)
    env = discover()
    ranks = ranks if ranks is not None else resolve_ranks(options, env.world_size)
    context = init_context(env, options.comm, ranks.loads, device, ranks.collective_timeout_s)
    settings = run_settings(options, ranks, context, output_dir, checkpoint_path)
    materialize_lazy_modules(model, train_set)
    memory_format = torch.channels_last if options.channels_last else torch.contiguous_format
    model = model.to(device, memory_format=memory_format)
    info = TrainingInfo(device=f"{device} ({choice.reason})", classes=classes_of(data), writer=context.lead,
                        speed=speed.record())
    if settings.verbose:
        print(f"[hpcdl] {'; '.join(speed.reasons)}", flush=True)
    restore_backend = apply_backend_settings(speed)
    step = loader = progress = None
    failed = True
    try:
        if not context.computes:  # WorkerLoad 0: this worker does no training computation
            info.stop_reason, failed = "no-load", False
            heartbeat.steps_ended()
            return model, info
        per_epoch = len(epoch_chunks(torch.arange(len(train_set)), settings.global_batch, context)[1])
        if per_epoch == 0:
            raise ConfigError(f"data: {len(train_set)} observations cannot give each of the "
                              f"{len(context.computing)} computing workers a sample")
        seed = options.seed if options.seed is not None else int(torch.randint(2**31, ()).item())
        state = RunState(shuffle_seed=seed, best=BestValidation(options.output_network == "best-validation-loss"))
        compiling = CompileDecision(speed, model, device, say=context.lead)
        step = make_step(model, options, settings.learn_rate, context, device, speed, compiling)
        resumed = restore_run(settings.checkpoint_path, state, model, step.optimizer, step.scaler, device, info)
        compiling.plan(state.iteration, per_epoch * options.max_epochs)
        if resumed and context.lead:  # in the log even when quiet: where the run went on from
            print(f"Resumed from the checkpoint of iteration {state.iteration} in {settings.checkpoint_path}",
                  flush=True)
        progress = Progress(options, settings, info, callbacks, state.elapsed_before,
                            total=per_epoch * options.max_epochs, environment=environment_words(options, context, info))
        loader = BatchLoader(train_set, device, memory_format, options.dispatch_in_background,
                             options.num_workers, options.prefetch_factor, state.shuffle_seed,
                             gpu_decode=use_gpu_decode(options.gpu_decode, train_set, device),
                             device_prefetch=options.device_prefetch, cpu_decode_share=options.cpu_decode_share)
        validation = Validation(val_set, step, options, device, memory_format)
        model.train()
        reason = run_epochs(step, loader, validation, progress, state, settings, len(train_set), per_epoch)
        heartbeat.steps_ended()  # the final validation and saving may take longer than hang_timeout_s
        info.speed.update(compiling.record)
        last = info.validation_history[-1]["iteration"] if info.validation_history else None
        if val_set is not None and last != state.iteration:
            progress.flush()
            progress.add_validation(validation(min(state.iteration // per_epoch + 1, options.max_epochs), state))
        if state.best.weights is not None:
            model.load_state_dict(state.best.weights)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # train_s ends when the device has finished, not when the host has
        info.skipped_files, info.train_s = loader.skipped, progress.elapsed() - state.elapsed_before
        progress.finish(reason)
        failed = False
    except BaseException as error:
        if progress is not None:
            progress.abandon(error)
        raise
    finally:
        if loader is not None:
            loader.close()
        step = validation = loader = None  # DDP goes before its process group (else an abort at exit)
        context.close(barrier=not failed)
        restore_backend()
    model.eval()
    return model, info
