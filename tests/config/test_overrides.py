"""Overrides the command line builds from its own options are text, whatever the text holds."""

from __future__ import annotations

from cramlm.cli.common import resolve_or_exit, with_allowed_changes


def test_a_resume_path_with_yaml_characters_stays_the_path():
    # unquoted, '#' after a space began a YAML comment: resume=my ckpt #2 became 'my ckpt'
    for path in ("runs/my ckpt #2/checkpoints/step-00000002", "a: b", "[x]", "null"):
        overrides = with_allowed_changes(path, ())
        assert resolve_or_exit("pretrain", overrides).resume == path, overrides
