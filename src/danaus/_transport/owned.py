"""Files only this user controls: read one only if it is ours and private, write one privately.

Another user who can write a file we read (or the directory it is in) decides
what we read: a job secret they know, a job state that names their workers.
So a file that holds such things is read only when

- it is not a symbolic link (``O_NOFOLLOW``) and is a regular file,
- it belongs to this user and no one else may read or write it (mode 600),
- and, where asked (``private_dir=True``), the directory it is in belongs to
  this user (or root) and no one else may write it, so no one can swap it,

all checked with ``fstat`` on the descriptors actually read (the file is opened
relative to the directory checked), so nothing changes between check and use.
Files are written the same way: a temporary file created ``O_EXCL |
O_NOFOLLOW`` with mode 600 in a checked directory, then renamed into place.

A refusal is a ``ValueError`` naming the file and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat

__all__ = ["ensure_private_dir", "make_dirs", "private_dir", "read_owned", "write_private"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def _check_mine(st: os.stat_result, path: str, what: str, why: str) -> None:
    """``ValueError`` unless ``path`` (``st``) belongs to this user; ``why`` says what its
    owner could do, and the fix."""
    if st.st_uid != os.getuid():
        raise ValueError(
            f"{what} {path!r} belongs to uid {st.st_uid}, not to this user "
            f"(uid {os.getuid()}): {why}"
        )


def _check_file(st: os.stat_result, path: str, what: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{what} {path!r} is not a regular file; use a plain file you own")
    _check_mine(
        st,
        path,
        what,
        "whoever owns it decides what this process reads from it. Use a file you own, with "
        "mode 600",
    )
    if st.st_mode & 0o077:
        raise ValueError(
            f"{what} {path!r} is readable or writable by others (mode "
            f"{oct(stat.S_IMODE(st.st_mode))}): anyone who reads it can run code in the "
            f"job. Fix it with: chmod 600 {path}"
        )


def _check_dir(st: os.stat_result, directory: str, path: str, what: str) -> None:
    if st.st_uid not in (os.getuid(), 0):
        raise ValueError(
            f"{what} {path!r} is in the directory {directory!r}, which belongs to uid "
            f"{st.st_uid}, not to this user (uid {os.getuid()}): its owner can replace the "
            "file. Keep it in a directory of your own (e.g. the default .danaus/, created "
            "mode 700)"
        )
    if st.st_mode & 0o022:
        raise ValueError(
            f"{what} {path!r} is in the directory {directory!r}, which others can write "
            f"(mode {oct(stat.S_IMODE(st.st_mode))}): they can replace the file. Keep it in "
            f"a directory only you can write, or fix it with: chmod go-w {directory}"
        )


def _open_dir(directory: str, path: str, what: str) -> int:
    dfd = os.open(directory, os.O_RDONLY | _DIRECTORY)
    try:
        _check_dir(os.fstat(dfd), directory, path, what)
    except BaseException:
        os.close(dfd)
        raise
    return dfd


def _open_nofollow(name: str, flags: int, path: str, what: str, **kw: int) -> int:
    try:
        return os.open(name, flags | _NOFOLLOW, **kw)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise ValueError(
            f"{what} {path!r} is a symbolic link: refusing to follow it (whoever can "
            "change the link chooses the file). Name the file itself"
        ) from None


def read_owned(path: str, what: str, *, private_dir: bool = False) -> bytes:
    """The bytes of ``path``, refused (``ValueError``) unless it is this user's own
    private file (and, with ``private_dir``, in a directory no one else can write).

    ``what`` names the file in the message (``"the secret file"``). Blocks on the
    file system only; ``FileNotFoundError`` if there is no such file.
    """
    dfd = None
    if private_dir:
        dfd = _open_dir(os.path.dirname(os.path.abspath(path)), path, what)
    try:
        if dfd is None:
            fd = _open_nofollow(path, os.O_RDONLY, path, what)
        else:
            fd = _open_nofollow(os.path.basename(path), os.O_RDONLY, path, what, dir_fd=dfd)
    finally:
        if dfd is not None:
            os.close(dfd)
    with os.fdopen(fd, "rb") as f:
        _check_file(os.fstat(f.fileno()), path, what)
        return f.read()


def make_dirs(path: str, mode: int = 0o700) -> None:
    """Create ``path`` and every missing parent, each with exactly ``mode`` whatever the
    umask (``os.makedirs`` gives the parents the umask's mode: ``~/.danaus`` came out
    775 under umask 002). Existing directories are left as they are."""
    missing = []
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:  # made meanwhile by someone else: the caller checks it
            continue
        st = os.lstat(d)
        if stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) != mode:
            os.chmod(d, mode)  # the umask took bits the mode asks for


def private_dir(path: str, what: str) -> str:
    """``path``, a directory only this user may use: created mode 700 (parents too, see
    ``make_dirs``) if missing; an existing one must be a directory (not a link) of this
    user, and loses any access of group and others (it is danaus's own, private by
    contract: a ``~/.danaus`` made 775 by an older danaus becomes 700). Anything else
    is a ``ValueError`` naming the fix. Returns ``path``."""
    make_dirs(path)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(
            f"{what} {path!r} is not a directory (a symbolic link or a file): remove it, "
            "and danaus makes a private directory there"
        )
    _check_mine(
        st, path, what, "its owner decides what is in it. Remove it, or choose another directory"
    )
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def ensure_private_dir(directory: str, what: str) -> None:
    """Create ``directory`` (and its parents) mode 700 if missing; else check that
    only this user (or root) can write it (``ValueError`` naming the fix otherwise).

    An existing directory keeps its mode: it may be the user's project folder."""
    make_dirs(directory)
    os.close(_open_dir(directory, directory, what))


def write_private(path: str, data: bytes, what: str) -> None:
    """Replace ``path`` at once by a file holding ``data``, mode 600, in a directory
    only this user can write (created mode 700 if missing; see ``ensure_private_dir``).

    A reader sees the old file or the new one, never half of one; the temporary file
    is created ``O_EXCL | O_NOFOLLOW`` beside it, so nothing planted there is written.
    """
    path = os.path.abspath(path)
    directory, name = os.path.split(path)
    make_dirs(directory)
    dfd = _open_dir(directory, path, what)
    try:
        tmp = f".{name}.{secrets.token_hex(8)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
        fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dfd)
            raise
    finally:
        os.close(dfd)
