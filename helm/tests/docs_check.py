"""Every value of helm/strata/values.yaml has a row in helm/strata/README.md, and every row
names a value that exists (the first cell of a table row, in backticks). The flags that
docs/deploy.md lists for each daemon are the ones the chart test allows (checks.FLAGS)."""

import re

import yaml

import checks
import harness

# Values documented as a whole rather than key by key (maps and lists passed through).
WHOLE = {"imagePullSecrets", "tls.certManager.issuerRef", "tls.certManager.publicIssuerRef", "tls.public.dnsNames",
         "auth.tokens", "probes.startup", "probes.readiness", "probes.liveness", "podSecurityContext",
         "containerSecurityContext", "serviceAccount.annotations", "commonLabels", "workers.nccl",
         "coordinator.service.annotations", "coordinator.service.loadBalancerSourceRanges",
         "kvstore.storage.accessModes", "metrics.serviceMonitor.labels", "metrics.dashboard.labels"}
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


def documented_flags(deploy):
    """{daemon: flags} from the tables of docs/deploy.md's section 2 ("common" for all three)."""
    section = deploy.split("\n## 2.", 1)[-1].split("\n## ", 1)[0]
    out, current = {}, None
    for line in section.splitlines():
        if line.startswith("Common to"):
            current = "common"
        elif line.startswith("strata-"):
            current = line.split()[0].split("-", 1)[1].rstrip(":")
        elif line.startswith("| `--") and current:
            out.setdefault(current, set()).update(re.findall(r"`--([a-z0-9-]+)`", line.split(" | ")[0]))
    return out


def check_flags(source_dir):
    doc = documented_flags((harness.Path(source_dir) / "docs" / "deploy.md").read_text())
    errors = []
    for daemon, allowed in checks.FLAGS.items():
        listed = doc.get("common", set()) | doc.get(daemon, set())
        errors += [f"docs/deploy.md does not list --{f} of strata-{daemon}" for f in sorted(allowed - listed)]
        errors += [f"docs/deploy.md lists --{f} for strata-{daemon}, which the chart test does not allow"
                   for f in sorted(listed - allowed)]
    return errors
