"""The watch over a local cluster's processes: when one ends under the run, the run ends
in one line at once; after ``stop()``, a process ending is the cluster stopped on purpose.

Each case runs in a process of its own, watching ``sleep`` processes under the names of
the cluster's (the watch ends its process, as it would end a run's): woken by the
processes' pidfds (Linux), or polling them where the OS has none."""

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

SCRIPT = """
import os, signal, subprocess, sys, time
from trainflow.cluster.watch import ClusterWatch

if sys.argv[4] == "polled":  # as where the OS has no pidfds
    del os.pidfd_open

# The sleeps take a stop signal as a cluster's processes do, whatever this process
# inherited (under nohup, SIGHUP is ignored, and so by the processes it starts).
for stop_signal in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(stop_signal, signal.SIG_DFL)
names = ("gcs_server", "raylet", "log_monitor")
processes = {
    name: subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for name in names
}
print(*(p.pid for p in processes.values()), flush=True)
watch = ClusterWatch(processes)
if sys.argv[3] == "stop":
    watch.stop()
time.sleep(0.2)
processes[sys.argv[1]].send_signal(int(sys.argv[2]))
time.sleep(5)
for process in processes.values():
    process.kill()
print("still running")
"""


def _watched(
    name: str, sig: signal.Signals, stop: bool = False, how: str = "pidfd"
) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    args = [sys.executable, "-c", SCRIPT, name, str(int(sig)), "stop" if stop else "watch", how]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    took = time.monotonic() - start
    for pid in done.stdout.splitlines()[0].split():  # the sleeps an ended watcher left
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    done.stdout = "\n".join(done.stdout.splitlines()[1:])
    return done, took


@pytest.mark.parametrize("how", ["pidfd", "polled"])
def test_a_raylet_that_dies_ends_the_run_in_one_line_at_once(how):
    done, took = _watched("raylet", signal.SIGKILL, how=how)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: the local Ray cluster stopped during the run (its raylet exited with -9); its log: "
    ), done.stderr
    assert "still running" not in done.stdout
    assert took < 5, took  # the 5 s sleep after the kill never ends


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_to_the_cluster_ends_the_run_saying_which(sig):
    done, _ = _watched("log_monitor", sig)
    assert done.returncode == 128 + sig, done.stderr
    assert done.stderr.strip() == f"stopped ({sig.name})"


def test_a_stopped_watch_leaves_the_cluster_to_whoever_stops_it():
    done, _ = _watched("raylet", signal.SIGKILL, stop=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "still running" and not done.stderr
