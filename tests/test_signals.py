"""A command's Ctrl-C and stop signals end a run in one line, whatever Ray or Prefect
does with them."""

import threading
import time

import pytest


@pytest.mark.slow
def test_sigterm_ends_a_blocking_ray_call_inside_a_flow_run(ray_cluster, prefect_harness):
    """Prefect's SIGTERM handler raises its own exception, which ``ray.get`` swallows: a
    SIGTERM to a `trainflow run` alone (Kubernetes, a worker's cancellation) went unheard
    until training ended. Around ``fit()``, it ends the call as SystemExit(143)."""
    import os
    import signal

    import ray
    from prefect import flow

    from trainflow.signals import stop_on_signals

    @ray.remote(num_cpus=0)
    def slow() -> None:
        time.sleep(60)

    ref = slow.remote()

    @flow
    def waits() -> None:
        with stop_on_signals():
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
            ray.get(ref)

    started = time.monotonic()
    try:
        with pytest.raises(SystemExit) as stopped:
            waits()
    finally:
        ray.cancel(ref, force=True)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert time.monotonic() - started < 30


@pytest.mark.slow
def test_from_a_ctrl_c_on_the_workers_output_stays_off_the_console_until_the_next_call(
    ray_cluster, capfd, tmp_path
):
    """Ctrl-C during ``fit()``: what the run's workers print while Ray tears them down
    (once, a worker's traceback under the command's one line) stays off the console. The
    lines still reach the driver (a handler of the test's own sees them); the next call
    shows them again."""
    import os
    import signal

    import ray

    from trainflow.ray_internals.probes import worker_output_handler
    from trainflow.signals import stop_on_signals

    arrived: list[str] = []
    got = threading.Condition()

    def receive(data) -> None:  # registered after Ray's own handler, which prints
        with got:
            arrived.extend(data["lines"])
            got.notify_all()

    def wait_for(text: str) -> None:
        with got:
            assert got.wait_for(lambda: any(text in line for line in arrived), timeout=120), arrived

    @ray.remote(num_cpus=0)
    def prints(first: str, then: str, when: str) -> None:
        print(first, flush=True)
        while not os.path.exists(when):
            time.sleep(0.02)
        print(then, flush=True)

    def interrupt(signum, frame) -> None:  # as Ray Train's handler, which fit() installs
        raise KeyboardInterrupt

    stopped = tmp_path / "stopped"
    with worker_output_handler("test-receive", receive):
        task = prints.remote("worker line before the stop", "worker line after the stop", str(stopped))
        with pytest.raises(KeyboardInterrupt), stop_on_signals():
            signal.signal(signal.SIGINT, interrupt)
            wait_for("worker line before the stop")
            os.kill(os.getpid(), signal.SIGINT)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the handler runs between bytecodes
                time.sleep(0.01)
        stopped.touch()
        ray.get(task)
        wait_for("worker line after the stop")
        shown = capfd.readouterr()
        assert "worker line before the stop" in shown.out + shown.err
        assert "worker line after the stop" not in shown.out + shown.err

        with stop_on_signals():
            ray.get(prints.remote("worker line of the next call", "", str(stopped)))
            wait_for("worker line of the next call")
        # Ray's handler, shown again, now runs after this test's: await its print.
        printed, deadline = "", time.monotonic() + 30
        while "worker line of the next call" not in printed and time.monotonic() < deadline:
            shown = capfd.readouterr()
            printed += shown.out + shown.err
            time.sleep(0.02)
        assert "worker line of the next call" in printed


def test_a_ctrl_c_during_start_up_is_raised_at_its_end_not_where_it_lands():
    """A KeyboardInterrupt raised inside an import beside other threads' imports can leave
    importlib's module lock taken (a start-up then waited forever, seen by hand): inside
    ``interrupts_deferred`` a Ctrl-C is only remembered, and raised once the block is done."""
    import os
    import signal

    from trainflow import signals

    before, reached = signal.getsignal(signal.SIGINT), False
    with signals.sigint_stops_the_run(), pytest.raises(KeyboardInterrupt):
        with signals.interrupts_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            deadline = time.monotonic() + 30
            while not signals._interrupted.is_set():  # the handler runs between bytecodes
                assert time.monotonic() < deadline, "the SIGINT never reached its handler"
                time.sleep(0.01)
            reached = True
    assert reached
    assert signal.getsignal(signal.SIGINT) is before  # put back
    # A later command starts with nothing remembered.
    with signals.sigint_stops_the_run():
        signals.raise_if_interrupted()
