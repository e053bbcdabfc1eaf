"""Files written whole: a reader sees the old content or the new, never a mix.

Why a module of its own: the agent (rank files, Prometheus discovery files) and the collectors (digests
``ranksight digest`` writes beside a live spool) put files where others read them at any moment.
"""

from __future__ import annotations

import contextlib
import os
import secrets

from .schema import TMP_PREFIX

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def atomic_write_bytes(path: str, data: bytes, durable: bool = True) -> None:
    """Write a file so that readers see either the old content or the new, never a mix.

    The temporary name has a random part and is created exclusively without following links (a planted
    symlink cannot redirect the write); ``durable`` fsyncs the file before the rename and the folder after,
    so a crash of the machine does not leave an empty file under the final name.
    """
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f"{TMP_PREFIX}{name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return  # a platform without directory handles: the rename is as durable as it gets
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename itself is still atomic
    finally:
        os.close(fd)
