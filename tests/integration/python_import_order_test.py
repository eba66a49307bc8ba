#!/usr/bin/env python3
"""`import straggler` loads torch first where torch is installed
(docs/gpu.md "Import order"):

  * in a fresh interpreter, `import straggler` alone leaves torch in
    sys.modules, and torch was imported before the extension was loaded
    (on a GPU machine with pip's torch 2.11, the other order ended the process
    with SIGSEGV inside torch's own import; this machine's Debian torch does
    not crash either way, so the order itself is what is checked here);
  * a torch that fails to import does not stop `import straggler` or a
    Client (a trainer that does not use torch must not fail because of it);
  * where torch is not installed, or STRAGGLER_IMPORT_TORCH=0, nothing is
    imported for it.
"""

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import check, main  # noqa: E402

# Records, when the extension is first looked for, whether torch is already
# imported then (in sys.modules: not merely looked for with find_spec).
PROBE = r"""
import sys
order = []
class Probe:
    def find_spec(self, name, path=None, target=None):
        if name == "straggler._straggler" and name not in order:
            if "torch" in sys.modules and hasattr(sys.modules["torch"], "Tensor"):
                order.append("torch")
            order.append(name)
        return None
sys.meta_path.insert(0, Probe())
import straggler
c = straggler.Client(job_id="import-order", rank=0, world_size=1, endpoint="127.0.0.1:9")
c.close()
print("ORDER " + ",".join(order))
print("TORCH_LOADED %s" % ("torch" in sys.modules and hasattr(sys.modules["torch"], "Tensor")))
"""


def probe(pythonpath, extra_path=None, **env_set):
    path = [p for p in (extra_path, pythonpath) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    env.pop("STRAGGLER_IMPORT_TORCH", None)  # the default unless the case sets it
    env.update(env_set)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         timeout=120)
    check(out.returncode == 0, "import straggler failed (exit %d):\n%s" %
          (out.returncode, (out.stdout + out.stderr)[-2000:]))
    lines = dict(l.split(" ", 1) for l in out.stdout.splitlines() if l.startswith(("ORDER", "TORCH")))
    return lines["ORDER"].split(","), lines["TORCH_LOADED"] == "True"


def test(args):
    have_torch = importlib.util.find_spec("torch") is not None
    order, loaded = probe(args.pythonpath)
    if have_torch:
        check(loaded, "torch is installed but `import straggler` did not import it")
        check(order == ["torch", "straggler._straggler"],
              "torch must be imported before the extension, the order was %s" % order)
    else:
        check(not loaded and order == ["straggler._straggler"],
              "torch is not installed, yet the import order was %s" % order)
    print("import order: %s (torch installed: %s)" % (",".join(order), have_torch))

    order, loaded = probe(args.pythonpath, STRAGGLER_IMPORT_TORCH="0")
    check(not loaded and order == ["straggler._straggler"],
          "STRAGGLER_IMPORT_TORCH=0, yet torch was imported (order %s)" % order)
    print("STRAGGLER_IMPORT_TORCH=0: torch not imported")

    with tempfile.TemporaryDirectory() as broken:
        os.makedirs(os.path.join(broken, "torch"))
        with open(os.path.join(broken, "torch", "__init__.py"), "w") as f:
            f.write("raise OSError('libcudart.so.13: cannot open shared object file')\n")
        order, loaded = probe(args.pythonpath, extra_path=broken)
        check(not loaded, "a torch that fails to import was reported as loaded")
        check("straggler._straggler" in order, "the extension was not loaded: %s" % order)
    print("a torch that fails to import: straggler imports, Client works")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pythonpath", required=True)
    a = parser.parse_args()
    main(lambda: test(a))
