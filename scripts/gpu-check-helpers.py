#!/usr/bin/env python3
"""GPU checks of scripts/gpu-check.sh that no ctest covers, one per subcommand.
Each prints what it saw and exits 0 (passed), 1 (failed) or 77 (skipped: the
reason on a "SKIP: " line).

  nvml          straggler-agent with the machine's real NVML (libnvidia-ml.so.1):
                telemetry on, the GPUs counted, and a rank reporting through
                the agent shows its GPU's readings in the daemon's GetWorker.
  one_rank      the NCCL backend in a one-rank job against the real stragglerd:
                a real one-rank communicator through BeginIteration, the
                in-band agreement and the all-reduce, every step participating
                and its average its own gradient.
  monitor_cuda  straggler.torch.monitor on a CUDA model (DDP over NCCL, one
                process): the compute time of steps that run a known GPU-side
                delay (torch.cuda._sleep, asynchronous to the host) exceeds
                the others' by most of that delay, as measured by CUDA events
                themselves - a host timer would see the enqueueing only.
  pip_nccl      `pip install` of python/ from this checkout with STRAGGLER_NCCL=on
                (pip --target, so the interpreter's own torch and NCCL stay in
                use): the installed module reports the NCCL backend and its
                libnccl, then python_nccl_test.py --gpu reducer runs against it.
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


def fail(why):
    print("FAILED: " + why)
    sys.exit(1)


def use_tests(tests_dir):
    sys.path.insert(0, os.path.join(tests_dir, "integration"))


def nvml(args):
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        skip("the NVIDIA driver's NVML (libnvidia-ml.so.1) cannot be loaded: %s" % e)
    use_tests(args.tests)
    from agent_test import Agent, http_get  # noqa: E402
    from harness import Daemon, run  # noqa: E402
    with tempfile.TemporaryDirectory(prefix="gpu-nvml-") as work:
        config = os.path.join(work, "agent.yaml")
        with open(config, "w") as f:
            f.write("telemetry:\n  interval_ms: 100\n")
        env = dict(os.environ, STRAGGLER_AGENT_NODE="gpu-check")
        env.pop("STRAGGLER_NVML_LIBRARY", None)  # the real one
        with Daemon(args.stragglerd, work) as d:
            sock = os.path.join(work, "agent.sock")
            agent = Agent(args.agent, work, sock, d.address, extra_args=["--config", config], env=env)
            try:
                agent.start()
                m = agent.metrics()
                enabled = m.get(("straggler_agent_telemetry_enabled", frozenset()))
                gpus = m.get(("straggler_agent_gpus", frozenset()))
                if enabled != 1 or not gpus:
                    fail("agent telemetry %r with %r GPUs (log %s)" % (enabled, gpus, agent.log_path))
                report = os.path.join(work, "sim.json")
                r = run([args.sim, "--daemon", "unix://" + sock, "--query-daemon", d.address, "--job",
                         "gpu-nvml", "--ranks", "1", "--iterations", "40", "--iteration-ms", "10",
                         "--quiet", "--report", report], timeout=120)
                if r.returncode != 0:
                    fail("straggler-sim through the agent exited %d: %s" % (r.returncode, r.stderr))
                body = json.loads(http_get(d.http_address, "/v1/jobs/gpu-nvml/workers/0"))
                gpu = body.get("worker", body).get("gpu")
                if not gpu or not gpu.get("uuid", "").startswith("GPU-"):
                    fail("GetWorker of rank 0 has no real GPU readings: %r" % body)
                # The REST field is powerWatts (v1.GpuTelemetry.power_watts); absent
                # where the GPU or a virtual machine does not report power.
                print("real NVML: %d GPU(s); rank 0 on %s at %s C, %s W, SM clock %s Hz" % (
                    gpus, gpu.get("uuid"), gpu.get("temperatureCelsius"), gpu.get("powerWatts"),
                    gpu.get("smClockHertz")))
            finally:
                agent.kill()


def one_rank(args):
    use_tests(args.tests)
    from harness import Daemon  # noqa: E402
    res = subprocess.run([args.driver, "--gpu-count"], capture_output=True, text=True, timeout=60)
    if res.stdout.strip() in ("", "0"):
        skip("no CUDA device for the NCCL backend: %s" % res.stderr.strip())
    with tempfile.TemporaryDirectory(prefix="gpu-one-rank-") as work:
        with Daemon(args.stragglerd, work) as d:
            out = subprocess.run([args.driver, "--daemon", d.address, "--job", "gpu-one-rank", "--rank", "0",
                                  "--world-size", "1", "--iterations", "20", "--step-ms", "2",
                                  "--backend", "nccl", "--elements", "256"],
                                 capture_output=True, text=True, timeout=180)
            if out.returncode != 0:
                fail("the one-rank NCCL driver exited %d:\n%s" % (out.returncode, out.stderr[-3000:]))
            lines = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
            steps = [s for s in lines if "it" in s]
            if len(steps) != 20:
                fail("%d steps reported, not 20:\n%s" % (len(steps), out.stdout[-2000:]))
            for s in steps:
                if not s["participated"] or s["active"] != [0]:
                    fail("step %d: participated %r, active %r" % (s["it"], s["participated"], s["active"]))
            certain = sum(1 for s in steps if s["certain"])
            # The driver prints the average's first elements; a rank alone averages to its own
            # gradient 12*(rank+1) + 12*k + 12*(it%7) (collective_driver.cc).
            for s in steps:
                want = [12 * 1 + 12 * k + 12 * (s["it"] % 7) for k in range(len(s["avg"]))]
                if [round(v) for v in s["avg"]] != want:
                    fail("step %d: average %r, not its own gradient %r" % (s["it"], s["avg"], want))
            print("one-rank NCCL communicator: 20 steps, %d certain, averages exact (%s)"
                  % (certain, res.stderr.strip().splitlines()[-1]))


MONITOR_CHILD = r"""
import os, torch, torch.distributed as dist
import straggler.torch
from torch.nn.parallel import DistributedDataParallel as DDP

class RecordingClient:
    def __init__(self): self.reports = []
    def report(self, epoch, iteration, compute_seconds, step_seconds=None, collective_wait_seconds=None):
        self.reports.append((iteration, compute_seconds)); return True
    def close(self): pass

torch.cuda.set_device(0)
dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
# Calibrate a GPU-side delay of ~80 ms with CUDA events.
a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
cycles = 10_000_000
for _ in range(8):
    a.record(); torch.cuda._sleep(cycles); b.record(); b.synchronize()
    ms = a.elapsed_time(b)
    if ms >= 80: break
    cycles = int(cycles * 90.0 / max(ms, 1.0))
SLEEP_MS = ms

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.l = torch.nn.Linear(256, 256); self.slow = False
    def forward(self, x):
        if self.slow: torch.cuda._sleep(cycles)   # queued on the GPU, the host goes on at once
        return self.l(x)

net = Net().cuda()
ddp = DDP(net, device_ids=[0])
client = RecordingClient()
mon = straggler.torch.monitor(ddp, client=client)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
x = torch.randn(64, 256, device="cuda")
slow_steps = set(range(6, 30, 3))
for it in range(30):
    net.slow = it in slow_steps
    ddp(x).sum().backward(); opt.step(); opt.zero_grad()
mon.close()
torch.cuda.synchronize()
rep = dict(client.reports)
slow = [rep[i] for i in slow_steps if i in rep]
fast = [rep[i] for i in range(4, 30) if i in rep and i not in slow_steps]
print("MONITOR sleep_ms=%.1f slow=%d fast=%d slow_ms=%.1f fast_ms=%.1f" % (
    SLEEP_MS, len(slow), len(fast), 1000 * sum(slow) / max(1, len(slow)), 1000 * sum(fast) / max(1, len(fast))))
dist.destroy_process_group()
"""


def monitor_cuda(args):
    env = dict(os.environ, PYTHONPATH=args.pythonpath)
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, env=env, timeout=120)
    if probe.returncode != 0:
        skip("torch is not importable: %s" % probe.stderr.strip()[-300:])
    if probe.stdout.strip() != "True":
        skip("torch sees no CUDA device")
    out = subprocess.run([sys.executable, "-c", MONITOR_CHILD], capture_output=True, text=True, env=env,
                         timeout=300)
    if out.returncode != 0:
        fail("the monitored CUDA job failed:\n" + (out.stdout + out.stderr)[-3000:])
    line = [l for l in out.stdout.splitlines() if l.startswith("MONITOR")][-1]
    f = dict(kv.split("=") for kv in line.split()[1:])
    sleep_ms, slow_ms, fast_ms = float(f["sleep_ms"]), float(f["slow_ms"]), float(f["fast_ms"])
    if int(f["slow"]) < 5 or int(f["fast"]) < 10:
        fail("too few steps reported: " + line)
    # Not a timing goal: whether the GPU's own delay is in compute_seconds at
    # all. A host clock around the asynchronous launch would see ~0 of it.
    if slow_ms - fast_ms < 0.5 * sleep_ms:
        fail("compute_seconds misses the GPU-side delay: " + line)
    print("monitor-only CUDA events: " + line)


def pip_nccl(args):
    src = os.path.join(args.source, "python")
    if not os.path.isfile(os.path.join(src, "setup.py")):
        skip("no python/setup.py under %s (a bundle: pip install needs the source checkout)" % args.source)
    probe = subprocess.run([sys.executable, "-c", "import setuptools, torch, pip; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        skip("%s cannot import setuptools, torch and pip: %s" % (sys.executable, probe.stderr.strip()[-300:]))
    if probe.stdout.strip() != "True":
        skip("torch sees no CUDA device")
    with tempfile.TemporaryDirectory(prefix="gpu-pip-") as work:
        target = os.path.join(work, "site")
        env = dict(os.environ, STRAGGLER_NCCL="on", STRAGGLER_BUILD_DIR=os.path.join(work, "build"),
                   PIP_DISABLE_PIP_VERSION_CHECK="1")
        env.pop("PYTHONPATH", None)
        res = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                              "--target", target, src], cwd=work, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if res.returncode != 0:
            fail("pip install with STRAGGLER_NCCL=on failed:\n" + res.stdout[-4000:])
        env["PYTHONPATH"] = target
        info = subprocess.run([sys.executable, "-c", "import straggler; print(straggler.__file__, "
                               "straggler.backends(), straggler._straggler.nccl_runtime())"],
                              cwd=work, env=env, capture_output=True, text=True, timeout=120)
        if info.returncode != 0 or not info.stdout.startswith(target + os.sep):
            fail("the pip-installed module does not load from %s with NCCL:\n%s%s" % (
                target, info.stdout, info.stderr[-2000:]))
        print("pip-installed: " + info.stdout.strip())
        out = subprocess.run([sys.executable, os.path.join(args.tests, "collective", "python_nccl_test.py"),
                              "--gpu", "reducer", "--pythonpath", target], cwd=work, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        print(out.stdout)
        if out.returncode == 77:
            sys.exit(77)  # its SKIP line says why
        if out.returncode != 0:
            fail("python_nccl_test.py --gpu reducer on the pip-installed module exited %d" % out.returncode)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("nvml")
    for flag in ("--stragglerd", "--agent", "--sim", "--tests"):
        n.add_argument(flag, required=True)
    o = sub.add_parser("one_rank")
    for flag in ("--stragglerd", "--driver", "--tests"):
        o.add_argument(flag, required=True)
    m = sub.add_parser("monitor_cuda")
    m.add_argument("--pythonpath", required=True)
    q = sub.add_parser("pip_nccl")
    q.add_argument("--source", required=True, help="the repository checkout (python/setup.py)")
    q.add_argument("--tests", required=True)
    args = p.parse_args()
    {"nvml": nvml, "one_rank": one_rank, "monitor_cuda": monitor_cuda, "pip_nccl": pip_nccl}[args.cmd](args)
    print("PASSED")


if __name__ == "__main__":
    main()
