#!/usr/bin/env python3
"""One rank of the PyTorch hybrid test (hybrid_torch_test.py starts eight):
4 replicas x 2 pipeline stages, rank = replica + 4 * stage (Megatron's
order). Stage 0 is Linear+Tanh, stage 1 Linear; activations and their
gradients go between a replica's stages by torch.distributed send/recv on
Gloo (the pipeline), and each stage is a DDP module over its data-parallel
group (torch's new_group) whose gradients straggler.torch's hook averages
among the group's active replicas.

Prints one JSON object per iteration (the stage's plan, and a checksum of the
stage's parameters and optimizer state after the step), then {"final": ...}.
An excluded replica that learns where it is taken back skips to there, both
stages together (stage 0 tells stage 1 each step); the iterations it skips
print "skipped": true. Reports the stage's own time (without the pipeline's
waits), so only a slow rank itself looks slow.
"""

import argparse
import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import straggler
import straggler.torch as st

REPLICAS, STAGES = 4, 2
IN, HIDDEN, OUT, BATCH = 8, 16, 4, 8


def checksum(module, optimizer):
    h = hashlib.sha1()
    for t in module.parameters():
        h.update(t.detach().numpy().tobytes())
    for s in optimizer.state.values():
        if "momentum_buffer" in s and s["momentum_buffer"] is not None:
            h.update(s["momentum_buffer"].numpy().tobytes())
    return h.hexdigest()[:16]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--iterations", type=int, default=80)
    p.add_argument("--step-ms", type=float, default=10)
    p.add_argument("--slow-ms", type=float, default=0)
    p.add_argument("--slow-from", type=int, default=0)
    p.add_argument("--slow-to", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(1)
    world = REPLICAS * STAGES
    replica, stage = a.rank % REPLICAS, a.rank // REPLICAS
    dist.init_process_group("gloo", store=dist.FileStore(a.store, world), rank=a.rank, world_size=world)
    # Every rank enters every new_group, in the same order (torch's rule).
    groups = [dist.new_group([r + REPLICAS * s for r in range(REPLICAS)]) for s in range(STAGES)]
    dp_group = groups[stage]
    dp_ranks = [r + REPLICAS * stage for r in range(REPLICAS)]

    client = straggler.Client(endpoint=a.daemon, job_id=a.job, rank=a.rank, world_size=world,
                              node="node%d" % a.rank, peer_group="stage%d" % stage, replica=replica,
                              run_id=st.run_id())
    state = st.PartialAllReduceState(
        client, collective_timeout=20.0, membership_timeout=1.5,
        group_ranks=dp_ranks, group_replicas=list(range(REPLICAS)), group_name="stage%d" % stage,
        replica_of=[r % REPLICAS for r in range(world)])

    torch.manual_seed(100 + a.rank)  # different on every rank: the first sync makes them equal
    module = (torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh()) if stage == 0
              else torch.nn.Linear(HIDDEN, OUT)).double()
    ddp = DDP(module, process_group=dp_group, broadcast_buffers=False, find_unused_parameters=False)
    ddp.register_comm_hook(state, st.partial_allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    peer = a.rank + REPLICAS if stage == 0 else a.rank - REPLICAS

    it = 0
    while it < a.iterations:
        plan = state.begin_step(it, model=ddp.module, optimizer=opt)
        # Skipping to the rejoin (docs/hybrid.md, "Readmission inside a
        # pipeline"): an excluded replica that fell behind goes straight to
        # the iteration where the groups take it back, but its stages must
        # skip together or one waits forever for the other's activations.
        # Stage 0 decides (its plan's rejoin_iteration) and tells stage 1
        # over the pipeline's own link, every step.
        target = torch.tensor([it], dtype=torch.int64)
        if stage == 0:
            if plan.rejoin_iteration is not None:
                target[0] = plan.rejoin_iteration
            dist.send(target, dst=peer, tag=3 * it + 2)
        else:
            dist.recv(target, src=peer, tag=3 * it + 2)
        if int(target[0]) > it:
            for skipped in range(it, min(int(target[0]), a.iterations)):
                print(json.dumps({
                    "it": skipped, "skipped": True, "version": plan.version, "certain": plan.certain,
                    "participating": False, "active": list(plan.active_ranks), "root": plan.root,
                    "synced": False, "stepped": False, "steps_taken": state.steps_taken,
                    "checksum": checksum(ddp.module, opt)}), flush=True)
            it = int(target[0])
            continue
        start = time.perf_counter()
        g = torch.Generator().manual_seed(1000 * replica + it)
        x = torch.randn(BATCH, IN, generator=g, dtype=torch.float64)
        y = torch.randint(0, OUT, (BATCH,), generator=g)
        waited = [0.0]  # seconds in the pipeline's send/recv: the other stage's time

        def p2p(op, t, other, tag):
            t0 = time.perf_counter()
            op(t, other, tag=tag)
            waited[0] += time.perf_counter() - t0

        if stage == 0:
            h = ddp(x)
            p2p(dist.send, h.detach(), peer, 3 * it)
            dh = torch.empty_like(h)
            p2p(dist.recv, dh, peer, 3 * it + 1)
            h.backward(dh)
        else:
            h = torch.empty(BATCH, HIDDEN, dtype=torch.float64)
            p2p(dist.recv, h, peer, 3 * it)
            h.requires_grad_()
            torch.nn.functional.cross_entropy(ddp(h), y).backward()
            p2p(dist.send, h.grad, peer, 3 * it + 1)
        slow = a.slow_ms > 0 and a.slow_from <= it < a.slow_to
        time.sleep((a.slow_ms if slow else a.step_ms) / 1000.0)
        # The stage's own time, as a pipeline trainer times it (Megatron's
        # timers keep the pipeline's waits apart): waiting on the other
        # stage is not this rank's slowness, so a slow stage-0 rank does not
        # make its stage-1 partner look slow too.
        state.end_step(0, time.perf_counter() - start - waited[0])
        stepped = state.optimizer_step(opt)
        opt.zero_grad()
        print(json.dumps({
            "it": it, "version": plan.version, "certain": plan.certain,
            "participating": plan.participating, "active": list(plan.active_ranks),
            "root": plan.root, "synced": it in state.synced_at, "stepped": stepped,
            "steps_taken": state.steps_taken, "checksum": checksum(ddp.module, opt)}), flush=True)
        it += 1

    print(json.dumps({"final": True, "steps_taken": state.steps_taken}), flush=True)
    client.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - the test reads stderr
        print("rank: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        raise
