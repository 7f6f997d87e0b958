"""Crash-safe file writes shared by the blob store and the expert disk tier.

A file appears under its final name whole or not at all: bytes go to a temp file in the
same folder, are fsynced, then renamed over the final name (atomic on POSIX), and the
folder is fsynced so the rename itself survives a crash. Pure module (no Django).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

TMP_PREFIX = ".tmp-"


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems refuse fsync on a directory
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _temp_in(folder: Path) -> tuple[int, str]:
    folder.mkdir(parents=True, exist_ok=True)
    return tempfile.mkstemp(prefix=TMP_PREFIX, dir=folder)


def write_atomic(path: Path, data: bytes | bytearray | memoryview, *, mode: int = 0o644) -> None:
    """Write `data` to `path` through a temp file, fsync and rename."""
    fd, tmp = _temp_in(path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def link_or_write_atomic(path: Path, data: bytes | bytearray | memoryview, *, existing: Path | None) -> bool:
    """Put `data` at `path`, as a hard link to `existing` when that file holds the same bytes.

    A payload loaded from a blob then occupies the disk once: the blob store and the expert
    disk tier share one inode (deleting either name leaves the other intact). Falls back to
    a copy when linking is impossible (another filesystem, no permission) or `existing` no
    longer has the right size. Returns True when it linked.
    """
    if existing is not None:
        try:
            if existing.stat().st_size == len(data):
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}.link")
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
                os.link(existing, tmp)
                os.replace(tmp, path)
                fsync_dir(path.parent)
                return True
        except OSError:
            pass
    write_atomic(path, data)
    return False
