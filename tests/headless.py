"""A page opened in a real headless browser (Debian's `chromium`), driven over the Chrome
DevTools Protocol: what its images, tables and console said once it loaded.

`open_page(path)` returns a `PageCheck`; tests skip without a browser unless
FLEET_REQUIRE_BROWSER=1 (CI installs `chromium` and sets it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")

# What the page shows, measured in the page: every <img> (loaded and drawn: complete with a
# natural width), the leaderboard's rows, and every element whose src/href names a file.
SURVEY = """JSON.stringify({
  images: Array.from(document.images).map(i => ({file: i.dataset.file || i.src.slice(0, 60),
                                                 ok: i.complete && i.naturalWidth > 0, width: i.naturalWidth})),
  rows: Array.from(document.querySelectorAll('#leaderboard tbody tr')).map(r =>
        Array.from(r.cells).map(c => c.textContent)),
  headings: Array.from(document.querySelectorAll('h2')).map(h => h.textContent),
  title: document.title
})"""


@dataclass
class PageCheck:
    images: list[dict]
    rows: list[list[str]]
    headings: list[str]
    title: str
    errors: list[str] = field(default_factory=list)  # console errors and uncaught exceptions
    values: list = field(default_factory=list)  # what each of `open_page`'s expressions gave


def browser() -> str | None:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def require_browser() -> str:
    found = browser()
    if found is None:
        if os.environ.get("FLEET_REQUIRE_BROWSER") == "1":
            pytest.fail("FLEET_REQUIRE_BROWSER=1 but no chromium on PATH")
        pytest.skip("no headless browser (apt-get install chromium)")
    return found


class Session:
    """One page target over a websocket: send commands, collect the events it sends meanwhile."""

    def __init__(self, url: str):
        import websocket  # noqa: PLC0415 - the test-only websocket client (dev extra)

        self.socket = websocket.create_connection(url, timeout=30, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events:
                if event.get("method") == method:
                    return event
            self.events.append(json.loads(self.socket.recv()))
        raise AssertionError(f"the page sent no {method} in {timeout} s")

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression[:60]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        out = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(str(params.get("exceptionDetails", {}).get("text")))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                out.append(str(params["entry"].get("text")))
        return out


def _stop(process: subprocess.Popen) -> None:
    """Kill chromium and its helper processes (its whole session), then reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _start(binary: str, profile: str) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
         "--allow-file-access-from-files", f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    assert process.stderr is not None
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
        if found:
            return process, int(found.group(1))
        if not line and process.poll() is not None:
            break
    _stop(process)
    raise AssertionError("chromium did not start its DevTools endpoint")


def open_page(path: Path, expressions: tuple[str, ...] = ()) -> PageCheck:
    """Load `path` in headless chromium, survey it once loaded, then evaluate `expressions`
    in the page one by one."""
    binary = require_browser()
    # chromium's helper processes may still write to the profile as it goes: cleaning it up is best effort
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        process, port = _start(binary, profile)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
                page = next(t for t in json.load(answer) if t.get("type") == "page")
            session = Session(page["webSocketDebuggerUrl"])
            for domain in ("Page", "Runtime", "Log"):
                session.call(f"{domain}.enable")
            session.call("Page.navigate", url=path.resolve().as_uri())
            session.wait_for("Page.loadEventFired")
            survey = json.loads(session.evaluate(SURVEY))
            values = [session.evaluate(e) for e in expressions]
            return PageCheck(**survey, errors=session.errors(), values=values)
        finally:
            _stop(process)
