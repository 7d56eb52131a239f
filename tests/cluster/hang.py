"""A call that must answer at once, run so that a hang fails its test instead of the suite."""

import threading

# What "at once" guards against is a wait without end (Ray's own behaviour): a check that
# has not answered in this long hangs. Timing it finer is the benchmarks' job.
HANG_S = 120


def answers(call):
    """What ``call()`` returns or raises, called in a thread; fails the test if it has not
    answered within HANG_S, instead of hanging the suite."""
    outcome = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as e:
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    assert not thread.is_alive(), f"no answer after {HANG_S} s: it waits instead of failing"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
