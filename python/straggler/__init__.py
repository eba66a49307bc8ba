"""stragglerd for Python trainers.

    import straggler
    client = straggler.Client(job_id="resnet", rank=0, world_size=4)  # the rest from env
    reducer = straggler.PartialAllReduce(client)      # rendezvous through the same daemon,
    # or store=<a torch.distributed Store>: through it, no daemon needed to start
    it = 0
    while it < steps:
        plan = reducer.begin_iteration(it)            # the membership switch rule
        if plan.rejoin_iteration is not None:         # excluded, readmitted further on:
            it = plan.rejoin_iteration                # skip the shadow steps up to there
            continue
        if plan.sync_parameters:
            reducer.sync_parameters([params])         # rejoin: from the lowest active rank
        grads = compute()
        client.report(epoch, it, compute_seconds)
        if reducer.all_reduce_average(grads)["participated"]:
            params -= lr * grads                      # excluded ranks do not step
        it += 1

`Client` and `PartialAllReduce` are the C++ classes of client_lib (see
client_lib/include/straggler/client.h and collective.h) through pybind11;
buffers are numpy arrays or CPU torch tensors (float32/float64, contiguous),
reduced in place without a copy. On GPUs,
`PartialAllReduce(client, backend="nccl", device=local_rank)` reduces CUDA
tensors in place on torch's current CUDA stream (docs/gpu.md); where this
module was built without NCCL, or no GPU is visible, it raises RuntimeError
naming the reason (`backends()` lists what was built). For PyTorch DDP see
`straggler.torch`.
"""

import atexit
import weakref

from ._straggler import (  # noqa: F401
    ClientStats,
    CollectiveError,
    ExcludedRank,
    Membership,
    PartialAllReduce,
    StepPlan,
    backends,
)
from ._straggler import Client as _Client

__all__ = ["Client", "ClientStats", "CollectiveError", "ExcludedRank", "Membership",
           "PartialAllReduce", "StepPlan", "backends"]

_live_clients = weakref.WeakSet()


class Client(_Client):
    __doc__ = _Client.__init__.__doc__

    def __init__(self, **options):
        super().__init__(**options)
        _live_clients.add(self)


@atexit.register
def _close_clients():
    # A client's background thread must stop before the interpreter finalizes:
    # a membership callback taking the GIL during finalization would end that
    # thread inside the interpreter.
    for client in list(_live_clients):
        client.close()
