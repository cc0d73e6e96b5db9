"""benchmarks/hostile_sweep.py's pieces, on hand-worked inputs: which leaves it breaks,
how it breaks one, and what counts as keeping the command line's contract."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import hostile_sweep as hs  # noqa: E402


def test_leaves_are_every_scalar_in_file_order():
    """Scalars at any depth of mappings and lists, in order; empty containers have none."""
    doc = {"a": 1, "b": [2, {"c": 3}], "d": {}, "e": []}
    assert list(hs.leaves(doc)) == [("a",), ("b", 0), ("b", 1, "c")]


def test_broken_replaces_or_deletes_one_leaf_and_leaves_the_original():
    """One leaf changed (or removed) in a copy; the base document is untouched."""
    base = {"a": {"b": 1, "c": [4, 5]}}
    assert hs.broken(base, ("a", "b"), "abc", False) == {"a": {"b": "abc", "c": [4, 5]}}
    assert hs.broken(base, ("a", "c", 0), None, True) == {"a": {"b": 1, "c": [5]}}
    assert base == {"a": {"b": 1, "c": [4, 5]}}


def test_verdict_accepts_success_and_one_line_errors_only():
    """Exit 0, or exit 2 with one stderr line and no traceback, keeps the contract; a
    second line, another exit code or a traceback breaks it."""
    assert hs.verdict(0, "") is None
    assert hs.verdict(2, "plansim: error: t.yaml: groups[0].nodes: -1: must be >= 1\n") is None
    assert hs.verdict(2, "plansim: error: a\nmore\n") is not None
    assert hs.verdict(1, "plansim: error: a\n") is not None
    assert hs.verdict(2, "Traceback (most recent call last):\n") is not None
