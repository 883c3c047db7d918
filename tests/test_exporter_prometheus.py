"""``umctl exporter`` scraped by a real Prometheus server (Debian's ``prometheus`` package,
installed by .ci/run): the exporter runs in a subprocess fed by the project's fake UVM tools
device (a fake process faulting at a known rate), Prometheus scrapes it every second, and the
rates and totals Prometheus computes through its HTTP query API must match what the fake
produced; the fake target is then killed mid-run and its series must end cleanly (final total
exact, no counter reset, gone after the grace period) while the exporter stays up.
What Prometheus stored is checked against the fake's own log of what it had sent when, not
against the wall clock: a loaded machine delays the fake, the exporter and the scrapes, and
none of that may change a verdict.

Run as a script (``--serve``), this file is the fake-fed exporter itself."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest

RATE = 2000          # faults per second the fake target takes
BATCH = 100          # faults per fault batch: 20 batches/s
PID = 4242
RUN_S = 16.0         # faulting, then killed
GRACE_S = 4.0

#: the most the exporter's totals may trail what the fake sent (drain + 250 ms interval + a
#: scrape), generous for a loaded 2-core machine
LAG_MAX_S = 10.0

pytestmark = pytest.mark.requires("prometheus")   # tests/conftest.py: UMCTL_REQUIRE_PROMETHEUS=1 in CI


# -- the fake-fed exporter (subprocess) -----------------------------------------------------

def serve(port: int, workdir: str) -> int:
    """The exporter on ``port`` over a fake node with one process that, once workdir/go
    exists, faults at RATE/s for RUN_S seconds and is then killed; writes what it produced to
    workdir/produced.json."""
    import pathlib

    from umctl.cli.main import main
    from umctl.exporter import agent as agent_mod
    from umctl.driver import abi, process
    from umctl.sources.uvmtools import source as source_mod

    from test_exporter import NodeDriver, faults_for, spawn
    from test_uvmtools_source import entries

    tmp = pathlib.Path(workdir)
    root = str(tmp / "proc")
    os.makedirs(root, exist_ok=True)
    drv = NodeDriver(root)
    process.PROC_ROOT = root
    abi.Ioctl = lambda: drv                              # the fake device at the Ioctl seam
    process.nvidia_smi_gpus = source_mod.nvidia_smi_gpus = lambda: []
    (tmp / "nvidia-uvm-tools").touch()
    agent_mod.TOOLS_PATH = str(tmp / "nvidia-uvm-tools")
    spawn(tmp, PID, comm="fake_train")

    def produce() -> None:
        while PID not in drv.ring_of or not (tmp / "go").exists():   # attached, and Prometheus scraping
            time.sleep(0.01)
        t0 = time.monotonic()
        sent = batch = 0
        log = []   # (wall time before this wake-up's emits, after them, faults sent by then)
        while (now := time.monotonic()) - t0 < RUN_S:
            due = int((now - t0) * RATE) // BATCH * BATCH
            before = time.time()
            while sent < due:
                recs = faults_for(PID, BATCH, batch)
                replay = entries({"type": abi.EV_GPU_FAULT_REPLAY, "r_gpu": 1, "r_batch": batch, "r_ts": 1})
                n = drv.emit(PID, abi.concat_entries([recs, replay])) - 1
                assert n == BATCH, "ring full"
                sent += BATCH
                batch += 1
            log.append((before, time.time(), sent))
            time.sleep(0.05)
        shutil.rmtree(tmp / "proc" / str(PID))           # the target is killed
        doc = {"faults": sent, "batches": batch, "t_start": time.time() - (time.monotonic() - t0),
               "t_kill": time.time(), "log": log}
        (tmp / "produced.json.tmp").write_text(json.dumps(doc))
        os.replace(tmp / "produced.json.tmp", tmp / "produced.json")

    threading.Thread(target=produce, daemon=True).start()
    return main(["exporter", "--listen", f"127.0.0.1:{port}", "--sample", "1", "--interval", "250ms",
                 "--grace", f"{GRACE_S}s", "--state-dir", str(tmp / "run")])


# -- the test -------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def query(base: str, expr: str, t: float | None = None) -> list:
    q = {"query": expr} | ({"time": f"{t:.3f}"} if t is not None else {})
    doc = json.loads(get(f"{base}/api/v1/query?{urllib.parse.urlencode(q)}"))
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def query_range(base: str, expr: str, start: float, end: float, step: float = 1.0) -> list:
    q = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    doc = json.loads(get(f"{base}/api/v1/query_range?{urllib.parse.urlencode(q)}"))
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def wait_for(what: str, cond, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if cond():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture
def workdir():
    """A directory of its own (pytest's numbered tmp_path directories are pruned by other pytest
    runs on the same machine, and this one holds the fake /proc and Prometheus's storage)."""
    import pathlib
    import tempfile

    d = pathlib.Path(tempfile.mkdtemp(prefix="umctl-exporter-prom-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_prometheus_rates_match_the_fake_and_a_killed_target_ends_cleanly(workdir):
    tmp_path = workdir
    eport, pport = free_port(), free_port()
    exp_log = open(tmp_path / "exporter.log", "w")
    exporter = subprocess.Popen([sys.executable, __file__, "--serve", str(eport), str(tmp_path)],
                                stdout=exp_log, stderr=subprocess.STDOUT)
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: umctl\n    static_configs:\n      - targets: ['127.0.0.1:{eport}']\n")
    prom_log = open(tmp_path / "prometheus.log", "w")
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{pport}"],
                            stdout=prom_log, stderr=subprocess.STDOUT, cwd=tmp_path)
    base = f"http://127.0.0.1:{pport}"
    try:
        wait_for("prometheus ready", lambda: get(f"{base}/-/ready") is not None, 60)
        wait_for("the exporter's first scrape",
                 lambda: any(r["value"][1] == "1" for r in query(base, 'up{job="umctl"}')), 60)
        (tmp_path / "go").touch()                        # the fake target starts faulting
        produced = tmp_path / "produced.json"
        wait_for("the fake target to be killed", produced.exists, RUN_S + 60)
        doc = json.loads(produced.read_text())
        # the series must end: after the grace period and a scrape, no sample at "now"
        sel = f'umctl_gpu_faults_total{{pid="{PID}"}}'
        wait_for("the series to end", lambda: query(base, sel) == [], GRACE_S + 30)
        t_end = time.time()

        # every sample Prometheus scraped, against the fake's log: never more than had been
        # sent by the end of the scrape (a scrape is stamped with its start and times out after
        # the 1 s interval), never less than had been sent LAG_MAX_S before it
        log = doc["log"]

        def sent_by(t: float, i: int) -> int:   # i=0: emits begun by t (an upper bound); 1: ended by t
            return max((e[2] for e in log if e[i] <= t), default=0)

        raw = query(base, f"{sel}[10m]", t_end)[0]["values"]
        samples = [(float(ts), float(v)) for ts, v in raw]
        assert len(samples) >= 5, samples
        assert all(a[1] <= b[1] for a, b in zip(samples, samples[1:])), samples      # a counter
        for ts, v in samples:
            assert sent_by(ts - LAG_MAX_S, 1) <= v <= sent_by(ts + 1.0, 0), (ts, v, doc["t_start"])

        # rates while it ran (Prometheus's own rate()), over windows wholly inside the scraped
        # run: a window the series only partly covers reads low (rate() divides by the window).
        # Their mean is the fake's rate; batches come with their faults (one replay each 100)
        t0, tk = max(doc["t_start"], samples[0][0]), doc["t_kill"]
        rates = query_range(base, f"rate({sel}[5s])", t0 + 6, tk - 1)
        values = [float(v) for _, v in rates[0]["values"]]
        assert len(values) >= 5, rates
        mean = sum(values) / len(values)
        assert mean == pytest.approx(RATE, rel=0.15), values
        b = query_range(base, f'rate(umctl_gpu_fault_batches_total{{pid="{PID}"}}[5s])', t0 + 6, tk - 1)
        bmean = sum(float(v) for _, v in b[0]["values"]) / len(b[0]["values"])
        assert bmean == pytest.approx(mean / BATCH, rel=0.02)

        # the ended series: the exact total, no reset, marked not attached during the grace
        last = query(base, f"max_over_time({sel}[2m])", t_end)
        assert float(last[0]["value"][1]) == doc["faults"]
        assert float(query(base, f"resets({sel}[2m])", t_end)[0]["value"][1]) == 0
        labels = last[0]["metric"]
        assert labels["comm"] == "fake_train" and labels["gpu"] == "0" and labels["uuid"].startswith("GPU-")
        attached = query(base, f'min_over_time(umctl_process_attached{{pid="{PID}"}}[2m])', t_end)
        assert float(attached[0]["value"][1]) == 0
        # and the exporter carried on: still scraped, nothing went wrong, its own series live
        assert query(base, 'up{job="umctl"}')[0]["value"][1] == "1"
        assert float(query(base, "umctl_exporter_errors_total")[0]["value"][1]) == 0
        assert float(query(base, 'umctl_exporter_processes{state="attached"}')[0]["value"][1]) == 0
        assert exporter.poll() is None
    except BaseException:
        exp_log.flush()
        prom_log.flush()
        print("--- exporter ---\n" + (tmp_path / "exporter.log").read_text()[-4000:])
        print("--- prometheus ---\n" + (tmp_path / "prometheus.log").read_text()[-4000:])
        raise
    finally:
        stop(exporter)
        stop(prom)
        exp_log.close()
        prom_log.close()
    assert exporter.returncode == 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", nargs=2, metavar=("PORT", "WORKDIR"), required=True)
    a = ap.parse_args()
    sys.exit(serve(int(a.serve[0]), a.serve[1]))
