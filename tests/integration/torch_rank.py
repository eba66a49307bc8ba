"""Lines every torch rank script shares (torch_ddp_rank.py,
torch_monitor_rank.py, torch_cause_rank.py, torch_no_daemon_rank.py): the
Gloo process group bootstrapped through the driver's FileStore, the entry
point that puts a failure on stderr, naming the rank, for the driver to
read, and the sleep in backward that stands for a GPU's compute.

    def main():
        rank, world = torch_rank.init_gloo(a.store)
        ...
    if __name__ == "__main__":
        torch_rank.run(main)
"""

import os
import sys
import time

import torch
import torch.distributed as dist


class SleepInBackward(torch.autograd.Function):
    """Identity; its backward sleeps box["seconds"] (read at backward time):
    a rank's compute that stands for a GPU's (the CPU idles, as it would
    while a GPU computes; 4 ranks share a small machine).

        h = SleepInBackward.apply(torch.tanh(layer(x)), box)
    """

    @staticmethod
    def forward(ctx, x, box):
        ctx.box = box
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.box["seconds"])
        return grad, None


def init_gloo(store, rank=None, world=None):
    """Joins the Gloo process group through the FileStore at `store`; rank and
    world size default to RANK and WORLD_SIZE. One torch thread: four ranks
    share a small machine. Returns (rank, world)."""
    rank = int(os.environ["RANK"]) if rank is None else rank
    world = int(os.environ["WORLD_SIZE"]) if world is None else world
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank,
                            world_size=world)
    return rank, world


def run(main):
    """sys.exit(main()); an exception is printed with the rank, then re-raised."""
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - the driver reads stderr
        print("rank %s: %s: %s" % (os.environ.get("RANK", "?"), type(e).__name__, e),
              file=sys.stderr)
        raise
