#!/usr/bin/env python3
"""One rank of torch_no_daemon_test.py: the README's exclusion recipe as a
user writes it (the client and the rendezvous from the environment and
torch.distributed's store, nothing passed by hand), on a 4-rank DDP job whose
daemon may be absent. Rank --slow-rank sleeps 4x longer per step while the
file --slow-flag exists. Once the file --stop-file holds an iteration K, the
ranks end before K, and an excluded rank (it takes part in no collective) at
once. Prints one JSON line per step, then {"final": ...}.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import straggler.torch as st

import torch_rank


def stop_at(path):
    """The iteration in `path` (the driver writes it whole, by rename), or None."""
    if not path:
        return None
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--store", required=True, help="FileStore path for init_process_group")
    p.add_argument("--iterations", type=int, required=True)
    p.add_argument("--step-ms", type=float, default=20)
    p.add_argument("--slow-rank", type=int, default=3)
    p.add_argument("--slow-flag", default="")
    p.add_argument("--stop-file", default="")
    a = p.parse_args()
    rank, world = torch_rank.init_gloo(a.store)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    ddp = DDP(model, broadcast_buffers=False, find_unused_parameters=False)
    state = st.PartialAllReduceState(collective_timeout=20.0)
    ddp.register_comm_hook(state, st.partial_allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    started = time.monotonic()
    it = 0
    while it < a.iterations:
        stop = stop_at(a.stop_file)
        excluded = state.plan is not None and not state.plan.participating
        if stop is not None and (it >= stop or excluded):
            break
        plan = state.begin_step(it, model=ddp.module, optimizer=opt)
        if plan.rejoin_iteration is not None:
            it = plan.rejoin_iteration
            continue
        step_start = time.perf_counter()
        g = torch.Generator().manual_seed(1000 * rank + it)
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        slow = rank == a.slow_rank and a.slow_flag and os.path.exists(a.slow_flag)
        time.sleep(a.step_ms * (4 if slow else 1) / 1000.0)
        state.end_step(0, time.perf_counter() - step_start)
        state.optimizer_step(opt)
        opt.zero_grad()
        print(json.dumps({"it": it, "t": time.monotonic() - started, "version": plan.version,
                          "participating": plan.participating, "certain": plan.certain,
                          "active": list(plan.active_ranks), "loss": loss.item()}), flush=True)
        it += 1
    print(json.dumps({"final": True, "run_id": state.client.run_id,
                      "connected": state.client.stats().connected,
                      "params": [v for t in ddp.module.parameters()
                                 for v in t.detach().reshape(-1)[:16].tolist()]}), flush=True)
    state.client.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    torch_rank.run(main)
