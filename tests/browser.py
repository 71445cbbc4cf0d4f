"""Open pages in headless Chromium through the DevTools protocol and report what went wrong:
console errors, uncaught exceptions, resources that failed to load (for ``test_docs.py``)."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import websocket

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str | None:
    """The Chromium executable on ``PATH`` (Debian's ``chromium`` package), or None."""
    return next((found for found in map(shutil.which, CANDIDATES) if found), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """A headless Chromium with a DevTools endpoint, closed by the context manager."""

    def __init__(self, executable: str):
        self.port, self.profile = _free_port(), tempfile.mkdtemp(prefix="chromium-")
        self.process = subprocess.Popen(
            [executable, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--remote-debugging-port={self.port}", f"--remote-allow-origins=http://127.0.0.1:{self.port}",
             f"--user-data-dir={self.profile}", "--window-size=1280,900", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # no Origin header: Chromium 111+ refuses DevTools connections from origins it was not told to allow
        self.socket = websocket.create_connection(self._page_endpoint(), timeout=30, suppress_origin=True)
        self.sequence = 0

    def _page_endpoint(self) -> str:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json", timeout=2) as answer:
                    targets = json.load(answer)
                return next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
            except (OSError, StopIteration, ValueError):
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("Chromium did not offer a DevTools page endpoint within 30 s") from None
                time.sleep(0.2)

    def __enter__(self):
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        return self

    def __exit__(self, *exc):
        self.socket.close()
        self.process.kill()
        self.process.wait(timeout=30)
        shutil.rmtree(self.profile, ignore_errors=True)

    def call(self, method: str, events: list | None = None, **params) -> dict:
        """Send one command and wait for its answer; events that arrive meanwhile go to ``events``."""
        self.sequence += 1
        self.socket.send(json.dumps({"id": self.sequence, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.sequence:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if events is not None and "method" in message:
                events.append(message)

    def problems(self, url: str, *, settle: float = 1.5) -> list[str]:
        """What went wrong while ``url`` loaded and ran for ``settle`` seconds after its load event."""
        events: list = []
        self.call("Page.navigate", events, url=url)
        deadline, loaded = time.monotonic() + 30, None
        self.socket.settimeout(0.25)
        try:
            while time.monotonic() < deadline and (loaded is None or time.monotonic() < loaded + settle):
                try:
                    message = json.loads(self.socket.recv())
                except websocket.WebSocketTimeoutException:
                    continue
                if message.get("method") == "Page.loadEventFired":
                    loaded = time.monotonic()
                events.append(message)
        finally:
            self.socket.settimeout(30)
        if loaded is None:
            return [f"{url}: the load event did not fire within 30 s"]
        return [problem for event in events if (problem := _problem(event))]

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))


def _problem(event: dict) -> str | None:
    method, params = event.get("method"), event.get("params", {})
    if method == "Runtime.exceptionThrown":
        details = params["exceptionDetails"]
        return f"uncaught exception: {details.get('exception', {}).get('description') or details.get('text')}"
    if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
        return "console error: " + " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
    if method == "Log.entryAdded" and params["entry"]["level"] == "error":
        entry = params["entry"]
        return f"{entry['source']} error: {entry['text']} ({entry.get('url', '')})"
    if method == "Network.loadingFailed" and not params.get("canceled"):
        return f"failed to load ({params.get('errorText')}, request {params.get('requestId')})"
    return None
