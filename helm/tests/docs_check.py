"""Every value of helm/strata/values.yaml has a row in helm/strata/README.md, and every row
names a value that exists (the first cell of a table row, in backticks)."""

import re

import yaml

import harness

# Values documented as a whole rather than key by key (maps and lists passed through).
WHOLE = {"imagePullSecrets", "tls.certManager.issuerRef", "tls.certManager.publicIssuerRef", "tls.public.dnsNames",
         "auth.tokens", "probes.startup", "probes.readiness", "probes.liveness", "podSecurityContext",
         "containerSecurityContext", "serviceAccount.annotations", "commonLabels", "workers.nccl",
         "coordinator.service.annotations", "coordinator.service.loadBalancerSourceRanges",
         "kvstore.storage.accessModes"}
WHOLE_IN_EACH = {"resources", "nodeSelector", "tolerations", "affinity", "podAnnotations", "podLabels", "extraArgs"}


def value_paths(values, prefix=""):
    out = set()
    for k, v in values.items():
        path = prefix + k
        if isinstance(v, dict) and v and path not in WHOLE and k not in WHOLE_IN_EACH:
            out |= value_paths(v, path + ".")
        else:
            out.add(path)
    return out


def documented_paths(readme):
    """The first cells of the tables under "## Values"."""
    section = readme.split("\n## Values", 1)[-1].split("\n## ", 1)[0]
    out = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            out |= set(re.findall(r"`([^`]+)`", line.split(" | ")[0]))
    return out


def check(source_dir):
    chart = harness.chart_dir(source_dir)
    values = value_paths(yaml.safe_load((chart / "values.yaml").read_text()))
    rows = documented_paths((chart / "README.md").read_text())
    errors = [f"values.yaml: {p} is not documented in README.md" for p in sorted(values - rows)]
    errors += [f"README.md documents {p}, which values.yaml does not have" for p in sorted(rows - values)]
    return errors
