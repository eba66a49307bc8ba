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
`straggler.torch`; for a hybrid-parallel job's peer group and replica,
`straggler.topology`.
"""

import atexit
import importlib.util
import os
import sys
import weakref

# torch, where it is installed, is loaded before the extension. On a GPU machine
# with pip's torch 2.11 (cu130) and this module built there with pip's pybind11
# 3.1, `import straggler` then `import torch` ended the process with SIGSEGV
# inside torch's own import (torch::get_symint_class, a null call under
# pthread_once); torch first imports cleanly (docs/gpu.md "Import order").
# A trainer that uses torch imports it anyway, so this costs it nothing; a
# process that never uses torch pays torch's import time once, unless it sets
# STRAGGLER_IMPORT_TORCH=0 (then it must not import torch after straggler).
if ("torch" not in sys.modules and os.environ.get("STRAGGLER_IMPORT_TORCH", "1") != "0"
        and importlib.util.find_spec("torch") is not None):
    try:
        import torch  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken torch must not stop a trainer that does not use it
        pass

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
from . import topology  # noqa: F401  (straggler.topology.from_layout)

__all__ = ["Client", "ClientStats", "CollectiveError", "ExcludedRank", "Membership",
           "PartialAllReduce", "StepPlan", "backends", "topology"]

_live_clients = weakref.WeakSet()


class Client(_Client):
    __doc__ = _Client.__init__.__doc__

    def __init__(self, **options):
        if "gpu_model" not in options and not os.environ.get("STRAGGLER_GPU_MODEL"):
            model = _torch_gpu_model()
            if model:
                options["gpu_model"] = model
        super().__init__(**options)
        _live_clients.add(self)


def _torch_gpu_model():
    """The name torch gives this process's GPU ("NVIDIA H100 80GB HBM3"), or None.

    Detection never compares ranks of different GPU models (docs/topology.md). Only
    a process whose CUDA torch has already initialized (the trainer moved a model
    or called set_device) is asked: asking would otherwise initialize CUDA here,
    and a process that forks after that cannot use CUDA in its children. torch is
    imported above wherever it is installed, so that it is imported says nothing
    of whether the trainer uses it. Elsewhere: gpu_model= or STRAGGLER_GPU_MODEL.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        name = torch.cuda.get_device_name(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 - a broken CUDA setup must not stop training
        return None
    # The daemon's rule: printable ASCII, at most 96 bytes.
    name = "".join(c for c in name if " " <= c <= "~")[:96]
    return name or None


@atexit.register
def _close_clients():
    # A client's background thread must stop before the interpreter finalizes:
    # a membership callback taking the GIL during finalization would end that
    # thread inside the interpreter.
    for client in list(_live_clients):
        client.close()
