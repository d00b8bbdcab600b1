"""Errors a user can act on. The CLI prints them without a traceback and exits with code 2."""
from __future__ import annotations


class FarmError(Exception):
    """A problem with the user's input: what was wrong, where, and what was expected."""


class SpaceError(FarmError):
    """A search space file is invalid."""

    def __init__(self, path: str, field: str, expected: str, got: object = ...) -> None:
        self.path, self.field, self.expected = path, field, expected
        message = f"{path}: {field}: expected {expected}"
        if got is not ...:
            message += f", got {got!r}"
        super().__init__(message)


class BundleError(FarmError):
    """A bundle failed verification or cannot be read."""
