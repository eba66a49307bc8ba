#!/usr/bin/env python3
"""straggler.PartialAllReduce(backend="nccl") from Python, in one process.

Everywhere (ctest python:nccl_args, and python:nccl_args_no_nccl against the module
`pip install` built without CUDA; each asserts what its build does):
  * argument checks name the bad value: an unknown backend, an option of the
    other backend (hostname for NCCL, device for Gloo), an unknown option,
    device=-2, world_size=0;
  * the loaded libnccl's version (ncclGetVersion) and the calls resolved in
    it by dlsym: revoke exactly when it and the build are >= 2.28.7, grow
    exactly when both are >= 2.29;
  * asking for NCCL where it cannot run raises RuntimeError naming the
    reason and never falls back to Gloo: "built without the NCCL backend" in
    a module built without it; otherwise, in a child process with
    CUDA_VISIBLE_DEVICES="" (so also on a GPU machine), "no CUDA device is
    visible" with CUDA's own message.

With --gpu reducer / --gpu ddp (scripts/gpu-check.sh on a GPU machine; exits
77 with the reason when there is no GPU, torch CUDA or NCCL backend):
  * a 1-rank NCCL reducer (a real one-rank communicator) averages CUDA
    float32/float64 tensors in place (a rank alone: its own values), reports
    participated, stages a CPU tensor through the device,
    refuses a CUDA tensor of another dtype, a non-contiguous one and one on
    another device, and a Gloo reducer refuses CUDA tensors;
  * DDP on init_process_group("nccl") with straggler.torch's hook and no
    daemon (STRAGGLER_ENDPOINT unreachable): every step is averaged on the
    full group (participated), and the model ends bit-identical to the same
    DDP model trained without the hook.
"""

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import TestFailure, check, main as harness_main  # noqa: E402

UNREACHABLE = "127.0.0.1:9"  # discard port: nothing answers gRPC there


def expect(exc_type, fragment, fn):
    try:
        fn()
    except exc_type as e:
        check(fragment in str(e), "%s raised %r, which does not name %r" % (fn, str(e), fragment))
        return str(e)
    except Exception as e:  # noqa: BLE001 - the wrong kind is the failure
        raise TestFailure("expected %s naming %r, got %s: %s" % (exc_type.__name__, fragment,
                                                                 type(e).__name__, e))
    raise TestFailure("expected %s naming %r, nothing was raised" % (exc_type.__name__, fragment))


def client(straggler, world_size=1):
    return straggler.Client(job_id="nccl-args", rank=0, world_size=world_size, endpoint=UNREACHABLE)


def check_arguments(straggler):
    c = client(straggler)
    P = straggler.PartialAllReduce
    expect(ValueError, "backend='mpi' is neither 'gloo' nor 'nccl'", lambda: P(c, backend="mpi"))
    expect(TypeError, "'device' is for backend='nccl'", lambda: P(c, backend="gloo", device=0))
    # backend='nccl' with options it does not take: a module with the NCCL
    # backend names the option; one without refuses NCCL itself first (the
    # same error as with no options), whatever else the call says.
    nccl_misuse = [("'hostname' is for backend='gloo'", dict(hostname="h")),
                   ("'max_cached_contexts' is for backend='gloo'", dict(max_cached_contexts=2)),
                   ("unknown option 'bogus'", dict(bogus=1))]
    for fragment, kwargs in nccl_misuse:
        if "nccl" in straggler.backends():
            expect(TypeError, fragment, lambda kw=kwargs: P(c, backend="nccl", **kw))
        else:
            msg = expect(RuntimeError, "built without the NCCL backend",
                         lambda kw=kwargs: P(c, backend="nccl", **kw))
            check("does not fall back to Gloo" in msg, "no word of the missing fallback: " + msg)
    if "nccl" in straggler.backends():
        expect(ValueError, "device=-2", lambda: P(c, backend="nccl", device=-2))
        expect(ValueError, "world_size=0", lambda: P(c, backend="nccl", world_size=0))
        expect(ValueError, "collective_timeout=-1", lambda: P(c, backend="nccl", collective_timeout=-1))
        check_runtime(straggler)
    else:
        msg = expect(RuntimeError, "built without the NCCL backend", lambda: P(c, backend="nccl"))
        check("does not fall back to Gloo" in msg, "the error does not say there is no fallback: " + msg)
    c.close()
    print("argument checks: ok (backends %s)" % straggler.backends())


def check_runtime(straggler):
    # ncclGetVersion and the dlsym of the version-dependent calls need no GPU:
    # what the loaded libnccl offers must match its version and the build's.
    import re
    text = straggler._straggler.nccl_runtime()
    m = re.match(r"NCCL (\d+)\.(\d+)\.(\d+) \(built against (\d+)\.(\d+)\.(\d+)\)", text)
    check(m is not None, "nccl_runtime() says %r" % text)
    v = [int(x) for x in m.groups()]
    loaded, built = v[0] * 10000 + v[1] * 100 + v[2], v[3] * 10000 + v[4] * 100 + v[5]
    revoke = min(loaded, built) >= 22807
    grow = min(loaded, built) >= 22900
    check(("ncclCommRevoke yes" in text) == revoke, "revoke for NCCL %d/%d: %r" % (loaded, built, text))
    check(("ncclCommGrow yes" in text) == grow, "grow for NCCL %d/%d: %r" % (loaded, built, text))
    print("loaded NCCL: " + text)


NO_GPU_CHILD = r"""
import straggler
c = straggler.Client(job_id="nccl-args", rank=0, world_size=1, endpoint=%r)
try:
    r = straggler.PartialAllReduce(c, backend="nccl")
except RuntimeError as e:
    if isinstance(e, straggler.CollectiveError):
        print("WRONG-KIND CollectiveError: %%s" %% e)
    else:
        print("RAISED %%s" %% e)
else:
    print("CONSTRUCTED backend=%%s" %% r.backend)
c.close()
""" % UNREACHABLE


def check_no_gpu(straggler, pythonpath):
    if "nccl" not in straggler.backends():
        print("no-GPU error: covered by 'built without' above (this module has no NCCL backend)")
        return
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=pythonpath)
    out = subprocess.run([sys.executable, "-c", NO_GPU_CHILD], env=env, capture_output=True,
                         text=True, timeout=120)
    line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr.strip()
    check(line.startswith("RAISED "), "backend='nccl' with no GPU visible: " + line)
    check("no CUDA device is visible" in line, "the error does not name the reason: " + line)
    check("cudaGetDeviceCount" in line, "the error does not carry CUDA's message: " + line)
    check("does not fall back to Gloo" in line, "the error does not say there is no fallback: " + line)
    print("no-GPU error: " + line[len("RAISED "):])


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


def check_gpu_reducer(straggler, torch):
    c = client(straggler)
    r = straggler.PartialAllReduce(c, backend="nccl", device=0, membership_timeout=0.2)
    check(r.backend == "nccl" and r.device == 0, "backend %r device %r" % (r.backend, r.device))
    plan = r.begin_iteration(0)
    check(plan.participating and plan.active_ranks == [0], "plan %r" % plan)
    for dtype in (torch.float32, torch.float64):
        t = torch.arange(1024, dtype=dtype, device="cuda:0")
        before = t.clone()
        res = r.all_reduce_average(t)
        check(res["participated"] and res["active_ranks"] == 1, "result %r" % res)
        check(torch.equal(t, before), "a rank alone changed its own average (%s)" % dtype)
    cpu = torch.full((5,), 3.0)
    check(r.all_reduce_average(cpu)["participated"] and torch.equal(cpu, torch.full((5,), 3.0)),
          "a CPU tensor staged through the device changed")
    expect(TypeError, "torch.int64", lambda: r.all_reduce_average(torch.ones(4, dtype=torch.int64, device="cuda:0")))
    expect(ValueError, "not contiguous", lambda: r.all_reduce_average(torch.ones(4, 4, device="cuda:0").t()))
    if torch.cuda.device_count() > 1:
        expect(ValueError, "this reducer's device is cuda:0",
               lambda: r.all_reduce_average(torch.ones(4, device="cuda:1")))
    g = straggler.PartialAllReduce(c, backend="gloo")
    expect(ValueError, "the Gloo backend reduces CPU tensors only",
           lambda: g.all_reduce_average(torch.ones(4, device="cuda:0")))
    c.close()
    print("1-rank NCCL reducer on CUDA tensors: ok (%s)" % straggler._straggler.nccl_runtime())


DDP_CHILD = r"""
import os, sys, torch, torch.distributed as dist
import straggler, straggler.torch
from torch.nn.parallel import DistributedDataParallel as DDP
os.environ.update(STRAGGLER_ENDPOINT=%r, STRAGGLER_JOB_ID="nccl-ddp", RANK="0", WORLD_SIZE="1",
                  LOCAL_RANK="0")
torch.cuda.set_device(0)
dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)

def model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).cuda()

def train(hook):
    ddp = DDP(model(), device_ids=[0], broadcast_buffers=False)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    state = None
    if hook:
        state = straggler.torch.PartialAllReduceState(membership_timeout=0.2, collective_timeout=30.0)
        assert state.reducer.backend == "nccl", state.reducer.backend
        ddp.register_comm_hook(state, straggler.torch.partial_allreduce_hook)
    g = torch.Generator(device="cuda").manual_seed(3)
    for it in range(8):
        if state:
            plan = state.begin_step(it, model=ddp.module, optimizer=opt)
            assert plan.participating and plan.active_ranks == [0], plan
        x = torch.randn(16, 32, device="cuda", generator=g)
        loss = ddp(x).pow(2).mean()
        loss.backward()
        if state:
            assert state.participated and state.buckets > 0, (state.participated, state.buckets)
            state.end_step(0, 0.01)
            state.optimizer_step(opt)
        else:
            opt.step()
        opt.zero_grad()
    return [p.detach().cpu() for p in ddp.module.parameters()], state

ref, _ = train(False)
got, state = train(True)
same = all(torch.equal(a, b) for a, b in zip(ref, got))
print("DDP-NCCL certain=%%s same=%%s" %% (state.plan.certain, same))
state.client.close()
dist.destroy_process_group()
""" % UNREACHABLE


def check_gpu_ddp(pythonpath):
    env = dict(os.environ, PYTHONPATH=pythonpath)
    out = subprocess.run([sys.executable, "-c", DDP_CHILD], env=env, capture_output=True, text=True,
                         timeout=240)
    tail = (out.stdout + out.stderr).strip()[-2000:]
    check(out.returncode == 0, "DDP over NCCL with the hook and no daemon failed:\n" + tail)
    line = [l for l in out.stdout.splitlines() if l.startswith("DDP-NCCL")][-1]
    check("same=True" in line, "the hooked model differs from plain DDP's: " + line)
    check("certain=False" in line, "with no daemon the membership should stay uncertain: " + line)
    print("DDP over NCCL, no daemon, full group: ok (%s)" % line)


def run(args):
    if args.pythonpath:
        sys.path.insert(0, args.pythonpath)
    import straggler
    if args.expect_backends is not None:
        # The no-NCCL run must really get a module without NCCL (and the
        # in-tree one the backends its build found).
        check(sorted(straggler.backends()) == sorted(args.expect_backends.split(",")),
              "the module %s has backends %s, expected %s" % (
                  straggler.__file__, straggler.backends(), args.expect_backends))
    if not args.gpu:
        check_arguments(straggler)
        check_no_gpu(straggler, args.pythonpath)
        return
    if "nccl" not in straggler.backends():
        skip("this straggler module was built without the NCCL backend")
    try:
        import torch
    except ImportError as e:
        skip("torch is not importable: %s" % e)
    if not torch.cuda.is_available():
        skip("torch sees no CUDA device (torch %s)" % torch.__version__)
    if args.gpu == "reducer":
        check_gpu_reducer(straggler, torch)
    else:
        check_gpu_ddp(args.pythonpath)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pythonpath", default="",
                   help="the folder holding the straggler package (default: the interpreter's)")
    p.add_argument("--expect-backends", metavar="LIST",
                   help="fail unless the module's backends are exactly these (comma-separated)")
    p.add_argument("--gpu", choices=["reducer", "ddp"],
                   help="one of the GPU checks (skipped, exit 77, without a GPU)")
    p.add_argument("--venv", help="run in this virtualenv's python (python:pip_install_venv's, whose "
                                  "module `pip install` built without CUDA)")
    args = p.parse_args()
    if args.venv and os.path.realpath(sys.prefix) != os.path.realpath(args.venv):
        python = os.path.join(args.venv, "bin", "python")
        if not os.path.exists(python):
            sys.exit("FAILED: no virtualenv at %s: python:pip_install_venv makes it "
                     "(run it first, or the whole python label)" % args.venv)
        os.execv(python, [python] + sys.argv)
    harness_main(lambda: run(args))


if __name__ == "__main__":
    main()
