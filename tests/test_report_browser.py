"""The report opens in a real headless browser: every image decodes and the page logs no
console error and throws no exception.

Chromium is driven over the Chrome DevTools Protocol on a pipe (--remote-debugging-pipe:
JSON messages ended by a NUL byte, commands on fd 3, replies and events on fd 4), so no
Python package is needed. Skips when no chromium is installed (.ci/install-browser.sh
installs Debian's).
"""
from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import subprocess
import time

import pytest

from costmodel.profile import load_profile
from reports.report import write_report
from sim.metrics import simulate
from specs.model import load_model
from specs.plan import resolve_plan
from sim.result import SearchResult
from specs.topology import load_topology

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
TIMEOUT_S = 20.0


def _browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no headless chromium: install Debian's chromium (see .ci/install-browser.sh)")


class Cdp:
    """A minimal DevTools client over the two pipes chromium opens with --remote-debugging-pipe."""

    def __init__(self, exe: str, profile_dir: str):
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds():  # in the child, before exec: the pipes become fds 3 and 4
            # Move both out of the way first: either may itself be fd 3 or 4.
            r, w = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(r, 3)
            os.dup2(w, 4)
            os.close(r)
            os.close(w)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-extensions", "--disable-dev-shm-usage", "--remote-debugging-pipe",
             f"--user-data-dir={profile_dir}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=fds, close_fds=False)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict] = []

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_child], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._from_child, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str) -> dict:
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            ev = self._read_message(deadline)
            self.events.append(ev)
            if ev.get("method") == method:
                return ev

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)


def _errors(events: list[dict]) -> list[str]:
    out = []
    for ev in events:
        m, p = ev.get("method"), ev.get("params", {})
        if m == "Runtime.exceptionThrown":
            det = p.get("exceptionDetails", {})
            out.append(f"exception: {det.get('text', '')} {det.get('exception', {}).get('description', '')}")
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console: " + json.dumps(p.get("args", []))[:300])
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            entry = p["entry"]
            out.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}")
    return out


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    """A heterogeneous comparison (every section, seven figures) written once."""
    model, cluster, profile = load_model("gpt3-1.3b"), load_topology("hetero-a100-v100"), load_profile(None)
    ranked = [simulate(model, resolve_plan(p, model, cluster.num_devices), cluster, profile, record=True)
              for p in ("tp=2,pp=2", "tp=8")]
    ranked.sort(key=lambda r: -r.tokens_per_s)
    sr = SearchResult(topology=cluster.name, model=model.name, num_devices=cluster.num_devices,
                      ranked=ranked, pruned={}, notes=["A note with <markup> & ampersands."])
    out = tmp_path_factory.mktemp("browser")
    write_report(out, sr)
    return out


def _open(exe, page, tmp_path):
    cdp = Cdp(exe, str(tmp_path / "profile"))
    try:
        target = cdp.call("Target.createTarget", url="about:blank")["targetId"]
        session = cdp.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            cdp.call(f"{domain}.enable", session)
        cdp.call("Page.navigate", session, url=page.as_uri())
        cdp.wait_for("Page.loadEventFired")
        expr = ("JSON.stringify({n: document.images.length, ok: Array.from(document.images)"
                ".filter(i => i.complete && i.naturalWidth > 0).length, title: document.title, "
                "h2: Array.from(document.querySelectorAll('h2')).map(h => h.textContent), "
                "findings: Array.from(document.querySelectorAll('#findings + ul li')).map(li => li.textContent)})")
        value = json.loads(cdp.call("Runtime.evaluate", session, expression=expr,
                                    returnByValue=True)["result"]["value"])
        return value, _errors(cdp.events)
    finally:
        cdp.close()


def test_report_loads_in_headless_chromium(report_dir, tmp_path):
    """All seven figures decode (complete, non-zero natural width), the sections render,
    the search's notes show as text (HTML-escaped), and chromium reports no exception,
    console error or failed load."""
    exe = _browser()
    value, errors = _open(exe, report_dir / "index.html", tmp_path)
    assert errors == []
    assert value["n"] == 7 and value["ok"] == 7
    assert value["h2"][0] == "Findings" and "Utilisation per device group" in value["h2"]
    assert "gpt3-1.3b on hetero-a100-v100" in value["title"]
    assert value["findings"][0] == "A note with <markup> & ampersands."  # escaped, shown as text


def test_the_check_sees_broken_pages(report_dir, tmp_path):
    """The same check on a page with a broken image and a script error reports both, so a
    pass above means something."""
    exe = _browser()
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head><title>x</title></head><body>'
                   '<img src="data:image/png;base64,AAAA">'
                   '<script>undefined_function();</script></body></html>')
    value, errors = _open(exe, bad, tmp_path)
    assert value["n"] == 1 and value["ok"] == 0
    assert any("exception" in e and "undefined_function" in e for e in errors)
