"""Errors a user can fix (a path, a file, an argument, a dataset, a missing GPU or server): the command line prints
them as one line. Anything else is a bug or a failure of the machine and keeps its traceback."""

from __future__ import annotations


class UsageError(Exception):
    """Base of every error the command line reports in one line."""


class BadInput(UsageError, ValueError):
    """An argument, file or dataset that is not what it should be."""


class MissingInput(UsageError, FileNotFoundError):
    """A path that does not exist."""


class Unavailable(UsageError, RuntimeError):
    """Something this machine lacks or that stopped: a GPU, TensorRT, a server process."""
