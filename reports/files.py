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
- The checks are real: the target folder must take a new file (one is created and removed at
  once), a report folder's own files must be writable names, no output may be an input of the
  command, and no two outputs may be the same path or one inside the other (``check_outputs``).
- ``staged()``: a command with several outputs writes them all at its end, or none: while it
  is active the renames wait for its end, and a failure removes every temporary (and any
  folder this run created).
- Files are written with the usual mode (0o666 less the umask), not mkstemp's 0o600.
"""
from __future__ import annotations

import os
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable

from costmodel.errors import InputError

try:  # POSIX; elsewhere concurrent writers are not serialised
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None


# The flag each checked output path was given with (absolute path -> flag), so that a write
# that still fails names the user's path and its flag, not a temporary file.
_FLAGS: dict[str, str] = {}


def _key(path: str | Path) -> str:
    return os.path.abspath(str(path))


def _flag_of(final: Path) -> str | None:
    return _FLAGS.get(_key(final)) or _FLAGS.get(_key(final.parent))


def _real(path: str | Path) -> str:
    return os.path.realpath(str(path))


def _same_file(out: Path, inp: Path) -> bool:
    """Whether writing `out` (a rename onto that name) would replace the file `inp`: the same
    path once links are resolved, the same directory entry, or the same file (hard link)."""
    try:
        if _real(out) == _real(inp):
            return True
        if os.path.join(_real(out.parent), out.name) == os.path.join(_real(inp.parent), inp.name):
            return True
        return out.exists() and os.path.samefile(out, inp)
    except (OSError, ValueError):
        return False


def _not_an_input(out: Path, text: str, flag: str, inputs: Iterable[tuple[str, str | Path | None]]) -> None:
    """InputError when the output `out` is one of the command's input files ((flag, path) pairs;
    values that are no file, e.g. a preset or bundled name, are skipped)."""
    for in_flag, value in inputs:
        if value is None or not str(value).strip():
            continue
        inp = Path(str(value))
        try:
            is_file = inp.is_file()
        except (OSError, ValueError):
            is_file = False
        if is_file and _same_file(out, inp):
            raise InputError(text, flag, f"is an input of this command ({in_flag}); choose another file")


def _cannot_write(text: str, flag: str, where: Path, err: OSError) -> InputError:
    return InputError(text, flag, f"cannot write in {str(where)[:60]!r}: {err.strerror or err}; "
                                  "give a path in a folder you can write to")


def _probe_file(folder: Path, text: str, flag: str) -> None:
    """A new file can be created in `folder`: one is created and removed at once (permissions,
    read-only mounts, /proc and /sys only show when tried)."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".plansim-probe.", suffix=".tmp")
    except OSError as err:
        raise _cannot_write(text, flag, folder, err) from None
    os.close(fd)
    os.unlink(name)


def _probe_folder(above: Path, text: str, flag: str) -> None:
    """A folder can be created in `above` (the nearest existing part of a report folder's
    path): one is created and removed at once."""
    try:
        name = tempfile.mkdtemp(dir=above, prefix=".plansim-probe.")
    except OSError as err:
        raise _cannot_write(text, flag, above, err) from None
    os.rmdir(name)


def output_file(path: str | Path, flag: str, inputs: Iterable[tuple[str, str | Path | None]] = ()) -> Path:
    """An output file path, checked before any work is done: not empty, not a folder, its
    folder exists and takes a new file, and it is none of ``inputs`` ((flag, path) pairs: the
    command's input files)."""
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
    _not_an_input(p, text, flag, inputs)
    _probe_file(p.parent, text, flag)
    _FLAGS[_key(p)] = flag
    return p


def output_dir(out_dir: str | Path, flag: str | None = None, names: Iterable[str] = (),
               inputs: Iterable[tuple[str, str | Path | None]] = ()) -> Path:
    """The output folder, checked before any work is done (created later, on write): it can
    be created, or takes new files; each of the files it will receive (``names``) is neither a
    folder nor a device nor one of ``inputs`` ((flag, path) pairs: the command's input files).
    ``flag`` defaults to --report in messages."""
    shown = flag or "--report"
    if not str(out_dir).strip():
        raise InputError(shown, None, "empty path; give a folder name")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(str(out), shown, "exists and is not a directory")
    # The folder is created with its parents on write: the nearest part of the path that
    # exists must be a folder, or the mkdir would fail only after all the work (a/b where a
    # is a file: "Not a directory").
    above = next((q for q in out.parents if q.exists()), None)
    if not out.exists() and above is not None and not above.is_dir():
        raise InputError(str(out), shown, f"{str(above)!r} exists and is not a directory; "
                                          "give a folder that can be created")
    inputs = list(inputs)
    for name in names:
        target = out / name
        if target.is_dir():
            raise InputError(str(target), shown, "is a folder; the report writes a file of that name there: "
                                                 "remove it or give another folder")
        if target.exists() and not target.is_file():
            raise InputError(str(target), shown, "exists and is not a regular file; the report writes a file of "
                                                 "that name there: remove it or give another folder")
        _not_an_input(target, str(target), shown, inputs)
    if out.exists():
        _probe_file(out, str(out), shown)
    else:
        _probe_folder(above if above is not None else Path("."), str(out), shown)
    if flag is not None:
        _FLAGS[_key(out)] = flag
    return out


Output = tuple[str, "str | Path | None", "Iterable[str] | None"]


def check_outputs(outputs: Iterable[Output], inputs: Iterable[tuple[str, str | Path | None]] = ()) -> list:
    """Every output of a command, checked before any work: ``outputs`` are (flag, path or None,
    names) with names None for a file and the names of the files it receives for a folder.
    Each is checked on its own (output_file, output_dir: writable, not an input), and no two
    may be the same path or one inside the other (the second write would replace, or fail on,
    the first). The checked paths, None where a path was None."""
    outputs, inputs = list(outputs), list(inputs)
    checked = []
    for flag, path, names in outputs:
        if path is None:
            checked.append(None)
        elif names is None:
            checked.append(output_file(path, flag, inputs))
        else:
            checked.append(output_dir(path, flag, names, inputs))
    live = [(flag, p, names is not None) for (flag, _, names), p in zip(outputs, checked) if p is not None]
    for i, (flag_a, a, a_dir) in enumerate(live):
        for flag_b, b, b_dir in live[i + 1:]:
            ra, rb = _real(a), _real(b)
            if ra == rb:
                raise InputError(str(b), flag_b, f"is also the {flag_a} output; give each output its own path")
            for (f_in, inner), (f_out, outer, out_dir) in (((flag_b, b), (flag_a, a, a_dir)),
                                                          ((flag_a, a), (flag_b, b, b_dir))):
                if _real(inner).startswith(_real(outer).rstrip(os.sep) + os.sep):
                    what = "folder" if out_dir else "file"
                    raise InputError(str(inner), f_in, f"is inside the {f_out} {what} {str(outer)[:60]!r}; "
                                                       "give a path outside it")
    return checked


def _temp_beside(final: Path) -> Path:
    fd, name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
    os.close(fd)
    return Path(name)


_UMASK_LOCK = threading.Lock()


def _file_mode() -> int:
    """0o666 less the process's umask: the mode open() would give a new file (mkstemp's
    temporaries are 0o600). The umask can only be read by setting it, so it is set back."""
    with _UMASK_LOCK:
        mask = os.umask(0o077)  # for the instant between the calls, the stricter mask
        os.umask(mask)
    return 0o666 & ~mask


def _write_error(final: Path, err: OSError) -> OSError:
    """The OSError of a failed write, naming the user's path and its flag (not the temporary)."""
    flag = _flag_of(final)
    head = f"{flag}: " if flag else ""
    return OSError(err.errno, f"{head}cannot write: {err.strerror or err} (nothing was written)", str(final))


class _Stage:
    """The writes of a staged() block: temporaries waiting for their rename, folders this run
    created, locks held until the end."""

    def __init__(self) -> None:
        self.renames: list[tuple[Path, Path]] = []
        self.made: list[Path] = []
        self.fds: list[int] = []

    def commit(self) -> None:
        done = 0
        try:
            for tmp, final in self.renames:
                os.replace(tmp, final)
                done += 1
        except OSError as err:
            for tmp, _ in self.renames[done:]:
                tmp.unlink(missing_ok=True)
            raise _write_error(self.renames[done][1], err) from None

    def abort(self, remove_folders: bool) -> None:
        for tmp, _ in self.renames:  # only the temporaries this run created
            tmp.unlink(missing_ok=True)
        for folder in reversed(self.made if remove_folders else []):
            try:
                folder.rmdir()  # only if still empty
            except OSError:
                pass

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)  # releases the lock
        self.fds.clear()


_local = threading.local()


def _current() -> _Stage | None:
    return getattr(_local, "stage", None)


@contextmanager
def staged(remove_folders: bool = True):
    """All the writes in the block (write_file, write_files) land together at its end, or none:
    each file goes to its temporary at once, the renames wait for the block to end without
    error; on an error every temporary is removed and (``remove_folders``) the folders the
    writes created, when still empty. A command with several outputs (simulate --trace and
    --report) writes them in one such block, so a failing second leaves the first unwritten.
    Nested blocks join the outer one."""
    if _current() is not None:
        yield
        return
    stage = _Stage()
    _local.stage = stage
    ok = False
    try:
        yield
        ok = True
    finally:
        _local.stage = None
        try:
            if ok:
                stage.commit()
            else:
                stage.abort(remove_folders)
        finally:
            stage.release()


def _write_all(pairs: list[tuple[Path, bytes]]) -> list[Path]:
    """Write each (final path, bytes) to a fresh temporary beside it, then rename them all
    (inside staged(): at the end of its block)."""
    for final, _ in pairs:
        if final.is_dir():
            raise InputError(str(final), _flag_of(final), "is a folder; cannot write the file there "
                                                          "(nothing was written)")
    mode = _file_mode()
    stage = _current()
    tmps: list[Path] = []
    final = pairs[0][0] if pairs else Path(".")
    try:
        for final, data in pairs:
            tmp = _temp_beside(final)
            tmps.append(tmp)
            tmp.write_bytes(data)
            os.chmod(tmp, mode)
    except BaseException as err:
        for tmp in tmps:  # only the temporaries this run created
            tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise _write_error(final, err) from None
        raise
    if stage is not None:
        stage.renames += [(tmp, final) for tmp, (final, _) in zip(tmps, pairs)]
    else:
        own = _Stage()
        own.renames = [(tmp, final) for tmp, (final, _) in zip(tmps, pairs)]
        own.commit()
    return [final for final, _ in pairs]


def write_file(path: str | Path, data: bytes) -> Path:
    """Write one file atomically (a unique temporary beside it, then a rename)."""
    return _write_all([(Path(path), data)])[0]


def _lock(folder: Path) -> int | None:
    """An exclusive lock on `folder` (its descriptor; closing it releases the lock)."""
    if fcntl is None:
        return None
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"plansim: waiting for another run writing {folder}", file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def _locked(folder: Path):
    fd = _lock(folder)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def write_files(out: Path, files: dict[str, bytes]) -> list[Path]:
    """Write `files` (name -> bytes, in that order) into `out`; return the final paths. The
    folder stays locked until the files are renamed into place (inside staged(): the end of
    its block)."""
    out = Path(out)
    missing = [q for q in [out, *out.parents] if not q.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _write_error(out, err) from None
    pairs = [(out / name, data) for name, data in files.items()]
    stage = _current()
    if stage is None:
        with _locked(out):
            return _write_all(pairs)
    stage.made += reversed(missing)  # outermost first; removed innermost first on failure
    fd = _lock(out)
    if fd is not None:
        stage.fds.append(fd)
    return _write_all(pairs)
