#!/usr/bin/env python3
"""PyTorch DDP with straggler.torch.partial_allreduce_hook, end to end: four
real rank processes (torch_ddp_rank.py: torch.distributed on Gloo with a
FileStore for DDP's bootstrap, the straggler client and PartialAllReduce
through the pybind11 module) against the real stragglerd on loopback.
Detection is off; rank 3 (the slow one) is excluded mid-run and readmitted
later with `stragglerctl override`, as collective_test.py does.

Checks:
  * every rank switches at each version's effective iteration; rank 3 takes
    no part while excluded and does not step its optimizer;
  * a float32 torch tensor averaged outside DDP equals the active ranks' mean
    exactly (multiples of 12);
  * the model on the active ranks matches a reference trained here, in one
    process, on the active ranks' gradients only (same seeds and data). The
    model is float64, and the only difference from the reference is the order
    in which Gloo sums 3 or 4 gradients (and divides once): a relative error
    of a few 1e-16 per step, which 80 steps of SGD with momentum on this small
    smooth model keep far below the 1e-9 bound. The same reference with all
    four ranks' gradients at every step must differ by more than 1e-6, so the
    comparison can tell the two apart;
  * rank 3, behind the group while excluded (it is 8x slower), skips its
    remaining shadow steps once its plan names the rejoin iteration
    (plan.rejoin_iteration), as straggler.torch's doc says a trainer should:
    it runs no step between the skip and the rejoin;
  * the readmitted rank ends with exactly the parameters of the others (it
    received parameters, momentum and step counter at its rejoin).
"""

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon, RankProcesses, check, ctl, require_torch, run_main  # noqa: E402

WORLD = 4
JOB = "torch-ddp"
ITERATIONS = 80
DEADLINE_S = 180
TOLERANCE = 1e-9


class Ranks(RankProcesses):
    def __init__(self, python, rank_script, daemon_address, workdir, pythonpath):
        env = dict(os.environ, PYTHONPATH=pythonpath, OMP_NUM_THREADS="1")
        store = os.path.join(workdir, "ddp.store")
        cmds = [[python, rank_script, "--daemon", daemon_address, "--job", JOB,
                 "--rank", str(r), "--world-size", str(WORLD), "--store", store,
                 "--iterations", str(ITERATIONS),
                 # Rank 3 is slow: while excluded it falls far enough behind
                 # the group to skip to its rejoin iteration.
                 "--step-ms", "80" if r == 3 else "10"] for r in range(WORLD)]
        super().__init__(cmds, workdir, DEADLINE_S, env=env, err_tail=3000)


def reference(rank_module, active_per_iteration):
    """Single-process training on the active ranks' gradients only."""
    import torch
    model = rank_module.make_model()
    opt = rank_module.make_optimizer(model.parameters())
    for it, active in enumerate(active_per_iteration):
        grads = None
        for r in active:
            model.zero_grad()
            x, y = rank_module.batch(r, it)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            g = [p.grad.detach().clone() for p in model.parameters()]
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        for p, g in zip(model.parameters(), grads):
            p.grad = g / len(active)
        opt.step()
    return [v for t in model.parameters() for v in t.detach().reshape(-1).tolist()]


def max_diff(a, b):
    check(len(a) == len(b), "parameter counts differ: %d vs %d" % (len(a), len(b)))
    return max(abs(x - y) for x, y in zip(a, b))


def switch_iteration(lines, version):
    for r in range(WORLD):
        first = next((row for row in lines[r] if row["version"] >= version), None)
        check(first is not None, "rank %d never applied version %d" % (r, version))
        check(first["version"] == version and first["it"] == first["effective_iteration"],
              "rank %d applied version %d at iteration %d, effective at %d"
              % (r, first["version"], first["it"], first["effective_iteration"]))
    its = {next(row["it"] for row in lines[r] if row["version"] >= version) for r in range(WORLD)}
    check(len(its) == 1, "ranks switched to version %d at different iterations %s" % (version, its))
    return its.pop()


def test(args):
    here = os.path.dirname(os.path.abspath(__file__))
    require_torch()
    sys.path.insert(0, args.pythonpath)
    import torch_ddp_rank as rank_module  # the same model, data and optimizer as the ranks

    with tempfile.TemporaryDirectory(prefix="torch-ddp-") as workdir:
        config = os.path.join(workdir, "stragglerd.yaml")
        with open(config, "w") as f:
            f.write("policy:\n  exclusion_enabled: false\n")  # only the test's overrides
        with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as d:
            ranks = Ranks(args.python, os.path.join(here, "torch_ddp_rank.py"), d.address,
                          workdir, args.pythonpath)
            try:
                ranks.wait_all_past(12)
                ctl(args.ctl, d.address, "override", JOB, "3", "exclude", "--reason", "test")
                ranks.wait_all_past(45, ranks=[0, 1, 2])
                ctl(args.ctl, d.address, "override", JOB, "3", "include", "--reason", "test")
                ranks.finish()
            finally:
                ranks.kill()
            check(d.stop() == 0, "stragglerd did not exit cleanly")

    final = ranks.final
    skips = {r: [row for row in ranks.lines[r] if "skip_to" in row] for r in range(WORLD)}
    lines = {r: [row for row in ranks.lines[r] if "skip_to" not in row] for r in range(WORLD)}
    by_it = {r: {row["it"]: row for row in lines[r]} for r in range(WORLD)}
    for r in range(WORLD):
        if r != 3:
            check(not skips[r] and len(lines[r]) == ITERATIONS,
                  "rank %d printed %d iterations and skipped at %s" % (r, len(lines[r]), skips[r]))
        bad = final[r]["bad_buffers"]
        for name, needle in [("int32", "neither float32 nor float64"),
                             ("strided", "not C-contiguous"), ("readonly", "not writable")]:
            check(bad[name] is not None and needle in bad[name],
                  "rank %d: a %s buffer was not refused with '%s': %r" % (r, name, needle, bad[name]))
    versions = sorted({row["version"] for row in lines[0]})
    check(len(versions) == 3, "expected versions 0, exclusion, readmission; saw %s" % versions)
    out_at = switch_iteration(lines, versions[1])
    back_at = switch_iteration(lines, versions[2])
    check(len(skips[3]) == 1, "rank 3 skipped %d times (%s), expected once, to its rejoin at %d"
          % (len(skips[3]), skips[3], back_at))
    skip = skips[3][0]
    check(skip["skip_to"] == back_at and not skip["participating"] and out_at <= skip["it"] < back_at,
          "rank 3 skipped from %d to %s (participating %s); excluded from %d to %d"
          % (skip["it"], skip["skip_to"], skip["participating"], out_at, back_at))
    ran = [row["it"] for row in lines[3]]
    check(ran == list(range(skip["it"])) + list(range(back_at, ITERATIONS)),
          "rank 3 ran iterations %s, expected 0..%d and %d..%d"
          % (ran, skip["it"] - 1, back_at, ITERATIONS - 1))

    active_per_iteration = []
    for it in range(ITERATIONS):
        # Rank 3 is missing at the iterations it skipped; were it in the
        # active set there, the participants would not match it below.
        rows = {r: by_it[r][it] for r in range(WORLD) if it in by_it[r]}
        participants = [r for r in rows if rows[r]["participating"]]
        active = rows[0]["active"]
        check(participants == active,
              "iteration %d: active set %s but ranks %s took part" % (it, active, participants))
        want_active = [0, 1, 2] if out_at <= it < back_at else [0, 1, 2, 3]
        check(active == want_active, "iteration %d: active %s, expected %s" % (it, active, want_active))
        for r, row in rows.items():
            check(row["certain"], "iteration %d rank %d: membership not certain" % (it, r))
            check(row["stepped"] == (r in active),
                  "iteration %d rank %d: stepped=%s although %s" % (
                      it, r, row["stepped"], "active" if r in active else "excluded"))
            if r in active:
                want = sum(12.0 * (a + 1) + 12.0 * (it % 7) for a in active) / len(active)
                check(row["probe"] == [want] * 5,
                      "iteration %d rank %d: float32 average %s, expected %s" % (it, r, row["probe"], want))
            else:
                check(row["probe"][0] == 12.0 * (r + 1) + 12.0 * (it % 7) and row["buckets"] >= 1,
                      "iteration %d: excluded rank %d's buffer changed (or DDP ran no hook)" % (it, r))
        active_per_iteration.append(active)
    check(all(by_it[r][back_at]["synced"] for r in range(WORLD)),
          "not every rank broadcast the model at the rejoin iteration %d" % back_at)
    check(not any(by_it[r][out_at]["synced"] for r in range(WORLD)), "a rank broadcast on a shrink")

    for r in range(1, WORLD):
        check(final[r]["final"] == final[0]["final"],
              "rank %d ended with parameters %g away from rank 0's" % (r, max_diff(final[r]["final"],
                                                                                     final[0]["final"])))
        check(final[r]["steps_taken"] == final[0]["steps_taken"],
              "rank %d's step counter %d, rank 0's %d" % (r, final[r]["steps_taken"],
                                                          final[0]["steps_taken"]))
    want = reference(rank_module, active_per_iteration)
    diff = max_diff(final[0]["final"], want)
    check(diff <= TOLERANCE, "the active ranks' model is %g away from the reference trained on "
          "the active ranks' gradients (bound %g)" % (diff, TOLERANCE))
    naive = reference(rank_module, [[0, 1, 2, 3]] * ITERATIONS)
    naive_diff = max_diff(final[0]["final"], naive)
    check(naive_diff > 1e-6, "the model is only %g away from one trained on all four ranks' "
          "gradients: the test cannot tell the two apart" % naive_diff)
    # Membership callbacks (on the client's thread, through the GIL) saw both changes.
    for r in range(WORLD):
        cb = final[r]["callback_versions"]
        check(versions[1] in cb and versions[2] in cb,
              "rank %d's membership callback saw versions %s, not %s" % (r, cb, versions[1:]))
        check(final[r]["last_version"] == versions[2] and final[r]["membership_ok"],
              "rank %d: membership_for(last) = version %s ok=%s"
              % (r, final[r]["last_version"], final[r]["membership_ok"]))
    print("rank 3 out at iteration %d, skipped from %d to its rejoin at %d; reference difference %.3g (all-ranks "
          "reference %.3g); all 4 ranks end equal" % (out_at, skip["it"], back_at, diff, naive_diff))


if __name__ == "__main__":
    # --python: an interpreter that imports torch; --pythonpath: the build's python/.
    run_main(test, "stragglerd", "ctl", "python", "pythonpath")
