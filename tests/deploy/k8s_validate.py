#!/usr/bin/env python3
"""Offline schema and consistency check of the Kubernetes manifests.

No cluster is needed: `kubectl apply/create --dry-run=client` asks the API
server for discovery and OpenAPI even in client mode, so it cannot run here.
Instead every built-in object is checked against the models of the official
Kubernetes Python client (Debian `python3-kubernetes`, generated from the
Kubernetes OpenAPI spec): unknown fields (a typo such as `readinesProbe`),
wrong types (`containerPort: "abc"`) and missing required fields are errors.
ServiceMonitors (a CRD, not in those models) are checked against the fields
of the Prometheus Operator's monitoring.coreos.com/v1 schema used here.
Then the manifests are checked against each other and against the binaries:
Service selectors match pod labels, named ports exist, probes and
ServiceMonitors use real ports, container flags are flags the binaries have,
the ConfigMap's stragglerd.yaml uses only keys of deploy/stragglerd.yaml.

Exit 0: all good; 1: errors (listed); 77: python3-kubernetes is missing.
"""
import argparse
import re
import sys

import yaml

try:
    from kubernetes import client as k8s
except ImportError:  # CI installs it (scripts/install-deps.sh)
    print("SKIP: python3-kubernetes is not installed (apt-get install python3-kubernetes)")
    sys.exit(77)

PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float), "datetime": str, "date": str}

# monitoring.coreos.com/v1 ServiceMonitor: the spec and endpoint fields of the
# Prometheus Operator CRD (v0.60+); None = any value.
SERVICE_MONITOR_SPEC = {
    "endpoints": "endpoints", "selector": "V1LabelSelector", "namespaceSelector": "namespaceSelector",
    "jobLabel": "str", "targetLabels": "list[str]", "podTargetLabels": "list[str]",
    "sampleLimit": "int", "targetLimit": "int", "labelLimit": "int", "labelNameLengthLimit": "int",
    "labelValueLengthLimit": "int", "attachMetadata": None, "keepDroppedTargets": "int",
    "scrapeProtocols": "list[str]", "bodySizeLimit": "str", "scrapeClass": "str",
}
SERVICE_MONITOR_ENDPOINT = {
    "port": "str", "targetPort": None, "path": "str", "scheme": "str", "params": None,
    "interval": "str", "scrapeTimeout": "str", "tlsConfig": None, "bearerTokenFile": "str",
    "bearerTokenSecret": None, "authorization": None, "honorLabels": "bool",
    "honorTimestamps": "bool", "trackTimestampsStaleness": "bool", "basicAuth": None,
    "oauth2": None, "metricRelabelings": None, "relabelings": None, "proxyUrl": "str",
    "followRedirects": "bool", "enableHttp2": "bool", "filterRunning": "bool",
}
DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")


class Checker:
    def __init__(self):
        self.errors = []

    def err(self, where, msg):
        self.errors.append(f"{where}: {msg}")

    def check_type(self, value, type_name, where):
        """Checks `value` against a python-client openapi type name."""
        if value is None:
            return
        if type_name in (None, "object"):
            return
        m = re.fullmatch(r"list\[(.+)\]", type_name)
        if m:
            if not isinstance(value, list):
                return self.err(where, f"expected a list, got {type(value).__name__} {value!r}")
            for i, v in enumerate(value):
                self.check_type(v, m.group(1), f"{where}[{i}]")
            return
        m = re.fullmatch(r"dict\(str, (.+)\)", type_name)
        if m:
            if not isinstance(value, dict):
                return self.err(where, f"expected a map, got {value!r}")
            for k, v in value.items():
                self.check_type(v, m.group(1), f"{where}.{k}")
            return
        if type_name in PRIMITIVES:
            ok = isinstance(value, PRIMITIVES[type_name])
            if type_name in ("int", "float") and isinstance(value, bool):
                ok = False
            if not ok:
                self.err(where, f"expected {type_name}, got {type(value).__name__} {value!r}")
            return
        model = getattr(k8s, type_name, None)
        if model is None:
            return self.err(where, f"no model {type_name} in the Kubernetes client")
        if not isinstance(value, dict):
            return self.err(where, f"expected a {type_name} object, got {value!r}")
        json_to_attr = {j: a for a, j in model.attribute_map.items()}
        for key, v in value.items():
            if key not in json_to_attr:
                self.err(where, f"unknown field '{key}' in {type_name}")
                continue
            self.check_type(v, model.openapi_types[json_to_attr[key]], f"{where}.{key}")

    def check_required(self, doc, type_name, where):
        """Deserialises through the client, whose models reject missing required fields."""
        api = k8s.ApiClient()
        try:
            api._ApiClient__deserialize(doc, type_name)
        except (ValueError, TypeError) as e:
            self.err(where, f"{type_name}: {e}")

    def check_fields(self, value, fields, where, what):
        if not isinstance(value, dict):
            return self.err(where, f"expected a {what} object")
        for key, v in value.items():
            if key not in fields:
                self.err(where, f"unknown field '{key}' in {what}")
            elif fields[key] in ("endpoints", "namespaceSelector"):
                pass
            else:
                self.check_type(v, fields[key], f"{where}.{key}")

    def service_monitor(self, doc, where):
        self.check_type(doc.get("metadata"), "V1ObjectMeta", f"{where}.metadata")
        for key in doc:
            if key not in ("apiVersion", "kind", "metadata", "spec"):
                self.err(where, f"unknown field '{key}' in ServiceMonitor")
        spec = doc.get("spec")
        if not isinstance(spec, dict):
            return self.err(where, "ServiceMonitor needs a spec")
        self.check_fields(spec, SERVICE_MONITOR_SPEC, f"{where}.spec", "ServiceMonitorSpec")
        if "selector" not in spec:
            self.err(f"{where}.spec", "selector is required")
        ns = spec.get("namespaceSelector", {})
        self.check_fields(ns, {"any": "bool", "matchNames": "list[str]"}, f"{where}.spec.namespaceSelector",
                          "NamespaceSelector")
        endpoints = spec.get("endpoints")
        if not isinstance(endpoints, list) or not endpoints:
            return self.err(f"{where}.spec", "endpoints must be a non-empty list")
        for i, ep in enumerate(endpoints):
            w = f"{where}.spec.endpoints[{i}]"
            self.check_fields(ep, SERVICE_MONITOR_ENDPOINT, w, "Endpoint")
            for d in ("interval", "scrapeTimeout"):
                if d in ep and not DURATION.match(str(ep[d])):
                    self.err(w, f"{d}={ep[d]!r} is not a Prometheus duration")


def model_name(api_version, kind):
    version = api_version.split("/")[-1]
    return version[0].upper() + version[1:] + kind


def labels_match(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def flags_of(args):
    return [a.split("=", 1)[0] for a in args or [] if a.startswith("--")]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("manifests", nargs="+")
    p.add_argument("--daemon-config", required=True, help="deploy/stragglerd.yaml")
    p.add_argument("--stragglerd", help="the stragglerd binary; container flags are checked against its --help")
    p.add_argument("--agent", help="the straggler-agent binary; container flags are checked "
                   "against its --help (else against --agent-flags)")
    p.add_argument("--agent-flags", default="--config,--listen,--listen-tcp,--upstream,--http-address,"
                   "--ready-file,--log-level,--node", help="the agent's flags, comma-separated")
    a = p.parse_args()

    c = Checker()
    docs = []
    for path in a.manifests:
        with open(path) as f:
            try:
                loaded = [d for d in yaml.safe_load_all(f) if d is not None]
            except yaml.YAMLError as e:
                c.err(path, f"not YAML: {e}")
                continue
        for i, d in enumerate(loaded):
            docs.append((f"{path}#{i}", d))

    for where, doc in docs:
        if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
            c.err(where, "not a Kubernetes object (apiVersion and kind are required)")
            continue
        where = f"{where} {doc['kind']}/{doc.get('metadata', {}).get('name', '?')}"
        if doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "ServiceMonitor":
            c.service_monitor(doc, where)
            continue
        name = model_name(doc["apiVersion"], doc["kind"])
        model = getattr(k8s, name, None)
        if model is None:
            c.err(where, f"unknown apiVersion/kind {doc['apiVersion']} {doc['kind']}")
            continue
        c.check_type(doc, name, where)
        c.check_required(doc, name, where)

    objs = {}
    for where, doc in docs:
        if isinstance(doc, dict) and "kind" in doc:
            objs.setdefault(doc["kind"], []).append((where, doc))

    # Workloads: pod labels, container ports by name, probe ports, flags.
    allowed_flags = {"stragglerd": None, "straggler-agent": set(a.agent_flags.split(","))}
    if a.stragglerd:
        import subprocess
        help_text = subprocess.run([a.stragglerd, "--help"], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True).stdout
        allowed_flags["stragglerd"] = set(re.findall(r"(--[a-z][a-z0-9-]*)", help_text))
        if "--grpc-address" not in allowed_flags["stragglerd"]:
            c.err(a.stragglerd, "--help does not list --grpc-address: not the daemon?")
    if a.agent:
        import subprocess
        help_text = subprocess.run([a.agent, "--help"], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True).stdout
        allowed_flags["straggler-agent"] = set(re.findall(r"(--[a-z][a-z0-9-]*)", help_text))
        if "--upstream" not in allowed_flags["straggler-agent"]:
            c.err(a.agent, "--help does not list --upstream: not the agent?")
    pods = []  # (where, labels, {port name: number}, namespace)
    for kind in ("Deployment", "DaemonSet", "StatefulSet"):
        for where, doc in objs.get(kind, []):
            spec = doc.get("spec", {})
            tmpl = spec.get("template", {})
            labels = tmpl.get("metadata", {}).get("labels", {})
            if not labels_match(spec.get("selector", {}).get("matchLabels"), labels):
                c.err(where, "spec.selector does not match the pod template's labels")
            ports = {}
            pod = tmpl.get("spec", {})
            volumes = {v.get("name") for v in pod.get("volumes", [])}
            # A StatefulSet's claims are volumes of its pods too.
            volumes |= {t.get("metadata", {}).get("name") for t in spec.get("volumeClaimTemplates", [])}
            if kind == "StatefulSet":
                # serviceName gives the pods their DNS names: a headless
                # Service of that name must select them.
                governing = [d for _, d in objs.get("Service", [])
                             if d.get("metadata", {}).get("name") == spec.get("serviceName")
                             and d.get("metadata", {}).get("namespace") == doc.get("metadata", {}).get("namespace")]
                if not governing:
                    c.err(where, f"serviceName '{spec.get('serviceName')}' names no Service in its namespace")
                for g in governing:
                    if g.get("spec", {}).get("clusterIP") != "None":
                        c.err(where, f"serviceName '{spec.get('serviceName')}' is not a headless Service "
                              "(clusterIP: None): the pods get no DNS names")
                    if not labels_match(g.get("spec", {}).get("selector"), labels):
                        c.err(where, f"Service '{spec.get('serviceName')}' does not select its pods")
            for ctr in pod.get("containers", []) + pod.get("initContainers", []):
                for port in ctr.get("ports", []):
                    if "name" in port:
                        ports[port["name"]] = port.get("containerPort")
                for m in ctr.get("volumeMounts", []):
                    if m.get("name") not in volumes:
                        c.err(where, f"container {ctr.get('name')} mounts unknown volume {m.get('name')}")
            for ctr in pod.get("containers", []):
                for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                    port = ctr.get(probe, {}).get("httpGet", {}).get("port")
                    if isinstance(port, str) and port not in ports:
                        c.err(where, f"{ctr.get('name')}.{probe} uses port '{port}', not a container port")
                binary = ctr.get("name")
                allowed = allowed_flags.get(binary)
                if allowed is not None:
                    for flag in flags_of(ctr.get("args")):
                        if flag not in allowed:
                            c.err(where, f"{binary} has no flag {flag}")
            pods.append((where, labels, ports, doc.get("metadata", {}).get("namespace")))

    # Services select some pod and map to its ports.
    services = []
    for where, doc in objs.get("Service", []):
        sel = doc.get("spec", {}).get("selector")
        ns = doc.get("metadata", {}).get("namespace")
        matched = [p for p in pods if p[3] == ns and labels_match(sel, p[1])]
        if not matched:
            c.err(where, f"selector {sel} matches no Deployment/DaemonSet/StatefulSet pod in namespace {ns}")
        for port in doc.get("spec", {}).get("ports", []):
            tp = port.get("targetPort", port.get("port"))
            for pw, _, ports, _ in matched:
                if isinstance(tp, str) and tp not in ports:
                    c.err(where, f"targetPort '{tp}' is not a named port of {pw}")
                if isinstance(tp, int) and tp not in ports.values():
                    c.err(where, f"targetPort {tp} is not a container port of {pw}")
        services.append((where, doc))

    # ServiceMonitors select a Service and scrape one of its named ports.
    for where, doc in objs.get("ServiceMonitor", []):
        spec = doc.get("spec", {})
        names = spec.get("namespaceSelector", {}).get("matchNames") or [doc["metadata"].get("namespace")]
        sel = spec.get("selector", {}).get("matchLabels")
        matched = [s for s in services if s[1]["metadata"].get("namespace") in names
                   and labels_match(sel, s[1]["metadata"].get("labels", {}))]
        if not matched:
            c.err(where, f"selector {sel} matches no Service")
        for ep in spec.get("endpoints", []):
            for sw, s in matched:
                port_names = {p.get("name") for p in s["spec"].get("ports", [])}
                if ep.get("port") not in port_names:
                    c.err(where, f"endpoint port '{ep.get('port')}' is not a port of {sw}")

    # The ConfigMap's daemon config uses known top-level keys only (the daemon
    # rejects unknown keys at startup: better to learn it here).
    with open(a.daemon_config) as f:
        known = set(yaml.safe_load(f).keys())
    for where, doc in objs.get("ConfigMap", []):
        text = (doc.get("data") or {}).get("stragglerd.yaml")
        if text is None:
            continue
        try:
            cfg = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            c.err(where, f"data.stragglerd.yaml is not YAML: {e}")
            continue
        for key in cfg:
            if key not in known:
                c.err(where, f"data.stragglerd.yaml: unknown key '{key}' (not in {a.daemon_config})")

    for e in c.errors:
        print(f"ERROR {e}")
    print(f"{len(docs)} objects in {len(a.manifests)} files: "
          + ("OK" if not c.errors else f"{len(c.errors)} error(s)"))
    return 1 if c.errors else 0


if __name__ == "__main__":
    sys.exit(main())
