"""Test helper: drive a headless Chromium page over the DevTools protocol, with the standard library alone.

Why: a single-page app such as Model Explorer draws its content after the load event (it
converts the model first), and streams server events, so ``--dump-dom`` and
``--virtual-time-budget`` catch it too early or never return. Over DevTools the test asks
the live page for its text until what it waits for is shown, then takes the screenshot.
The WebSocket client is the minimum the protocol needs (text frames, masked from client).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from headless_browser import browser_command


class DevToolsPage:
    """One page of a headless Chromium started on ``url``; use as a context manager."""

    def __init__(self, url: str, width: int = 1400, height: int = 900) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.process = subprocess.Popen(
            browser_command(
                f"--window-size={width},{height}",
                f"--remote-debugging-port={self.port}",
                "--use-angle=swiftshader",
                "--enable-unsafe-swiftshader",
                url,
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.sock: socket.socket | None = None
        self.next_id = 0

    def __enter__(self) -> DevToolsPage:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=2) as response:
                    pages = [page for page in json.loads(response.read()) if page.get("type") == "page"]
                if pages:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "headless Chromium did not open its DevTools port"
            time.sleep(0.3)
        address = urllib.parse.urlparse(pages[0]["webSocketDebuggerUrl"])
        self.sock = socket.create_connection((address.hostname, address.port), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {address.path} HTTP/1.1\r\nHost: {address.netloc}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += self.sock.recv(1)
        assert b" 101 " in reply.split(b"\r\n")[0], reply
        return self

    def __exit__(self, *exc: object) -> None:
        if self.sock is not None:
            self.sock.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _recv_exact(self, count: int) -> bytes:
        assert self.sock is not None
        data = b""
        while len(data) < count:
            chunk = self.sock.recv(count - len(data))
            assert chunk, "DevTools closed the connection"
            data += chunk
        return data

    def _recv_message(self) -> dict:
        payload = b""
        while True:
            first, second = self._recv_exact(2)
            length = second & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._recv_exact(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._recv_exact(8))[0]
            payload += self._recv_exact(length)
            if first & 0x80:  # the final fragment
                return json.loads(payload)

    def call(self, method: str, **params: object) -> dict:
        """Send one DevTools command and return its result (events received meanwhile are dropped)."""
        assert self.sock is not None
        self.next_id += 1
        body = json.dumps({"id": self.next_id, "method": method, "params": params}).encode()
        mask = os.urandom(4)
        header = bytes([0x81])
        if len(body) < 126:
            header += bytes([0x80 | len(body)])
        elif len(body) < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", len(body))
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", len(body))
        self.sock.sendall(header + mask + bytes(byte ^ mask[i % 4] for i, byte in enumerate(body)))
        while True:
            message = self._recv_message()
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                return message["result"]

    def evaluate(self, expression: str) -> object:
        """Return the value of a JavaScript expression evaluated in the page."""
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def text(self) -> str:
        """Return the page's visible text now."""
        return str(self.evaluate("document.body ? document.body.innerText : ''") or "")

    def wait_for_text(self, *needles: str, timeout: float = 60) -> str:
        """Return the page's text once it shows every one of ``needles``; fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            if all(needle in text for needle in needles):
                return text
            assert time.monotonic() < deadline, f"the page never showed {needles}; it shows: {text[-1500:]}"
            time.sleep(0.5)

    def screenshot(self, png: Path) -> Path:
        """Save what the page shows now as a PNG and return its path."""
        png.parent.mkdir(parents=True, exist_ok=True)
        png.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        return png

    def sections_screenshot(self, png: Path, first: str, last: str, *, scale: float = 0.7, width: int = 900) -> Path:
        """Save a PNG of the page from the top of element ``#first`` to the bottom of ``#last``, ``width`` px wide, scaled."""
        box = self.evaluate(
            f"(function () {{ var a = document.getElementById({json.dumps(first)}).getBoundingClientRect(),"
            f" b = document.getElementById({json.dumps(last)}).getBoundingClientRect();"
            " return [a.left + window.scrollX, a.top + window.scrollY, b.bottom + window.scrollY]; })()"
        )
        left, top, bottom = box  # type: ignore[misc]
        clip = {"x": left, "y": top, "width": width, "height": bottom - top, "scale": scale}
        png.parent.mkdir(parents=True, exist_ok=True)
        data = self.call("Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True)["data"]
        png.write_bytes(base64.b64decode(data))
        return png
