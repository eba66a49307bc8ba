#!/usr/bin/env python3
"""One rank of the cause tests (torch_cause_test.py starts four).

A plain DDP job on Gloo (CPU) with straggler.torch.monitor(ddp, work=...)
and its loader wrapped, `for batch in mon.loader(loader)`, as
docs/python.md's recipe says. The batches come from a torch DataLoader over
a dataset whose item `it` is the whole batch of iteration `it`
(batch_size=None, num_workers=0: the fetch runs in the training thread, so
mon.loader() times it).

As in torch_monitor_rank.py the model stands for a GPU job: each backward
sleeps between its layers (the CPU idles, as it would while a GPU computes;
4 ranks share 2 cores). Two cases:

  --case input: every batch's fetch sleeps --input-ms (the loader's normal
    cost); on the rank given --slow-from, the fetch sleeps --slow-input-ms
    instead from that iteration on. Compute is --compute-ms everywhere.
  --case work: each batch holds 8 sequences of log-normal length (mean 64
    tokens, sigma 0.6: about +-25% tokens per step), padded, with an
    attention mask; work= is the mask's sum (the tokens). The backward
    sleeps --compute-ms x (0.2 + 0.8 x tokens / 512): a fixed part and a
    part in proportion to the tokens, and --slow-factor times that on the
    rank given --slow-from, from that iteration on.

Prints one JSON object per iteration ("it", "tokens", "sleep", "fetch": the
wall time the dataset's item took, "reported": the monitor's newest report,
one step behind), then {"final": ...} with the monitor's counts.
"""

import argparse
import json
import math
import random
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import straggler.torch as st

import torch_rank

VOCAB, IN, HIDDEN, OUT = 1000, 64, 256, 8
SEQUENCES, MEAN_TOKENS, SIGMA = 8, 64, 0.6
REFERENCE_TOKENS = SEQUENCES * MEAN_TOKENS


class Model(torch.nn.Module):
    """Token embeddings, their masked mean per sequence, two layers. The CPU
    part is small and the same for any length; the sleep in backward is the
    (GPU) compute, set per batch by the training loop."""

    def __init__(self, box):
        super().__init__()
        self.box = box
        self.embed = torch.nn.Embedding(VOCAB, IN)
        self.first = torch.nn.Linear(IN, HIDDEN)
        self.out = torch.nn.Linear(HIDDEN, OUT)

    def forward(self, ids, mask):
        m = mask.unsqueeze(-1).to(torch.float32)
        pooled = (self.embed(ids) * m).sum(1) / m.sum(1).clamp(min=1.0)
        h = torch_rank.SleepInBackward.apply(torch.tanh(self.first(pooled)), self.box)
        return self.out(h)


class Batches(torch.utils.data.Dataset):
    """Item `it` is iteration it's batch: ids [8, longest], mask, labels."""

    def __init__(self, rank, case, iterations, input_s, slow_input_s, slow_from):
        self.rank, self.case, self.n = rank, case, iterations
        self.input_s, self.slow_input_s, self.slow_from = input_s, slow_input_s, slow_from

    def __len__(self):
        return self.n

    def __getitem__(self, it):
        start = time.perf_counter()
        rng = random.Random(7919 * self.rank + it)
        if self.case == "work":
            # Log-normal lengths with mean MEAN_TOKENS: mu = ln(mean) - sigma^2 / 2.
            mu = math.log(MEAN_TOKENS) - SIGMA * SIGMA / 2
            lengths = [max(1, int(round(rng.lognormvariate(mu, SIGMA))))
                       for _ in range(SEQUENCES)]
        else:
            lengths = [MEAN_TOKENS] * SEQUENCES
        longest = max(lengths)
        mask = torch.zeros(SEQUENCES, longest, dtype=torch.int64)
        for i, n in enumerate(lengths):
            mask[i, :n] = 1
        g = torch.Generator().manual_seed(1000 * self.rank + it)
        ids = torch.randint(0, VOCAB, (SEQUENCES, longest), generator=g) * mask
        y = torch.randint(0, OUT, (SEQUENCES,), generator=g)
        slow = 0 <= self.slow_from <= it and self.slow_input_s is not None
        # The loader's own cost: reading and decoding, a slow disk on one rank.
        time.sleep((self.slow_input_s if slow else self.input_s) * (1.0 + 0.05 * rng.random()))
        return {"ids": ids, "mask": mask, "y": y, "it": it,
                "fetch": time.perf_counter() - start}


def tokens(batch):
    """work=: the batch's token count, from its attention mask (on the CPU)."""
    return float(batch["mask"].sum())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--store", required=True, help="FileStore path for DDP's bootstrap")
    p.add_argument("--case", choices=["input", "work"], required=True)
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--compute-ms", type=float, default=40)
    p.add_argument("--input-ms", type=float, default=2)
    p.add_argument("--slow-input-ms", type=float, default=None)
    p.add_argument("--slow-factor", type=float, default=1.0)
    p.add_argument("--slow-from", type=int, default=-1, help="-1: never slow")
    p.add_argument("--no-work", action="store_true", help="monitor without work=")
    p.add_argument("--no-loader", action="store_true",
                   help="iterate the loader itself, not mon.loader(loader): no input wait")
    a = p.parse_args()
    rank, world = torch_rank.init_gloo(a.store)
    torch.manual_seed(0)
    box = {"seconds": 0.0}
    ddp = DDP(Model(box))
    mon = st.monitor(ddp, work=None if a.no_work else tokens)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    slow_input = None if a.slow_input_ms is None else a.slow_input_ms / 1000.0
    dataset = Batches(rank, a.case, a.iterations, a.input_ms / 1000.0, slow_input, a.slow_from)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, shuffle=False, num_workers=0)
    jitter = random.Random(rank)
    for batch in (loader if a.no_loader else mon.loader(loader)):
        it = batch["it"]
        n = tokens(batch)
        seconds = a.compute_ms / 1000.0 * (1.0 + 0.05 * jitter.random())
        if a.case == "work":
            seconds *= 0.2 + 0.8 * n / REFERENCE_TOKENS
            if 0 <= a.slow_from <= it:
                seconds *= a.slow_factor
        box["seconds"] = seconds
        loss = torch.nn.functional.cross_entropy(ddp(batch["ids"], batch["mask"]), batch["y"])
        loss.backward()
        opt.step()
        opt.zero_grad()
        last = mon.last
        print(json.dumps({"it": it, "tokens": n, "sleep": seconds, "fetch": batch["fetch"],
                          "reported": last._asdict() if last is not None else None}), flush=True)
    mon.close()  # reports the last step; closes the client monitor() made
    print(json.dumps({"final": {"reported": mon.reported, "dropped": mon.dropped,
                                "bad_work": mon.bad_work,
                                "last": mon.last._asdict() if mon.last else None}}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    torch_rank.run(main)
