"""cramlm: language-model pretraining and evaluation under a fixed compute budget."""

__version__ = "0.1.0"
