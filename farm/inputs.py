"""Reading a user's file within bounds: a regular file only (a FIFO would block, a device such as
/dev/zero never end, a folder fail late), at most a given number of bytes read."""
from __future__ import annotations

import os
import stat
from pathlib import Path


class NotAFile(OSError):
    """The path names a folder, device, FIFO or socket: expected a regular file."""


class TooLarge(ValueError):
    """The file holds more bytes than its reader's bound."""


def read_regular(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most `max_bytes` bytes; NotAFile, TooLarge, or the
    OSError of opening it. Opened without blocking (a FIFO is refused, not waited on)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise NotAFile(f"{path}: not a regular file (a folder, device or FIFO)")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise TooLarge(f"{path}: more than {max_bytes} bytes")
    return data
