"""Every input file goes through one YAML loader and one error translator (issue 8).

The loader refuses what PyYAML would silently accept or choke on (a key given twice, bytes
that are not UTF-8, binary files, an alias bomb), for plan, model, topology and profile files
alike; the translator words every schema error the same way: ``FILE: FIELD: VALUE: allowed``
with VALUE cut to a short prefix.
"""
from __future__ import annotations

import re
import time

import pytest

from costmodel.errors import InputError
from costmodel.profile import load_profile
from specs.model import load_model
from specs.plan import resolve_plan
from specs.topology import load_topology

TOPOLOGY = """\
name: t
node_types:
  box:
    gpu: A100-SXM4-80GB
    gpus_per_node: 2
    intra: {kind: nvswitch, bw_GBps: 300, latency_us: 1}
groups:
  - {name: g, node_type: box, nodes: 1}
"""
MODEL = """\
name: m
num_layers: 4
hidden_size: 256
num_attention_heads: 4
seq_length: 128
vocab_size: 1024
global_batch_size: 8
"""
PROFILE = "fabrics:\n  nvswitch: {bw_eff: 0.5}\n"
PLAN = "tp: 2\n"
MODEL_SPEC = load_model("gpt3-125m")


def _load(kind: str, path: str):
    """Load a file of `kind` the way the command line does."""
    if kind == "topology":
        return load_topology(path)
    if kind == "model":
        return load_model(path)
    if kind == "profile":
        return load_profile(path)
    return resolve_plan(path, MODEL_SPEC, 8)


GOOD = {"topology": TOPOLOGY, "model": MODEL, "profile": PROFILE, "plan": PLAN}
KINDS = list(GOOD)


def _write(tmp_path, kind, data: bytes | str) -> str:
    p = tmp_path / f"{kind}.yaml"
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(p)


def _error(kind, path) -> InputError:
    with pytest.raises(InputError) as exc:
        _load(kind, path)
    msg = str(exc.value)
    assert "\n" not in msg and len(msg) < 400, msg
    return exc.value


@pytest.mark.parametrize("kind", KINDS)
def test_good_files_load(tmp_path, kind):
    """The base documents the other tests corrupt are valid (so each failure below is caused
    by the one corruption)."""
    assert _load(kind, _write(tmp_path, kind, GOOD[kind])) is not None


@pytest.mark.parametrize("kind", KINDS)
def test_duplicate_key_rejected(tmp_path, kind):
    """A key given twice is an error in every file type. Before: plan and model files kept
    the last value silently (`tp: 2` then `tp: 4` gave tp=4)."""
    first = GOOD[kind].splitlines()[0]
    err = _error(kind, _write(tmp_path, kind, GOOD[kind] + first + "\n"))
    assert "duplicate key" in str(err) and "line" in str(err)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("data,needle", [(b"name: \xff\xfe\n", "not UTF-8"), (b"\x00\x01\x02bin", "binary")],
                         ids=["latin1", "binary"])
def test_non_utf8_and_binary_rejected(tmp_path, kind, data, needle):
    """Latin-1 bytes or a binary file: one-line InputError naming the file. Before: plan,
    model and profile files raised UnicodeDecodeError (a traceback)."""
    path = _write(tmp_path, kind, data)
    err = _error(kind, path)
    assert needle in err.message and err.source == path


def _bomb(key: str) -> str:
    """A 'billion laughs' document: 9**8 = 43 million strings from ten short lines."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        lines.append(f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\n{key}: *l8\n"


@pytest.mark.parametrize("kind,key", [("topology", "name"), ("topology", "description"),
                                      ("profile", "source"), ("model", "name"), ("plan", "tp")])
def test_alias_bomb_fails_fast(tmp_path, kind, key):
    """An alias bomb is refused in well under a second with a one-line error. Before: a
    topology `name` or a profile `source` bomb grew memory by ~70 MB/s (error messages
    repr()-ed the expanded value)."""
    path = _write(tmp_path, kind, _bomb(key))
    t0 = time.perf_counter()
    err = _error(kind, path)
    assert time.perf_counter() - t0 < 2.0
    assert "aliases expand" in str(err)


def test_small_aliases_still_work(tmp_path):
    """Sharing a block with an alias (a few nodes) is legitimate YAML and still loads."""
    text = TOPOLOGY.replace("intra: {kind", "intra: &fab {kind") + "description: shared\n"
    assert load_topology(_write(tmp_path, "topology", text)).num_devices == 2


@pytest.mark.parametrize("kind", ["topology", "model", "profile", "plan"])
def test_missing_file_one_line(tmp_path, kind):
    """A path that does not exist: one line naming it."""
    path = str(tmp_path / "absent.yaml")
    assert path in str(_error(kind, path))


@pytest.mark.parametrize("kind,text,field", [
    ("topology", TOPOLOGY.replace("bw_GBps: 300", "bw_GBps: -300"), "node_types.box.intra.bw_GBps"),
    ("model", MODEL.replace("num_layers: 4", "num_layers: -4"), "num_layers"),
    ("plan", "tp: -4\n", "tp"),
], ids=["topology", "model", "plan"])
def test_one_wording(tmp_path, kind, text, field):
    """Model, plan and topology schema errors share one wording: FILE: FIELD: VALUE: what is
    allowed (the range). Before: topology said '...; got -300', model/plan '... (got -4)'."""
    path = _write(tmp_path, kind, text)
    err = _error(kind, path)
    value = "-300" if kind == "topology" else "-4"
    assert str(err).startswith(f"{path}: {field}: {value}: must be an integer in [1, ") or \
        str(err).startswith(f"{path}: {field}: {value}: must be a finite number in [")


@pytest.mark.parametrize("kind,text", [
    ("topology", TOPOLOGY.replace("gpu: A100-SXM4-80GB", "gpu: A100-SXM4-80GB\n    colour: " + "x" * 5000)),
    ("topology", TOPOLOGY.replace("kind: nvswitch", "kind: " + "y" * 5000)),
    ("model", MODEL.replace("name: m", "name: m\nactivation: " + "z" * 5000)),
    ("plan", "schedule: " + "w" * 5000 + "\n"),
    ("plan", "compress: topk:" + "9" * 5000 + "\n"),
    ("profile", "runtime: {grad_reduce_dtype: " + "v" * 5000 + "}\n"),
], ids=["topology-key", "topology-kind", "model", "plan-schedule", "plan-compress", "profile"])
def test_values_quoted_as_short_prefix(tmp_path, kind, text):
    """A 5,000-character bad value is quoted as a prefix of at most 60 characters. Before:
    error messages repr()-ed the whole value."""
    err = _error(kind, _write(tmp_path, kind, text))
    assert len(str(err)) < 300 and not re.search(r"(.)\1{60}", str(err))


def test_bundled_files_one_lookup():
    """Topologies, scenarios and profiles are listed and found by the one helper in
    costmodel/yamlio: the names equal the *.yaml stems in the source tree's folders
    (listed here with pathlib, independently), and an unknown bundled name is refused in
    one line naming the field and the bundled choices (a base profile for calibrate --runs
    too, which used to raise FileNotFoundError)."""
    from pathlib import Path

    from costmodel.yamlio import bundled_file, bundled_names
    from specs.scenario import list_scenarios, scenario_path
    from specs.topology import list_topologies
    from validate.fit_runs import _overlay
    root = Path(__file__).parent.parent
    stems = lambda d: sorted(p.stem for p in (root / d).glob("*.yaml"))  # noqa: E731
    assert list_topologies() == stems("topologies") and "dgx-a100" in list_topologies()
    assert list_scenarios() == stems("scenarios") == ["dp2-half-speed", "slow-node-175b"]
    assert bundled_names("costmodel", "profiles") == stems("costmodel/profiles")
    assert bundled_file("costmodel", "nope", "profiles") is None
    assert Path(str(bundled_file("scenarios", "dp2-half-speed"))) == root / "scenarios" / "dp2-half-speed.yaml"
    assert scenario_path("dp2-half-speed").endswith("dp2-half-speed.yaml")
    with pytest.raises(InputError, match=r"--profile: no bundled profile or file named 'nope'; bundled: a100-ib-hdr"):
        _overlay("nope")
    assert _overlay("a100-ib-hdr") and "\n" not in str(pytest.raises(InputError, _overlay, "nope").value)
