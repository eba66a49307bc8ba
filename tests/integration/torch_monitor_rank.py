#!/usr/bin/env python3
"""One rank of the monitoring-only test (torch_monitor_test.py starts four).

A plain DDP job on Gloo (CPU), integrated as README's monitoring-only recipe
says: DDP(model), then straggler.torch.monitor(ddp) with the client from the
environment (RANK, WORLD_SIZE, STRAGGLER_ENDPOINT, STRAGGLER_JOB_ID). The
model stands for a GPU job: each backward sleeps --compute-ms between its two
layers (the CPU idles, as it would while a GPU computes; 4 ranks share 2
cores), and the slow rank sleeps 120-180 ms more from --slow-from on (so it
stays above 2x its peers when a loaded machine slows their CPU part). The sleep
sits between the first layer and the others, so DDP's all-reduce of the
bucket of the later layers overlaps it.

--timing naive replaces the monitor by the obvious integration that does not
work: time forward+backward and report that (it includes the wait for the
slowest rank's last bucket).

Prints one JSON object per iteration: "naive" (forward+backward wall time,
always measured) and the monitor's newest report ("reported", one step
behind); then {"final": ...}.
"""

import argparse
import json
import random
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import straggler
import straggler.torch as st

import torch_rank

IN, HIDDEN, OUT, BATCH = 64, 512, 8, 16


class Model(torch.nn.Module):
    def __init__(self, box):
        super().__init__()
        self.box = box
        self.first = torch.nn.Linear(IN, HIDDEN)
        self.second = torch.nn.Linear(HIDDEN, HIDDEN)  # 1 MiB: DDP's first bucket
        self.out = torch.nn.Linear(HIDDEN, OUT)

    def forward(self, x):
        h = torch_rank.SleepInBackward.apply(torch.tanh(self.first(x)), self.box)
        return self.out(torch.tanh(self.second(h)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--store", required=True, help="FileStore path for DDP's bootstrap")
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--compute-ms", type=float, default=20)
    p.add_argument("--epoch-iterations", type=int, default=14)
    p.add_argument("--slow-from", type=int, default=-1, help="-1: never slow")
    p.add_argument("--timing", choices=["monitor", "naive"], default="monitor")
    a = p.parse_args()
    rank, world = torch_rank.init_gloo(a.store)
    torch.manual_seed(0)
    box = {"seconds": 0.0}
    # From the second step on DDP has two buckets: out and second (DDP's
    # first bucket holds 1 MiB), then first. The first bucket's all-reduce
    # runs while backward sleeps.
    ddp = DDP(Model(box))
    if a.timing == "monitor":
        mon = st.monitor(ddp)                                # the recipe's one line
        client = mon.client
    else:
        mon = None
        client = straggler.Client()
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    jitter = random.Random(rank)
    slow = random.Random(1000 + rank)
    for it in range(a.iterations):
        epoch = it // a.epoch_iterations
        if mon is not None:
            mon.set_epoch(epoch)  # the recipe's optional line
        box["seconds"] = a.compute_ms / 1000.0 * (1.0 + 0.05 * jitter.random())
        if 0 <= a.slow_from <= it:
            box["seconds"] += slow.uniform(0.120, 0.180)
        g = torch.Generator().manual_seed(1000 * rank + it)
        x = torch.randn(BATCH, IN, generator=g)
        y = torch.randint(0, OUT, (BATCH,), generator=g)
        start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        naive = time.perf_counter() - start
        if mon is None:
            client.report(epoch, it, naive, step_seconds=naive)
        opt.step()
        opt.zero_grad()
        last = mon.last if mon is not None else None
        print(json.dumps({"it": it, "naive": naive, "sleep": box["seconds"],
                          "reported": last._asdict() if last is not None else None}), flush=True)
    if mon is not None:
        mon.close()  # reports the last step; closes the client monitor() made
        final = {"reported": mon.reported, "dropped": mon.dropped,
                 "unmatched": mon.unmatched_backwards, "last": mon.last._asdict()}
    else:
        client.flush(5.0)
        client.close()
        final = {}
    # Every rank's data differs: equal parameters mean DDP still averaged.
    final["params"] = [v for t in ddp.module.parameters()
                       for v in t.detach().reshape(-1)[:64].tolist()]
    print(json.dumps({"final": final}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    torch_rank.run(main)
