#!/usr/bin/env python3
"""One rank of torch_job_id_test.py, launched by the real torchrun: README's
monitoring-only recipe (DDP(model), then straggler.torch.monitor(ddp), the
client from the environment) with whatever job id the environment gives,
none included.

Trains --iterations steps of a tiny DDP model on Gloo (CPU) through two
monitored DDP modules (the "not monitoring" warning is logged once per
process), then tries the exclusion integration's PartialAllReduceState when
the monitor has no client (it must refuse, naming STRAGGLER_JOB_ID). Writes
--out/rank<RANK>.json: the monitors' `enabled`, the client's job id, the
steps reported, the refusal's text, the first parameters (equal on every
rank when DDP averaged).
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import straggler.torch as st

import torch_rank


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="directory for rank<RANK>.json")
    p.add_argument("--iterations", type=int, default=12)
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # torchrun's env:// rendezvous
    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = DDP(torch.nn.Linear(16, 4))
    other = DDP(torch.nn.Linear(4, 2))
    mon = st.monitor(ddp)    # the recipe's line
    mon2 = st.monitor(other)  # a second one: the warning is not repeated
    opt = torch.optim.SGD(list(ddp.parameters()) + list(other.parameters()), lr=0.1)
    for it in range(a.iterations):
        mon.set_epoch(0)
        g = torch.Generator().manual_seed(100 * rank + it)
        x = torch.randn(8, 16, generator=g)
        loss = other(torch.tanh(ddp(x))).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    job_id = mon.client.job_id if mon.enabled else None
    mon.close()
    mon2.close()
    state_error = None
    if not mon.enabled:
        try:
            st.PartialAllReduceState()
        except ValueError as e:
            state_error = str(e)
    result = {"rank": rank, "enabled": [mon.enabled, mon2.enabled], "job_id": job_id,
              "reported": [mon.reported, mon2.reported], "state_error": state_error,
              "run_id_env": os.environ.get("TORCHELASTIC_RUN_ID"),
              "params": [v for t in ddp.module.parameters() for v in t.detach().reshape(-1).tolist()]}
    with open(os.path.join(a.out, "rank%d.json" % rank), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    torch_rank.run(main)
