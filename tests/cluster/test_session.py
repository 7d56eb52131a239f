"""A run's Ray session: the worker processes it starts ahead of its first tasks."""


def test_warm_workers_start_one_per_cpu_with_the_preprocessing_code_imported(ray_cluster):
    import ray

    from trainflow.cluster.session import warm_workers

    refs = warm_workers(["trainflow.pipelines.data.prepare"], most=8)
    assert len(refs) == min(int(ray.cluster_resources()["CPU"]), 8)
    ray.get(refs, timeout=60)  # a worker that cannot import trainflow.pipelines.data.prepare fails here
    assert len(warm_workers(["trainflow.pipelines.data.prepare"], most=1)) == 1
