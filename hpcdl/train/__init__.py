"""What a training job does: the loop, its schedule, progress, checkpoints and prediction."""
