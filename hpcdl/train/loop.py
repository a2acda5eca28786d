"""train_network: MATLAB's trainNetwork for a PyTorch module, read top to bottom."""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import nn

from hpcdl.config import TrainingOptions
from hpcdl.data.batches import as_dataset, classes_of
from hpcdl.data.images import BadImageError
from hpcdl.data.encoded import use_gpu_decode
from hpcdl.data.loader import BatchLoader
from hpcdl.distributed.context import DistContext, init_context
from hpcdl.distributed.shares import global_batch, shares
from hpcdl.errors import ConfigError
from hpcdl.train.datawait import WaitClock
from hpcdl.train.checkpoint import load_latest_checkpoint, save_checkpoint
from hpcdl.train.device import choose_device
from hpcdl.train.progress import Callback, Progress, TrainingInfo
from hpcdl.train.schedule import learn_rate_at, scaled_learn_rate
from hpcdl.train.steps import (autocast, clip_gradients, correct_count, evaluate_totals, make_loss, make_optimizer,
                               validation_record)


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


def _effective_options(options: TrainingOptions, context: DistContext) -> tuple[TrainingOptions, int]:
    """Options with the scaled learning rate, and the global batch, as the run reports them."""
    batch = global_batch(options.mini_batch_size, context.loads, options.batch_scaling)
    effective = dataclasses.replace(options, initial_learn_rate=scaled_learn_rate(options, batch))
    if not context.lead:
        effective = dataclasses.replace(effective, verbose=False, output_dir=None, plots="none")
    if context.distributed and context.lead and options.verbose:
        per_worker = shares(batch, context.loads)
        print(f"[hpcdl] {len(context.computing)} computing worker(s) of {context.env.world_size}; global "
              f"mini-batch {batch}, per worker {per_worker}; learning rate {effective.learn_rate:.6g} "
              f"(lr_scaling={options.lr_scaling}); comm={options.comm}", flush=True)
    return effective, batch


def _check_inputs(options: Any, has_validation: bool) -> None:
    if not isinstance(options, TrainingOptions):
        raise ConfigError(f"options: expected hpcdl.TrainingOptions, got {type(options).__name__}")
    if options.plots != "none" and options.output_dir is None:
        raise ConfigError("training.output_dir: required when training.plots=training-progress")
    if options.validation_patience is not None and not has_validation:
        raise ConfigError("training.validation_patience: set, but no validation_data was given")
    if options.output_network == "best-validation-loss" and not has_validation:
        raise ConfigError("training.output_network=best-validation-loss: needs validation_data")


def train_network(data: Any, model: nn.Module, options: Optional[TrainingOptions] = None, *,
                  validation_data: Any = None, callbacks: Sequence[Callback] = ()
                  ) -> tuple[nn.Module, TrainingInfo]:
    """Train ``model`` on ``data`` (a Dataset of (x, y) or an (x, y) tensor pair).

    Returns the trained network and a TrainingInfo with every iteration's and
    validation's record. Each callback receives the iteration record (with the
    validation result, if one was computed) and stops training by returning True.
    """
    options = options if options is not None else TrainingOptions()
    _check_inputs(options, validation_data is not None)
    train_set = as_dataset(data, "data")
    val_set = as_dataset(validation_data, "validation_data") if validation_data is not None else None
    choice = choose_device(options)
    device = choice.device
    seed_everything(options.seed)
    context = init_context(options, device)
    options, batch = _effective_options(options, context)
    memory_format = torch.channels_last if options.channels_last else torch.contiguous_format
    model = model.to(device, memory_format=memory_format)
    info = TrainingInfo(device=f"{device} ({choice.reason})", classes=classes_of(data), writer=context.lead)
    if not context.computes:  # WorkerLoad 0: this worker does no training computation
        context.close()
        info.stop_reason = "no-load"
        return model, info
    optimizer = make_optimizer(model, options)
    scaler = torch.amp.GradScaler(device.type, enabled=options.precision == "fp16")
    wrapped = context.wrap(model)
    forward = torch.compile(wrapped) if options.compile else wrapped
    loss_fn, cast = make_loss(options), autocast(options, device)
    classification = options.loss == "crossentropy"
    per_epoch = len(epoch_chunks(torch.arange(len(train_set)), batch, context)[1])
    if per_epoch == 0:
        raise ConfigError(f"data: {len(train_set)} observations cannot give each of the "
                          f"{len(context.computing)} computing workers a sample")
    val_indices = context.local_chunk(torch.arange(len(val_set))) if val_set is not None else None

    iteration, elapsed_before, best_loss, bad_validations, best_weights = 0, 0.0, math.inf, 0, None
    shuffle_seed = options.seed if options.seed is not None else int(torch.randint(2**31, ()).item())
    resumed = load_latest_checkpoint(options.checkpoint_path)
    if resumed:
        model.load_state_dict(resumed["model"])
        optimizer.load_state_dict(resumed["optimizer"])
        scaler.load_state_dict(resumed["scaler"])
        torch.set_rng_state(resumed["rng_cpu"])
        if device.type == "cuda" and resumed["rng_cuda"] is not None:
            torch.cuda.set_rng_state(resumed["rng_cuda"], device)
        info.history, info.validation_history = resumed["history"], resumed["validation_history"]
        iteration, elapsed_before = resumed["iteration"], resumed["elapsed_s"]
        best_loss, bad_validations = resumed["best_loss"], resumed["bad_validations"]
        best_weights, shuffle_seed = resumed["best_model"], resumed["shuffle_seed"]
    progress = Progress(options, info, callbacks, elapsed_before)
    if resumed and options.verbose:
        print(f"Resumed from the checkpoint of iteration {iteration} in {options.checkpoint_path}")

    def checkpoint() -> None:
        progress.flush()
        if not context.lead:
            return
        save_checkpoint(options.checkpoint_path, iteration, {
            "iteration": iteration, "elapsed_s": progress.elapsed(), "model": model.state_dict(),
            "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
            "rng_cpu": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "history": info.history, "validation_history": info.validation_history,
            "best_loss": best_loss, "bad_validations": bad_validations, "best_model": best_weights,
            "shuffle_seed": shuffle_seed})

    def validate(epoch: int) -> dict[str, Any]:
        nonlocal best_loss, bad_validations, best_weights
        totals = context.all_sum(evaluate_totals(forward, val_set, val_indices, options, device, memory_format))
        result = {"epoch": epoch, "iteration": iteration, **validation_record(totals, options)}
        if result["loss"] < best_loss:
            best_loss, bad_validations = result["loss"], 0
            if options.output_network == "best-validation-loss":
                best_weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            bad_validations += 1
        return result

    loader = BatchLoader(train_set, device, memory_format, options.dispatch_in_background, options.num_workers,
                         options.prefetch_factor, gpu_decode=use_gpu_decode(options.gpu_decode, train_set, device),
                         device_prefetch=options.device_prefetch)
    clock = WaitClock(device)

    every_iterations = options.checkpoint_path and options.checkpoint_frequency_unit == "iteration"
    every_epochs = options.checkpoint_path and options.checkpoint_frequency_unit == "epoch"
    reason = "max-epochs"
    model.train()
    for epoch in range(iteration // per_epoch, options.max_epochs):
        chunks, totals = epoch_chunks(epoch_order(options, len(train_set), epoch, shuffle_seed), batch, context)
        skip = iteration - epoch * per_epoch  # batches already done before a resume
        for (loaded, wait), total in zip(clock.timed(loader.epoch(chunks[skip:], epoch)), totals[skip:]):
            if loaded is None:  # every file of this batch was unreadable and skipped
                if context.distributed:
                    raise BadImageError("a whole mini-batch of unreadable images: the other workers would wait")
                iteration += 1
                continue
            x, y = loaded
            learn_rate = learn_rate_at(options, iteration, per_epoch)
            for group in optimizer.param_groups:
                group["lr"] = learn_rate
            with cast():
                out = forward(x)
                loss = loss_fn(out, y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss * context.loss_scale(len(y), total)).backward()
            context.finish_gradients()
            if options.gradient_clip != "none":
                scaler.unscale_(optimizer)
                clip_gradients(model, options)
            scaler.step(optimizer)
            scaler.update()
            iteration += 1
            progress.step(epoch + 1, iteration, learn_rate, loss, correct_count(out, y, classification), len(y), wait)
            due = val_set is not None and iteration % options.validation_frequency == 0
            stop = progress.end_iteration(validate(epoch + 1) if due else None)
            if callbacks and context.distributed:
                stop = context.any_true(stop, device)  # a stop asked on any worker stops them all
            if every_iterations and iteration % options.checkpoint_frequency == 0:
                checkpoint()
            patience = options.validation_patience
            if stop or (patience is not None and bad_validations >= patience):
                reason = "callback" if stop else "validation-patience"
                break
        else:
            if every_epochs and (epoch + 1) % options.checkpoint_frequency == 0:
                checkpoint()
            continue
        break

    last = info.validation_history[-1]["iteration"] if info.validation_history else None
    if val_set is not None and last != iteration:
        progress.flush()
        progress.add_validation(validate(min(iteration // per_epoch + 1, options.max_epochs)))
    if best_weights is not None:
        model.load_state_dict(best_weights)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # train_s ends when the device has finished, not when the host has
    info.skipped_files, info.train_s = loader.skipped, progress.elapsed() - elapsed_before
    progress.finish(reason)
    forward = wrapped = loader = None  # DDP and the workers go before their process group (else an abort at exit)
    context.close()
    model.eval()
    return model, info
