"""What every step shares (trainflow/tasks/steps.py): the name of what a call starts, and
the times a flow run's summary shows."""

from prefect import flow, task

from trainflow.tasks.steps import run_id, step, step_times


def test_each_call_of_a_step_names_its_run_apart_and_a_retry_keeps_the_name(prefect_harness):
    """Two trainings in one flow run are two Ray runs; a retried one resumes its own."""
    seen: list[str] = []

    @task(retries=1, retry_delay_seconds=0)
    def starts_a_run() -> None:
        seen.append(run_id())
        if len(seen) == 1:
            raise RuntimeError("the first attempt fails")

    @flow
    def two_calls() -> None:
        starts_a_run()
        starts_a_run()

    two_calls()
    first, retried, second = seen
    assert retried == first and second != first


def test_a_flow_run_records_the_steps_that_ran_and_not_those_answered_from_the_cache(
    prefect_harness, tmp_path
):
    from prefect.cache_policies import INPUTS

    @step(name="cached-step", cache_policy=INPUTS, persist_result=True, result_storage=tmp_path)
    def cached(x: int) -> int:
        return x

    @step(name="plain-step")
    def plain(x: int) -> int:
        return x + 1

    @flow
    def timed() -> tuple[dict[str, float], list[str]]:
        with step_times() as steps:
            cached(1)
            plain(cached(1))  # the second call of cached-step comes from the cache
        return steps.of(("cached-step", "plain-step", "never-called"))

    seconds, not_run = timed()
    assert seconds["cached-step"] > 0 and seconds["plain-step"] > 0
    assert not_run == ["never-called"]
    # A second flow run finds cached-step's result in the cache: it does not run.
    seconds, not_run = timed()
    assert not_run == ["cached-step", "never-called"] and seconds["plain-step"] > 0
