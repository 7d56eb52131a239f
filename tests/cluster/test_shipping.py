"""trainflow shipped to a cluster's workers as runtime_env py_modules."""

import shutil


def test_a_shipped_trainflow_comes_before_one_the_cluster_has(ray_cluster, tmp_path):
    """A cluster's own trainflow (here: an older copy first on the workers' PYTHONPATH, and
    the session's editable install) loses to the copy shipped as runtime_env py_modules:
    Ray puts py_modules ahead of the path the worker had."""
    import ray

    from trainflow import __version__
    from trainflow.cluster.shipping import trainflow_package, uploaded_modules

    # An older release of trainflow, as a cluster's image might hold (a copy, since every
    # worker of this job runs trainflow's setup hook from whichever copy it imports).
    stale = tmp_path / "site" / "trainflow"
    shutil.copytree(trainflow_package(), stale, ignore=shutil.ignore_patterns("__pycache__"))
    version = stale / "version.py"
    version.write_text(version.read_text().replace(f'__version__ = "{__version__}"', '__version__ = "0.0.1"'))
    older = {"env_vars": {"PYTHONPATH": str(stale.parent)}}

    @ray.remote(num_cpus=0)
    def imported() -> tuple[str, str]:
        import trainflow

        return trainflow.__file__, trainflow.__version__

    where, version = ray.get(
        imported.options(runtime_env={**uploaded_modules([trainflow_package()]), **older}).remote()
    )
    assert "runtime_resources" in where and version != "0.0.1", where
    # Without the shipped copy, the same worker environment imports the stale one: the
    # check above is about the order, not about a path that was never there.
    assert ray.get(imported.options(runtime_env=older).remote()) == (
        str(stale / "__init__.py"),
        "0.0.1",
    )
