"""The evaluation stage: labelled tasks, fine-tuning, metrics."""

from cramlm.eval import glue  # noqa: F401 (registers the "glue:" task prefix of load_task)
