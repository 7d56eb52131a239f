"""A Ray Train callback that runs in a training's controller process and records, in the
cluster's key-value store, whether that process imported torch. It is a module of its
own, importing no torch, so that unpickling the callback there imports none either."""

import sys

import ray.train

NAMESPACE = "trainflow-tests"


def key(run_name: str) -> bytes:
    return f"controller-torch/{run_name}".encode()


class ControllerModules(ray.train.UserCallback):
    def after_report(self, run_context, metrics, checkpoint):
        from ray.experimental.internal_kv import _internal_kv_put

        imported = b"torch" if "torch" in sys.modules else b"none"
        _internal_kv_put(key(run_context.get_run_config().name), imported, namespace=NAMESPACE)


def controller_imported_torch(run_name: str) -> bool | None:
    """What the run's controller recorded (None: nothing, it never reported)."""
    from ray.experimental.internal_kv import _internal_kv_get

    value = _internal_kv_get(key(run_name), namespace=NAMESPACE)
    return None if value is None else value == b"torch"
