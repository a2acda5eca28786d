"""Your own transform of each training image, after hpcdl's augmentation (``data.transform``)."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch.utils.data import Dataset


class TransformedDatastore(Dataset):
    """Items (image, label) of ``store`` with ``transform(image)`` as the image; run in the background workers."""

    def __init__(self, store: Dataset, transform: Callable[[torch.Tensor], Any]) -> None:
        self.store, self.transform = store, transform
        self.accepts_epoch = getattr(store, "accepts_epoch", False)
        self.classes = getattr(store, "classes", None)
        self.channels = getattr(store, "channels", None)

    def __len__(self) -> int:
        return len(self.store)

    def reopen(self) -> None:
        """Reopen the wrapped datastore's files in a new worker process."""
        if hasattr(self.store, "reopen"):
            self.store.reopen()

    def __getitem__(self, key: Any) -> Optional[tuple[Any, Any]]:
        item = self.store[key]
        if item is None:  # a bad file skipped by the store
            return None
        image, label = item
        return self.transform(image), label
