"""Local folders the trainer and the `evokube` command write, checked before any work.

A folder that cannot be written (a file in its place or above it, no permission, a read-only
volume) is said at once in one line naming it: the trainer exits 78 when a restart would meet
it again (`permanent`), else 75; the laptop commands exit 78. Never a traceback midway.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

# What writing a folder fails with that a restart in the same pod spec fails with again.
PERMANENT_ERRNOS = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.EEXIST,  # a file where the folder should be
        errno.ENOTDIR,  # a file above it
        errno.EISDIR,  # a folder where a file should be
        errno.ENAMETOOLONG,
        errno.ELOOP,
    }
)


def prepare(path: str | os.PathLike[str]) -> None:
    """Create the folder `path` (and its parents) and write and delete a probe file in it;
    OSError, as the system says it, when that fails."""
    os.makedirs(path, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".evokube-probe-"):
        pass


def prepare_file(path: str | os.PathLike[str]) -> None:
    """`prepare` the folder of the file `path`, which must not be a folder itself."""
    prepare(Path(path).parent)
    if Path(path).is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))


def permanent(err: OSError) -> bool:
    return err.errno in PERMANENT_ERRNOS


def describe(path: str | os.PathLike[str], err: OSError) -> str:
    """One line: `path` cannot be written, and why."""
    if err.errno in (errno.EEXIST, errno.ENOTDIR):
        why = "a file is in the way (it, or a folder above it, is a file)"
    elif err.errno == errno.EISDIR:
        why = "it is a folder"
    else:
        why = err.strerror or str(err)
    return f"cannot write to {os.fspath(path)}: {why}"
