"""The training stage: budget, schedules, optimizers, the loop, checkpoints."""
