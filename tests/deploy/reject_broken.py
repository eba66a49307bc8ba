#!/usr/bin/env python3
"""Proves the deploy linters can fail: each deliberately broken copy of a
shipped unit or manifest must be rejected by the check that claims to catch
it, and the unmodified file must pass. A linter that accepts everything
fails this test.

  reject_broken.py --source-dir SRC --verify-units SH --k8s-validate PY
                   --stragglerd BIN --agent BIN --python PY
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

UNIT_BREAKS = [
    ("unknown key", "stragglerd.service", "ProtectSystem=strict", "ProtectSystm=strict"),
    ("bad value", "stragglerd.service", "Restart=on-failure", "Restart=sometimes"),
    ("missing binary", "straggler-agent.service", "/usr/local/bin/straggler-agent", "/nonexistent/straggler-agent"),
    ("state database outside the StateDirectory", "stragglerd.service",
     "StateDirectory=stragglerd\n", ""),
    # Later assignments win in systemd units: undo the hardening at the end
    # of [Service]; the exposure threshold must catch it.
    ("drop-in flag the daemon does not have", "stragglerd.service.d/replica.conf",
     "state.db --etcd-endpoints ", "state.db --etcd-endpoint "),
    ("drop-in unknown key", "stragglerd.service.d/replica.conf", "ExecStart=\nExecStart=",
     "ExecStart=\nExecStrat="),
    ("hardening removed", "stragglerd.service", "\n[Install]",
     "\nDynamicUser=no\nCapabilityBoundingSet=~\nSystemCallFilter=\nRestrictAddressFamilies=\n"
     "ProtectSystem=no\nProtectHome=no\nNoNewPrivileges=no\nPrivateDevices=no\nPrivateTmp=no\n"
     "ProtectKernelTunables=no\nProtectKernelModules=no\nRestrictNamespaces=no\nPrivateUsers=no\n"
     "MemoryDenyWriteExecute=no\nProtectControlGroups=no\nProtectProc=default\nProcSubset=all\n\n[Install]"),
]

MANIFEST_BREAKS = [
    ("misspelt field", "stragglerd.yaml", "          readinessProbe:", "          readinesProbe:"),
    ("wrong type", "stragglerd.yaml", "containerPort: 7070", "containerPort: \"seventy\""),
    ("Service targetPort not a container port", "stragglerd.yaml", "targetPort: grpc", "targetPort: grpcc"),
    ("probe on an unknown port", "straggler-agent.yaml", "path: /healthz\n              port: http-metrics",
     "path: /healthz\n              port: metrics"),
    ("flag the daemon does not have", "stragglerd.yaml", "--grpc-address=", "--grpc-addr="),
    ("flag the agent does not have", "straggler-agent.yaml", "--upstream=", "--upstream-address="),
    ("ServiceMonitor port the Service lacks", "servicemonitors.yaml", "- port: http-metrics", "- port: metrics"),
    ("ServiceMonitor unknown field", "servicemonitors.yaml", "honorLabels: true", "honourLabels: true"),
    ("unknown daemon config key", "stragglerd.yaml", "    log_level: info", "    loglevel: info"),
    ("required field missing", "straggler-agent.yaml", "      containers:\n", "      containerz:\n"),
]

# The replicas on etcd (deploy/kubernetes/ha/, checked with the shared files
# but without the single-replica stragglerd.yaml).
HA_BREAKS = [
    ("StatefulSet's Service not headless", "stragglerd-replicas.yaml", "  clusterIP: None\n", ""),
    ("StatefulSet's serviceName names no Service", "stragglerd-replicas.yaml",
     "  serviceName: stragglerd\n", "  serviceName: stragglerd-peers\n"),
    ("a mount of no volume or claim", "etcd.yaml", "            - name: data\n              mountPath",
     "            - name: etcd-data\n              mountPath"),
]

YAML_BREAKS = [
    ("duplicate key", "namespace.yaml", "  name: straggler\n", "  name: straggler\n  name: other\n"),
    ("bad indentation", "servicemonitors.yaml", "      path: /metrics", "       path: /metrics"),
]


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return r.returncode, r.stdout


def main():
    p = argparse.ArgumentParser()
    for a in ("--source-dir", "--verify-units", "--k8s-validate", "--stragglerd", "--agent", "--python"):
        p.add_argument(a, required=True)
    a = p.parse_args()
    units = os.path.join(a.source_dir, "deploy", "systemd")
    kube = os.path.join(a.source_dir, "deploy", "kubernetes")
    daemon_cfg = os.path.join(a.source_dir, "deploy", "stragglerd.yaml")
    yamllint_cfg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "yamllint.yaml")
    have_yamllint = shutil.which("yamllint") is not None
    failures = []
    ran = []      # checks that ran (a skipped one proves nothing)
    skipped = []

    def check(kind, what, cmd, expect_ok):
        rc, out = run(cmd)
        if rc == 77:
            print(f"SKIP {kind}: {what}: {out.strip()}")
            skipped.append(kind)
            return None
        ran.append(kind)
        ok = rc == 0
        verdict = "accepted" if ok else "rejected"
        print(f"{'ok  ' if ok == expect_ok else 'FAIL'} {kind}: {what}: {verdict}")
        if ok != expect_ok:
            failures.append(f"{kind}: {what}")
            print(out)
        elif not expect_ok:
            print("     " + "\n     ".join(l for l in out.splitlines() if "FAIL" in l or "ERROR" in l
                                          or "ignoring" in l or "not executable" in l or "error" in l)[:600])
        return ok

    with tempfile.TemporaryDirectory() as tmp:
        def broken(src_dir, name, old, new):
            text = open(os.path.join(src_dir, name)).read()
            if old not in text:
                failures.append(f"break pattern {old!r} not found in {name}: update this test")
                return None
            d = tempfile.mkdtemp(dir=tmp)
            for f in os.listdir(src_dir):
                if os.path.isfile(os.path.join(src_dir, f)):
                    shutil.copy(os.path.join(src_dir, f), d)
                elif os.path.isdir(os.path.join(src_dir, f)):  # a unit's drop-ins
                    shutil.copytree(os.path.join(src_dir, f), os.path.join(d, f))
            with open(os.path.join(d, name), "w") as f:
                f.write(text.replace(old, new, 1))
            return d

        def units_cmd(d):
            return ["sh", a.verify_units, a.stragglerd, a.agent] + [
                os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".service")]

        # The agent's flags come from its --help when the real agent is built
        # (a stand-in binary has no --help).
        agent_help = run([a.agent, "--help"])[1] if os.access(a.agent, os.X_OK) else ""
        agent_args = ["--agent", a.agent] if "--upstream" in agent_help else []

        def k8s_cmd(d):
            return [a.python, a.k8s_validate, "--daemon-config", daemon_cfg, "--stragglerd",
                    a.stragglerd] + agent_args + [os.path.join(d, f) for f in sorted(os.listdir(d))
                                                  if f.endswith(".yaml")]

        def yamllint_cmd(d):
            return ["yamllint", "-c", yamllint_cfg, d]

        check("units", "as shipped", units_cmd(units), True)
        for what, name, old, new in UNIT_BREAKS:
            d = broken(units, name, old, new)
            if d:
                check("units", f"{what} ({name})", units_cmd(d), False)
        check("manifests", "as shipped", k8s_cmd(kube), True)
        for what, name, old, new in MANIFEST_BREAKS:
            d = broken(kube, name, old, new)
            if d:
                check("manifests", f"{what} ({name})", k8s_cmd(d), False)
        ha = tempfile.mkdtemp(dir=tmp)
        for f in ("namespace.yaml", "straggler-agent.yaml", "servicemonitors.yaml"):
            shutil.copy(os.path.join(kube, f), ha)
        for f in os.listdir(os.path.join(kube, "ha")):
            shutil.copy(os.path.join(kube, "ha", f), ha)
        check("manifests", "replicas on etcd (ha/) as shipped", k8s_cmd(ha), True)
        for what, name, old, new in HA_BREAKS:
            d = broken(ha, name, old, new)
            if d:
                check("manifests", f"{what} (ha/{name})", k8s_cmd(d), False)
        if have_yamllint:
            check("yamllint", "as shipped", yamllint_cmd(kube), True)
            for what, name, old, new in YAML_BREAKS:
                d = broken(kube, name, old, new)
                if d:
                    check("yamllint", f"{what} ({name})", yamllint_cmd(d), False)
        else:
            print("SKIP yamllint: not installed (apt-get install yamllint)")

    if failures:
        print("\nNOT REJECTED / WRONG:\n  " + "\n  ".join(failures))
        return 1
    if not ran:
        # Every linter was missing: report a skip (77), never a pass.
        print("\nSKIPPED: no linter ran (" + ", ".join(sorted(set(skipped))) + ")")
        return 77
    print("\nevery broken file was rejected by the checks that ran (" +
          ", ".join(sorted(set(ran))) + ")" +
          (("; skipped: " + ", ".join(sorted(set(skipped)))) if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
