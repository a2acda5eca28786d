"""Your own transform of each training image, after hpcdl's augmentation (``data.transform``)."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch.utils.data import Dataset

from hpcdl.data.views import DatastoreView


class TransformedDatastore(DatastoreView):
    """Items (image, label) of ``store`` with ``transform(image)`` as the image; run in the background workers."""

    def __init__(self, store: Dataset, transform: Callable[[torch.Tensor], Any]) -> None:
        self._show(store)
        self.transform = transform
        self.accepts_epoch = getattr(store, "accepts_epoch", False)

    def __getitem__(self, key: Any) -> Optional[tuple[Any, Any]]:
        item = self.store[key]
        if item is None:  # a bad file skipped by the store
            return None
        image, label = item
        return self.transform(image), label
