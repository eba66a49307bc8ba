#!/usr/bin/env python3
"""README's DDP exclusion example is the one of the straggler.torch docstring.

    readme_ddp_example.py --source-dir REPO_ROOT

The example code of python/straggler/torch.py's module docstring (the
indented block from `import straggler` to the first blank line) must appear,
line for line, as a ```python block of README.md: the one that registers
`partial_allreduce_hook`. The README's copy once lacked the
`plan.rejoin_iteration` skip, and a rank readmitted after following it stalled
the group.

Every ```python block of README.md must also say what it assumes (issue 28:
the exclusion example used `epoch`, `steps` and `opt` undefined): each name
it uses without defining it (not a builtin, not imported or assigned in the
block) is listed on a `# assumes ...:` comment line of the block.

Python 3 standard library only; exit 1 naming the first difference.
"""

import argparse
import ast
import builtins
import difflib
import os
import re
import sys

HOOK = "register_comm_hook(state, straggler.torch.partial_allreduce_hook)"


def docstring_example(path):
    with open(path, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read()), clean=False)
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("import straggler"))
    block = []
    for line in lines[start:]:
        if not line.strip():
            break
        block.append(line[4:] if line.startswith("    ") else line)
    return block


def readme_examples(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return [m.group(1).splitlines() for m in re.finditer(r"^```python\n(.*?)^```$", text, re.M | re.S)]


def unstated_names(block):
    """Names the block uses but neither defines nor lists on an `# assumes`
    line, sorted."""
    text = "\n".join(block)
    tree = ast.parse(text)
    defined, used = set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else defined).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
    assumed, in_assumes = set(), False
    for line in block:
        stripped = line.strip()
        if stripped.startswith("# assumes"):
            in_assumes = True
        elif not stripped.startswith("#"):
            in_assumes = False
        if in_assumes:
            assumed.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", stripped.split(":", 1)[-1]))
    return sorted(used - defined - assumed)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source-dir", required=True)
    args = ap.parse_args()
    expected = docstring_example(os.path.join(args.source_dir, "python", "straggler", "torch.py"))
    if not any(HOOK in line for line in expected) or not any("rejoin_iteration" in line
                                                             for line in expected):
        print("FAILED: the straggler.torch docstring example lost its hook or its rejoin skip")
        return 1
    examples = readme_examples(os.path.join(args.source_dir, "README.md"))
    for block in examples:
        missing = unstated_names(block)
        if missing:
            print("FAILED: a README ```python block uses %s without defining them or listing "
                  "them on a '# assumes ...:' line:\n%s" % (", ".join(missing), "\n".join(block)))
            return 1
    candidates = [b for b in examples if any(HOOK in line for line in b)]
    if not candidates:
        print("FAILED: README has no ```python block with %s" % HOOK)
        return 1
    for block in candidates:
        if block == expected:
            print("PASSED: README's DDP example is the docstring's (%d lines)" % len(expected))
            return 0
    diff = difflib.unified_diff(expected, candidates[0], "torch.py docstring", "README.md",
                                lineterm="")
    print("FAILED: README's DDP example differs from the straggler.torch docstring:")
    print("\n".join(diff))
    return 1


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    sys.exit(main())
