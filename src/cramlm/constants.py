"""Values every stage agrees on, in one place (no imports: any module may use them)."""

IGNORE_INDEX = -100  # label of a position that carries no target (padding, unmasked MLM tokens); torch's default
OUTPUTS_DIR = "outputs"  # where runs go by default (<base_dir>/<name>); a bare run name is looked up there
