"""The evaluation stage: labelled tasks, fine-tuning, metrics."""
