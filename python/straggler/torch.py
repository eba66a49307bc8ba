"""PyTorch DDP integration: average gradients among the ACTIVE ranks only.

    import straggler, straggler.torch
    # assumes your DDP script's: dist, DDP, time, model, opt, loss_fn, batch(it) -> (x, y),
    # steps, epoch
    dist.init_process_group("gloo", ...)                 # DDP's own bootstrap
    ddp = DDP(model, broadcast_buffers=False, find_unused_parameters=False)
    state = straggler.torch.PartialAllReduceState()      # client + reducer from env
    ddp.register_comm_hook(state, straggler.torch.partial_allreduce_hook)
    it = 0
    while it < steps:
        plan = state.begin_step(it, model=ddp.module, optimizer=opt)  # before forward
        if plan.rejoin_iteration is not None:            # excluded, readmitted there:
            it = plan.rejoin_iteration                   # skip the shadow steps up to it
            continue
        x, y = batch(it)
        start = time.perf_counter()
        loss_fn(ddp(x), y).backward()                    # the hook reduces each bucket
        state.end_step(epoch, time.perf_counter() - start)  # reports compute time
        state.optimizer_step(opt)                        # skipped on an excluded rank
        opt.zero_grad()
        it += 1

GPUs: under init_process_group("nccl") the state's reducer is
straggler.PartialAllReduce(backend="nccl", device=torch.cuda.current_device())
(pass backend= to choose): the hook averages the CUDA buckets in place on
torch's current stream, with the project's own NCCL communicators (torchrun
example and NCCL version rules: docs/gpu.md). Gloo stays the CPU backend.

Hybrid jobs (pipeline/tensor x data parallelism, docs/hybrid.md): one state
per model chunk, each over that chunk's data-parallel group, the DDP module
built over the same group (process_group=):

    s0 = PartialAllReduceState(client, group_ranks=dp_ranks, group_replicas=reps,
                               group_name="stage1.chunk0", replica_of=replica_of)
    s1 = PartialAllReduceState(client, group_ranks=..., group_name="stage1.chunk1",
                               group_replicas=..., switch_from=s0.reducer)

The hook then averages over the group's active replicas, and begin_step(it,
model=chunk) broadcasts that chunk's parameters and optimizer state from the
lowest active replica when a replica rejoins. Every group follows one job-wide
switch (built by the first state, shared by switch_from=), so a replica leaves
and rejoins every group at the same iteration. Call begin_step on the chunks in
the same order on every rank.

Why a hook on the project's own Gloo contexts and not torch.distributed
subgroups: in torch 1.13 `new_group` must be entered by every rank of the
default group, the straggler too, so building a subgroup waits on the very rank
it leaves out. straggler.PartialAllReduce builds one Gloo context per active
set, by its members only, through a rendezvous store: here the one
init_process_group made (`rendezvous_store()`: a PrefixStore
'straggler/<job>/<run>/<launch>/' over it), not stragglerd's.

No daemon needed: the run id (`run_id()`: STRAGGLER_RUN_ID, else a
TORCHELASTIC_RUN_ID other than 'none', else a UUID rank 0 publishes in that
store) and the rendezvous come from torch.distributed, so a job whose daemon
is absent at start, or gone, trains on the full group: the client retries in
the background, begin_step's membership stays uncertain (one
membership_timeout wait per outage, then none) and the in-band agreement
keeps the set it applied, everyone at the start. Once the daemon answers,
reports reach it and exclusion works from then on. Without torch.distributed
initialized (or with rendezvous_endpoint= or store= given), the reducer
rendezvouses as its options say: stragglerd's RendezvousService by default.

What DDP itself must not do (each is a collective on the FULL group, which the
active ranks would then wait on the straggler for):
  * find_unused_parameters=False: True all-reduces the used-parameter bitmap
    through the process group every step;
  * broadcast_buffers=False: True broadcasts module buffers (BatchNorm running
    stats) from rank 0 at every forward. Buffers are instead sent with the
    parameters by begin_step when a rank rejoins.
  * no DDP `join()` context and no other torch.distributed collective in the
    step. DDP's construction (a parameter broadcast) and its one-time bucket
    rebuild at the second forward do use the full group: every rank is
    present then, since an excluded rank keeps running forward and backward.

An excluded rank gets back its own local gradients from the hook; it must not
apply them (it did not take part in the average): `optimizer_step` skips it.
Rejoin: at the iteration where a rank is readmitted (and at the first
iteration), begin_step broadcasts, from the lowest active rank, the
parameters, the module buffers, the optimizer state and the step counter
(`steps_taken`), so the readmitted rank continues from the group's model.

Skipping to the rejoin: an excluded rank is usually behind the group (it is
excluded for being slow). Once it holds the version that readmits it, its
plan names that version's effective iteration (`plan.rejoin_iteration`,
None otherwise), and begin_step at that iteration is certain at once for it.
Its shadow steps before then would be overwritten by the broadcast, and the
group would wait at the rejoin for it to work through them, so the loop
above calls begin_step(plan.rejoin_iteration) next, running nothing for the
iterations in between (no forward, backward, report or optimizer step). Its
data loader skips the same batches. DDP has no collective of its own to miss
there once its bucket rebuild (the second forward, see above) is done, and a
rank has always run that far before it can be excluded in a fresh job
(exclusion takes effect `lead_iterations` after the reports that caused it).
A trainer that restarts against a daemon still holding its rank excluded
must run two steps before it skips.
"""

import array
import io
import time

import torch

import torch.distributed as dist

from . import Client, PartialAllReduce
from ._launch import rendezvous_store, run_id
from ._monitor import DDPMonitor, StepTiming, monitor  # noqa: F401 - monitoring only

__all__ = ["PartialAllReduceState", "partial_allreduce_hook", "monitor", "run_id",
           "rendezvous_store"]


class PartialAllReduceState:
    """Per-process state of the hook: the client, the PartialAllReduce and the
    plan of the current step. Create one per process, before training.

    The membership is decided once per step, in begin_step: DDP calls the hook
    once per gradient bucket, and every bucket of a step must be reduced among
    the same ranks.

    Thread safety: used by the training thread (and DDP's hook, which runs
    inside that thread's backward); not for concurrent steps.
    """

    def __init__(self, client=None, reducer=None, backend=None, **options):
        # Client options come from the environment (RANK, WORLD_SIZE,
        # STRAGGLER_ENDPOINT, STRAGGLER_JOB_ID, ...) when no client is given.
        # With torch.distributed initialized, the run id and the rendezvous
        # come from its store (straggler._launch): no daemon is needed to
        # start, and a second launch under the same job id reads none of the
        # first one's keys.
        # backend: "nccl" when the process group is NCCL's, else "gloo"; NCCL
        # runs on the current CUDA device unless device= says otherwise.
        torch_store = dist.is_available() and dist.is_initialized()
        if client is None:
            client = Client(run_id=run_id()) if torch_store else Client()
        self.client = client
        if reducer is None:
            if backend is None:
                backend = "nccl" if torch_store and dist.get_backend() == "nccl" else "gloo"
            if backend == "nccl" and "device" not in options and torch.cuda.is_available():
                options["device"] = torch.cuda.current_device()
            if torch_store and "store" not in options and "rendezvous_endpoint" not in options:
                options["store"] = rendezvous_store(client)
            reducer = PartialAllReduce(client, backend=backend, **options)
        self.reducer = reducer
        self.plan = None
        self.iteration = None
        self.participated = False
        self.buckets = 0
        self.collective_seconds = 0.0
        self.steps_taken = 0  # optimizer steps applied; broadcast on rejoin
        self.synced_at = []   # iterations at which begin_step broadcast the model

    def begin_step(self, iteration, model=None, optimizer=None):
        """Apply the membership switch rule for `iteration` (call before the
        forward pass, with strictly increasing iterations). When the plan says
        so, broadcast the model, its buffers, the optimizer state and the step
        counter from the lowest active rank. Returns the StepPlan; on an
        excluded rank whose readmission is known, plan.rejoin_iteration is
        where to call begin_step next (see the module's doc)."""
        self.plan = self.reducer.begin_iteration(iteration)
        self.iteration = iteration
        self.participated = self.plan.participating
        self.buckets = 0
        self.collective_seconds = 0.0
        if self.plan.sync_parameters and self.plan.participating:
            if model is None:
                raise ValueError(
                    "begin_step(%d): the plan asks for a parameter broadcast (a rank joins "
                    "at this iteration) but no model was given" % iteration)
            self._sync(model, optimizer)
        return self.plan

    def end_step(self, epoch, step_seconds):
        """Report this step to stragglerd: compute time = step_seconds minus the
        time the hook spent in collectives (waiting on other ranks is not this
        rank's slowness)."""
        compute = max(0.0, step_seconds - self.collective_seconds)
        return self.client.report(epoch, self.iteration, compute, step_seconds=step_seconds,
                                  collective_wait_seconds=self.collective_seconds)

    def optimizer_step(self, optimizer):
        """optimizer.step() when this rank took part in the step's average;
        an excluded rank skips it. Returns whether it stepped."""
        if not self.participated:
            return False
        optimizer.step()
        self.steps_taken += 1
        return True

    def _sync(self, model, optimizer):
        # Pass 1, fixed sizes on every rank: the step counter and the size of
        # the root's serialized optimizer state (its structure may differ on
        # a rank that stepped less, e.g. momentum buffers not yet created).
        blob = b""
        if optimizer is not None and self.client.rank == self.plan.root:
            out = io.BytesIO()
            torch.save(optimizer.state_dict(), out)
            blob = out.getvalue()
        # array.array, not numpy: a GPU machine's pip torch may come without numpy.
        header = array.array("q", [self.steps_taken, len(blob)])
        self.reducer.sync_parameters([header])
        self.steps_taken = int(header[0])
        # Pass 2: parameters and buffers in place (same shapes everywhere, as
        # DDP checks at construction), and the optimizer state bytes.
        tensors = [p.data for p in model.parameters()] + [b.data for b in model.buffers()]
        for t in tensors:
            if not t.is_contiguous():
                raise ValueError("begin_step: a parameter or buffer of shape %s is not "
                                 "contiguous; it cannot be broadcast in place" % (tuple(t.shape),))
        state = bytearray(blob) if blob else bytearray(int(header[1]))
        self.reducer.sync_parameters(tensors + ([state] if len(state) else []), **_stream_of(tensors))
        if optimizer is not None and len(state) and self.client.rank != self.plan.root:
            optimizer.load_state_dict(torch.load(io.BytesIO(bytes(state))))
        self.synced_at.append(self.iteration)


def _stream_of(tensors):
    # The caller's current CUDA stream for CUDA tensors (the NCCL backend
    # queues its collective after the backward's kernels there); nothing for
    # host buffers, which the Gloo backend reduces.
    for t in tensors:
        if getattr(t, "is_cuda", False):
            return {"stream": torch.cuda.current_stream(t.device).cuda_stream}
    return {}


def partial_allreduce_hook(state, bucket):
    """DDP communication hook (torch 1.13: ddp.register_comm_hook(state, hook)).
    Averages the bucket among the active ranks of state.plan through the
    project's Gloo context, or for a CUDA bucket its NCCL communicator, in
    place on torch's current stream; on an excluded rank returns the bucket
    unchanged.
    state.begin_step must have been called for this step."""
    if state.plan is None:
        raise RuntimeError("partial_allreduce_hook: state.begin_step(iteration) was not called "
                           "before the first backward")
    buffer = bucket.buffer()
    start = time.perf_counter()
    result = state.reducer.all_reduce_average(buffer, **_stream_of([buffer]))  # in place, GIL released
    state.collective_seconds += time.perf_counter() - start
    state.buckets += 1
    if not result["participated"]:
        state.participated = False
    future = torch.futures.Future()
    future.set_result(buffer)
    return future
