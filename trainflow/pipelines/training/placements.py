"""The placement groups of a sweep's worker groups, so that the sweep can remove them.

A trial that ASHA stops is killed with its TorchTrainer's controller, which then cannot
remove its workers' placement group; Ray Train's own cleaner does, a check later, only
in workers that run trainflow's setup hook (``ray_internals.answer_cleaner_from_gcs``:
Ray's own check needs the dashboard's state API). Left alone, the CPUs could stay reserved and
later trials wait forever. So rank 0
of every worker group of a sweep records its placement group here
(:func:`record_placement`), and the sweep removes a trial's groups when it ends
(:meth:`PlacementTracker.release`) and every group left when the sweep ends
(:meth:`PlacementTracker.close`).

Held in Ray's GCS key-value store, one key per group,
``trainflow/placements/<tracker>/<run>/<group id>``, written once by the worker that
holds it: nothing else to start, and a record outlives the worker that wrote it.
"""

from __future__ import annotations

from trainflow import ray_internals

NAMESPACE = "trainflow"
PREFIX = "trainflow/placements/"


def record_placement(tracker: str, run: str) -> None:
    """Record the placement group of the calling Ray Train worker's group, in the Ray
    Train run ``run``, with the :class:`PlacementTracker` named ``tracker``."""
    import ray

    group = ray.util.get_current_placement_group()
    if group is not None:
        ray_internals.kv_put(f"{PREFIX}{tracker}/{run}/{group.id.hex()}", b"", NAMESPACE)


class PlacementTracker:
    """The placement groups that the worker groups of a sweep named ``name`` recorded."""

    def __init__(self, name: str):
        self.name = name
        self.prefix = f"{PREFIX}{name}/"

    def groups(self, run: str = "") -> list[str]:
        """The hex ids of the groups recorded for the Ray Train run ``run`` and the runs
        named ``run-<more>`` (a trial's runs after a PBT exploit); "": every run."""
        keys = [key.decode() for key in ray_internals.kv_list(f"{self.prefix}{run}", NAMESPACE)]
        names = [key.removeprefix(self.prefix).rsplit("/", 1) for key in keys]
        return sorted(
            {group for name, group in names if not run or name == run or name.startswith(f"{run}-")}
        )

    def release(self, run: str) -> None:
        """Remove the groups of the Ray Train run ``run`` (and ``run-<more>``) that still
        hold resources."""
        self._remove(self.groups(run))

    def close(self) -> None:
        """Remove every group still held, and forget them all."""
        try:
            self._remove(self.groups())
        finally:
            ray_internals.kv_delete_prefix(self.prefix, NAMESPACE)

    @staticmethod
    def _remove(hex_ids: list[str]) -> None:
        import ray
        from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

        for hex_id in hex_ids:
            group = PlacementGroup(ray.PlacementGroupID(bytes.fromhex(hex_id)))
            if placement_group_table(group).get("state") not in ("REMOVED", None):
                remove_placement_group(group)
