"""Write a report's files all or none: every file goes to a temporary name first and is
renamed into place only once all of them were written, so a failure (disk full, a bad
value found late) leaves no half-written report and keeps an earlier one intact."""
from __future__ import annotations

import os
from pathlib import Path

from costmodel.errors import InputError


def output_dir(out_dir: str | Path, flag: str = "--report") -> Path:
    """The output folder, checked before any work is done (created later, on write)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(str(out), flag, "exists and is not a directory")
    return out


def write_files(out: Path, files: dict[str, bytes]) -> list[Path]:
    """Write `files` (name -> bytes, in that order) into `out`; return the final paths."""
    out.mkdir(parents=True, exist_ok=True)
    tmps: list[tuple[Path, Path]] = []
    try:
        for name, data in files.items():
            tmp = out / f".{name}.tmp"
            tmp.write_bytes(data)
            tmps.append((tmp, out / name))
    except BaseException:
        for tmp, _ in tmps:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, final in tmps:
        os.replace(tmp, final)
    return [final for _, final in tmps]
