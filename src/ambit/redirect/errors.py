"""Errors of the redirect package (tree in :mod:`ambit.redirect`)."""

from __future__ import annotations

from collections.abc import Sequence

from ambit.errors import AmbitError


class RedirectError(AmbitError):
    """Base of every error raised by :mod:`ambit.redirect`."""


class RedirectSettingsError(RedirectError):
    """A pod annotation (or a setting) cannot be used; the message names the annotation and what was expected."""


class RedirectApplyError(RedirectError):
    """A command that installs or removes redirection rules failed."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: bytes) -> None:
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr
        err = stderr.decode(errors="replace").strip()
        super().__init__(f"{' '.join(self.argv)} exited {returncode}: {err[-500:]}")
