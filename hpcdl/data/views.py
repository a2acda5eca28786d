"""A datastore that shows another one (augmented, transformed): the other's length, classes and channels, and
its files reopened in each background worker."""

from __future__ import annotations

from torch.utils.data import Dataset


class DatastoreView(Dataset):
    """The part every view of a datastore shares; a subclass calls ``_show(store)`` when it is built."""

    store: Dataset

    def _show(self, store: Dataset) -> None:
        self.store = store
        self.classes = getattr(store, "classes", None)
        self.channels = getattr(store, "channels", None)

    def __len__(self) -> int:
        return len(self.store)

    def reopen(self) -> None:
        """Reopen the wrapped datastore's files in a new worker process."""
        if hasattr(self.store, "reopen"):
            self.store.reopen()
