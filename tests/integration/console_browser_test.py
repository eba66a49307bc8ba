#!/usr/bin/env python3
"""The web console in a real headless Chromium (DevTools protocol, cdp.py)
against the real stragglerd, fed by straggler-sim with one straggler.

1. Live job: while rank 3 is excluded, the console's rank table shows it
   excluded with its ratio (and a screenshot is written to --out); once the
   sim ends, the membership timeline shows the version that excluded rank 3
   and the one that readmitted it. No console error, no uncaught exception.
2. Admin through the page: the token typed into the page, a policy change and
   an override whose reason is `<img src=x onerror=alert(1)>`, made with the
   page's forms: the reason shows as text, no <img> element exists, no dialog opened; the token
   is in no storage, cookie, URL or daemon log line.
3. auth.protect_reads: the page asks for the token and shows no job without
   it; with it, the job list appears.

    console_browser_test.py --stragglerd PATH --sim PATH --chromium PATH --out DIR
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cdp import Browser  # noqa: E402
from harness import Daemon, check, daemon_get, excluded, main, wait_for  # noqa: E402

JOB = "console-demo"
RANKS = 8
SLOW_RANK = 3
# 40 ms steps, slow from 30 to 450 of 600: the straggler stays excluded for
# many seconds, so the page is looked at while it is, even on a loaded machine.
ITERATIONS, SLOW_FROM, SLOW_TO, ITERATION_MS = 600, 30, 450, 40
HOSTILE = "<img src=x onerror=alert(1)>"
TOKEN = "console-test-token-8c1f2e"


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def start_sim(args, daemon, workdir, job, iterations, slow):
    log = open(os.path.join(workdir, job + ".sim.log"), "w")
    cmd = [args.sim, "--daemon", daemon.address, "--job", job, "--ranks", str(RANKS),
           "--iterations", str(iterations), "--iteration-ms", str(ITERATION_MS),
           "--noise", "0.05", "--seed", "7"]
    if slow:
        cmd += ["--slow", "%d:3:%d:%d" % (SLOW_RANK, SLOW_FROM, SLOW_TO)]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def finish_sim(sim, daemon):
    try:
        rc = sim.wait(timeout=180)
    except subprocess.TimeoutExpired:
        sim.kill()
        raise
    check(rc == 0, "straggler-sim exited with %d\ndaemon log:\n%s" % (rc, daemon.log_tail()))


def rank_row(b, rank):
    """The page's rank table row of `rank` as {state, ratio, reason}, or None."""
    return b.js("""(() => {
      const tr = document.querySelector('#ranks tr[data-rank="%d"]');
      if (!tr) return null;
      return {state: tr.dataset.state, ratio: tr.querySelector('.ratio').textContent,
              reason: tr.querySelector('.reason').textContent};
    })()""" % rank)


def live_job(args, workdir, b):
    token_file = write(os.path.join(workdir, "token"), TOKEN + "\n")
    config = write(os.path.join(workdir, "daemon.yaml"), "auth:\n  token_file: %s\n" % token_file)
    with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as d:
        url = "http://%s/" % d.http_address
        sim = start_sim(args, d, workdir, JOB, ITERATIONS, slow=True)
        try:
            wait_for("rank %d excluded" % SLOW_RANK,
                     lambda: SLOW_RANK in excluded(daemon_get(d, "/v1/jobs/" + JOB)), timeout=90)
            b.navigate(url)
            b.wait_js("document.querySelector('#jobs tr[data-job=\"%s\"] a') !== null" % JOB,
                      "the job in the job list")
            b.js("document.querySelector('#jobs tr[data-job=\"%s\"] a').click()" % JOB)
            b.wait_js("location.hash === '#/jobs/%s' && !!document.querySelector('#ranks')" % JOB,
                      "the job page")
            row = wait_for("rank %d excluded on the page" % SLOW_RANK,
                           lambda: (lambda r: r if r and r["state"] == "excluded" else None)(
                               rank_row(b, SLOW_RANK)), timeout=30)
            ratio = float(row["ratio"].rstrip("×"))
            check(ratio > 1.5, "rank %d shows ratio %r, expected the straggler's (> 1.5)"
                  % (SLOW_RANK, row["ratio"]))
            check(row["reason"].startswith("straggler"),
                  "rank %d's reason is %r, expected straggler evidence" % (SLOW_RANK, row["reason"]))
            healthy = rank_row(b, 0)
            check(healthy and healthy["state"] == "healthy", "rank 0 shows %r" % healthy)
            check(b.js("!!document.querySelector('#heatmap')"), "no heatmap canvas on the page")
            # The timeline shows what the exclusion did to the step time once
            # enough iterations past the switch are in: the job got faster.
            def step_change():
                rows = b.js("""[...document.querySelectorAll('#timeline tbody tr')].map(
                    tr => ({change: tr.querySelector('.change').textContent,
                            step: tr.children[4].textContent, cls: tr.children[4].className}))""")
                for r in rows or []:
                    if "excluded rank %d" % SLOW_RANK in r["change"] and "\u2192" in r["step"]:
                        return r
                return None
            step = wait_for("the exclusion's step-time change on the timeline", step_change,
                            timeout=30)
            check(step["cls"] == "gain",
                  "excluding rank %d shows %r, expected a faster job" % (SLOW_RANK, step["step"]))
            print("timeline: excluding rank %d: %s" % (SLOW_RANK, step["step"]))
            b.pump(0.5)
            b.screenshot(os.path.join(args.out, "console.png"))
            print("screenshot: %s" % os.path.join(args.out, "console.png"))
        finally:
            finish_sim(sim, d)

        # The page polls: the readmission appears without a reload.
        def timeline():
            rows = b.js("""[...document.querySelectorAll('#timeline tbody tr')].map(
                tr => ({version: tr.dataset.version, change: tr.querySelector('.change').textContent}))""")
            out = {"excluded": None, "readmitted": None}
            for r in rows:
                if "excluded rank %d" % SLOW_RANK in r["change"]:
                    out["excluded"] = int(r["version"])
                if "readmitted rank %d" % SLOW_RANK in r["change"]:
                    out["readmitted"] = int(r["version"])
            return out if out["excluded"] and out["readmitted"] else None
        versions = wait_for("the timeline's excluding and readmitting versions", timeline,
                            timeout=30)
        check(versions["excluded"] < versions["readmitted"],
              "timeline: readmitting version %(readmitted)d is not after excluding %(excluded)d"
              % versions)
        print("timeline: v%(excluded)d excluded rank 3, v%(readmitted)d readmitted it" % versions)
        check(rank_row(b, SLOW_RANK)["state"] != "excluded", "rank 3 still shows excluded")

        # Admin: the token typed in, an override with HTML in its reason.
        check(b.js("!document.querySelector('#admin')"), "admin actions shown without a token")
        b.js("document.querySelector('#auth-state button').click()")
        b.wait_js("!document.getElementById('token-form').hidden", "the token form")
        b.js("""document.getElementById('token-input').value = %s;
                document.getElementById('token-form').requestSubmit()""" % json.dumps(TOKEN))
        b.wait_js("!!document.querySelector('#override-form')", "the admin forms")
        b.js("""document.getElementById('override-rank').value = '5';
                document.getElementById('override-kind').value = 'force_exclude';
                document.getElementById('override-reason').value = %s;
                document.getElementById('override-form').requestSubmit()""" % json.dumps(HOSTILE))
        b.wait_js("document.getElementById('admin-result').textContent.startsWith('done')",
                  "the override's answer")
        shown = b.wait_js("""(() => {
            const cells = [...document.querySelectorAll('#ranks td.reason, #events td.message')]
              .filter(td => td.textContent.includes(%s));
            return cells.length ? cells.length : null; })()""" % json.dumps(HOSTILE),
                          "the override reason shown as text")
        print("the HTML reason shows as text in %d cells" % shown)
        # The policy form: the daemon's PolicyConfig JSON, through PUT .../policy.
        b.js("""document.getElementById('admin-result').textContent = '';
                document.getElementById('policy-json').value = '{"thresholdFactor": 2.5}';
                document.getElementById('policy-form').requestSubmit()""")
        b.wait_js("document.getElementById('admin-result').textContent.startsWith('done')",
                  "the policy change's answer")
        factor = daemon_get(d, "/v1/jobs/" + JOB)["policy"]["thresholdFactor"]
        check(factor == 2.5, "the page's policy change left thresholdFactor at %r" % factor)
        check(b.js("document.querySelectorAll('img').length") == 0,
              "an <img> element exists: the reason was rendered as HTML")
        b.pump(1.0)
        check(b.dialogs == [], "a JavaScript dialog opened: %r" % b.dialogs)
        check(b.js("localStorage.length + sessionStorage.length === 0 && document.cookie === ''"),
              "the page stored something (the token must live in memory only)")
        check(TOKEN not in b.js("location.href + document.body.innerText"),
              "the token is visible in the page or its URL")
        check(b.console_errors == [], "console errors: %r" % b.console_errors)
        check(d.stop() == 0, "stragglerd did not exit cleanly")
        with open(d.log_path) as f:
            check(TOKEN not in f.read(), "the daemon logged the token")


def protected_reads(args, workdir, b):
    token_file = write(os.path.join(workdir, "token2"), TOKEN + "\n")
    config = write(os.path.join(workdir, "protected.yaml"),
                   "auth:\n  token_file: %s\n  protect_reads: true\n" % token_file)
    with Daemon(args.stragglerd, workdir, name="protected",
                extra_args=["--config", config]) as d:
        job = "protected-job"
        sim = start_sim(args, d, workdir, job, 30, slow=False)
        finish_sim(sim, d)
        b.navigate("http://%s/#/jobs/%s" % (d.http_address, job))
        b.wait_js("!document.getElementById('token-form').hidden", "the token prompt")
        b.pump(2.5)  # one poll interval: nothing may appear later either
        check(b.js("document.getElementById('main').children.length") == 0,
              "the page shows something without the token: %r" % b.js("document.body.innerText"))
        check(b.js("document.getElementById('token-form').hidden") is False,
              "the token prompt went away without a token")
        b.navigate("http://%s/" % d.http_address)
        b.wait_js("!document.getElementById('token-form').hidden", "the token prompt on /")
        check(job not in b.js("document.body.innerText"), "the job id shows without the token")
        b.js("""document.getElementById('token-input').value = %s;
                document.getElementById('token-form').requestSubmit()""" % json.dumps(TOKEN))
        b.wait_js("!!document.querySelector('#jobs tr[data-job=\"%s\"]')" % job,
                  "the job list once the token is given")
        check(d.stop() == 0, "stragglerd did not exit cleanly")


def test():
    p = argparse.ArgumentParser()
    p.add_argument("--stragglerd", required=True)
    p.add_argument("--sim", required=True)
    p.add_argument("--chromium", required=True)
    p.add_argument("--out", required=True, help="where console.png goes (the build tree)")
    p.add_argument("--keep", help="keep the work directory here")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    workdir = args.keep or tempfile.mkdtemp(prefix="console_browser_")
    os.makedirs(workdir, exist_ok=True)
    try:
        with Browser(args.chromium, workdir) as b:
            live_job(args, workdir, b)
        # A fresh browser profile: nothing of the first run can leak in.
        second = os.path.join(workdir, "second-browser")
        os.makedirs(second)
        with Browser(args.chromium, second) as b:
            protected_reads(args, workdir, b)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main(test)
