#!/usr/bin/env python3
"""One rank of the paper experiment (run.py starts four).

A small CNN on synthetic CIFAR-10-shaped data (3x32x32, 10 classes, fixed
seeds), PyTorch DDP on Gloo, one thread per rank. With --daemon the gradients
go through straggler.torch.partial_allreduce_hook (averaged among the active
ranks that stragglerd names); without it DDP's own all-reduce runs (no
mitigation).

The straggler (--slow-rank) sleeps (factor - 1) x its wall-clock compute time
after its backward pass, inside the timed step, in its slow iterations (and,
with --timing cpu, reports factor x its CPU time; see README.md):
  --slow-mode half   the first half of every epoch (the paper's experiment)
  --slow-mode whole  every iteration (the paper's motivating experiment)
Iterations are numbered globally (epoch * iterations_per_epoch + k).

While excluded, a rank keeps computing and reporting (shadow recovery). As
soon as its plan names the iteration where it is readmitted
(plan.rejoin_iteration: the effective iteration of the version that includes
it again), it skips its remaining shadow iterations and goes straight there:
the group's parameters, optimizer state and step counter arrive by broadcast
at that iteration, and the group does not wait at the rejoin for the rank to
work through iterations whose results would be overwritten. When --done-file
appears (rank 0 writes it after its last iteration) a rank that is excluded
at that moment stops: the active ranks have finished the job and its
remaining shadow work is not needed.

Prints one JSON object per iteration on stdout and a final {"final": ...}.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

BATCH, CLASSES, DATA_BATCHES = 32, 10, 8


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(16 * 8 * 8, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, CLASSES))


def make_data(rank):
    g = torch.Generator().manual_seed(1234 + rank)
    return [(torch.randn(BATCH, 3, 32, 32, generator=g),
             torch.randint(0, CLASSES, (BATCH,), generator=g)) for _ in range(DATA_BATCHES)]


def is_slow(mode, it, per_epoch):
    if mode == "whole":
        return True
    if mode == "half":
        return it % per_epoch < per_epoch // 2
    return False


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", help="stragglerd gRPC address; none = plain DDP all-reduce")
    p.add_argument("--job", default="paper")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--store", required=True, help="FileStore path for DDP's bootstrap")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--iterations-per-epoch", type=int, default=40)
    p.add_argument("--slow-rank", type=int, default=3)
    p.add_argument("--slow-mode", choices=["none", "half", "whole"], default="none")
    p.add_argument("--slow-factor", type=float, default=3.0)
    p.add_argument("--done-file", required=True)
    p.add_argument("--timing", choices=["cpu", "wall"], default="cpu",
                   help="compute time reported to stragglerd: the process's CPU time in "
                        "forward+backward (plus the injected sleep), or wall-clock minus "
                        "collectives (state.end_step)")
    a = p.parse_args()
    torch.set_num_threads(1)

    dist.init_process_group("gloo", store=dist.FileStore(a.store, a.world_size),
                            rank=a.rank, world_size=a.world_size)
    model = make_model()
    ddp = DDP(model, broadcast_buffers=False, find_unused_parameters=False)
    state = None
    if a.daemon:
        import straggler
        import straggler.torch as st
        client = straggler.Client(endpoint=a.daemon, job_id=a.job, rank=a.rank,
                                  world_size=a.world_size, node="node%d" % a.rank,
                                  iterations_per_epoch=a.iterations_per_epoch)
        state = st.PartialAllReduceState(client, collective_timeout=120.0,
                                         membership_timeout=10.0)
        ddp.register_comm_hook(state, st.partial_allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    data = make_data(a.rank)
    slow_here = a.rank == a.slow_rank and a.slow_mode != "none"

    total = a.epochs * a.iterations_per_epoch
    job_start = time.time()
    stopped_early = None
    skipped = 0  # shadow iterations not run: skipped to the rejoin
    it = 0
    while it < total:
        epoch = it // a.iterations_per_epoch
        participating = True
        if state is not None:
            plan = state.begin_step(it, model=ddp.module, optimizer=opt)
            participating = plan.participating
            if not participating and os.path.exists(a.done_file):
                stopped_early = it
                break
            if plan.rejoin_iteration is not None and plan.rejoin_iteration > it:
                # Excluded, and the group readmits this rank at rejoin_iteration:
                # this shadow step and those up to it would only be overwritten
                # by the broadcast there. begin_step(rejoin_iteration) is
                # certain at once for this rank.
                if plan.rejoin_iteration >= total:  # the job ends before that
                    stopped_early = it
                    break
                skipped += plan.rejoin_iteration - it
                it = plan.rejoin_iteration
                continue
        t0 = time.time()
        start = time.perf_counter()
        cpu0 = time.process_time()
        x, y = data[it % DATA_BATCHES]
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        cpu = time.process_time() - cpu0
        wall_own = time.perf_counter() - start - (state.collective_seconds if state else 0.0)
        slow = slow_here and is_slow(a.slow_mode, it, a.iterations_per_epoch)
        reported = cpu
        if slow:
            # The step takes slow_factor x its wall-clock compute (the job sees a
            # rank that many times slower); the CPU time reported is scaled the
            # same way (a sleep burns no CPU).
            time.sleep((a.slow_factor - 1.0) * wall_own)
            reported = a.slow_factor * cpu
        step = time.perf_counter() - start
        if state is not None:
            if a.timing == "cpu":
                state.client.report(epoch, it, reported, step_seconds=step,
                                    collective_wait_seconds=state.collective_seconds)
            else:
                state.end_step(epoch, step)
            stepped = state.optimizer_step(opt)
            coll = state.collective_seconds
        else:
            opt.step()
            stepped, coll = True, None
        opt.zero_grad()
        print(json.dumps({"it": it, "epoch": epoch, "t0": t0, "step": step, "cpu": cpu, "wall_compute": wall_own,
                          "reported": reported,
                          "collective": coll,
                          "slow": slow, "participating": participating, "stepped": stepped,
                          "loss": loss.item()}), flush=True)
        it += 1
    end = time.time()
    if a.rank == 0:
        with open(a.done_file + ".tmp", "w") as f:
            f.write("%f\n" % end)
        os.replace(a.done_file + ".tmp", a.done_file)
    if state is not None:
        state.client.flush(5.0)
        state.client.close()
    print(json.dumps({"final": True, "start": job_start, "end": end,
                      "stopped_early": stopped_early, "skipped": skipped}), flush=True)
    # No destroy_process_group: an excluded rank that stopped early must not
    # wait on a full-group barrier.
    os._exit(0)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - the driver reads stderr
        print("rank %s: %s: %s" % (os.environ.get("RANK", "?"), type(e).__name__, e),
              file=sys.stderr)
        raise
