"""Probe latency under slowloris clients (issue 15, item 2): a real stragglerd
on 127.0.0.1:0, optionally a 1000-rank job fed by straggler-loadgen, then for
each count N in --clients: N connections that send a request line and then
one header byte every --trickle-ms (reconnecting as soon as the daemon closes
one, as an attacker would), and meanwhile --probes timed GETs of /healthz,
/readyz and /metrics, each on a fresh connection (as a kubelet probe or a
Prometheus scrape does), --interval-ms apart. Prints p50/p99/max per endpoint and N, and writes
them as JSON with --json. No asserts on the figures: BENCHMARKS.md
"HTTP probes under slow clients" has the runs.

    slowloris_bench.py --stragglerd build/daemon/stragglerd
        [--loadgen build/tools/straggler-loadgen/straggler-loadgen --ranks 1000]
        [--clients 0,8,50] [--probes 50] [--slow-readers /metrics [--read-bytes 1]]
        [--per-rank-metrics]
        [--tls [--tls-stall silent|hello]] [--json out.json] [--smoke]

--slow-readers PATH: the slow clients send a whole GET PATH instead and read its response
--read-bytes per --trickle-ms, reconnecting once the daemon closed it (with
--per-rank-metrics and --ranks 10000, /metrics is ~9 MB).
--tls-stall: the slow clients are a TLS handshake flood instead: each opens TCP and sends
nothing (silent), or sends its ClientHello and never answers the server's (hello).

--smoke (ctest bench:slowloris_smoke): 2 probes per endpoint at 0 and 4
clients, checks only that every probe was answered 200.

Python 3 standard library only.
"""

import argparse
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time

from slowloris import Slowloris, probe


def start_daemon(binary, workdir, extra):
    ready = os.path.join(workdir, "stragglerd.ready.json")
    log = open(os.path.join(workdir, "stragglerd.log"), "w")
    proc = subprocess.Popen(
        [binary, "--grpc-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0",
         "--ready-file", ready, "--log-level", "warn", *extra],
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit("stragglerd exited with %d" % proc.returncode)
        try:
            with open(ready) as f:
                r = json.load(f)
            return proc, ready, r["http_address"]
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            time.sleep(0.05)
    proc.kill()
    sys.exit("stragglerd did not become ready")


def tls_config(workdir):
    """The config section serving HTTPS only, with a throwaway certificate made by
    the openssl command; the client context (certificate not checked)."""
    cert, key = os.path.join(workdir, "cert.pem"), os.path.join(workdir, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ("tls:\n  cert_file: %s\n  key_file: %s\n  grpc: false\n  http: true\n"
            % (cert, key)), ctx


def vm_rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def pct(values, q):
    v = sorted(values)
    if not v:
        return None
    i = min(len(v) - 1, max(0, int(round(q / 100.0 * len(v) + 0.5)) - 1))
    return v[i]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stragglerd", required=True)
    ap.add_argument("--loadgen", help="straggler-loadgen: feed a job of --ranks first")
    ap.add_argument("--ranks", type=int, default=1000)
    ap.add_argument("--clients", default="0,8,50")
    ap.add_argument("--probes", type=int, default=50, help="per endpoint and client count")
    ap.add_argument("--trickle-ms", type=int, default=500)
    ap.add_argument("--settle-s", type=float, default=1.0,
                    help="after the slow clients connect, before probing")
    ap.add_argument("--timeout-s", type=float, default=60.0, help="per probe")
    ap.add_argument("--interval-ms", type=int, default=50,
                    help="pause before each probe: 100 probes of 3 paths span 15 s, three "
                         "read timeouts, so slow clients are cut off and reconnect meanwhile")
    ap.add_argument("--paths", default="/healthz,/readyz,/metrics")
    ap.add_argument("--slow-readers", metavar="PATH",
                    help="the slow clients send a whole GET PATH and read its response "
                         "--read-bytes per --trickle-ms (instead of trickling headers)")
    ap.add_argument("--read-bytes", type=int, default=1,
                    help="what a --slow-readers client reads per --trickle-ms (at most)")
    ap.add_argument("--tls", action="store_true",
                    help="HTTPS (tls.http with a throwaway certificate; gRPC stays plaintext): "
                         "probes and slow clients do a TLS handshake first")
    ap.add_argument("--tls-stall", choices=("silent", "hello"),
                    help="with --tls: the slow clients open TCP and then send nothing (silent) "
                         "or only their ClientHello (hello), a handshake flood")
    ap.add_argument("--per-rank-metrics", action="store_true",
                    help="metrics.per_rank_max_ranks: 65536, so /metrics of --ranks 10000 "
                         "carries per-rank series (~9 MB)")
    ap.add_argument("--json")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("daemon_args", nargs="*", help="after --: extra stragglerd flags")
    args = ap.parse_args()
    if args.smoke:
        args.clients, args.probes, args.settle_s, args.interval_ms = "0,4", 2, 0.3, 0

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tls, extra, config_text = None, list(args.daemon_args), ""
        if args.tls_stall and not args.tls:
            sys.exit("--tls-stall needs --tls")
        if args.tls:
            section, tls = tls_config(tmp)
            config_text += section
        if args.per_rank_metrics:
            config_text += "metrics:\n  per_rank_max_ranks: 65536\n"
        if config_text:
            config = os.path.join(tmp, "bench.yaml")
            with open(config, "w") as f:
                f.write(config_text)
            extra += ["--config", config]
        proc, ready, http_address = start_daemon(args.stragglerd, tmp, extra)
        host, port = http_address.rsplit(":", 1)
        port = int(port)
        try:
            if args.loadgen:
                p = subprocess.run(
                    [args.loadgen, "--ready-file", ready, "--ranks", str(args.ranks),
                     "--streams", "4", "--batch", "250", "--rate", "50000", "--duration", "3",
                     "--job", "bench"], capture_output=True, text=True, timeout=120)
                if p.returncode != 0:
                    sys.exit("straggler-loadgen exited %d:\n%s%s" % (p.returncode, p.stdout,
                                                                     p.stderr))
            failed = 0
            for n in [int(x) for x in args.clients.split(",")]:
                with Slowloris(host, port, n, args.trickle_ms / 1000.0,
                               args.slow_readers, tls, args.tls_stall,
                               args.read_bytes) as attack:
                    time.sleep(args.settle_s)
                    for path in args.paths.split(","):
                        times, statuses, size = [], {}, 0
                        for _ in range(args.probes):
                            time.sleep(args.interval_ms / 1000.0)
                            dt, status, size = probe(host, port, path, args.timeout_s, tls)
                            times.append(dt)
                            statuses[str(status)] = statuses.get(str(status), 0) + 1
                            if status != 200:
                                failed += 1
                        row = {"clients": n, "path": path, "probes": len(times),
                               "p50_ms": round(pct(times, 50) * 1000, 2),
                               "p99_ms": round(pct(times, 99) * 1000, 2),
                               "max_ms": round(max(times) * 1000, 2), "statuses": statuses,
                               "bytes": size}
                        results.append(row)
                        print("clients=%-3d %-9s probes=%-3d p50=%9.2f ms  p99=%9.2f ms  "
                              "max=%9.2f ms  %7d B  %s" % (n, path, row["probes"], row["p50_ms"],
                                                          row["p99_ms"], row["max_ms"], size,
                                                          statuses),
                              flush=True)
                    rss = vm_rss_kib(proc.pid)
                    row_attack = {"clients": n, "connections": attack.connections,
                                  "closed_by_server": attack.closed_by_server,
                                  "daemon_rss_kib": rss}
                results.append(row_attack)
                print("clients=%-3d slow connections opened=%d closed by the daemon=%d, "
                      "daemon VmRSS %s KiB (at the end of the probes)"
                      % (n, row_attack["connections"], row_attack["closed_by_server"], rss),
                      flush=True)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"trickle_ms": args.trickle_ms, "slow_readers": args.slow_readers,
                       "tls_stall": args.tls_stall, "results": results}, f, indent=1)
    if failed:
        sys.exit("%d probes not answered 200" % failed)


if __name__ == "__main__":
    main()
