"""Errors a user can act on. The CLI prints them without a traceback and exits with code 2.

Every message is one line of bounded length: whitespace runs (newlines included) become one
space and the text is cut at MAX_MESSAGE characters, so a hostile input (a 100 MB YAML value, a
key id list of a million lines) can never make an error line hundreds of MB long.
"""
from __future__ import annotations

import reprlib

# The longest error message, in characters; values quoted in messages are cut far shorter (`shorten`).
MAX_MESSAGE = 2000
# The longest quoted value (`got ...`) in a message.
MAX_VALUE = 160

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset = 3, 8, 8, 8, 8
_REPR.maxstring, _REPR.maxlong, _REPR.maxother = MAX_VALUE, 60, MAX_VALUE


def shorten(text: str, limit: int = MAX_VALUE) -> str:
    """`text` on one line, cut to at most `limit` characters (a cut says how much was left out)."""
    text = " ".join(text.split()) if any(c in text for c in "\n\r\t\v\f") else text
    if len(text) <= limit:
        return text
    note = f"... ({len(text) - limit} more characters)"
    return text[: max(0, limit - len(note))] + note


def show(value: object, limit: int = MAX_VALUE) -> str:
    """A bounded repr of `value` for messages: never the whole of a huge or deeply shared value."""
    try:
        text = _REPR.repr(value)
    except (ValueError, RecursionError, MemoryError):
        text = f"<{type(value).__name__}>"
    return shorten(text, limit)


class FarmError(Exception):
    """A problem with the user's input: what was wrong, where, and what was expected."""

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(shorten(str(message), MAX_MESSAGE), *args)


class SpaceError(FarmError):
    """A search space file is invalid."""

    def __init__(self, path: str, field: str, expected: str, got: object = ...) -> None:
        self.path, self.field, self.expected = path, field, expected
        message = f"{shorten(str(path), 400)}: {shorten(str(field), 200)}: expected {expected}"
        if got is not ...:
            message += f", got {show(got)}"
        super().__init__(message)


class BundleError(FarmError):
    """A bundle failed verification or cannot be read."""
