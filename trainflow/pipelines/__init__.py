"""Ray and PyTorch, a folder per stage: ``data`` (prepare), ``models``, ``training``
(Ray Train), ``sweep`` (Ray Tune), ``evaluation`` (and batch prediction), ``registry``
(MLflow) and ``serving`` (Ray Serve). Never imports Prefect."""
