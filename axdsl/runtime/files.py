"""Writing files safely: whole or not at all, and never through a link someone planted.

`replace_file` writes a new file beside the target, created exclusively (tempfile.mkstemp: O_EXCL,
a name nobody can guess or link in advance), flushes it to disk and renames it over the target: a
reader, a kill or a full disk leaves either the old file whole or the new one. When the target is
a symlink, the rename replaces the link itself: nothing is written where it points. A target
that is neither a regular file nor a link (a device such as /dev/full or /dev/stdout, a FIFO) is
written as it is: renaming over it would replace the device node itself (as root, `plot --out
/dev/full` turned /dev/full into a PNG).
`open_append` opens a log (metrics.jsonl) to append, refusing a symlink (O_NOFOLLOW).
axdsl's commands (fmt, eval, export, build) import these; the build copies them into runtime.py.
"""

import errno
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path


class UnsafePathError(OSError):
    """A file axdsl was about to write is a symlink: it writes nothing through one."""


def replace_file(path: Path, data: bytes | str, mode: int | None = None) -> None:
    """Write `data` (str: UTF-8) to `path` by an exclusive temporary file in its directory, fsync
    and rename. `mode`: the new file's permissions; by default those of the file it replaces, or
    0666 less the umask for a new one (tempfile's 0600 is not what a user expects)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    replace_file_with(path, lambda tmp: tmp.write_bytes(raw), mode)


def replace_file_with(path: Path, write: Callable[[Path], object], mode: int | None = None) -> None:
    """`replace_file` for a writer that takes a file name (safetensors' save_file): `write(tmp)`
    fills the exclusive temporary file, which is then flushed to disk and renamed onto `path`."""
    path = Path(path)
    if _special(path):  # a device or a FIFO: written to, never replaced
        write(path)
        return
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(path) if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _special(path: Path) -> bool:
    """Whether `path` exists and is neither a regular file, a directory nor a symlink."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode))


def _mode_for(path: Path) -> int:
    try:
        st = os.lstat(path)
        if not os.path.islink(path):
            return st.st_mode & 0o7777
    except OSError:
        pass
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def open_append(path: Path, binary: bool = False):
    """`path` opened to append (created if missing); a symlink there is refused (O_NOFOLLOW) with
    an UnsafePathError naming it, rather than appended through."""
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise UnsafePathError(
                f"{path} is a symlink; axdsl appends to no file through one"
            ) from None
        raise
    return os.fdopen(fd, "a+b") if binary else os.fdopen(fd, "a+", encoding="utf-8")


def refuse_symlink(path: Path) -> None:
    """Raise UnsafePathError when `path` is a symlink (for a file rewritten in place: fmt)."""
    if os.path.islink(path):
        raise UnsafePathError(f"{path} is a symlink; axdsl writes no file through one")
