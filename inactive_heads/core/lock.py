"""A results folder's lock: one writer at a time.

A sweep, ``predict fit`` and ``predict eval`` each write a folder bit by bit (records, predictors,
the eval's sweep) and resume from what they find there. Two of them on one folder at once would
overwrite each other's files, so each holds ``<folder>/.lock`` — a small JSON object naming the
work, the host, the process and since when — while it writes; a second one stops with a one-line
:class:`FolderInUseError` naming the holder. A lock left by a process that no longer runs on this
host is taken over; one from another host is not (its process cannot be checked from here).
"""

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from .errors import UserError

LOCK_FILE = ".lock"


class FolderInUseError(UserError, RuntimeError):
    """Another process holds the results folder's lock."""


class FolderLock:
    """``<folder>/.lock`` (work, host, pid, since) while ``work`` writes the folder; a second
    writer refuses. Folders created for the lock are removed on exit when nothing was written in
    them."""

    def __init__(self, folder: str | os.PathLike, work: str = "sweep"):
        self.path = Path(folder) / LOCK_FILE
        self.work = work
        self.mine = False
        self.created: list[Path] = []  # folders made for the lock, deepest first

    def __enter__(self) -> "FolderLock":
        folder = self.path.parent
        self.created = [p for p in (folder, *folder.parents) if not p.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        me = {"work": self.work, "host": socket.gethostname(), "pid": os.getpid(),
              "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            except FileExistsError:
                if not self._stale():
                    other = self._holder()
                    raise FolderInUseError(
                        f"'{folder}' is in use by another {other.get('work', 'sweep')} (pid {other.get('pid')} "
                        f"on {other.get('host')} since {other.get('since')}); wait for it, or delete "
                        f"{self.path} if that process is gone"
                    ) from None
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.mine = True
            return self
        raise FolderInUseError(f"could not take the lock {self.path}; delete it if no {self.work} is running")

    def _holder(self) -> dict[str, Any]:
        try:
            d = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return d if isinstance(d, dict) else {}

    def _stale(self) -> bool:
        other = self._holder()
        if other.get("host") != socket.gethostname() or not isinstance(other.get("pid"), int):
            return False
        try:
            os.kill(other["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def __exit__(self, *exc) -> None:
        if self.mine:
            self.path.unlink(missing_ok=True)
            self.mine = False
        for folder in self.created:  # work that stopped before writing anything leaves no folder
            try:
                folder.rmdir()
            except OSError:
                break
        self.created = []
