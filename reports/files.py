"""Write outputs atomically, without touching anything the run did not create.

- Every output path is checked before any work is done (``output_file``, ``output_dir``), so a
  bad second output never leaves the first one written.
- Each file goes to a temporary file with a unique name in the target folder
  (``tempfile.mkstemp``: created exclusively, so it can never be someone else's file) and is
  renamed over the final name only when every file of the set was written; on failure only
  the temporaries this run created are removed.
- A report folder is written under an exclusive lock on the folder itself (POSIX ``flock``),
  so concurrent runs writing the same folder take turns and the folder always holds a complete
  report from exactly one run; a run that has to wait says so on stderr.
"""
from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from costmodel.errors import InputError

try:  # POSIX; elsewhere concurrent writers are not serialised
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None


def output_file(path: str | Path, flag: str) -> Path:
    """An output file path, checked before any work is done: not empty, not a folder, and its
    folder exists."""
    text = str(path)
    if not text.strip():
        raise InputError(flag, None, "empty path; give a file name")
    p = Path(text)
    if text.endswith(("/", os.sep)) or p.is_dir():
        raise InputError(text, flag, "is a folder; give a file name")
    if not p.parent.is_dir():
        raise InputError(text, flag, f"No such file or directory: folder {str(p.parent)[:60]!r} does not exist")
    if p.exists() and not p.is_file():
        # The atomic rename would replace a device, FIFO or socket (say /dev/null) with a file.
        raise InputError(text, flag, "exists and is not a regular file; give a file name")
    return p


def output_dir(out_dir: str | Path, flag: str = "--report") -> Path:
    """The output folder, checked before any work is done (created later, on write)."""
    if not str(out_dir).strip():
        raise InputError(flag, None, "empty path; give a folder name")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(str(out), flag, "exists and is not a directory")
    # The folder is created with its parents on write: the nearest part of the path that
    # exists must be a folder, or the mkdir would fail only after all the work (a/b where a
    # is a file: "Not a directory").
    above = next((q for q in out.parents if q.exists()), None)
    if not out.exists() and above is not None and not above.is_dir():
        raise InputError(str(out), flag, f"{str(above)!r} exists and is not a directory; "
                                         "give a folder that can be created")
    return out


def _temp_beside(final: Path) -> Path:
    fd, name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
    os.close(fd)
    return Path(name)


def _write_all(pairs: list[tuple[Path, bytes]]) -> list[Path]:
    """Write each (final path, bytes) to a fresh temporary beside it, then rename them all."""
    for final, _ in pairs:
        if final.is_dir():
            raise InputError(str(final), None, "is a folder; cannot write the file there (nothing was written)")
    tmps: list[Path] = []
    try:
        for final, data in pairs:
            tmp = _temp_beside(final)
            tmps.append(tmp)
            tmp.write_bytes(data)
    except BaseException:
        for tmp in tmps:  # only the temporaries this run created
            tmp.unlink(missing_ok=True)
        raise
    for tmp, (final, _) in zip(tmps, pairs):
        os.replace(tmp, final)
    return [final for final, _ in pairs]


def write_file(path: str | Path, data: bytes) -> Path:
    """Write one file atomically (a unique temporary beside it, then a rename)."""
    return _write_all([(Path(path), data)])[0]


@contextmanager
def _locked(folder: Path):
    if fcntl is None:
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"plansim: waiting for another run writing {folder}", file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def write_files(out: Path, files: dict[str, bytes]) -> list[Path]:
    """Write `files` (name -> bytes, in that order) into `out`; return the final paths."""
    out.mkdir(parents=True, exist_ok=True)
    with _locked(out):
        return _write_all([(out / name, data) for name, data in files.items()])
