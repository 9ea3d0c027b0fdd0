"""The one atomic writer: results, reports and score files appear whole or not at all.

Every file the toolkit writes for someone to read later goes through :func:`atomic_path`: the
content is written to a temporary file in the destination folder and renamed over the target, so
a reader (or a resumed sweep) never sees half a file. The temporary file gets the permissions an
ordinary ``open(path, "w")`` would give (``0o666`` minus the umask), not ``mkstemp``'s private
``0o600``: a colleague on a shared filesystem can read the results.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = write_json_atomic(folder / "a.json", {"x": 1})
    >>> (folder / "a.json").read_text()
    '{\\n "x": 1\\n}'
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import UserError

__all__ = ["atomic_path", "current_umask", "write_bytes_atomic", "write_json_atomic", "write_text_atomic"]


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux ``/proc``)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # elsewhere: read by setting, then restore at once
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; when the block ends without error, rename it onto
    ``path`` (mode ``0o666 & ~umask``). On error the temporary file is removed and ``path`` is left
    as it was. Parent folders are created.

    >>> import tempfile, pathlib, torch
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "t.pt"
    >>> with atomic_path(target) as tmp:
    ...     torch.save({"a": 1}, tmp)
    >>> target.is_file()
    True
    """
    path = Path(path)
    if path.is_dir():
        raise UserError(f"'{path}' is a folder; give the path of a file to write")
    created = [p for p in (path.parent, *path.parent.parents) if not p.exists()]  # deepest first
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        for folder in created:
            try:
                folder.rmdir()
            except OSError:
                break
        raise UserError(f"cannot write '{path}': {e.strerror or e}; choose a folder you can write to") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        for folder in created:  # the folders made for this file, when nothing else went in
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    finally:
        if tmp.exists():
            tmp.unlink()


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return path


def write_text_atomic(path: str | os.PathLike, text: str, *, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically; returns the path."""
    return write_bytes_atomic(path, text.encode(encoding))


def write_json_atomic(path: str | os.PathLike, data: Any, *, indent: int | None = 1) -> Path:
    """Write ``data`` as JSON to ``path`` atomically; returns the path."""
    return write_text_atomic(path, json.dumps(data, indent=indent))
