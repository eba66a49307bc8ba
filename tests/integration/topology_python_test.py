#!/usr/bin/env python3
"""straggler.topology and Client(peer_group=, replica=) without a daemon
(docs/topology.md):

  * from_layout gives Megatron's stage and data-parallel index for two rank
    orders, checked against the groups Megatron-LM's RankGenerator builds
    (written out here again in Python), and against hand-worked ranks;
  * RANK and WORLD_SIZE are the defaults, data is derived from WORLD_SIZE,
    and a bad layout raises ValueError naming the value;
  * Client takes peer_group= and replica= (and STRAGGLER_PEER_GROUP /
    STRAGGLER_REPLICA), and refuses what the daemon would refuse.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import check, main  # noqa: E402


def megatron_groups(sizes, mask):
    """Megatron-LM's generate_masked_orthogonal_rank_groups (parallel_state.py)."""
    def prefix(a):
        r = [1]
        for v in a:
            r.append(r[-1] * v)
        return r

    def decompose(index, shape):
        stride = prefix(shape)
        return [(index // d) % s for s, d in zip(shape, stride)]

    world = prefix(sizes)[-1]
    gstride = prefix(sizes)
    masked = [s for s, m in zip(sizes, mask) if m]
    unmasked = [s for s, m in zip(sizes, mask) if not m]
    mstride = [d for d, m in zip(gstride, mask) if m]
    ustride = [d for d, m in zip(gstride, mask) if not m]
    size = prefix(masked)[-1]
    groups = []
    for g in range(world // size):
        gi = decompose(g, unmasked)
        groups.append([sum(x * y for x, y in zip(decompose(r, masked), mstride))
                       + sum(x * y for x, y in zip(gi, ustride)) for r in range(size)])
    return groups


def check_order(topology, order, data, pipeline, tensor):
    names = order.split("-")
    size = {"tp": tensor, "cp": 1, "ep": 1, "dp": data, "pp": pipeline}
    sizes = [size[n] for n in names]
    stage, replica = {}, {}
    for g in megatron_groups(sizes, [n == "pp" for n in names]):
        for i, r in enumerate(g):
            stage[r] = i
    for g in megatron_groups(sizes, [n == "dp" for n in names]):
        for i, r in enumerate(g):
            replica[r] = i
    world = data * pipeline * tensor
    for rank in range(world):
        t = topology.from_layout(data=data, pipeline=pipeline, tensor=tensor, order=order,
                                 rank=rank)
        check((t.stage, t.replica) == (stage[rank], replica[rank]),
              "%s rank %d: stage %d replica %d, Megatron says %d %d"
              % (order, rank, t.stage, t.replica, stage[rank], replica[rank]))
        check(t.peer_group == "stage%d" % stage[rank], "peer group %r" % (t.peer_group,))


def raises(fn, needle):
    try:
        fn()
    except ValueError as e:
        check(needle in str(e), "ValueError %r does not name %r" % (str(e), needle))
        return
    raise AssertionError("no ValueError (expected one naming %r)" % needle)


def test():
    import straggler
    from straggler import topology

    # Megatron's docstring example: 16 GPUs, tp 2, pp 4, default order.
    t = topology.from_layout(data=2, pipeline=4, tensor=2, rank=13)
    check(t == ("stage3", 0, 3, 1, 0), "rank 13 of tp2 pp4 dp2: %r" % (t,))
    check(straggler.topology is topology, "straggler.topology is the module")
    for order in ("tp-cp-ep-dp-pp", "tp-pp-dp", "dp-pp-tp", "pp-dp-tp"):
        check_order(topology, order, data=4, pipeline=3, tensor=2)
    t = topology.from_layout(data=2, pipeline=2, tensor=2, order="tp-pp-dp", rank=6)
    check((t.peer_group, t.replica) == ("stage1", 1), "tp-pp-dp rank 6: %r" % (t,))

    # RANK and WORLD_SIZE as torchrun sets them; data = world / (pp x tp).
    os.environ["RANK"] = "13"
    os.environ["WORLD_SIZE"] = "16"
    t = topology.from_layout(pipeline=4, tensor=2)
    check((t.peer_group, t.replica) == ("stage3", 0), "from RANK/WORLD_SIZE: %r" % (t,))
    raises(lambda: topology.from_layout(pipeline=3, tensor=2), "not divisible")
    raises(lambda: topology.from_layout(data=2, pipeline=4, tensor=2, rank=16),
           "rank 16 is outside the layout's world of 16 ranks")
    raises(lambda: topology.from_layout(data=2, pipeline=2, order="tp-dp", rank=0),
           "pp size is 2 but order 'tp-dp' does not name it")
    raises(lambda: topology.from_layout(data=2, pipeline=2, tensor=2, world_size=9, rank=0),
           "world_size=9")
    del os.environ["RANK"]
    raises(lambda: topology.from_layout(pipeline=2), "RANK is not set")

    # The client: keyword arguments, then the environment; no daemon needed.
    opts = dict(job_id="topo", rank=11, world_size=16, endpoint="127.0.0.1:1",
                backoff_initial=5.0, backoff_max=5.0)
    t = topology.from_layout(pipeline=4, tensor=2, rank=11)  # tp 1, dp 1, pp 2
    c = straggler.Client(peer_group=t.peer_group, replica=t.replica, **opts)
    check((c.peer_group, c.replica) == ("stage2", 1), "client: %r %r" % (c.peer_group, c.replica))
    c.close()
    c = straggler.Client(**opts)
    check((c.peer_group, c.replica) == ("", None), "default: %r %r" % (c.peer_group, c.replica))
    c.close()
    os.environ["STRAGGLER_PEER_GROUP"] = "stage0"
    os.environ["STRAGGLER_REPLICA"] = "7"
    c = straggler.Client(**opts)
    check((c.peer_group, c.replica) == ("stage0", 7), "env: %r %r" % (c.peer_group, c.replica))
    c.close()
    c = straggler.Client(replica=None, **opts)  # a keyword overrides the environment
    check(c.replica is None, "replica=None: %r" % (c.replica,))
    c.close()
    del os.environ["STRAGGLER_PEER_GROUP"], os.environ["STRAGGLER_REPLICA"]
    raises(lambda: straggler.Client(peer_group="stage 1", **opts),
           "peer_group 'stage 1' has ' ' at byte 5")
    raises(lambda: straggler.Client(replica=16, **opts), "replica=16 >= world_size=16")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pythonpath", required=True)
    args = parser.parse_args()
    sys.path.insert(0, args.pythonpath)
    main(test)
