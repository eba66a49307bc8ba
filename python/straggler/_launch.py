"""What one launch of a torch.distributed job shares without the daemon: its
run id (docs/runs.md) and the store its ranks rendezvous through.

    client = straggler.Client(run_id=run_id())       # after init_process_group
    reducer = straggler.PartialAllReduce(client, store=rendezvous_store(client))

Both use the store init_process_group made, so every rank of one launch
agrees on them with no daemon running (issue: a trainer must never fail
because stragglerd is absent).
"""

import os
import uuid

import torch.distributed as dist

__all__ = ["run_id", "rendezvous_store"]

_RUN_ID = None


def _env_run_id():
    # torchrun sets TORCHELASTIC_RUN_ID to the literal "none" without
    # --rdzv_id or --standalone: that names no launch (as ClientOptions::FromEnv).
    for name in ("STRAGGLER_RUN_ID", "TORCHELASTIC_RUN_ID"):
        value = os.environ.get(name, "")
        if value and value != "none":
            return value
    return None


def _launch():
    # torchelastic restarts the workers of one run against one store:
    # TORCHELASTIC_RESTART_COUNT tells those launches' keys apart.
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def run_id(store=None):
    """This launch's run id: STRAGGLER_RUN_ID or TORCHELASTIC_RUN_ID when
    set, else one rank 0 draws (a UUID) and publishes in the default store of
    torch.distributed (init_process_group must have run), read by every other
    rank. The same value for the whole process once known."""
    global _RUN_ID
    if _RUN_ID is None:
        _RUN_ID = _env_run_id()
    if _RUN_ID is None:
        store = store if store is not None else dist.distributed_c10d._get_default_store()
        key = "straggler/run_id/%s" % _launch()
        if dist.get_rank() == 0:
            store.set(key, uuid.uuid4().hex)
        _RUN_ID = store.get(key).decode()  # blocks until rank 0 has set it
    return _RUN_ID


def rendezvous_store(client, store=None):
    """A PrefixStore over torch.distributed's default store for the
    partial all-reduce's Gloo contexts and agreement keys, named by job, run
    and launch so no other job or launch can read them."""
    base = store if store is not None else dist.distributed_c10d._get_default_store()
    return dist.PrefixStore("straggler/%s/%s/%s/" % (client.job_id, run_id(base), _launch()), base)
