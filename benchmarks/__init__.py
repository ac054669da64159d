"""cramlm's benchmarks (benchmarks/README.md indexes them). Run each from the repository root with
cramlm installed (``pip install -e .``): ``python benchmarks/<script>.py``, or ``python -m
benchmarks.<script>``, which the two scripts that reuse another script's code need
(step_cpu_time: train_step's step; prefetch_cpu: scaling's data)."""
