"""MLflow's full environment: the Python that runs MLflow's UI (``trainflow ui``) and a
team stack's MLflow server.

MLflow's UI comes with the full ``mlflow`` package, whose pins (pyarrow among them) are
older than the project's, so it runs from an environment of its own: a venv in the
user's cache folder (:func:`ui_env`), made once with the release of ``mlflow`` that
matches trainflow's ``mlflow-skinny``, so that the UI and trainflow read and write the
registry's database at one schema. The cache folder, not TRAINFLOW_HOME: the venv
depends only on MLflow's release and Python's, so every project's home shares one, and
it can be deleted and made again, where TRAINFLOW_HOME holds what cannot (the registry,
the runs).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import time
import venv
from collections.abc import Callable, Iterator
from pathlib import Path

from trainflow.stack.services import StackError

READY_MARK = ".trainflow-ready"  # written last: an environment without it is remade


class UIError(RuntimeError):
    """MLflow's UI could not be prepared or started; the message says why and what to do."""


def mlflow_release() -> str:
    """The MLflow release trainflow writes the registry with (its ``mlflow-skinny``, or a
    full ``mlflow`` installed in its place)."""
    for dist in ("mlflow-skinny", "mlflow"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise UIError("trainflow's environment has no MLflow; reinstall trainflow")


def full_mlflow_here() -> bool:
    """Whether the full ``mlflow``, its UI's files included, is installed beside trainflow."""
    spec = importlib.util.find_spec("mlflow")
    return bool(spec and spec.origin and (Path(spec.origin).parent / "server/js/build/index.html").exists())


def ui_env(release: str | None = None) -> Path:
    """The UI's environment: a venv per MLflow release and Python, in the user's cache
    folder (XDG_CACHE_HOME, else ~/.cache)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    py = f"py{sys.version_info.major}.{sys.version_info.minor}"
    return cache / "trainflow" / f"mlflow-ui-{release or mlflow_release()}-{py}"


def ui_python(say: Callable[[str], None]) -> Path:
    """A Python that runs MLflow's UI: this one when the full ``mlflow`` (its UI's files
    included) is installed beside trainflow, else the UI's own environment, made now if
    it is not ready."""
    if full_mlflow_here():
        return Path(sys.executable)
    release = mlflow_release()
    env = ui_env(release)
    if not (env / READY_MARK).exists():
        with _env_lock(env, say):
            if not (env / READY_MARK).exists():  # another command may have made it meanwhile
                make_env(env, release, say)
    return env / "bin" / "python"


@contextlib.contextmanager
def _env_lock(env: Path, say: Callable[[str], None]) -> Iterator[None]:
    """One process at a time makes the environment; the others wait for it."""
    env.parent.mkdir(parents=True, exist_ok=True)
    with open(env.parent / f"{env.name}.lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another command that is preparing MLflow's UI in {env}")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def make_env(env: Path, release: str, say: Callable[[str], None]) -> None:
    """A venv at ``env`` with ``mlflow==release`` installed by pip (from pip's own index
    and config), marked ready last; UIError, with pip's reason, when it cannot be made."""
    say(
        f"preparing MLflow's UI, once: installing mlflow=={release} into {env}, an environment "
        "of its own (full mlflow pins an older pyarrow than trainflow's); a minute or two, "
        "longer on a slow network ..."
    )
    start = time.monotonic()
    shutil.rmtree(env, ignore_errors=True)  # what an interrupted install left
    try:
        venv.EnvBuilder(with_pip=True).create(env)
    except (OSError, subprocess.CalledProcessError) as e:
        raise UIError(
            f"could not make a virtual environment at {env} ({e}); Python's venv and ensurepip "
            "modules are needed (Debian and Ubuntu: apt-get install python3-venv)"
        ) from None
    log = env / "install.log"
    with open(log, "w") as out:
        pip = [str(env / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check"]
        installed = subprocess.run([*pip, f"mlflow=={release}"], stdout=out, stderr=subprocess.STDOUT)
    if installed.returncode != 0:
        raise UIError(
            f"could not install mlflow=={release} for MLflow's UI ({last_error(log)}); it needs a "
            f"package index that pip reaches (pip's config or PIP_INDEX_URL); pip's log: {log}"
        )
    (env / READY_MARK).write_text(f"mlflow=={release}\n")
    say(f"MLflow's UI is ready ({time.monotonic() - start:.0f} s); later runs reuse {env}")


def last_error(log: Path) -> str:
    """The last line of a log that says what failed (pip's ``ERROR:`` line), else its last line."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("ERROR", "Error", "error"))]
    return (errors or lines or ["no output"])[-1]


def mlflow_python(say: Callable[[str], None]) -> Path:
    """MLflow's full environment (the one `trainflow ui` keeps) with PostgreSQL's driver."""
    try:
        python = ui_python(say)
    except UIError as e:
        raise StackError(f"MLflow server: {e}") from None
    # One command at a time installs it: two pip runs into one environment can break it.
    with open(Path(python).parent.parent / ".trainflow-psycopg2.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if subprocess.run([python, "-c", "import psycopg2"], capture_output=True).returncode != 0:
            say("installing PostgreSQL's driver (psycopg2-binary) into MLflow's environment ...")
            pip = [
                python,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "psycopg2-binary",
            ]
            done = subprocess.run(pip, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise StackError(
                    f"MLflow server: psycopg2-binary did not install: {done.stderr.strip()[-300:]}"
                )
    return python
