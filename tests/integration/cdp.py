"""A headless Chromium driven over the DevTools protocol, for the console tests.

    with Browser(chromium_path, workdir) as b:
        b.navigate("http://127.0.0.1:PORT/#/jobs/demo")
        b.wait_js("document.querySelector('#ranks') !== null", "the rank table")
        text = b.js("document.body.innerText")
        b.screenshot("console.png")
        assert b.console_errors == []

Chromium speaks the protocol over --remote-debugging-pipe (fds 3 and 4,
NUL-terminated JSON), so nothing but the standard library is needed and no
port can be taken by another process. Every console message of level error,
uncaught exception and JavaScript dialog (alert()) is collected.
"""

import base64
import fcntl
import json
import os
import select
import subprocess
import time

from harness import TestFailure, check


class Browser:
    def __init__(self, binary, workdir):
        self.binary = binary
        self.workdir = workdir
        self.proc = None
        self.next_id = 0
        self.buffer = b""
        self.session = None
        self.console_errors = []
        self.dialogs = []
        self.console_lines = []

    def __enter__(self):
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()

        parent_ends = (self.to_chrome, self.from_chrome)

        def fds():  # in the child: the protocol's fixed descriptors 3 (in) and 4 (out)
            # Moved above 4 first: a pipe end may itself be 3 or 4.
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome_r, from_chrome_w)]
            for fd in (to_chrome_r, from_chrome_w) + parent_ends:
                os.close(fd)
            for target, fd in zip((3, 4), high):
                os.dup2(fd, target, inheritable=True)
                os.close(fd)

        profile = os.path.join(self.workdir, "chromium-profile")
        self.log = open(os.path.join(self.workdir, "chromium.log"), "w")
        self.proc = subprocess.Popen(
            [self.binary, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--remote-debugging-pipe", "--user-data-dir=" + profile, "--no-first-run",
             "--disable-extensions", "--disable-background-networking", "--disable-sync",
             "--window-size=1400,1000", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            # close_fds would run after fds() and close 3 and 4 again.
            preexec_fn=fds, close_fds=False)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        targets = self.call("Target.getTargets", session=False)["targetInfos"]
        page = [t for t in targets if t["type"] == "page"]
        check(page, "chromium opened no page: %r" % targets)
        self.session = self.call("Target.attachToTarget",
                                 {"targetId": page[0]["targetId"], "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.call(domain)
        return self

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.call("Browser.close", session=False, timeout=5)
            except (TestFailure, OSError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.close(self.to_chrome)
        os.close(self.from_chrome)
        self.log.close()
        return False

    def _read_message(self, deadline):
        while b"\0" not in self.buffer:
            if time.monotonic() > deadline:
                raise TestFailure("chromium did not answer in time (log: %s)"
                                  % os.path.join(self.workdir, "chromium.log"))
            ready, _, _ = select.select([self.from_chrome], [], [], 0.5)
            if ready:
                chunk = os.read(self.from_chrome, 1 << 20)
                if not chunk:
                    raise TestFailure("chromium closed the DevTools pipe (exit %r)" % self.proc.poll())
                self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(raw)

    def _note(self, msg):
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            self.console_lines.append("%s: %s" % (params["type"], text))
            if params["type"] in ("error", "assert"):
                self.console_errors.append(text)
        elif method == "Runtime.exceptionThrown":
            d = params["exceptionDetails"]
            self.console_errors.append("uncaught: %s %s" % (
                d.get("text"), d.get("exception", {}).get("description", "")))
        elif method == "Log.entryAdded":
            e = params["entry"]
            self.console_lines.append("%s: %s" % (e["level"], e["text"]))
            if e["level"] == "error":
                self.console_errors.append("%s: %s (%s)" % (e["source"], e["text"], e.get("url", "")))
        elif method == "Page.javascriptDialogOpening":
            self.dialogs.append(params.get("message"))
            self.call("Page.handleJavaScriptDialog", {"accept": True}, wait=False)

    def call(self, method, params=None, session=True, timeout=30, wait=True):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self.to_chrome, json.dumps(msg).encode() + b"\0")
        if not wait:
            return None
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == msg["id"]:
                if "error" in reply:
                    raise TestFailure("DevTools %s failed: %s" % (method, reply["error"]))
                return reply.get("result", {})
            self._note(reply)

    def pump(self, seconds):
        """Lets events arrive for `seconds` (console messages, dialogs)."""
        self.js("1")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.1)
            self.js("1")

    def navigate(self, url):
        self.call("Page.navigate", {"url": url})

    def js(self, expression):
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise TestFailure("page script %r threw: %s" % (expression, result["exceptionDetails"]))
        return result["result"].get("value")

    def wait_js(self, expression, what, timeout=30):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.js(expression)
            except TestFailure as e:  # the page is still loading: not there yet
                last = e
            else:
                if last:
                    return last
            time.sleep(0.2)
        raise TestFailure("timed out after %d s waiting for %s in the page (%s); page text:\n%s"
                          % (timeout, what, expression, self.js("document.body.innerText")[:3000]))

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        with open(path, "wb") as f:
            f.write(base64.b64decode(data["data"]))
        with open(path, "rb") as f:
            check(f.read(8) == b"\x89PNG\r\n\x1a\n", "%s is not a PNG" % path)
