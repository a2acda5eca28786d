"""A real headless browser for tests: Debian's chromium driven through the Chrome DevTools protocol over its
--remote-debugging-pipe (JSON messages ending in NUL on file descriptors 3 and 4), with the standard library only."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
"""The browser (apt-get install chromium; tests/run-all.sh installs it)."""


class Browser:
    """One headless chromium with one page open; ``call`` sends a DevTools command and returns its result."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 1000) -> None:
        if CHROMIUM is None:
            raise RuntimeError("chromium is not installed: apt-get install -y chromium")
        to_browser_read, self.to_browser = os.pipe()
        self.from_browser, from_browser_write = os.pipe()
        # the child's ends moved above 4 first, so that putting them on 3 and 4 (before exec) clobbers neither
        child_in, child_out = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser_read, from_browser_write))
        os.close(to_browser_read)
        os.close(from_browser_write)
        self.process = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             f"--user-data-dir={profile}", f"--window-size={width},{height}", "--allow-file-access-from-files",
             "--no-first-run", "--disable-extensions", "--disable-background-networking", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4), preexec_fn=lambda: (os.dup2(child_in, 3), os.dup2(child_out, 4)))
        os.close(child_in)
        os.close(child_out)
        self.buffer, self.next_id, self.session = b"", 0, None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")

    def _message(self) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            chunk = os.read(self.from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed its pipe (exit {self.process.poll()})")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send ``method`` (to the page once one is attached) and wait for its answer; RuntimeError for an error."""
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if self.session is not None and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._message()
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, path: Path, timeout: float = 30.0) -> None:
        """Load a file and wait until its document is complete."""
        self.call("Page.navigate", url=path.absolute().as_uri())
        deadline = time.monotonic() + timeout
        while self.evaluate("document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not load in {timeout} s")
            time.sleep(0.05)

    def click(self, selector: str, index: int = 0) -> None:
        """A real mouse click (pressed and released) at the middle of the element ``selector`` picks."""
        box = self.evaluate(f"(function(){{var e=document.querySelectorAll({json.dumps(selector)})[{index}];"
                            "e.scrollIntoView({block:'center'});var r=e.getBoundingClientRect();"
                            "return [r.left+r.width/2, r.top+r.height/2]})()")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """The page as a PNG file (the whole page, beyond the window, by default)."""
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=full_page)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        """End the browser."""
        try:
            self.call("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self.to_browser)
        os.close(self.from_browser)
