#!/usr/bin/env python3
"""One rank of the PyTorch DDP test (torch_ddp_test.py starts four).

A float64 MLP trained with DDP on the Gloo backend (DDP's own bootstrap
through a FileStore), its gradients averaged by straggler.torch's
partial_allreduce_hook among the active ranks that stragglerd's membership
names. Each rank's batch at iteration i is drawn from a generator seeded with
data_seed(rank, i), so the test can recompute every gradient in one process.

Prints one JSON object per iteration, then {"final": ...}; exits 1 with the
error on stderr when something fails.
"""

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import straggler
import straggler.torch as st

import torch_rank

IN, HIDDEN, OUT, BATCH = 16, 32, 4, 8


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, OUT)).double()


def batch(rank, it):
    g = torch.Generator().manual_seed(1000 * rank + it)
    x = torch.randn(BATCH, IN, generator=g, dtype=torch.float64)
    y = torch.randint(0, OUT, (BATCH,), generator=g)
    return x, y


def make_optimizer(params):
    # Momentum: the optimizer state a rejoining rank must receive.
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def check_bad_buffers(reducer):
    """Rank-local: bad buffers are refused, naming the problem, before any
    collective is attempted."""
    errors = {}
    for name, buf in [("int32", np.zeros(4, dtype=np.int32)),
                      ("strided", torch.zeros(4, 4)[:, 0]),
                      ("readonly", np.frombuffer(b"\0" * 16, dtype=np.float32))]:
        try:
            reducer.all_reduce_average(buf)
            errors[name] = None
        except (TypeError, ValueError) as e:
            errors[name] = str(e)
    return errors


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--store", required=True, help="FileStore path for DDP's bootstrap")
    p.add_argument("--iterations", type=int, default=80)
    p.add_argument("--step-ms", type=float, default=10)
    # torch_restart_readmit_test.py: the step takes --slow-ms while the file
    # --slow-file exists; the run ends before the iteration a --stop-file
    # names, once it holds one (every rank reads the same number).
    p.add_argument("--slow-file")
    p.add_argument("--slow-ms", type=float, default=0)
    p.add_argument("--stop-file")
    # false_recovery_test.py: this much of the step is CPU work (a busy loop)
    # that a CPU hog on the same core slows, the rest a sleep.
    p.add_argument("--spin-ms", type=float, default=0)
    a = p.parse_args()
    torch_rank.init_gloo(a.store, a.rank, a.world_size)
    client = straggler.Client(endpoint=a.daemon, job_id=a.job, rank=a.rank,
                              world_size=a.world_size, node="node%d" % a.rank)
    seen_versions = []
    client.on_membership_change(lambda m: seen_versions.append(m.version))
    state = st.PartialAllReduceState(client, collective_timeout=20.0, membership_timeout=10.0)
    bad = check_bad_buffers(state.reducer)

    model = make_model()
    ddp = DDP(model, broadcast_buffers=False, find_unused_parameters=False)
    ddp.register_comm_hook(state, st.partial_allreduce_hook)
    opt = make_optimizer(ddp.parameters())

    def stop_at():
        if a.stop_file and os.path.exists(a.stop_file):
            with open(a.stop_file) as f:
                text = f.read().strip()
            if text:
                return min(a.iterations, int(text))
        return a.iterations

    def step_ms():
        slow = a.slow_file and os.path.exists(a.slow_file)
        return a.slow_ms if slow else a.step_ms

    it = 0
    while it < stop_at():
        plan = state.begin_step(it, model=ddp.module, optimizer=opt)
        if plan.rejoin_iteration is not None:
            # Excluded and readmitted further on: skip the shadow steps up to
            # there, as a trainer should (straggler.torch's doc).
            print(json.dumps({"it": it, "skip_to": plan.rejoin_iteration,
                              "participating": plan.participating}), flush=True)
            it = plan.rejoin_iteration
            continue
        start = time.perf_counter()
        x, y = batch(a.rank, it)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        # The simulated rest of the step (rank 3 is slower): CPU work, then a sleep.
        spin_end = time.perf_counter() + a.spin_ms / 1000.0
        while time.perf_counter() < spin_end:
            pass
        time.sleep(max(0.0, step_ms() - a.spin_ms) / 1000.0)
        state.end_step(0, time.perf_counter() - start)
        # A float32 CPU tensor outside DDP: multiples of 12, so the average
        # among 3 or 4 ranks is exact and the test compares it for equality.
        probe = torch.full((5,), 12.0 * (a.rank + 1) + 12.0 * (it % 7), dtype=torch.float32)
        probe_result = state.reducer.all_reduce_average(probe)
        stepped = state.optimizer_step(opt)
        opt.zero_grad()
        print(json.dumps({
            "it": it, "version": plan.version, "effective_iteration": plan.effective_iteration,
            "certain": plan.certain, "participating": plan.participating,
            "active": list(plan.active_ranks), "synced": it in state.synced_at,
            "buckets": state.buckets, "stepped": stepped,
            "probe": probe.tolist(), "probe_participated": probe_result["participated"],
            "loss": loss.item()}), flush=True)
        it += 1

    client.flush(5.0)
    membership = client.membership_for(it - 1, 5.0)
    print(json.dumps({
        "final": [v for t in ddp.module.parameters() for v in t.detach().reshape(-1).tolist()],
        "steps_taken": state.steps_taken,
        "momentum_norm": sum(float(s["momentum_buffer"].norm()) for s in opt.state.values()),
        "callback_versions": seen_versions, "last_version": membership.version,
        "membership_ok": membership.ok, "acked": client.stats().acked, "bad_buffers": bad,
    }), flush=True)
    client.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    torch_rank.run(main)
