"""The whole pipeline in one command (``cramlm run``, :mod:`cramlm.pipeline.recipe`) and scaling
sweeps (``cramlm sweep``, :mod:`cramlm.pipeline.sweep`). Nothing is imported here so that
``cramlm --help`` stays fast."""
