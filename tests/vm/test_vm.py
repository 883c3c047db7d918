"""The VM test bed as a pytest test (marker ``vm``): tests/vm/run.sh boots the stock Debian kernel
under QEMU and runs tests/vm/guest.py inside; every check it prints must pass.

Run with ``python3 -m pytest -m vm tests/vm -s`` (root, the packages listed in docs/guide/kernel.md,
"The VM test bed"; ~3-6 minutes on 2 cores). .ci/run runs tests/vm/run.sh directly."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.vm


def test_vm_test_bed():
    if os.geteuid() != 0:
        pytest.skip("the VM test bed builds and loads kernel modules: run as root")
    if not shutil.which("vng"):
        pytest.skip("virtme-ng (vng) not installed; see docs/guide/kernel.md (The VM test bed)")
    r = subprocess.run(["bash", str(HERE / "run.sh")], capture_output=True, text=True, timeout=1500)
    print(r.stdout[-6000:])
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("VMRESULT ")]
    assert lines, f"no VMRESULT from the guest (rc {r.returncode}):\n{r.stderr[-3000:]}"
    res = json.loads(lines[-1][len("VMRESULT "):])
    failed = [k for k, ok in res["checks"].items() if not ok]
    assert not failed and r.returncode == 0, f"failed checks: {failed}"
    m = res["metrics"]
    assert m["fuzz_sent"] >= 100_000 and m["fuzz_rejected"] == m["fuzz_sent"] and m["dmesg_warnings"] == 0
