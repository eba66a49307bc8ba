"""A rank's peer group and replica, for `straggler.Client(peer_group=, replica=)`.

    import straggler
    from straggler import topology
    t = topology.from_layout(pipeline=4, tensor=2)   # rank from RANK, data from WORLD_SIZE
    client = straggler.Client(peer_group=t.peer_group, replica=t.replica)

The rank order is Megatron-LM's (`order`, default "tp-cp-ep-dp-pp": the first
name varies fastest), computed by the same C++ code as straggler/topology.h
and the C ABI's straggler_topology_from_layout. Peers are the ranks of one
pipeline stage ("stage<p>"); the replica is the data-parallel index. See
docs/topology.md, also for launches that are not laid out this way (set
STRAGGLER_PEER_GROUP and STRAGGLER_REPLICA, or pass your own values).
"""

import collections
import os

from ._straggler import topology_from_layout as _from_layout

__all__ = ["Topology", "from_layout"]

Topology = collections.namedtuple(
    "Topology", ["peer_group", "replica", "stage", "tensor_rank", "context_rank"])
Topology.__doc__ = "A rank's place in a data x pipeline x tensor (x context) layout."


def _env_int(name):
    value = os.environ.get(name)
    if value is None or value == "":
        raise ValueError("%s is not set: pass it explicitly" % name)
    try:
        return int(value)
    except ValueError:
        raise ValueError("%s=%r is not an integer" % (name, value)) from None


def from_layout(pipeline=1, tensor=1, data=None, context=1, order="tp-cp-ep-dp-pp", rank=None,
                world_size=None):
    """The Topology of `rank` (default: $RANK) in a layout of `data` replicas x `pipeline`
    stages x `tensor` x `context` ranks per stage. `data` defaults to world_size (default:
    $WORLD_SIZE) divided by pipeline x tensor x context, which must divide it, as in
    Megatron. ValueError names a bad value."""
    if rank is None:
        rank = _env_int("RANK")
    per_replica = pipeline * tensor * context
    if data is None:
        if world_size is None:
            world_size = _env_int("WORLD_SIZE")
        if per_replica <= 0 or world_size % per_replica != 0:
            raise ValueError(
                "world_size=%d is not divisible by pipeline x tensor x context = %d x %d x %d"
                % (world_size, pipeline, tensor, context))
        data = world_size // per_replica
    elif world_size is not None and world_size != data * per_replica:
        raise ValueError("world_size=%d differs from data x pipeline x tensor x context = %d"
                         % (world_size, data * per_replica))
    for name, value in (("rank", rank), ("data", data), ("pipeline", pipeline),
                        ("tensor", tensor), ("context", context)):
        if not isinstance(value, int) or value < 0:
            raise ValueError("%s=%r must be a non-negative integer" % (name, value))
    d = _from_layout(rank, data, pipeline, tensor, context, order)
    return Topology(d["peer_group"], d["replica"], d["stage"], d["tensor_rank"],
                    d["context_rank"])
