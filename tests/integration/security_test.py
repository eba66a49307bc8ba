#!/usr/bin/env python3
"""TLS, mutual TLS and the bearer token against the real stragglerd.

Certificates are made here with the openssl command: a CA, a server
certificate for 127.0.0.1/localhost, a client certificate from the same CA,
and a client certificate from a second, foreign CA.

1. TLS + token (reads open): a plaintext gRPC client and a plaintext HTTP
   client are refused; stragglerctl with --tls-ca reads without a token;
   admin RPCs without a token or with a wrong one are UNAUTHENTICATED, with
   --token-file (and STRAGGLER_TOKEN_FILE) they work; straggler-sim reports
   through TLS (the client library, STRAGGLER_TLS_CA); REST over HTTPS: reads
   open, PUT/POST 401 without or with a wrong token, 200 with it; /metrics
   over HTTPS counts the refusals; SIGHUP takes a new token file.
2. Mutual TLS + protect_reads: clients without a certificate or with a
   foreign CA's are refused (gRPC and HTTPS); with the client certificate
   reads need the token too (gRPC and REST, /metrics), /healthz does not;
   straggler-sim with a client certificate reports (ingest needs no token).
   The agent relays over mutual TLS (upstream_tls) for a sim on its unix
   socket, whose STRAGGLER_TLS_* do not apply there.
3. Start-up errors (exit 2) name the file: missing or empty token file, a key
   that does not belong to the certificate. Without a token file the daemon
   warns that admin calls are open.
No token ever appears in a daemon log.

    security_test.py --stragglerd PATH --ctl PATH --sim PATH --agent PATH
"""

import http.client
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_test import Agent  # noqa: E402
from harness import Daemon, TestFailure, check, in_workdir, run, run_main  # noqa: E402

CTL_TIMEOUT_S = 20
RANKS = 2


def openssl(workdir, *args):
    res = run(["openssl", *args], 60, cwd=workdir)
    check(res.returncode == 0, "openssl %s failed:\n%s" % (" ".join(args), res.stderr))


def make_ca(workdir, name):
    openssl(workdir, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", name + ".key", "-out", name + ".pem", "-subj", "/CN=" + name)


def make_cert(workdir, name, ca, extensions):
    """A key and a certificate for `name`, signed by `ca`, with these v3 extensions."""
    openssl(workdir, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key",
            "-out", name + ".csr", "-subj", "/CN=" + name)
    with open(os.path.join(workdir, name + ".ext"), "w") as f:
        f.write(extensions)
    openssl(workdir, "x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey",
            ca + ".key", "-CAcreateserial", "-days", "2", "-out", name + ".pem",
            "-extfile", name + ".ext")


def make_pki(workdir):
    make_ca(workdir, "ca")
    make_ca(workdir, "foreign-ca")
    make_cert(workdir, "server", "ca",
              "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    make_cert(workdir, "client", "ca", "extendedKeyUsage=clientAuth\n")
    make_cert(workdir, "intruder", "foreign-ca", "extendedKeyUsage=clientAuth\n")
    return {name: os.path.join(workdir, name) for name in
            ("ca", "foreign-ca", "server", "client", "intruder")}


def write(path, text, mode=0o600):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


class Ctl:
    """stragglerctl with a fixed set of TLS/token flags."""

    def __init__(self, binary, address, *flags, env=None):
        self.binary, self.address, self.flags = binary, address, list(flags)
        self.env = dict(os.environ, **(env or {}))
        for var in ("STRAGGLER_TLS_CA", "STRAGGLER_TLS_CERT", "STRAGGLER_TLS_KEY"):
            if env is None or var not in env:
                self.env.pop(var, None)
        if env is None or "STRAGGLER_TOKEN_FILE" not in env:
            self.env.pop("STRAGGLER_TOKEN_FILE", None)

    def __call__(self, *args, expect_rc=0, expect_err=None):
        cmd = [self.binary, "--daemon", self.address, "--timeout-ms", "5000", *self.flags, *args]
        res = run(cmd, CTL_TIMEOUT_S, env=self.env)
        check(res.returncode == expect_rc,
              "%s exited %d, expected %d\nstdout:\n%s\nstderr:\n%s"
              % (" ".join(cmd), res.returncode, expect_rc, res.stdout, res.stderr))
        if expect_err is not None:
            check(expect_err in res.stderr,
                  "%s: stderr lacks %r:\n%s" % (" ".join(cmd), expect_err, res.stderr))
        return res


def tls_context(pki, cert=None):
    ctx = ssl.create_default_context(cafile=pki["ca"] + ".pem")
    if cert is not None:
        ctx.load_cert_chain(cert + ".pem", cert + ".key")
    return ctx


def https(address, method, path, ctx, token=None, body=None):
    """(status, headers, body) of one HTTPS request."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=10)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = "Bearer " + token
    try:
        conn.request(method, path, body=body, headers=headers)
        res = conn.getresponse()
        return res.status, dict(res.getheaders()), res.read().decode()
    finally:
        conn.close()


def https_refused(address, ctx, what):
    """The TLS handshake (or the first request) must fail."""
    try:
        status, _, _ = https(address, "GET", "/healthz", ctx)
    except (ssl.SSLError, ConnectionError, OSError):
        return
    raise TestFailure("%s: HTTPS request got status %d, expected the handshake to fail"
                      % (what, status))


def plain_http_refused(address):
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", "/healthz")
        res = conn.getresponse()
        status = res.status
    except (ConnectionError, OSError, http.client.HTTPException):
        return
    finally:
        conn.close()
    raise TestFailure("plaintext HTTP to the HTTPS port got status %d" % status)


def run_sim(sim, address, job, env, query=None):
    cmd = [sim, "--daemon", address, "--job", job, "--ranks", str(RANKS), "--iterations", "30",
           "--iteration-ms", "5", "--seed", "5", "--quiet"]
    if query is not None:
        cmd += ["--query-daemon", query]
    res = run(cmd, 120, env=dict(os.environ, **env))
    check(res.returncode == 0, "straggler-sim over TLS failed:\n%s%s" % (res.stdout, res.stderr))
    check("not acknowledged" not in res.stderr and "cannot read the job's events" not in res.stderr,
          "straggler-sim over TLS lost reports or events:\n%s" % res.stderr)


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise TestFailure("metric %s not in /metrics:\n%s" % (name, text[:2000]))


def check_log_clean(daemon, tokens):
    with open(daemon.log_path) as f:
        log = f.read()
    for t in tokens:
        check(t not in log, "a token appears in the daemon log %s" % daemon.log_path)
    return log


def daemon_with(args, workdir, name, config_text):
    config = write(os.path.join(workdir, name + ".yaml"), config_text, 0o644)
    return Daemon(args.stragglerd, workdir, name=name, extra_args=["--config", config])


def tls_and_token(args, workdir, pki):
    token = secrets.token_urlsafe(24)
    wrong = secrets.token_urlsafe(24)
    new_token = secrets.token_urlsafe(24)
    token_file = write(os.path.join(workdir, "token"), token + "\n")
    wrong_file = write(os.path.join(workdir, "wrong-token"), wrong + "\n")
    config = ("tls:\n  cert_file: %s.pem\n  key_file: %s.key\nauth:\n  token_file: %s\n"
              % (pki["server"], pki["server"], token_file))
    job = "tls-job"
    with daemon_with(args, workdir, "tls", config) as d:
        ca = pki["ca"] + ".pem"
        # Plaintext clients: gRPC fails to connect (exit 3), HTTP gets no answer.
        Ctl(args.ctl, d.address)("jobs", expect_rc=3, expect_err="UNAVAILABLE")
        plain_http_refused(d.http_address)

        reader = Ctl(args.ctl, d.address, "--tls-ca", ca)
        reader("jobs")
        # The trainer's library over TLS, configured by environment only.
        run_sim(args.sim, d.address, job, {"STRAGGLER_TLS_CA": ca})
        jobs = json.loads(reader("--output", "json", "jobs").stdout)
        check(any(j["jobId"] == job for j in jobs.get("jobs", [])),
              "the job straggler-sim reported over TLS is not listed: %s" % jobs)

        # Admin RPCs: no token, a wrong one, the right one (flag and environment).
        reader("reset", job, expect_rc=1, expect_err="UNAUTHENTICATED")
        reader("--token-file", wrong_file, "override", job, "1", "exclude", expect_rc=1,
               expect_err="UNAUTHENTICATED: the bearer token is not valid")
        reader("--token-file", token_file, "override", job, "1", "exclude", "--reason", "tls")
        # The sim has finished, so the exclusion itself is withheld by the
        # membership gate; the override is what the token unlocked.
        worker = json.loads(reader("--output", "json", "worker", job, "1").stdout)
        check(worker.get("override") == "RANK_OVERRIDE_FORCE_EXCLUDE",
              "the override made with --token-file is not on the worker: %s" % worker)
        Ctl(args.ctl, d.address, env={"STRAGGLER_TLS_CA": ca, "STRAGGLER_TOKEN_FILE": token_file})(
            "override", job, "1", "none")
        worker = json.loads(reader("--output", "json", "worker", job, "1").stdout)
        check(worker.get("override") in (None, "RANK_OVERRIDE_UNSPECIFIED"),
              "the override cleared with STRAGGLER_TOKEN_FILE is still on the worker: %s"
              % worker)

        # REST over HTTPS: reads open, changes need the token.
        ctx = tls_context(pki)
        status, _, body = https(d.http_address, "GET", "/v1/jobs/" + job, ctx)
        check(status == 200, "GET job over HTTPS: %d %s" % (status, body))
        status, headers, body = https(d.http_address, "POST", "/v1/jobs/%s/reset" % job, ctx)
        check(status == 401 and json.loads(body)["code"] == "UNAUTHENTICATED",
              "POST reset without a token: %d %s" % (status, body))
        check(headers.get("WWW-Authenticate", "").startswith("Bearer"),
              "a 401 without WWW-Authenticate: %s" % headers)
        status, _, body = https(d.http_address, "PUT", "/v1/jobs/%s/policy" % job, ctx, token=wrong,
                                body='{"limit": 1}')
        check(status == 401, "PUT policy with a wrong token: %d %s" % (status, body))
        status, _, body = https(d.http_address, "PUT", "/v1/jobs/%s/policy" % job, ctx, token=token,
                                body='{"limit": 1}')
        check(status == 200 and json.loads(body)["policy"]["limit"] == 1,
              "PUT policy with the token: %d %s" % (status, body))
        status, _, metrics = https(d.http_address, "GET", "/metrics", ctx)
        check(status == 200, "GET /metrics over HTTPS: %d" % status)
        check(metric(metrics, "straggler_auth_rejected_total") >= 4,
              "straggler_auth_rejected_total below the 4 refusals made")
        # curl, as an operator would.
        res = run(["curl", "-sS", "--fail", "--cacert", ca, "https://%s/metrics" % d.http_address],
                  30)
        check(res.returncode == 0 and "straggler_build_info" in res.stdout,
              "curl --cacert https://.../metrics failed: %s" % res.stderr)

        # SIGHUP re-reads the token file: the old token stops working.
        write(token_file, new_token + "\n")
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while True:
            status, _, _ = https(d.http_address, "POST", "/v1/jobs/%s/reset" % job, ctx,
                                 token=new_token)
            if status == 200:
                break
            check(time.monotonic() < deadline, "the new token was not taken on SIGHUP")
            time.sleep(0.1)
        status, _, _ = https(d.http_address, "POST", "/v1/jobs/%s/reset" % job, ctx, token=token)
        check(status == 401, "the old token still works after SIGHUP: %d" % status)
        check(d.stop() == 0, "stragglerd did not exit 0")
        log = check_log_clean(d, [token, wrong, new_token])
        check("security: grpc TLS, http TLS" in log, "no security summary in the log:\n%s" % log)
        check("no auth.token_file" not in log, "warned about a missing token file that is set")


def mutual_tls(args, workdir, pki):
    token = secrets.token_urlsafe(24)
    token_file = write(os.path.join(workdir, "mtls-token"), token + "\n")
    config = ("tls:\n  cert_file: %s.pem\n  key_file: %s.key\n  client_ca_file: %s.pem\n"
              "auth:\n  token_file: %s\n  protect_reads: true\n"
              % (pki["server"], pki["server"], pki["ca"], token_file))
    job = "mtls-job"
    with daemon_with(args, workdir, "mtls", config) as d:
        ca = pki["ca"] + ".pem"
        client = ["--tls-ca", ca, "--tls-cert", pki["client"] + ".pem",
                  "--tls-key", pki["client"] + ".key"]
        # No client certificate, or one from a foreign CA: the handshake fails.
        Ctl(args.ctl, d.address, "--tls-ca", ca)("jobs", expect_rc=3)
        Ctl(args.ctl, d.address, "--tls-ca", ca, "--tls-cert", pki["intruder"] + ".pem",
            "--tls-key", pki["intruder"] + ".key")("jobs", expect_rc=3)
        https_refused(d.http_address, tls_context(pki), "no client certificate")
        https_refused(d.http_address, tls_context(pki, pki["intruder"]), "foreign-CA certificate")

        # With the certificate: reads need the token (protect_reads).
        Ctl(args.ctl, d.address, *client)("jobs", expect_rc=1, expect_err="UNAUTHENTICATED")
        Ctl(args.ctl, d.address, *client)("watch", job, expect_rc=1, expect_err="UNAUTHENTICATED")
        ctl = Ctl(args.ctl, d.address, *client, "--token-file", token_file)
        ctl("jobs")

        # Ingest needs the certificate, not the token; the sim reads its
        # events with the token from STRAGGLER_TOKEN_FILE.
        run_sim(args.sim, d.address, job, {
            "STRAGGLER_TLS_CA": ca, "STRAGGLER_TLS_CERT": pki["client"] + ".pem",
            "STRAGGLER_TLS_KEY": pki["client"] + ".key", "STRAGGLER_TOKEN_FILE": token_file})
        jobs = json.loads(ctl("--output", "json", "jobs").stdout)
        check(any(j["jobId"] == job for j in jobs.get("jobs", [])),
              "the job straggler-sim reported over mutual TLS is not listed: %s" % jobs)

        ctx = tls_context(pki, pki["client"])
        for path in ("/v1/jobs", "/metrics"):
            status, _, body = https(d.http_address, "GET", path, ctx)
            check(status == 401, "GET %s without a token under protect_reads: %d" % (path, status))
            status, _, body = https(d.http_address, "GET", path, ctx, token=token)
            check(status == 200, "GET %s with the token: %d %s" % (path, status, body[:200]))
        status, _, body = https(d.http_address, "GET", "/healthz", ctx)
        check(status == 200 and body == "ok", "/healthz needs no token: %d %s" % (status, body))
        status, _, _ = https(d.http_address, "GET", "/readyz", ctx)
        check(status == 200, "/readyz needs no token: %d" % status)

        # The agent's upstream over mutual TLS; the sim reaches the agent on
        # its unix socket in plaintext although its environment names TLS files.
        cert_env = {"STRAGGLER_TLS_CA": ca, "STRAGGLER_TLS_CERT": pki["client"] + ".pem",
                    "STRAGGLER_TLS_KEY": pki["client"] + ".key",
                    "STRAGGLER_TOKEN_FILE": token_file}
        agent_config = write(os.path.join(workdir, "agent.yaml"),
                             "upstream_tls:\n  ca_file: %s\n  cert_file: %s.pem\n"
                             "  key_file: %s.key\n" % (ca, pki["client"], pki["client"]), 0o644)
        sock = os.path.join(workdir, "agent", "agent.sock")
        agent = Agent(args.agent, workdir, sock, d.address, extra_args=["--config", agent_config])
        try:
            agent.start()
            run_sim(args.sim, "unix://" + sock, "agent-job", cert_env, query=d.address)
            jobs = json.loads(ctl("--output", "json", "jobs").stdout)
            check(any(j["jobId"] == "agent-job" for j in jobs.get("jobs", [])),
                  "the job relayed by the agent over mutual TLS is not listed: %s" % jobs)
            check(agent.stop() == 0, "straggler-agent did not exit 0")
        finally:
            agent.kill()
        check(d.stop() == 0, "stragglerd did not exit 0")
        check_log_clean(d, [token])


def startup_errors(args, workdir, pki):
    def refused(name, config_text, expected):
        config = write(os.path.join(workdir, name + ".yaml"), config_text, 0o644)
        res = run([args.stragglerd, "--config", config, "--grpc-address", "127.0.0.1:0",
                   "--http-address", "127.0.0.1:0"], 30)
        check(res.returncode == 2, "%s: exit %d, expected 2\n%s" % (name, res.returncode,
                                                                    res.stderr + res.stdout))
        check(expected in res.stderr + res.stdout,
              "%s: the error lacks %r:\n%s" % (name, expected, res.stderr + res.stdout))

    missing = os.path.join(workdir, "no-such-token")
    refused("missing-token", "auth:\n  token_file: %s\n" % missing,
            "auth.token_file: cannot read token file %s" % missing)
    empty = write(os.path.join(workdir, "empty-token"), "\n")
    refused("empty-token", "auth:\n  token_file: %s\n" % empty, "token file %s is empty" % empty)
    refused("wrong-key", "tls:\n  cert_file: %s.pem\n  key_file: %s.key\n"
            % (pki["server"], pki["client"]),
            "tls.key_file=%s.key does not match tls.cert_file=%s.pem" % (pki["client"],
                                                                         pki["server"]))
    refused("missing-ca", "tls:\n  cert_file: %s.pem\n  key_file: %s.key\n  client_ca_file: %s\n"
            % (pki["server"], pki["server"], missing), "cannot read tls.client_ca_file " + missing)

    # The default: no token, a warning, admin calls open (as before).
    with Daemon(args.stragglerd, workdir, name="open") as d:
        Ctl(args.ctl, d.address)("jobs")
        check(d.stop() == 0, "stragglerd did not exit 0")
        with open(d.log_path) as f:
            log = f.read()
        check("no auth.token_file: AdminService and mutating REST calls are open" in log,
              "no warning about open admin calls:\n%s" % log)


def test(args):
    if shutil.which("openssl") is None:
        raise TestFailure("the openssl command is needed (Debian package openssl)")

    def body(workdir):
        pki = make_pki(workdir)
        tls_and_token(args, workdir, pki)
        mutual_tls(args, workdir, pki)
        startup_errors(args, workdir, pki)

    in_workdir("stragglerd-security-", body)


if __name__ == "__main__":
    run_main(test, "stragglerd", "ctl", "sim", "agent")
