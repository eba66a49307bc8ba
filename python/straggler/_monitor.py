"""Monitoring-only PyTorch DDP integration: report each rank's compute time,
leave DDP's collectives as they are.

    ddp = DDP(model)                               # plain DDP, any backend
    mon = straggler.torch.monitor(ddp)             # client from the environment
    for epoch in ...:
        mon.set_epoch(epoch)                       # optional
        for x, y in loader:                        # the training loop is unchanged
            loss_fn(ddp(x), y).backward(); opt.step(); opt.zero_grad()

Why not time forward+backward around the model: DDP all-reduces gradient
buckets while backward still runs, and backward() returns only once every
all-reduce is done, that is once the slowest rank has offered its last bucket.
Every rank then measures the straggler's time (the issue that motivated this
module saw a 1.02x spread with one rank sleeping 60-100 ms per step).

What is measured instead. DDP calls a communication hook for each gradient
bucket, in bucket order, as soon as that bucket and every bucket before it is
ready on this rank. The hook records the time and hands the bucket on to the
all-reduce (by default what torch's `default_hooks.allreduce_hook` does, on
DDP's own process group: divide by the group's size and all_reduce, one
asynchronous all-reduce per bucket as DDP does without a hook). That all-reduce
is asynchronous, so the hook of the LAST bucket runs when this rank's own
backward has produced every gradient, whatever the other ranks are doing.

    compute_seconds  = step start -> last bucket ready (this rank's work only)
    step_seconds     = step start -> next step start (everything, waits too)
    collective_wait  = last bucket ready -> its all-reduce done (CPU only):
                       the part of backward() spent waiting on the other ranks

The step starts at the first forward of the wrapped module (a forward
pre-hook on ddp.module, so after DDP's own forward-time collectives: the
buffer broadcast and the one-time bucket rebuild) with gradients enabled,
unless begin_step() opened it earlier (call it before loading the batch to
count data loading as compute). Forwards under torch.no_grad() (evaluation)
do not start a step; gradient accumulation under ddp.no_sync() stays in the
step that the synchronizing backward ends. Time between the last bucket and
the next step's start (the wait inside backward(), optimizer.step(), data
loading unless begin_step() is used) is not compute.

Clocks: monotonic wall-clock time (time.perf_counter) on CPU, never process
CPU time, which cannot see a rank that is slow because it sleeps or waits.
When the parameters are on a GPU, the step start and the last bucket are
torch.cuda.Event(enable_timing=True) records on the current stream (the hook
runs on the stream that produced the gradients), so the GPU's own timeline is
measured, not the host's enqueueing. Nothing synchronizes on the hot path: a
step's events are resolved at a later step start, once event.query() says the
GPU passed them (after 8 pending steps the oldest is waited for: the GPU passed
it long ago), so a step is reported one step (or a few, on GPU) late, and
close() reports the rest.

What it cannot tell apart. Any other collective inside the step makes this
rank wait for the others there, and that wait counts as compute: SyncBatchNorm
(all-reduces in forward), tensor or pipeline parallelism, a user's all_reduce
between forward and backward. Work in backward after the last parameter's
gradient (gradients of inputs that need them) is not compute. The GPU path is
tested with stand-in events only (python:monitor_only_unit); the CPU path
with 4 real Gloo ranks (integration:monitor_only).

Input wait and work (issue 31). Wrap the loader the training loop iterates,
`for batch in mon.loader(loader):` (a DataLoader, any iterable, or an
iterator): each `__next__` is timed (perf_counter around it), and that time
is the input_wait_seconds of the step the batch goes into: the next step to
start, or the open one (gradient accumulation's further micro-batches),
summed. Input wait is never compute: where it falls inside a step's compute
window (begin_step() before the load, micro-batches) it is taken out of
compute_seconds (on GPU: the host's fetch time out of the GPU's span, exact
when the GPU waited for the batch, too much when it still had queued work;
clamped at 0). monitor(ddp, work=fn) calls fn(batch) on each batch the
wrapped loader yields and reports the sum per step as `work` (> 0, the job's
unit, e.g. the token count from the attention mask); a value that is not a
finite number > 0, or an exception in fn, leaves that step's work out (one
warning, counted in `bad_work`) rather than having the daemon refuse the
step. Why the loader and not the gap after the last gradient bucket: that
gap holds DDP's all-reduce wait and the optimizer, so healthy ranks waiting
on a straggler would look input-bound. The optimizer is not timed (torch
1.13 has no optimizer hooks); pass optimizer_seconds to Client.report
yourself if you time it. Without mon.loader() no input wait or work is
reported, as before.

Iterations are counted from `iteration` (default 0), one per synchronizing
backward, across epochs (the daemon wants iterations that grow);
begin_step(iteration=...) or set_iteration() renumber, e.g. after restoring a
checkpoint.
"""

import atexit
import collections
import logging
import math
import threading
import time
import weakref

import torch
import torch.distributed as dist

from . import Client

__all__ = ["DDPMonitor", "StepTiming", "monitor"]

StepTiming = collections.namedtuple(
    "StepTiming", ["epoch", "iteration", "compute_seconds", "step_seconds",
                   "collective_wait_seconds", "input_wait_seconds", "work"],
    defaults=(None, None))
StepTiming.__doc__ = """One reported step. Times in seconds; step_seconds is None for the
last step (no next start), collective_wait_seconds None on GPU, input_wait_seconds
None without mon.loader(), work None without work= (or when it was invalid)."""

_MAX_PENDING = 8  # GPU steps whose events may still be in flight before one is waited for
_live_monitors = weakref.WeakSet()
_log = logging.getLogger("straggler")
_unmonitored_warned = False  # the warning of a monitor without a client, once per process


class _Input:
    """Input wait and work of batches fetched for one step."""
    __slots__ = ("seconds", "in_step", "work")

    def __init__(self):
        self.seconds = 0.0   # every timed __next__ of the step's batches
        self.in_step = 0.0   # of that, fetched while the step was open (inside compute)
        self.work = None     # sum of work(batch); NaN once one batch's was invalid


class _Step:
    __slots__ = ("epoch", "iteration", "wall_start", "start", "ready", "ready_wall", "done",
                 "step_seconds", "input")

    def __init__(self, epoch, iteration, wall_start, start, input_):
        self.epoch = epoch
        self.iteration = iteration
        self.wall_start = wall_start  # perf_counter: step_seconds, both clocks
        self.start = start            # perf_counter or a recorded cuda.Event
        self.ready = None             # the same, at the last bucket's hook
        self.ready_wall = None
        self.done = None              # perf_counter when the last all-reduce completed
        self.step_seconds = None
        self.input = input_           # _Input, or None without mon.loader()


class DDPMonitor:
    """Reports each step's compute time of one DDP module to stragglerd
    through a straggler.Client; see the module's doc for what is measured.

    Build it with monitor(ddp) before the first backward (DDP takes one
    communication hook, and only before training).

    Thread safety: the class is thread-safe. Its hooks run in the training
    thread's forward, in autograd's backward threads and in the process
    group's completion thread; its methods may be called from any thread. A
    lock guards the step state and is never held while calling the client or
    waiting on the GPU; a second one keeps the reports in iteration order.
    Overlapping steps of one DDP module (two threads training it at once)
    are not supported, as in DDP itself.
    """

    def __init__(self, ddp, client=None, *, epoch=0, iteration=0, process_group=None,
                 comm_hook=None, comm_state=None, work=None):
        if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            raise TypeError("monitor(): expected a DistributedDataParallel module, got %s"
                            % type(ddp).__name__)
        self.ddp = ddp
        self._own_client = client is None
        # Options from the environment (RANK, WORLD_SIZE, STRAGGLER_ENDPOINT,
        # STRAGGLER_JOB_ID, ...), as PartialAllReduceState does; the run id
        # from torch.distributed's store when the environment gives none.
        if client is None:
            from ._launch import run_id  # torch.distributed is initialized: DDP runs
            try:
                client = Client(run_id=run_id(), monitor_only=True)
            except ValueError as e:
                # Monitoring is never the reason training stops (issue 28: a
                # missing STRAGGLER_JOB_ID ended every rank).
                client = None
                _warn_unmonitored(e)
        self.client = client
        # False: no client could be made from the environment; the monitor
        # then does nothing (DDP keeps its own all-reduce, or comm_hook).
        self.enabled = client is not None
        # Without comm_hook, what torch's default_hooks.allreduce_hook does.
        self._group = ddp.process_group if process_group is None else process_group
        self._comm_hook = comm_hook
        self._comm_state = comm_state
        self._device = next((p.device for p in ddp.module.parameters()), torch.device("cpu"))
        self._cuda = self._device.type == "cuda"
        self._lock = threading.Lock()
        self._report_lock = threading.Lock()  # reports leave in iteration order
        self._epoch = epoch
        self._next_iteration = iteration
        self._open = None      # the step between its start and its last bucket
        self._pending = []     # ended steps, not yet reported (oldest first)
        self._closed = False
        self.last = None       # StepTiming of the newest reported step
        self.reported = 0      # steps handed to client.report
        self.dropped = 0       # of those, refused by the client (queue full)
        self.unmatched_backwards = 0  # synchronizing backwards without a started step
        if work is not None and not callable(work):
            raise TypeError("monitor(): work= must be a callable of the batch, got %s"
                            % type(work).__name__)
        self._work_fn = work
        self._input_next = None  # _Input of batches fetched before the next step starts
        self.bad_work = 0        # batches whose work(batch) was invalid or raised
        self._bad_work_warned = False
        if not self.enabled:
            self._closed = True  # every method is then a no-op
            if comm_hook is not None:
                ddp.register_comm_hook(comm_state, comm_hook)
            return
        try:
            ddp.register_comm_hook(self, _monitor_hook)
        except RuntimeError as e:
            raise ValueError("monitor(): this DDP module already has a communication hook (%s); "
                             "pass it as monitor(ddp, comm_hook=hook, comm_state=state) instead, "
                             "and monitor registers it" % e) from e
        self._pre_hook = ddp.module.register_forward_pre_hook(self._on_forward)
        _live_monitors.add(self)

    def loader(self, iterable):
        """Wraps the loader the training loop iterates (a DataLoader, any
        iterable, or an iterator) so that each batch's fetch is timed as the
        input wait of the step it goes into, and work= is called on it (see
        the module's doc). Iterating the result iterates `iterable`; other
        attributes (len(), .sampler, .dataset) are the wrapped object's."""
        return _TimedLoader(self, iterable)

    def set_epoch(self, epoch):
        """The epoch of the steps that start from now on."""
        with self._lock:
            self._epoch = epoch

    def set_iteration(self, iteration):
        """The iteration number of the next step to start (then +1 per step)."""
        with self._lock:
            self._next_iteration = iteration

    def begin_step(self, iteration=None, epoch=None):
        """Starts a step now (optional; the first forward starts one otherwise).
        Call it before loading the batch to count data loading as compute
        (a fetch through mon.loader() is input wait instead, never compute).
        A step already started and not ended is restarted."""
        with self._lock:
            if epoch is not None:
                self._epoch = epoch
            if iteration is not None:
                self._next_iteration = iteration
            elif self._open is not None:
                self._next_iteration = self._open.iteration  # the same step, restarted
            if self._open is not None and self._open.input is not None:
                # Batches fetched for the step restarted now go into the new
                # one, before its start: not inside its compute.
                carried = self._open.input
                carried.in_step = 0.0
                self._input_next = carried
            self._open = None
        self._start()

    def flush(self):
        """Reports every ended step now, waiting for the GPU where needed."""
        self._resolve(wait=True)

    def close(self):
        """Reports the remaining steps and stops timing; DDP's all-reduce goes
        on as before (a DDP module keeps its communication hook). Closes the
        client when monitor() created it. Idempotent; run at exit too."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._open = None
        self._pre_hook.remove()
        self._resolve(wait=True)
        if self._own_client:
            self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        if not self.enabled:
            return "DDPMonitor(disabled: no client)"
        return "DDPMonitor(%s, reported=%d, last=%r)" % ("cuda" if self._cuda else "cpu",
                                                        self.reported, self.last)

    # The hooks.

    def _on_forward(self, module, inputs):
        if torch.is_grad_enabled():  # else evaluation: no backward, so no step
            self._start()
        return None

    def _on_bucket(self, bucket):
        # The bucket is ready now; the clock stops before the all-reduce
        # launch (for the default hook: dividing the bucket, enqueueing).
        now = time.perf_counter()
        if not bucket.is_last():
            return self._reduce(bucket, None)
        ready = self._mark_gpu(bucket.buffer().device) if self._cuda else now
        with self._lock:
            step = self._open
            self._open = None
            if step is None:
                if not self._closed:
                    self.unmatched_backwards += 1
            else:
                step.ready = ready
                step.ready_wall = now
                self._pending.append(step)
        # A CUDA future completes before the GPU does: no wait is measured.
        return self._reduce(bucket, None if self._cuda else step)

    def _reduce(self, bucket, step):
        """The all-reduce of one bucket; on the last one, `step.done` gets
        the time it completed (read after backward() returned: DDP waits for
        the future)."""
        if self._comm_hook is not None:
            future = self._comm_hook(self._comm_state, bucket)
            if step is None:
                return future

            def done(fut):
                step.done = time.perf_counter()
                return fut.value()

            return future.then(done)
        # torch's allreduce_hook (default_hooks.py), with the completion time
        # taken in its one callback rather than in a second one.
        tensor = bucket.buffer()
        tensor.div_(self._group.size())
        future = dist.all_reduce(tensor, group=self._group, async_op=True).get_future()
        if step is None:
            return future.then(_first_tensor)

        def done_default(fut):
            step.done = time.perf_counter()
            return fut.value()[0]

        return future.then(done_default)

    # Internals.

    def _start(self):
        """Opens a step unless one is open: ends the previous step's
        step_seconds, reports what is known, then starts the clock (so that
        reporting is in no step's compute time)."""
        with self._lock:
            if self._open is not None or self._closed:
                return
            now = time.perf_counter()
            for step in self._pending:
                if step.step_seconds is None:
                    step.step_seconds = now - step.wall_start
        self._resolve()
        with self._lock:
            if self._open is not None or self._closed:
                return
            start = self._mark_gpu(self._device) if self._cuda else time.perf_counter()
            self._open = _Step(self._epoch, self._next_iteration, now, start, self._input_next)
            self._input_next = None
            self._next_iteration += 1

    def _fetched(self, seconds, batch):
        """A batch came out of the wrapped loader after `seconds`."""
        if self._closed:  # disabled or closed: nothing to report (read again below)
            return
        work = self._work_of(batch) if self._work_fn is not None else None
        with self._lock:
            if self._closed:
                return
            step = self._open
            if step is not None:
                if step.input is None:
                    step.input = _Input()
                acc = step.input
                acc.in_step += seconds
            else:
                if self._input_next is None:
                    self._input_next = _Input()
                acc = self._input_next
            acc.seconds += seconds
            if self._work_fn is not None:
                if work is None:
                    acc.work = math.nan  # one batch's work unknown: the step's is (NaN stays)
                elif acc.work is None:
                    acc.work = work
                else:
                    acc.work += work

    def _work_of(self, batch):
        """work(batch) as a float > 0, else None (warned once, counted)."""
        try:
            w = float(self._work_fn(batch))
            why = None if math.isfinite(w) and w > 0 else "%r is not a finite number > 0" % w
        except Exception as e:  # noqa: BLE001 - monitoring never stops training
            why = "work(batch) raised %s: %s" % (type(e).__name__, e)
        if why is None:
            return w
        with self._lock:
            self.bad_work += 1
            warn = not self._bad_work_warned
            self._bad_work_warned = True
        if warn:
            _log.warning("straggler.torch.monitor: a step's work is left out: %s "
                         "(further ones are counted in bad_work)", why)
        return None

    def _mark_gpu(self, device):
        # On the current stream of that device: in the hook, the stream that
        # produced the gradients (autograd runs a backward op on its forward's).
        stream = torch.cuda.current_stream(device)
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    def _resolve(self, wait=False):
        """Reports the ended steps whose times are known, oldest first."""
        with self._report_lock:
            self._resolve_locked(wait)

    def _resolve_locked(self, wait):
        ready = []
        with self._lock:
            while self._pending:
                step = self._pending[0]
                if (self._cuda and not wait and len(self._pending) <= _MAX_PENDING
                        and not step.ready.query()):
                    break
                # The step after it has started (its step_seconds is set) or
                # none will: only then may it be reported.
                if step.step_seconds is None and not (wait or self._closed):
                    break
                ready.append(self._pending.pop(0))
        for step in ready:
            if self._cuda:
                step.start.synchronize()  # both passed already, unless waiting was asked for
                step.ready.synchronize()
                compute = step.start.elapsed_time(step.ready) / 1000.0
                wait_s = None
            else:
                compute = step.ready - step.start
                wait_s = None if step.done is None else max(0.0, step.done - step.ready)
            extra = {}
            if step.input is not None:
                compute -= step.input.in_step  # input wait is never compute
                extra["input_wait_seconds"] = step.input.seconds
                work = step.input.work
                if work is not None and math.isfinite(work):
                    extra["work"] = work
            timing = StepTiming(step.epoch, step.iteration, max(0.0, compute), step.step_seconds,
                                wait_s, extra.get("input_wait_seconds"), extra.get("work"))
            # The new keywords only when measured: a client of its own
            # (tests, wrappers) that predates them keeps working.
            ok = self.client.report(step.epoch, step.iteration, timing.compute_seconds,
                                    step_seconds=timing.step_seconds,
                                    collective_wait_seconds=timing.collective_wait_seconds,
                                    **extra)
            with self._lock:
                self.last = timing
                self.reported += 1
                self.dropped += 0 if ok else 1


class _TimedLoader:
    """What DDPMonitor.loader returns: iterating it iterates the wrapped
    object, timing each __next__ (see the module's doc)."""

    def __init__(self, monitor, wrapped):
        self._monitor = monitor
        self._wrapped = wrapped
        # An iterator is consumed as it is; an iterable (a DataLoader, one
        # pass per epoch) gives a fresh iterator to each iter().
        self._it = wrapped if hasattr(wrapped, "__next__") else None

    def __iter__(self):
        if self._it is not None:
            return self
        return _TimedLoader(self._monitor, iter(self._wrapped))

    def __next__(self):
        if self._it is None:  # next() on an iterable: as iter() then next()
            self._it = iter(self._wrapped)
        t0 = time.perf_counter()
        batch = next(self._it)  # StopIteration ends the loop: no batch, no wait
        self._monitor._fetched(time.perf_counter() - t0, batch)
        return batch

    def __len__(self):
        return len(self._wrapped)

    def __getattr__(self, name):
        return getattr(self._wrapped, name)


def _warn_unmonitored(error):
    global _unmonitored_warned
    if _unmonitored_warned:
        return
    _unmonitored_warned = True
    _log.warning("straggler.torch.monitor: not monitoring, training goes on unchanged: %s", error)


def _first_tensor(fut):
    return fut.value()[0]


def _monitor_hook(state, bucket):
    # DDP checks a hook's signature by parameter name ("bucket").
    return state._on_bucket(bucket)


def monitor(ddp, client=None, *, epoch=0, iteration=0, process_group=None, comm_hook=None,
            comm_state=None, work=None):
    """Monitoring only: reports every step's compute time of `ddp` (a
    DistributedDataParallel module) to stragglerd, without changing its
    collectives. Returns the DDPMonitor. Call before the first backward.

    client: a straggler.Client; default one from the environment (RANK,
      WORLD_SIZE, STRAGGLER_ENDPOINT, STRAGGLER_JOB_ID, else torchrun's
      TORCHELASTIC_RUN_ID), marked monitor_only (the daemon never excludes
      its rank: DDP's all-reduce keeps it in) and closed by close(). When the
      environment gives no usable options (no job id), one warning is logged
      (logger "straggler") and the monitor does nothing (`enabled` False):
      training goes on. A client passed here is used as it is: create it with
      monitor_only=True.
    epoch, iteration: those of the first step (then set_epoch(), and one
      iteration per step).
    process_group: the group the default all-reduce uses; default DDP's own.
    comm_hook, comm_state: a communication hook to run instead of the default
      all-reduce (e.g. default_hooks.fp16_compress_hook, process_group), since
      DDP takes only one: monitor times the buckets and calls it.
    work: a callable of a batch returning its work (> 0, one unit for the
      whole job: tokens, samples, a cost such as the sum of squared sequence
      lengths), called on each batch of mon.loader(loader); a step reports
      the sum over its batches. Compute it from data on the CPU (the batch
      before .to(device)): a GPU tensor's .item() waits for the GPU.
    Input wait: iterate mon.loader(loader) instead of loader (module doc).
    """
    return DDPMonitor(ddp, client, epoch=epoch, iteration=iteration, process_group=process_group,
                      comm_hook=comm_hook, comm_state=comm_state, work=work)


@atexit.register
def _close_monitors():
    # Registered after straggler's own atexit hook (this module imports it
    # first), so it runs before the clients close: the last step is reported.
    for mon in list(_live_monitors):
        try:
            mon.close()
        except Exception:  # noqa: BLE001 - at exit, e.g. CUDA already torn down
            pass
