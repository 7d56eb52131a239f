"""One training of a model at a time (trainflow.tasks.one_training_at_a_time): trainings of one
model take turns, and a slot a dead driver kept is freed."""

import contextvars
import threading
from pathlib import Path

from trainflow.tasks import one_training_at_a_time


def in_thread(target) -> threading.Thread:
    # A daemon: a broken lock fails the test below instead of hanging the suite at exit.
    # With this thread's context: the Prefect test harness's settings (its database),
    # which a flow run's thread has.
    thread = threading.Thread(target=contextvars.copy_context().run, args=(target,), daemon=True)
    thread.start()
    return thread


def test_two_trainings_of_one_model_take_turns(prefect_harness, trainflow_home):
    asking, entered, released = threading.Event(), threading.Event(), threading.Event()
    entered_after_release = []

    def second():
        asking.set()
        with one_training_at_a_time("turns"):
            entered_after_release.append(released.is_set())
            entered.set()

    with one_training_at_a_time("turns"):
        waiter = in_thread(second)
        assert asking.wait(60)
        # A negative takes some waiting to show: the second training has asked for the
        # slot for a second (several of Prefect's acquisition attempts) and not got it.
        assert not entered.wait(1.0), "a second training of the model entered while the first ran"

        # Another model's training does not wait for this model's slot.
        other_entered = threading.Event()

        def another_model():
            with one_training_at_a_time("another-model"):
                other_entered.set()

        other = in_thread(another_model)
        assert other_entered.wait(60), "another model's training waited for this model's slot"
        other.join(60)
        assert not other.is_alive()
        released.set()

    # The waiting training enters once the slot is released, not before.
    assert entered.wait(60), "the second training never got the released slot"
    waiter.join(60)
    assert not waiter.is_alive()
    assert entered_after_release == [True]


def test_a_slot_a_killed_run_kept_is_named_in_the_log_and_freed_by_the_command_it_gives(
    prefect_harness, trainflow_home, caplog
):
    import logging

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate

    # What a run killed outright leaves: the model's slot taken, nobody to release it.
    limit = "trainflow-model-killed"
    with get_client(sync_client=True) as client:
        taken = GlobalConcurrencyLimitCreate(name=limit, limit=1, active_slots=1)
        client.create_global_concurrency_limit(taken)
    entered = threading.Event()

    def next_run():
        with one_training_at_a_time("killed", logging.getLogger("test-policy")):
            entered.set()

    with caplog.at_level(logging.WARNING, logger="test-policy"):
        waiter = in_thread(next_run)
        assert not entered.wait(1.0), "a run entered a slot that was taken"
    (record,) = [r for r in caplog.records if r.name == "test-policy"]
    assert f"`prefect gcl update {limit} --active-slots 0`" in record.getMessage()
    # What the command it names does, through the same API.
    with get_client(sync_client=True) as client:
        client.update_global_concurrency_limit(limit, GlobalConcurrencyLimitUpdate(active_slots=0))
    assert entered.wait(60), "the waiting run never got the freed slot"
    waiter.join(60)
    assert not waiter.is_alive()


def test_a_slot_whose_holder_died_before_training_is_freed_by_the_next_run(
    prefect_harness, trainflow_home, caplog
):
    """A driver killed outright while it held the slot, before its train step wrote a run
    record (starting Ray, preparing the data): the next run on the machine frees the slot,
    whichever TRAINFLOW_HOME each had (the holder is named beside Prefect's database,
    which keeps the slot)."""
    import logging

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.settings import get_current_settings

    from tests.pipelines.test_run_records import dead_driver
    from trainflow.tasks.slots import SlotHolder, slot_holders

    limit = "trainflow-model-died-early"
    with get_client(sync_client=True) as client:
        limit_id = client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name=limit, limit=1, active_slots=1)
        )
    holders = slot_holders(limit, limit_id)
    database = get_current_settings().server.database.connection_url.get_secret_value()
    assert database.endswith(f"{holders.parents[2]}/{Path(database).name}")
    assert trainflow_home not in holders.parents
    holders.mkdir(parents=True)
    gone = dead_driver()
    (holders / "gone.json").write_text(SlotHolder(driver=gone, since=1.0).model_dump_json())

    entered = threading.Event()

    def next_run():
        with one_training_at_a_time("died-early", logging.getLogger("test-policy")):
            assert [p.name for p in holders.iterdir()] != ["gone.json"]  # this run holds it now
            entered.set()

    with caplog.at_level(logging.WARNING, logger="test-policy"):
        waiter = in_thread(next_run)
        assert entered.wait(60), "the next run waited for a slot whose holder had died"
        waiter.join(60)
    (record,) = [r for r in caplog.records if r.name == "test-policy"]
    assert record.getMessage() == (
        f"a training of died-early ({gone.describe()}) died before it trained; its concurrency slot "
        "is free again"
    )
    assert not list(holders.iterdir())  # the run's own holder file went with its slot
    with get_client(sync_client=True) as client:
        assert client.read_global_concurrency_limit_by_name(limit).active_slots == 0


def test_a_live_holder_keeps_its_slot_beside_a_dead_holders_record(prefect_harness, trainflow_home):
    """A record of a dead driver left beside a live holder's (a machine where both wrote
    under one PREFECT_HOME) does not free the live run's slot."""
    import logging
    import os

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    from tests.pipelines.test_run_records import dead_driver
    from trainflow.pipelines.training.run_records import Driver
    from trainflow.tasks.slots import SlotHolder, slot_holders

    limit = "trainflow-model-held"
    with get_client(sync_client=True) as client:
        limit_id = client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name=limit, limit=1, active_slots=1)
        )
    holders = slot_holders(limit, limit_id)
    holders.mkdir(parents=True)
    (holders / "gone.json").write_text(SlotHolder(driver=dead_driver(), since=1.0).model_dump_json())
    live = Driver.this()
    assert live.pid == os.getpid()
    (holders / "live.json").write_text(SlotHolder(driver=live, since=2.0).model_dump_json())
    entered = threading.Event()

    def next_run():
        with one_training_at_a_time("held", logging.getLogger("test-policy")):
            entered.set()

    waiter = in_thread(next_run)
    assert not entered.wait(1.0), "a run took the slot a live driver holds"
    with get_client(sync_client=True) as client:
        assert client.read_global_concurrency_limit_by_name(limit).active_slots == 1
        (holders / "live.json").unlink()  # the live run ends: it releases its slot
        client.release_concurrency_slots(names=[limit], slots=1, occupancy_seconds=1.0)
    assert entered.wait(60), "the waiting run never got the released slot"
    waiter.join(60)


def test_a_run_leaves_the_holders_of_another_servers_slot_of_that_name_alone(prefect_harness, trainflow_home):
    """A machine whose runs use two Prefect servers (a team's, and the temporary one) under
    one PREFECT_HOME: a run on one server neither frees nor forgets a dead driver that
    holds the other server's slot of the same model, which the next run there frees."""
    import uuid

    from tests.pipelines.test_run_records import dead_driver
    from trainflow.tasks.slots import SlotHolder, slot_holders

    elsewhere = slot_holders("trainflow-model-two-servers", uuid.uuid4())
    elsewhere.mkdir(parents=True)
    (elsewhere / "gone.json").write_text(SlotHolder(driver=dead_driver(), since=1.0).model_dump_json())

    with one_training_at_a_time("two-servers"):
        pass

    assert [p.name for p in elsewhere.iterdir()] == ["gone.json"]
