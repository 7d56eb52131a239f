"""Ray and PyTorch, a folder per stage: ``data`` (prepare), ``models``, ``training``
(Ray Train, and sweeps on Ray Tune), ``evaluation`` (and batch prediction), ``registry``
(MLflow) and ``serving`` (Ray Serve). Never imports Prefect."""
