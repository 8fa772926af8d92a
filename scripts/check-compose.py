"""Validates docker-compose.yml and the Dockerfile without a Docker engine (none runs here).

Checks: the YAML parses; the demo's services are all there; every build context has a Dockerfile
whose COPY sources exist; every host path mounted exists; every file a quotagate command names
(relative to the image's /etc/quotagate, which holds the repository's catalogs/ and examples/)
exists; every QUOTAGATE_* variable is a documented option; depends_on names existing services;
ports are published on loopback (127.0.0.1:HOST:CONTAINER). Exits 1 listing every problem.
"""
import os
import re
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
problems = []


def problem(msg):
    problems.append(msg)


with open(os.path.join(ROOT, "docker-compose.yml")) as f:
    compose = yaml.safe_load(f)
services = compose.get("services") or {}
for name in ["redis", "upstream", "catalog", "gateway-a", "gateway-b"]:
    if name not in services:
        problem(f"service {name} is missing")

documented = set(re.findall(r"`(QUOTAGATE_[A-Z_]+)`", open(os.path.join(ROOT, "docs/configuration.md")).read()))

for name, svc in services.items():
    build = svc.get("build")
    if build is not None:
        context = build if isinstance(build, str) else build.get("context", ".")
        dockerfile = os.path.join(ROOT, context, "Dockerfile")
        if not os.path.isfile(dockerfile):
            problem(f"{name}: build context {context} has no Dockerfile")
        else:
            for line in open(dockerfile):
                m = re.match(r"\s*COPY\s+(?!--from)(.+)", line)
                if m:
                    for src in m.group(1).split()[:-1]:
                        # target/: the prebuilt binary, made by cargo before such a build.
                        if src.startswith("target/"):
                            continue
                        if not os.path.exists(os.path.join(ROOT, context, src)):
                            problem(f"Dockerfile: COPY source {src} does not exist")
    for volume in svc.get("volumes", []):
        host = volume.split(":")[0]
        if host.startswith((".", "/")) and not os.path.exists(os.path.join(ROOT, host)):
            problem(f"{name}: mounted path {host} does not exist")
    if svc.get("image", "").startswith("quotagate"):
        for arg in svc.get("command", []):
            if re.match(r"^(examples|catalogs)/", arg) and not os.path.exists(os.path.join(ROOT, arg)):
                problem(f"{name}: command names {arg}, which does not exist")
        for var in (svc.get("environment") or {}):
            if var.startswith("QUOTAGATE_") and var not in documented:
                problem(f"{name}: {var} is not a documented option")
    for dep in svc.get("depends_on", []):
        if dep not in services:
            problem(f"{name}: depends on unknown service {dep}")
    for port in svc.get("ports", []):
        if not re.fullmatch(r"127\.0\.0\.1:\d+:\d+", str(port)):
            problem(f"{name}: port {port!r} is not 127.0.0.1:HOST:CONTAINER (loopback only)")

if problems:
    print("docker-compose.yml / Dockerfile:\n  " + "\n  ".join(problems))
    sys.exit(1)
print(f"docker-compose.yml: {len(services)} services, all referenced files present")
