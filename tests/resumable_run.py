"""A training run with everything that draws random numbers on: dropout, augmentation, shuffling and
background workers. ``python -m tests.resumable_run ROOT CHECKPOINTS KILL_AT`` runs it and kills itself
(SIGKILL, no clean-up) once iteration KILL_AT is done."""

from __future__ import annotations

import os
import signal
import sys
from typing import Callable, Optional, Sequence

import torch

from hpcdl import ImageDatastore, TrainingOptions, build_model, train_network
from hpcdl.data.augment import AugmentedImageDatastore


def run(root: str, checkpoints: Optional[str], callbacks: Sequence[Callable] = ()) -> tuple[torch.nn.Module, object]:
    """Three epochs of a small CNN with dropout on augmented digits, checkpointed every 4 iterations."""
    store = ImageDatastore(root)
    train_set, _ = store.split(0.5, seed=0)
    augmented = AugmentedImageDatastore(train_set, [8, 8], crop="random", random_x_reflection=True,
                                        rotation=[-10, 10], brightness=0.2, seed=5)
    torch.manual_seed(1)
    model = build_model("small_cnn", in_channels=1, num_classes=10, width=8, dropout=0.3, image_size=(8, 8))
    options = TrainingOptions(max_epochs=3, mini_batch_size=64, shuffle="every-epoch", seed=11, verbose=False,
                              execution_environment="cpu", dispatch_in_background=True, num_workers=2,
                              checkpoint_path=checkpoints, checkpoint_frequency=4,
                              checkpoint_frequency_unit="iteration", checkpoint_keep=3)
    return train_network(augmented, model, options, callbacks=callbacks)


if __name__ == "__main__":
    root, folder, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])

    def kill(record: dict) -> bool:
        if record["iteration"] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return False

    run(root, folder, [kill])
