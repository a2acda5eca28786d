"""Train a small CNN on real image files (scikit-learn's digits as PNGs) with the Python API.

    python examples/train_digits.py

Reaches about 97% validation accuracy in a few seconds on 2 CPU cores; writes
metrics.jsonl and training-progress.png into ./runs/digits-example.
"""

from __future__ import annotations

import torch

import hpcdl
from hpcdl.data.digits import digits_folder

store = hpcdl.ImageDatastore(digits_folder())  # written once under ~/.cache/hpcdl/digits
train_set, validation_set = store.split(0.2, seed=0)
print(f"{len(train_set)} training and {len(validation_set)} validation images, classes {store.classes}")

torch.manual_seed(0)
model = hpcdl.build_model("small_cnn", in_channels=store.channels, num_classes=len(store.classes))
options = hpcdl.TrainingOptions(
    solver="adam",
    max_epochs=8,
    mini_batch_size=64,
    validation_frequency=20,
    verbose_frequency=20,
    plots="training-progress",
    output_dir="runs/digits-example",
)
model, info = hpcdl.train_network(train_set, model, options, validation_data=validation_set)

labels, scores = hpcdl.classify(model, validation_set)
accuracy = sum(label == store.classes[y] for label, (_, y) in zip(labels, validation_set)) / len(validation_set)
print(f"validation accuracy {accuracy:.2%}; progress plot in runs/digits-example/training-progress.png")
