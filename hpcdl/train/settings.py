"""What one rank's run uses beside its options and its plan's shares: what it writes and shows."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hpcdl.config import TrainingOptions
from hpcdl.distributed.context import DistContext
from hpcdl.distributed.shares import RankShares
from hpcdl.view.tensorboard import events_folder


@dataclass(frozen=True)
class RunSettings:
    """This rank's learning rate and global batch, and what it writes and shows (only the lead writes)."""

    learn_rate: float
    """The initial learning rate after lr_scaling."""
    global_batch: int
    """Observations per iteration over all computing workers."""
    output_dir: Optional[Path]
    """Where metrics.jsonl and the plot go; None: nowhere (and always None off the lead worker)."""
    checkpoint_path: Optional[Path]
    """Where checkpoints go; None: no checkpoints."""
    verbose: bool
    """Print the progress table (the lead worker only)."""
    plots: bool
    """Draw training-progress.png."""
    rank_events: Optional[Path] = None
    """Where a rank other than the lead writes TensorBoard events of its own values (its loss, data wait): the
    run folder's tensorboard/rankN; None on the lead (its events go with the metrics) and in a run of one."""


def run_settings(options: TrainingOptions, ranks: RankShares, context: DistContext,
                 output_dir: Optional[str | Path] = None, checkpoint_path: Optional[str | Path] = None) -> RunSettings:
    """The settings of this rank's run; ``output_dir``/``checkpoint_path`` stand in for unset options."""
    output = options.output_dir or output_dir
    checkpoints = options.checkpoint_path or checkpoint_path
    settings = RunSettings(
        learn_rate=ranks.learn_rate, global_batch=ranks.global_batch,
        output_dir=Path(output) if output and context.lead else None,
        checkpoint_path=Path(checkpoints) if checkpoints else None,
        verbose=options.verbose and context.lead, plots=options.plots != "none" and context.lead,
        rank_events=events_folder(Path(output), context.env.rank) if output and context.distributed
        and not context.lead else None)
    if context.distributed and settings.verbose:
        print(f"[hpcdl] {len(context.computing)} computing worker(s) of {context.env.world_size}; global "
              f"mini-batch {ranks.global_batch}, per worker {ranks.worker_batches}; learning rate "
              f"{settings.learn_rate:.6g} (lr_scaling={options.lr_scaling}); comm={options.comm}", flush=True)
    return settings
