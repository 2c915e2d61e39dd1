#!/usr/bin/env python3
"""helm_schema_test: every object the strata chart renders, in every case of chart_test.py,
is valid against the Kubernetes API schemas (and cert-manager's, and LeaderWorkerSet's types),
offline, with unknown fields reported (validate_k8s.mjs).

usage: schema_test.py SOURCE_DIR BUILD_DIR
Exit 0: passed; 1: failed; 77: skipped (helm, node or the validator could not be installed).
"""

import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import harness


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    source, build = sys.argv[1], sys.argv[2]
    start = time.monotonic()
    try:
        prefix = harness.ensure_validator(build)  # while chart_test installs helm
        helm = harness.ensure_helm(build)
    except harness.Skip as e:
        harness.skip(str(e))
    installed = time.monotonic()
    tmp = harness.new_tmp()

    def run(case):
        name, override = case
        docs, r = harness.render(helm, source, harness.write_values(tmp, name, override))
        return name, docs, r

    cases = [("default values", {})] + harness.MATRIX + harness.EXTRA_CASES
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(run, cases))
    objects, failed_cases = [], []
    for name, docs, r in results:
        if docs is None:
            print(f"FAIL {name}: helm template: {r.stderr.strip()}")
            failed_cases.append(name)
            continue
        objects += [{"source": name, "doc": d} for d in docs]

    # The script runs beside its node_modules, so that its imports resolve there.
    script = Path(prefix) / "validate_k8s.mjs"
    shutil.copyfile(Path(__file__).with_name("validate_k8s.mjs"), script)
    r = subprocess.run(["node", str(script)], input=json.dumps(objects), capture_output=True, text=True,
                       timeout=120)
    print(r.stdout, end="")
    lines = r.stdout.splitlines()
    for name, docs, _ in results:
        if docs is not None:
            bad = any(line.startswith(f"{name}: ") for line in lines)
            print(f"{'FAIL' if bad else 'ok  '} {name}: {len(docs)} objects")
            if bad:
                failed_cases.append(name)
    # A validator that failed its self-test, or did not run at all, fails the test as well.
    broken = any(line.startswith("self-test") for line in lines) or (r.returncode != 0 and not failed_cases)
    if broken:
        print("FAIL the validator: " + (r.stderr.strip() or "self-test"))
    kinds = sorted({o["doc"]["kind"] for o in objects})
    print(f"kinds: {', '.join(kinds)}")
    print(f"tools {installed - start:.1f} s, validation {time.monotonic() - installed:.1f} s")
    print(f"{len(cases) - len(failed_cases)} passed, {len(failed_cases) + broken} failed")
    return 1 if failed_cases or broken else 0


if __name__ == "__main__":
    sys.exit(main())
