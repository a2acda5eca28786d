"""Which jobs commands go to a login node, told cheaply (no import of the SSH client for a local command)."""

from __future__ import annotations

from typing import Optional, Sequence

from hpcdl.store.safety import JOB_KEY

ID_VERBS = ("show", "watch", "wait", "cancel", "fetch", "resume", "logs", "why", "stacks", "report", "tensorboard")
"""The jobs verbs that take a job's ID."""
OPTIONS_WITH_VALUES = ("--rank", "--timeout", "--to", "--time", "--point", "--metric", "--port")


def is_site_override(override: str) -> bool:
    """cluster=NAME and cluster.remote.*: the overrides that pick the login node."""
    key = override.lstrip("+~").partition("=")[0]
    return key == "cluster" or key.startswith("cluster.remote.")


def job_key(argv: Sequence[str]) -> Optional[str]:
    """The ID of an ID verb's arguments (the first word after the verb that is no option or option value)."""
    for n, word in enumerate(argv[1:], start=1):
        if not word.startswith("-") and argv[n - 1] not in OPTIONS_WITH_VALUES and not is_site_override(word):
            return word
    return None


def goes_remote(argv: Sequence[str]) -> bool:
    """Whether ``python -m hpcdl.jobs ARGV`` is for a login node: it names a profile (cluster=NAME), or its
    job was submitted from here to one (see hpcdl.remote.records)."""
    if any(is_site_override(word) for word in argv):
        return True
    if not argv or argv[0] not in ID_VERBS or (key := job_key(argv)) is None or not JOB_KEY.match(key):
        return False  # no ID, or one the local command refuses with its own message
    from hpcdl.remote.records import site_of

    return site_of(key) is not None
