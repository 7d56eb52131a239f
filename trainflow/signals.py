"""A command's Ctrl-C and stop signals, so that a run ends in one line however it is stopped.

``sigint_stops_the_run`` is the ``trainflow`` command's Ctrl-C handler; ``interrupts_deferred``
holds a Ctrl-C back during start-up; ``raise_if_interrupted`` is checked before every
step; ``stop_on_signals`` wraps a blocking Ray call (a training's ``fit()``).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from trainflow.ray_internals import worker_output_shown

_interrupted = threading.Event()  # a Ctrl-C that sigint_stops_the_run's handler took
_deferring = 0  # > 0 inside interrupts_deferred()
# Told at once, from a thread, of each SIGTERM or SIGHUP that reaches a stop_on_signals block.
stop_signal_listeners: list[threading.Event] = []


def on_sigint(signum, frame) -> None:
    """The SIGINT handler of :func:`sigint_stops_the_run`."""
    _interrupted.set()
    if not _deferring:
        raise KeyboardInterrupt


@contextmanager
def sigint_stops_the_run() -> Iterator[None]:
    """A command's Ctrl-C: KeyboardInterrupt, as Python's own handler raises it, and
    remembered. Prefect's engine, interrupted at some points of its own work between
    tasks, goes on as if nothing happened: :func:`raise_if_interrupted` (before every
    step and every training) stops the run then. Inside :func:`interrupts_deferred`,
    only remembered. Outside the main thread (where Python runs signal handlers), nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, on_sigint)
    if before is not on_sigint:  # (the ``trainflow`` command's own since its start)
        _interrupted.clear()
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """A Ctrl-C during the block is raised at its end, or where the block calls
    :func:`raise_if_interrupted`, not where it lands: a KeyboardInterrupt raised inside an
    import while other threads import (a command's start-up) can leave one of importlib's
    module locks taken, and the start-up waiting for it forever."""
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    raise_if_interrupted()


def raise_if_interrupted() -> None:
    """KeyboardInterrupt, if a Ctrl-C taken by :func:`sigint_stops_the_run` has not ended
    the run yet."""
    if _interrupted.is_set():
        raise KeyboardInterrupt


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Around a blocking Ray call in the main thread (a training's ``fit()``), a stop signal
    ends it as Python would without Ray in the way.

    SIGTERM raises SystemExit(143): Prefect's handler raises a TerminationSignal that
    ``ray.get`` swallows, so a SIGTERM to the driver alone would wait for training to end.
    Ctrl-C raises KeyboardInterrupt instead of Ray Train's SystemExit(1), after its handler
    aborts the controller (checkpoints stay); the workers' output stays off the console until
    the next call. docs/guides/faults-and-resume.md."""
    raise_if_interrupted()
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    received: list[int] = []

    def stop(signum, frame) -> None:
        received.append(signum)
        raise SystemExit(128 + signum)

    # Whichever handler runs, Python writes each signal's number here as the signal
    # arrives: how a Ctrl-C that Ray's handler took is known, and at once.
    read, write = os.pipe()
    for fd in (read, write):
        os.set_blocking(fd, False)
    worker_output_shown(True)
    ctrl_c = _SigintWatch(read)
    wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    before = signal.signal(signal.SIGTERM, stop)
    before_int = signal.getsignal(signal.SIGINT)

    def interrupted() -> bool:
        ctrl_c.stop()
        return ctrl_c.seen.is_set()

    try:
        yield
    except SystemExit:
        if received:  # Ray hands it back as SystemExit(1)
            raise SystemExit(128 + received[0]) from None
        if interrupted():
            raise KeyboardInterrupt from None
        raise
    else:
        if interrupted():
            raise KeyboardInterrupt
    finally:
        signal.set_wakeup_fd(wakeup)
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)
        signal.signal(signal.SIGINT, before_int if before_int is not None else signal.default_int_handler)
        ctrl_c.stop()
        os.close(read)
        os.close(write)


class _SigintWatch:
    """A thread reading the signal numbers Python writes to ``read`` (its wakeup fd): on
    a SIGINT, ``seen`` is set and the workers' output leaves the console; on a SIGTERM or
    SIGHUP, each event of :data:`stop_signal_listeners` is set."""

    def __init__(self, read: int) -> None:
        self.seen = threading.Event()
        self._read = read
        self._stop_read, self._stop_write = os.pipe()
        self._thread = threading.Thread(target=self._watch, name="trainflow-sigint-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        import select

        while True:
            ready, _, _ = select.select([self._read, self._stop_read], [], [])
            if self._read in ready:
                self._take()
            if self._stop_read in ready:
                return

    def _take(self) -> None:
        """Reads the signals written since the last read; on a SIGINT among them, the
        workers' output leaves the console."""
        try:
            signals = os.read(self._read, 512)
        except (BlockingIOError, OSError):
            return
        if signal.SIGINT in signals:
            self.seen.set()
            worker_output_shown(False)
        if signal.SIGTERM in signals or signal.SIGHUP in signals:
            for listener in list(stop_signal_listeners):
                listener.set()

    def stop(self) -> None:
        """Ends the thread (once), then takes what it had not read."""
        if self._thread.is_alive():
            os.write(self._stop_write, b"x")
            self._thread.join()
            os.close(self._stop_read)
            os.close(self._stop_write)
            self._take()
