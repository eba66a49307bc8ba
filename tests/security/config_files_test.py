#!/usr/bin/env python3
"""Hostile or broken config files against the real stragglerd and
straggler-agent (issue 28, item 14). One case per run:

yaml_bomb
  1. A 468-byte alias bomb (nine levels, each a list of nine aliases of the
     one before: 9^9 nodes once expanded) as the config: both programs exit 2
     naming the bound ("an alias bomb?"). Before: 28 s of CPU, then an
     unrelated error.
  2. The same on SIGHUP: refused and logged, and a good reload right after it
     is applied.
  3. An unclosed quote: exit 2 naming the file, the line that opens it and
     the problem (before: "log_level=info grpc_address: ... is not one of
     ...").
fifo
  A FIFO as tls.key_file, auth.token_file, persistence.path, the agent's
  listen_tcp_tls.key_file: exit 2 naming the key and "not a regular file (a
  FIFO)", without waiting. Before: the start blocked for ever on the open,
  deaf to SIGTERM (this test's 20 s timeout fails it).

    config_files_test.py --case yaml_bomb|fifo --stragglerd PATH --agent PATH
"""

import argparse
import os
import signal
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import Daemon, check, in_workdir, main, run, wait_for  # noqa: E402

START_TIMEOUT_S = 20


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def alias_bomb(levels=9):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append("a%d: &a%d [%s]" % (i, i, ", ".join(["*a%d" % (i - 1)] * 9)))
    return "\n".join(lines) + "\n"


def daemon_cmd(args, config):
    return [args.stragglerd, "--config", config, "--grpc-address", "127.0.0.1:0",
            "--http-address", "127.0.0.1:0"]


def agent_cmd(args, workdir, config):
    return [args.agent, "--config", config, "--listen", "unix://%s/agent.sock" % workdir,
            "--upstream", "127.0.0.1:1", "--http-address", "127.0.0.1:0"]


def refused(cmd, what, expected):
    """`cmd` must exit 2 within START_TIMEOUT_S, its output holding each of
    `expected`."""
    res = run(cmd, START_TIMEOUT_S)
    out = res.stdout + res.stderr
    check(res.returncode == 2, "%s: exit %d, expected 2:\n%s" % (what, res.returncode, out))
    for e in expected:
        check(e in out, "%s: the error lacks %r:\n%s" % (what, e, out))
    print("%s: refused: %s" % (what, out.strip().splitlines()[-1]))


def log_of(daemon):
    with open(daemon.log_path) as f:
        return f.read()


def yaml_bomb(args, workdir):
    bomb = write(os.path.join(workdir, "bomb.yaml"), alias_bomb())
    check(os.path.getsize(bomb) < 540, "the bomb is %d bytes" % os.path.getsize(bomb))
    for name, cmd in (("stragglerd", daemon_cmd(args, bomb)),
                      ("straggler-agent", agent_cmd(args, workdir, bomb))):
        refused(cmd, "%s --config ALIAS-BOMB" % name,
                ["%s:" % bomb, "YAML nodes once its aliases are expanded (an alias bomb?)"])

    quote = write(os.path.join(workdir, "quote.yaml"),
                  'grpc_address: 127.0.0.1:0\nlog_level: "info\nhttp_address: 127.0.0.1:0\n')
    expected = ["%s:2: the quoted value opened here (\") is not closed on this line" % quote]
    refused(daemon_cmd(args, quote), "stragglerd --config UNCLOSED-QUOTE", expected)
    refused(agent_cmd(args, workdir, quote), "straggler-agent --config UNCLOSED-QUOTE", expected)

    config = write(os.path.join(workdir, "stragglerd.yaml"), "limits:\n  max_jobs: 5\n")
    with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as d:
        write(config, alias_bomb())
        d.proc.send_signal(signal.SIGHUP)
        wait_for("the refused reload", lambda: "(an alias bomb?)" in log_of(d), timeout=30)
        check("SIGHUP: config rejected, keeping the running one: %s:" % config in log_of(d),
              "the bomb's reload was not refused:\n%s" % d.log_tail())
        write(config, "limits:\n  max_jobs: 6\n")
        d.proc.send_signal(signal.SIGHUP)
        wait_for("the good reload after the bomb", lambda: "config reloaded from" in log_of(d),
                 timeout=30)
        print("SIGHUP with an alias bomb: refused; the next good reload applied")
        check(d.stop() == 0, "stragglerd did not exit 0")


def fifo(args, workdir):
    pipe = os.path.join(workdir, "fifo")
    os.mkfifo(pipe)
    cert = write(os.path.join(workdir, "cert.pem"), "not read as far as this\n")
    not_regular = "not a regular file (a FIFO)"
    cases = [
        ("stragglerd tls.key_file=FIFO",
         daemon_cmd(args, write(os.path.join(workdir, "tls.yaml"),
                                "tls:\n  cert_file: %s\n  key_file: %s\n" % (cert, pipe))),
         ["tls.key_file %s: %s" % (pipe, not_regular)]),
        ("stragglerd auth.token_file=FIFO",
         daemon_cmd(args, write(os.path.join(workdir, "auth.yaml"),
                                "auth:\n  token_file: %s\n" % pipe)),
         ["auth.token_file: cannot read token file %s: %s" % (pipe, not_regular)]),
        ("stragglerd persistence.path=FIFO",
         daemon_cmd(args, write(os.path.join(workdir, "db.yaml"),
                                "persistence:\n  path: %s\n" % pipe)),
         ["persistence.path=%s is not a regular file" % pipe]),
        ("stragglerd --config FIFO", daemon_cmd(args, pipe),
         ["config file %s is not a regular file" % pipe]),
        ("straggler-agent listen_tcp_tls.key_file=FIFO",
         agent_cmd(args, workdir, write(os.path.join(workdir, "agent.yaml"),
                                        "listen_tcp: 127.0.0.1:0\nlisten_tcp_tls:\n"
                                        "  cert_file: %s\n  key_file: %s\n" % (cert, pipe))),
         ["listen_tcp_tls.key_file %s: %s" % (pipe, not_regular)]),
    ]
    for what, cmd, expected in cases:
        refused(cmd, what, expected)


def test(args):
    body = {"yaml_bomb": yaml_bomb, "fifo": fifo}[args.case]
    in_workdir("stragglerd-config-files-", lambda workdir: body(args, workdir))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", required=True, choices=["yaml_bomb", "fifo"])
    parser.add_argument("--stragglerd", required=True)
    parser.add_argument("--agent", required=True)
    parsed = parser.parse_args()
    main(lambda: test(parsed))
