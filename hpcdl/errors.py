"""The exceptions hpcdl raises: one base class, one subclass per kind of failure."""

from __future__ import annotations


class HpcdlError(Exception):
    """Base class of every error hpcdl raises on purpose."""


class ConfigError(HpcdlError, ValueError):
    """An option has a bad value; raised before anything runs or is submitted."""


class SubmissionError(HpcdlError):
    """A job could not be handed to its cluster backend."""


class JobFailedError(HpcdlError):
    """A job ended without a result; carries the stderr tail of the first failing rank."""

    def __init__(self, message: str, stderr_tail: str = "") -> None:
        super().__init__(message + (f"\n--- stderr tail ---\n{stderr_tail}" if stderr_tail else ""))
        self.stderr_tail = stderr_tail


class FolderGoneError(HpcdlError):
    """A job's folder was deleted while the job ran: the job stops rather than create it again."""
