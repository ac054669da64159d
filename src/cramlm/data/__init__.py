"""The data stage: sources -> tokenizer -> packed tokens -> datasets and collators."""
