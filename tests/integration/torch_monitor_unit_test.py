#!/usr/bin/env python3
"""straggler.torch.monitor in one process, without a daemon: a 1-rank DDP
job on Gloo and a client that records the reports. Checks what is measured
and how steps are told apart:

  * an all-reduce that completes 150 ms late (a comm hook whose future a
    timer thread completes) is in collective_wait_seconds and step_seconds,
    not in compute_seconds; a 30 ms sleep inside backward, before the last
    bucket, is in compute_seconds;
  * a sleep between backward() and the next forward (the optimizer, data
    loading) is not compute, unless begin_step() opened the step before it;
  * iterations count synchronizing backwards: forwards under no_grad() do not
    start a step, gradient accumulation under no_sync() is one step;
    set_epoch, begin_step(iteration=...) renumber;
  * on GPU, steps are reported only once their events have passed (query()),
    oldest first, and after 8 pending steps the oldest is waited for
    (fake events stand in for torch.cuda.Event, so this runs on any machine);
  * mon.loader(): each batch's fetch is input_wait_seconds of the step it
    goes into (never compute, also after begin_step() or for gradient
    accumulation's micro-batches), work= is summed per step, an invalid
    work leaves that step's work out (bad_work); a DataLoader's len() and
    attributes pass through, and it is iterated once per epoch;
  * a DDP module that has a comm hook already is refused with a ValueError;
  * close() reports the last step (step_seconds None) and closes nothing it
    did not create;
  * without a job id in the environment the monitor is a no-op (`enabled`
    False) and the comm hook given still runs.
"""

import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import check, main  # noqa: E402


class RecordingClient:
    def __init__(self):
        self.reports = []
        self.closed = False

    def report(self, epoch, iteration, compute_seconds, step_seconds=None,
               collective_wait_seconds=None, **extra):
        self.reports.append(dict(epoch=epoch, iteration=iteration, compute=compute_seconds,
                                 step=step_seconds, wait=collective_wait_seconds,
                                 input=extra.pop("input_wait_seconds", None),
                                 work=extra.pop("work", None), extra=extra))
        return True

    def close(self):
        self.closed = True


def test():
    try:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
    except ImportError as e:
        print("SKIPPED: %s cannot import torch (%s)" % (sys.executable, e))
        sys.exit(77)
    import straggler.torch as st
    from straggler import _monitor

    torch.set_num_threads(1)
    workdir = tempfile.mkdtemp(prefix="monitor-unit-")
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(workdir, "store"), 1),
                            rank=0, world_size=1)
    box = {"sleep": 0.0}

    class SleepInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            time.sleep(box["sleep"])
            return grad

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first = torch.nn.Linear(8, 512)
            self.second = torch.nn.Linear(512, 512)  # DDP's first bucket: 1 MiB
            self.out = torch.nn.Linear(512, 2)

        def forward(self, x):
            h = SleepInBackward.apply(torch.tanh(self.first(x)))
            return self.out(torch.tanh(self.second(h)))

    def late_allreduce(state, bucket):
        """The default all-reduce, completed 150 ms late on the last bucket."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        inner = default_hooks.allreduce_hook(state, bucket)
        if not bucket.is_last():
            return inner
        out = torch.futures.Future()
        threading.Timer(0.150, lambda: out.set_result(inner.wait())).start()
        return out

    def step(ddp, x=None):
        x = torch.ones(4, 8) if x is None else x
        ddp(x).sum().backward()

    # --- What is measured.
    client = RecordingClient()
    ddp = DDP(Model())
    mon = st.monitor(ddp, client, epoch=3, iteration=100, comm_hook=late_allreduce,
                     comm_state=dist.group.WORLD)
    for i in range(4):
        box["sleep"] = 0.030
        step(ddp)
        time.sleep(0.100)  # "optimizer and data loading": not compute
    check([r["iteration"] for r in client.reports] == [100, 101, 102],
          "reported iterations %s (one step late)" % [r["iteration"] for r in client.reports])
    for r in client.reports[1:]:  # the first step has one bucket, and warm-up
        # The bound leaves 100 ms for the CPU work of a loaded machine.
        check(0.030 <= r["compute"] < 0.030 + 0.100,
              "compute %.1f ms: not the 30 ms backward sleep without the 150 ms all-reduce "
              "delay and the 100 ms after backward" % (r["compute"] * 1e3))
        check(r["wait"] is not None and r["wait"] >= 0.145,
              "collective wait %s: not the 150 ms late all-reduce" % r["wait"])
        check(r["step"] >= r["compute"] + 0.145 + 0.095 and r["epoch"] == 3,
              "step %.1f ms, compute %.1f ms, epoch %d" % (r["step"] * 1e3, r["compute"] * 1e3,
                                                         r["epoch"]))
    measured = [round(r["compute"] * 1e3, 1) for r in client.reports]
    # begin_step before the "data loading": it is compute then.
    box["sleep"] = 0.0
    mon.begin_step()
    time.sleep(0.040)
    step(ddp)
    mon.flush()
    last = client.reports[-1]
    check(last["iteration"] == 104 and last["compute"] >= 0.040,
          "begin_step: iteration %d compute %.1f ms, expected 104 and >= 40 ms"
          % (last["iteration"], last["compute"] * 1e3))
    # Evaluation, accumulation, renumbering.
    with torch.no_grad():
        ddp(torch.ones(4, 8))           # no step: the sleep after it is no step's compute
    time.sleep(0.100)
    with ddp.no_sync():
        step(ddp)                       # accumulates: the step goes on
    mon.set_epoch(4)                    # the open step keeps its epoch
    step(ddp)                           # ends iteration 105
    mon.begin_step(iteration=200)
    step(ddp)
    mon.close()
    got = [(r["iteration"], r["epoch"]) for r in client.reports[-2:]]
    check(got == [(105, 3), (200, 4)], "iterations and epochs %s, expected [(105, 3), (200, 4)]"
          % got)
    check(client.reports[-2]["compute"] < 0.100,
          "an evaluation forward started a step: compute %.1f ms includes the 100 ms after it"
          % (client.reports[-2]["compute"] * 1e3))
    check(client.reports[-1]["step"] is None and not client.closed and mon.reported == 7,
          "close(): last step_seconds %s, client closed %s, reported %d"
          % (client.reports[-1]["step"], client.closed, mon.reported))
    step(ddp)  # after close(): DDP's all-reduce goes on, nothing is reported
    check(mon.reported == 7 and mon.unmatched_backwards == 0, "a step after close() counted")

    check(all(r["input"] is None and r["work"] is None for r in client.reports),
          "without mon.loader() a step reported input wait or work: %s" % client.reports)

    # --- Input wait and work (issue 31): the wrapped loader's __next__ is
    # timed, work= is called on each batch; neither is compute.
    def sleepy(sizes, sleep):
        for n in sizes:
            time.sleep(sleep)            # "the data loader"
            yield torch.ones(n, 8)

    box["sleep"] = 0.0
    client = RecordingClient()
    fed = DDP(Model())
    mon = st.monitor(fed, client, work=lambda batch: 10.0 * batch.shape[0])
    for x in mon.loader(sleepy([2, 3, 4, 5], 0.060)):  # an iterator (a generator)
        step(fed, x)
    mon.flush()
    got = [(r["iteration"], r["work"]) for r in client.reports]
    check(got == [(0, 20.0), (1, 30.0), (2, 40.0), (3, 50.0)],
          "work per step %s, expected 10 x the batch size" % got)
    check(all(r["input"] is not None and r["input"] >= 0.060 for r in client.reports),
          "input wait per step %s, each fetch slept 60 ms" % [r["input"] for r in client.reports])
    check(all(not r["extra"] for r in client.reports), "unexpected keywords %s" % client.reports)
    # begin_step() before the fetch: the fetch lies in the step's compute
    # window, and is taken out of compute. Gradient accumulation: two
    # micro-batches, one step, their waits and works summed.
    it = iter(mon.loader(sleepy([6, 7, 1], 0.150)))
    mon.begin_step()
    step(fed, next(it))
    mon.flush()
    last = client.reports[-1]
    check(last["input"] >= 0.150 and last["compute"] < 0.150 and last["work"] == 60.0,
          "begin_step before a 150 ms fetch: input %.1f ms, compute %.1f ms (must not hold the "
          "fetch), work %s" % (last["input"] * 1e3, last["compute"] * 1e3, last["work"]))
    with fed.no_sync():
        step(fed, next(it))              # opens the step; the second fetch is inside it
    step(fed, next(it))
    mon.flush()
    last = client.reports[-1]
    check(last["input"] >= 0.300 and last["work"] == 80.0 and last["compute"] < 0.150,
          "two micro-batches: input %.1f ms (>= 2 x 150), work %s (70 + 10), compute %.1f ms"
          % (last["input"] * 1e3, last["work"], last["compute"] * 1e3))
    # A work that is not > 0 (or raises) leaves that step's work out, counted.
    bad = {"n": 0}

    def flaky_work(batch):
        bad["n"] += 1
        if bad["n"] == 2:
            return 0.0
        if bad["n"] == 3:
            raise KeyError("attention_mask")
        return 5.0
    mon2_client = RecordingClient()
    fed2 = DDP(Model())
    mon2 = st.monitor(fed2, mon2_client, work=flaky_work)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(8, 8)),
                                         batch_size=2)
    wrapped = mon2.loader(loader)
    check(len(wrapped) == 4 and wrapped.batch_size == 2,
          "the wrapper hides the DataLoader's len/attributes: %d, %r"
          % (len(wrapped), getattr(wrapped, "batch_size", None)))
    for epoch in range(2):               # an iterable: one fresh pass per epoch
        for (x,) in wrapped:
            step(fed2, x)
    mon2.close()
    works = [r["work"] for r in mon2_client.reports]
    check(works == [5.0, None, None] + [5.0] * 5 and mon2.bad_work == 2,
          "works %s (bad_work %d): the 0 and the raising call must leave their step's work out"
          % (works, mon2.bad_work))
    try:
        st.monitor(DDP(Model()), RecordingClient(), work=3)
        check(False, "work=3 (not callable) was accepted")
    except TypeError as e:
        check("work=" in str(e), "the error does not name work=: %s" % e)

    # --- One comm hook per DDP module.
    other = DDP(Model())
    other.register_comm_hook(None, lambda state, bucket: late_allreduce(None, bucket))
    try:
        st.monitor(other, RecordingClient())
        check(False, "monitor() took a DDP module that has a comm hook")
    except ValueError as e:
        check("comm_hook=" in str(e), "the error does not say what to do: %s" % e)

    # --- No job id in the environment (issue 28): no client, a no-op monitor,
    # the comm hook given still runs (DDP takes it as without the monitor).
    saved = {k: os.environ.pop(k, None) for k in ("STRAGGLER_JOB_ID", "TORCHELASTIC_RUN_ID")}
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    calls = []

    def counting_allreduce(state, bucket):
        calls.append(bucket.index())
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        return default_hooks.allreduce_hook(state, bucket)

    plain = DDP(Model())
    off = st.monitor(plain, comm_hook=counting_allreduce, comm_state=dist.group.WORLD)
    for _ in range(3):
        off.begin_step()
        step(plain)
    off.flush()
    off.close()
    check(not off.enabled and off.client is None and off.reported == 0 and calls,
          "without a job id: enabled %s, client %r, reported %d, comm hook calls %d"
          % (off.enabled, off.client, off.reported, len(calls)))
    for k, v in saved.items():
        if v is not None:
            os.environ[k] = v

    # --- GPU resolution order, with fake events.
    class FakeEvent:
        made = []

        def __init__(self):
            self.passed = False
            self.waited = False
            self.at = time.perf_counter()
            FakeEvent.made.append(self)

        def query(self):
            return self.passed

        def synchronize(self):
            self.waited = True
            self.passed = True

        def elapsed_time(self, end):
            return (end.at - self.at) * 1e3

    client = RecordingClient()
    gpu = DDP(Model())
    mon = _monitor.DDPMonitor(gpu, client)
    mon._cuda = True
    mon._mark_gpu = lambda device: FakeEvent()
    step(gpu)
    step(gpu)
    check(not client.reports, "reported a step whose GPU events had not passed")
    for e in FakeEvent.made[:2]:  # the first step's start and ready
        e.passed = True
    step(gpu)
    check([r["iteration"] for r in client.reports] == [0] and client.reports[0]["wait"] is None,
          "after the first step's events passed: %s" % client.reports)
    for _ in range(10):
        step(gpu)
    waited = [i for i, e in enumerate(FakeEvent.made) if e.waited]
    check([r["iteration"] for r in client.reports] == list(range(4))
          and len(mon._pending) == 9 and waited,
          "with 8 steps pending the oldest is waited for: reported %s, pending %d"
          % ([r["iteration"] for r in client.reports], len(mon._pending)))
    mon.close()
    order = [r["iteration"] for r in client.reports]
    check(order == list(range(13)), "close() did not report every step in order: %s" % order)
    dist.destroy_process_group()
    print("compute reported for a 30 ms backward sleep, a 150 ms late all-reduce and 100 ms "
          "after backward: %s ms" % measured)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--pythonpath":
        sys.path.insert(0, sys.argv[2])
    main(test)
