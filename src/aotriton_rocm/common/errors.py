"""The one error type of the ``aotriton-rocm`` commands.

A command's function raises :class:`CommandError` (or a subclass: the
tooling's own errors derive from it) when it cannot do what was asked; the
message says what is wrong and what to do. ``cli.main`` turns it into the
message on stderr and the exit status, in one place. Standard library only.
"""
from __future__ import annotations

__all__ = ["CommandError", "UsageError", "Terminated", "FAILED", "USAGE", "INTERRUPTED",
           "TERMINATED"]

FAILED = 1       # the work was tried and failed (a compile, a check, a gate)
USAGE = 2        # a bad request: command line, spec, targets, inputs refused up front
INTERRUPTED = 130   # SIGINT (Ctrl-C)
TERMINATED = 143    # SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be, so that the
    same clean-up runs (``cli.main`` turns it into exit status 143)."""


class CommandError(Exception):
    """A command failed; ``exit_code`` is the process exit status."""

    exit_code = FAILED

    def __init__(self, message: str = "", exit_code: "int | None" = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = int(exit_code)


class UsageError(CommandError):
    """A request the command refuses before doing any work (exit status 2)."""

    exit_code = USAGE
