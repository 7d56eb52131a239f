"""Where a Hugging Face model or tokenizer is: a local folder, or a model id in the user's
Hugging Face cache (``HF_HOME``), fetched from the hub when missing unless
``HF_HUB_OFFLINE=1``. Not there: one line naming it and how to get it (ConfigError).

Importing ``transformers`` prints progress bars and load reports; :func:`quiet` keeps its
logger at errors, as trainflow's own lines say what a user can act on.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainflow.config import ConfigError
from trainflow.config.training import HF, kind_name

# What a model or tokenizer needs of a hub repository: configs, weights, vocabularies.
FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"]


def resolve(name: str, field: str, prefix: str = "") -> str:
    """The local folder that holds ``name`` (a folder, or a model id), as an absolute
    path; ``field`` and ``prefix`` (``hf:``) name the config's field and value for the
    one-line error."""
    shown = f"{prefix}{name}"
    require(field, shown)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file() and not (path / "tokenizer_config.json").is_file():
            raise ConfigError(
                f"{field} {shown}: the folder holds no config.json; give a folder written by "
                "save_pretrained, or a model id"
            )
        return str(path.resolve())
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ConfigError(f"{field} {shown}: no such folder; give a folder written by save_pretrained")
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        return _snapshot(name, offline)
    except Exception as e:
        why = "HF_HUB_OFFLINE is set" if offline else f"the hub did not give it ({type(e).__name__})"
        raise ConfigError(
            f"{field} {shown}: not in the Hugging Face cache and {why}; fetch it where the hub answers "
            f"(hf download {name}) or give a local folder"
        ) from None


def model_folder(kind: str) -> str:
    """The folder of ``model.kind: hf:<model id or folder>``, resolved (ConfigError when it
    is not there): the hf family's check before a run, and where its tokenizer is."""
    return resolve(kind_name(kind), "model.kind", HF)


@functools.lru_cache(maxsize=16)
def _snapshot(name: str, offline: bool) -> str:
    """The cache's folder of model id ``name``, asked of the hub once per process: a run's
    checks, ingest and model each look for it."""
    from huggingface_hub import snapshot_download

    with quiet():
        return snapshot_download(name, allow_patterns=FILES, local_files_only=offline)


def require(field: str, name: str) -> None:
    """transformers and peft import here, else one line saying how to install them."""
    try:
        import peft  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            f"{field} {name}: needs {e.name or 'transformers'}; pip install 'trainflow[hf]'"
        ) from None


@contextmanager
def quiet() -> Iterator[None]:
    """transformers and huggingface_hub at errors, their progress bars and future-warnings off."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for name in ("transformers", "huggingface_hub", "peft"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        try:
            import transformers

            transformers.utils.logging.set_verbosity_error()
            transformers.utils.logging.disable_progress_bar()
        except ImportError:
            pass
        yield
