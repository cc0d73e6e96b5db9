"""The one reader of input files: text decoding and YAML parsing for every file type
(plan, model, topology, profile; the runs CSV shares the text decoding).

It lives in costmodel, the lowest package, because profiles (costmodel/profile.py) read
YAML too and costmodel may not import specs. Every failure is a one-line InputError:

- a missing or unreadable file, a file larger than ``MAX_FILE_BYTES``;
- binary content (a NUL byte) or bytes that are not UTF-8;
- malformed YAML (with line and column), a mapping key given twice (PyYAML would keep the
  last value silently);
- aliases that expand the document by more than ``MAX_ALIAS_NODES`` nodes (a "billion
  laughs" alias bomb is refused after composing its small node graph, before anything is
  constructed, validated or printed), or an alias that contains itself.
"""
from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

import yaml

from costmodel.errors import InputError

# Input files are hand-written descriptions of a cluster, a model or a plan: the largest
# bundled one is a few kB. 2 MiB leaves room for a machine-written explicit network of
# ~30k links (about 60 B a link) while bounding what a mistaken path (a dataset, a binary)
# can make us read and how long reading it takes: parsing is linear in the scalars, about
# 30 us each with PyYAML's Python parser here, so 16 MiB of one-line keys took over 60 s
# to refuse, 4 MiB of one-item list lines 34 s, 2 MiB about 17.
MAX_FILE_BYTES = 2 * 2**20
# YAML nodes that aliases may add beyond the ones written in the file. Sharing a block of
# settings a few times adds tens of nodes; an alias bomb adds millions.
MAX_ALIAS_NODES = 10_000


def not_a_file(path: str | Path, what: str = "file") -> str | None:
    """Why ``path``, which exists, cannot be read as ``what`` (a directory, a device, FIFO
    or socket), or None: it is a regular file or does not exist. The loaders that take a
    preset name or a path ask this before saying "no such file", which would be wrong
    about a directory that plainly exists; a FIFO is never opened, so it cannot block."""
    p = Path(path)
    if p.is_dir():
        return f"a directory; expected a {what}"
    if p.exists() and not p.is_file():
        return f"not a regular file (a device, FIFO or socket); expected a {what}"
    return None


def read_text(path: str | Path, source: str | None = None, what: str = "file") -> str:
    """The UTF-8 text of ``path``; InputError (one line) when it is missing, unreadable,
    too large, binary or not UTF-8."""
    source = source or str(path)
    p = Path(path)
    try:
        problem = not_a_file(p, what)
        if problem:
            raise InputError(source, None, problem)
        if not p.is_file():
            raise InputError(source, None, f"no such {what}")
        if p.stat().st_size > MAX_FILE_BYTES:
            raise InputError(source, None, f"{p.stat().st_size:,} bytes; an input file may have at most "
                                           f"{MAX_FILE_BYTES:,} bytes")
        data = p.read_bytes()
    except OSError as err:
        raise InputError(source, None, f"cannot read the {what}: {err.strerror or err}") from None
    return decode(data, source)


def decode(data: bytes, source: str) -> str:
    """UTF-8 text of ``data``, refusing binary content (NUL bytes) and other encodings. A
    leading byte-order mark is dropped: Excel's "CSV UTF-8" export and Windows Notepad write
    one (EF BB BF, Unicode 15.0 section 23.8), and kept it would glue itself to the first
    column's name, so a runs table exported from a spreadsheet lost its `run_id` column."""
    if b"\x00" in data:
        at = data.index(b"\x00")
        raise InputError(source, None, f"binary content (a NUL byte at offset {at}); expected a UTF-8 text file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(source, None, f"not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); "
                                       "save the file as UTF-8") from None
    return text.removeprefix("\ufeff")


# The pure-Python parser, not libyaml's (yaml.CSafeLoader): libyaml overflows its C stack
# on a deeply nested document (a 200 kB file of nested lists killed the process with
# SIGSEGV), where the Python parser raises RecursionError, refused below in one line.
class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects a mapping key given twice and reads no base-60 numbers."""


# YAML 1.1 reads 6:6 as the base-60 integer 366 and 1:30.5 as 90.5 (PyYAML's int and float
# resolvers); YAML 1.2 dropped that, and here it only ever turned a plan file's
# `layers: 6:6` into a wrong number. The resolvers below are PyYAML's without the base-60
# forms, so such a value stays the string the user wrote.
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"""^(?:[-+]?0b[0-1_]+
                |[-+]?0[0-7_]+
                |[-+]?(?:0|[1-9][0-9_]*)
                |[-+]?0x[0-9a-fA-F_]+)$""", re.X),
    list("-+0123456789"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
                |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
                |[-+]?\.(?:inf|Inf|INF)
                |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            dup = key in seen
        except TypeError:  # an unhashable key: construct_mapping reports it
            dup = False
        if dup:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {str(key)[:60]!r}",
                                                    key_node.start_mark)
        if not isinstance(key, (list, dict)):
            seen.add(key)
    return loader.construct_mapping(node, deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _expanded_size(root: yaml.Node, limit: int) -> tuple[int, int]:
    """(nodes of the document with every alias expanded, distinct nodes); the first stops
    counting past ``limit``.
    The composed graph shares aliased nodes, so sizes are memoised per node (linear time)."""
    size: dict[int, int] = {}
    active: set[int] = set()

    def walk(node: yaml.Node) -> int:
        key = id(node)
        if key in size:
            return size[key]
        if key in active:
            raise ValueError("an alias refers to a node that contains it")
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        for child in children:
            total = min(total + walk(child), limit + 1)
        active.discard(key)
        size[key] = total
        return total

    return walk(root), len(size)


def parse_yaml(text: str, source: str):
    """The YAML document in ``text`` (None when empty); InputError on any problem above."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            expanded, distinct = _expanded_size(node, 10 * MAX_FILE_BYTES)
        except ValueError as err:
            raise InputError(source, None, f"malformed YAML: {err}") from None
        except RecursionError:
            raise InputError(source, None, "malformed YAML: nested too deeply") from None
        if expanded - distinct > MAX_ALIAS_NODES:
            raise InputError(source, None, f"YAML aliases expand the document by more than "
                                           f"{MAX_ALIAS_NODES:,} nodes; write the values out")
        return loader.construct_document(node)
    except ValueError as err:  # an integer beyond Python's 4,300-digit conversion limit
        why = "a number with more than 4,300 digits" if "digits" in str(err) else str(err)[:120]
        raise InputError(source, None, f"malformed YAML: {why}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise InputError(source, None, f"malformed YAML{where}: {problem}") from None
    except RecursionError:
        raise InputError(source, None, "malformed YAML: nested too deeply") from None
    finally:
        loader.dispose()


def load_yaml(path: str | Path, source: str | None = None, what: str = "file"):
    """Read and parse one YAML input file (see the module docstring for what is refused)."""
    source = source or str(path)
    return parse_yaml(read_text(path, source, what), source)


def load_yaml_mapping(path: str | Path, source: str | None = None, what: str = "file",
                      expected: str = "a mapping"):
    """load_yaml for a file that must hold a mapping: an empty file (nothing but blanks or
    comments, which YAML reads as nothing) is refused rather than read as every default,
    since a plan, profile or scenario the user named but left empty is a mistake (a
    truncated write, the wrong path), not a request for the defaults ({} asks for them);
    so is any other top level than a mapping."""
    source = source or str(path)
    data = load_yaml(path, source, what)
    if data is None:
        raise InputError(source, None, f"the {what} is empty: expected {expected}")
    if not isinstance(data, dict):
        raise InputError(source, None, f"expected {expected}, got {type(data).__name__}")
    return data


# ----------------------------------------------------------------------------- bundled files
# Topologies (package ``topologies``), scenarios (``scenarios``) and hardware profiles
# (``costmodel/profiles``) ship as YAML files inside the installed packages; these two
# functions are the one way to list and find them (importlib.resources, so an installed
# wheel works as well as a source checkout).

def bundled_names(package: str, folder: str = "") -> list[str]:
    """Stems of the ``*.yaml`` files bundled in ``package``/``folder``, sorted."""
    root = files(package).joinpath(folder) if folder else files(package)
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def bundled_file(package: str, name: str, folder: str = ""):
    """The bundled resource ``package``/``folder``/``name``.yaml, or None when there is none."""
    res = files(package).joinpath(f"{folder}/{name}.yaml" if folder else f"{name}.yaml")
    return res if res.is_file() else None
