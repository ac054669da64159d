"""Zero-shot minimal pairs (BLiMP and its like): the ``eval.minimal_pairs`` block, reading pair
files, and the accuracy per paradigm, per phenomenon and macro-averaged. Torch-free; the
sentence scorers are in eval/sentence_scores.py.

A pair is two sentences differing in one grammatical point; a model is right when it scores the
acceptable one higher. A source is a JSONL file (one pair per line, gzipped or not) or a folder of
them (every ``*.jsonl`` and ``*.jsonl.gz``, in name order). The field names are BLiMP's by default (``sentence_good``,
``sentence_bad``, ``UID`` the paradigm, ``linguistics_term`` the phenomenon) and configurable;
a file without the paradigm field is one paradigm named after the file's stem. Refused, naming the
file and line: a paradigm given two phenomena, a paradigm or phenomenon field set to a name (not
BLiMP's) that no line of a file has (a typo would silently regroup the pairs), and a folder whose
subfolders hold pair files that ``paths`` does not list (they would not be read).

Scoring conventions (see eval/sentence_scores.py for how each kind of model scores a sentence):
- **Ties count half.** A pair whose two scores differ by at most :data:`TIE_NATS` nats (identical
  token sequences always do) scores 0.5, and the tie rate is reported: lm-evaluation-harness and
  the BabyLM pipelines count a tie as right (argmax over [good, bad]), so a model that scores
  every sentence alike would get 100%.
- **Accuracy** per paradigm (pairs right / pairs), per phenomenon (the mean of its paradigms'),
  and the macro average over paradigms (BLiMP's headline figure).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from cramlm.config.base import Config, PositiveInt
from cramlm.io import package_path

TIE_NATS = 1e-4  # scores this close are a tie: far above fp32 batching noise (~1e-6), far below a model's differences

PLL_VARIANTS = ("word-l2r", "original")
PllVariant = Literal["word-l2r", "original"]

# BLiMP's reference figures on the 36 paradigms of the shared folder (minimal_pairs/README.md: the
# BLiMP paper's models, per-paradigm accuracy averaged over these paradigms, in %)
BLIMP_SHARED_36 = frozenset("""adjunct_island anaphor_gender_agreement animate_subject_passive causative
coordinate_structure_constraint_complex_left_branch determiner_noun_agreement_1 determiner_noun_agreement_irregular_1
determiner_noun_agreement_with_adj_2 determiner_noun_agreement_with_adj_irregular_2 distractor_agreement_relational_noun
ellipsis_n_bar_1 existential_there_object_raising existential_there_quantifiers_1 expletive_it_object_raising inchoative
irregular_past_participle_adjectives irregular_plural_subject_verb_agreement_1 left_branch_island_echo_question
matrix_question_npi_licensor_present npi_present_2 only_npi_scope passive_1 principle_A_c_command principle_A_case_2
principle_A_domain_2 principle_A_reconstruction regular_plural_subject_verb_agreement_1 sentential_negation_npi_scope
sentential_subject_island superlative_quantifiers_1 tough_vs_raising_2 transitive wh_questions_object_gap
wh_questions_subject_gap_long_distance wh_vs_that_no_gap_long_distance wh_vs_that_with_gap_long_distance""".split())
REFERENCE_36 = {"5-gram": 58.4, "LSTM": 66.5, "Transformer-XL": 67.5, "GPT-2 (1.5B)": 81.2}


class PairFields(Config):
    """Which JSON fields of a pair file hold what (BLiMP's names by default)."""

    good: str = Field("sentence_good", description="the acceptable sentence")
    bad: str = Field("sentence_bad", description="the unacceptable sentence (minimally different)")
    paradigm: str | None = Field(
        "UID", description="the paradigm's name; null or absent from a line: the file's stem")
    phenomenon: str | None = Field(
        "linguistics_term", description="the phenomenon the paradigm tests (BLiMP's files label its paper's 12 and s-selection, "
        "animate_subject_passive's, which the paper counts under argument structure); null or absent: the paradigm's name")

    @model_validator(mode="after")
    def _sentences_apart(self):
        if self.good == self.bad or {self.good, self.bad} & {self.paradigm, self.phenomenon}:
            raise ValueError(f"the two sentences need fields of their own: good={self.good!r}, bad={self.bad!r}, "
                             f"paradigm={self.paradigm!r}, phenomenon={self.phenomenon!r}")
        return self


class PairsConfig(Config):
    """``eval.minimal_pairs``: zero-shot minimal-pair scoring (no fine-tuning), beside the tasks."""

    paths: list[str] = Field(
        [], description="JSONL pair files or folders of them (every *.jsonl and *.jsonl.gz), pkg:// or user paths; empty: no "
        "minimal-pair scoring. The shared BLiMP paradigms: ${oc.env:CRAMLM_DATA_DIR,../shared/data}/minimal_pairs/blimp")
    fields: PairFields = Field(PairFields(), description="the field names of a pair (BLiMP's by default)")
    max_pairs: PositiveInt | None = Field(
        None, description="score the first N pairs of each paradigm (in file order); null: all")
    pll: list[PllVariant] = Field(
        ["word-l2r"], min_length=1,
        description="masked LMs' pseudo-log-likelihood variants, the first the headline: word-l2r (Kauf & Ivanova "
        "2023: a token's own mask also covers the rest of its word; the default, docs/evaluation.md says why) "
        "or original (Salazar et al. 2020, BabyLM's: the token alone masked). Both: [word-l2r, original] "
        "(the copies they share are scored once)")
    generator: bool = Field(
        True, description="ELECTRA (rtd) runs: also score with the generator's pseudo-log-likelihood, beside the "
        "discriminator's (the headline)")
    batch_tokens: PositiveInt = Field(
        8192, description="tokens (padded) per forward pass when scoring; no effect on the scores, only on speed and memory")
    save_every: PositiveInt = Field(
        2048, description="sentences scored between two writes of the partial file (<stem>.partial.json): a stopped or "
        "killed evaluation keeps the sentences scored so far and the same command continues after them; no effect on "
        "the scores")

    @field_validator("pll")
    @classmethod
    def _once_each(cls, value: list[str]) -> list[str]:
        if len(set(value)) < len(value):
            raise ValueError(f"each variant once: {value}")
        return value


class PairsError(ValueError):
    """A pair file is missing or malformed; the message names the file and line."""


@dataclass
class Pair:
    good: str
    bad: str
    paradigm: str
    phenomenon: str
    where: str = ""  # file:line, named by errors about the pair


def _is_pairs(path: Path) -> bool:
    return path.name.endswith((".jsonl", ".jsonl.gz"))


def pair_files(spec: str, listed: frozenset[Path] = frozenset()) -> list[Path]:
    """The JSONL files of one ``paths`` entry: a file, or a folder's ``*.jsonl`` and ``*.jsonl.gz`` in
    name order; a subfolder holding pair files that is not ``listed`` (resolved folders of ``paths``) is refused."""
    path = package_path(spec)
    if path.is_dir():
        nested = sorted(d.name for d in path.iterdir() if d.is_dir() and not d.name.startswith(".")
                        and d.resolve() not in listed and any(f.is_file() for f in d.rglob("*") if _is_pairs(f)))
        if nested:
            raise PairsError(f"eval.minimal_pairs.paths: {path}: subfolder{'s' if len(nested) > 1 else ''} "
                             f"{', '.join(nested)} hold{'' if len(nested) > 1 else 's'} pair files (*.jsonl, *.jsonl.gz), which would not be "
                             "read (a folder's own are): list each folder of pairs in paths")
        files = sorted(p for p in path.iterdir() if p.is_file() and _is_pairs(p))
        if not files:
            raise PairsError(f"eval.minimal_pairs.paths: {path}: no *.jsonl or *.jsonl.gz files in this folder")
        return files
    if path.is_file():
        return [path]
    raise PairsError(f"eval.minimal_pairs.paths: {spec}: no such file or folder")


def _unicode(value: str, key: str, path: Path, lineno: int) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate (JSON's "\ud800" escapes): no text a tokenizer or a report takes
        raise PairsError(f"{path}:{lineno}: field '{key}' is not valid Unicode text ({e.reason} at character {e.start})") from None
    return value


def _text(obj: dict, key: str, path: Path, lineno: int) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise PairsError(f"{path}:{lineno}: field '{key}' (eval.minimal_pairs.fields) is "
                         + ("missing" if value is None else "not a non-empty string"))
    return _unicode(value, key, path, lineno)


def _name(obj: dict, key: str | None, path: Path, lineno: int) -> str | None:
    """The paradigm or phenomenon field of a line; None when unset, absent or empty."""
    value = obj.get(key) if key else None
    if value is None or value == "":
        return None
    if isinstance(value, (dict, list, bool)):
        raise PairsError(f"{path}:{lineno}: field '{key}' (eval.minimal_pairs.fields) is not a name: {json.dumps(value)[:60]}")
    return _unicode(str(value), key, path, lineno)


def file_paradigm(path: Path) -> str:
    """The paradigm of a file whose lines name none: its name without .jsonl(.gz)."""
    name = path.name.removesuffix(".gz")
    return name.removesuffix(".jsonl") if name.endswith(".jsonl") else Path(name).stem


def read_pairs(path: Path, fields: PairFields, max_pairs: int | None = None) -> list[Pair]:
    """The pairs of one JSONL file (each paradigm cut to its first ``max_pairs``)."""
    from cramlm.eval.tasks import TaskError, _rows

    try:
        rows = list(_rows(path, "jsonl", False)[1])  # (line number, JSON object); errors name file and line
    except TaskError as e:
        raise PairsError(str(e)) from None
    pairs, counts, first = [], {}, {}
    for lineno, obj in rows:
        paradigm = _name(obj, fields.paradigm, path, lineno) or file_paradigm(path)
        phenomenon = _name(obj, fields.phenomenon, path, lineno) or paradigm
        was, at = first.setdefault(paradigm, (phenomenon, lineno))
        if was != phenomenon:
            raise PairsError(f"{path}:{lineno}: paradigm '{paradigm}' has phenomenon '{phenomenon}' here, '{was}' on line "
                             f"{at} (field '{fields.phenomenon}'): a paradigm is one phenomenon")
        counts[paradigm] = counts.get(paradigm, 0) + 1
        if max_pairs is None or counts[paradigm] <= max_pairs:
            pairs.append(Pair(_text(obj, fields.good, path, lineno), _text(obj, fields.bad, path, lineno), paradigm,
                              phenomenon, f"{path}:{lineno}"))
    for key in ("paradigm", "phenomenon"):  # a name of the user's own that no line has is a typo, not a fallback
        name = getattr(fields, key)
        if rows and name and name != PairFields.model_fields[key].default and not any(name in obj for _, obj in rows):
            raise PairsError(f"{path}: no line has field '{name}' (eval.minimal_pairs.fields.{key}); null: "
                             + ("each file is one paradigm named after it" if key == "paradigm" else "the phenomenon is the paradigm"))
    if not pairs:
        raise PairsError(f"{path}: no pairs")
    return pairs


def load_pairs(cfg: PairsConfig) -> list[Pair]:
    """Every pair of ``cfg.paths`` (empty when none are set); a paradigm met in two files is an error."""
    pairs: list[Pair] = []
    seen: dict[str, Path] = {}
    listed = frozenset(path.resolve() for path in map(package_path, cfg.paths) if path.is_dir())
    read: dict[Path, str] = {}
    for spec in cfg.paths:
        for path in pair_files(spec, listed):
            if path.resolve() in read:
                raise PairsError(f"eval.minimal_pairs.paths: {path} is read twice (through {read[path.resolve()]!r} and {spec!r})")
            read[path.resolve()] = spec
            got = read_pairs(path, cfg.fields, cfg.max_pairs)
            for paradigm in dict.fromkeys(p.paradigm for p in got):
                if paradigm in seen:
                    raise PairsError(f"{path}: paradigm '{paradigm}' is also in {seen[paradigm]}: each paradigm in one file")
                seen[paradigm] = path
            pairs += got
    return pairs


# ------------------------------------------------------------------------------ accuracy


def outcome(good: float, bad: float) -> float:
    """1 when the good sentence scores higher, 0.5 for a tie (within TIE_NATS), else 0."""
    if abs(good - bad) <= TIE_NATS:
        return 0.5
    return 1.0 if good > bad else 0.0


def off_chance(paradigms: dict) -> dict[str, int]:
    """Paradigms whose accuracy is above or below 50% by more than two binomial standard errors of a
    coin over its pairs. A macro average near 50% may be a model at chance on every paradigm, or one
    with systematic preferences that pass some paradigms and fail others (as an n-gram model's do)."""
    off = {"above": 0, "below": 0}
    for r in paradigms.values():
        if abs(r["accuracy"] - 0.5) > 2 * (0.25 / r["pairs"]) ** 0.5:
            off["above" if r["accuracy"] > 0.5 else "below"] += 1
    return off


def accuracy(pairs: list[Pair], good: list[float], bad: list[float]) -> dict:
    """Accuracy per paradigm, per phenomenon (mean of its paradigms) and macro over paradigms,
    as fractions, the tie rate, and the paradigms off chance (``off_chance``): the record eval.json
    keeps per scorer."""
    by_paradigm: dict[str, list[float]] = {}
    phenomenon: dict[str, str] = {}
    for p, g, b in zip(pairs, good, bad):
        by_paradigm.setdefault(p.paradigm, []).append(outcome(g, b))
        phenomenon[p.paradigm] = p.phenomenon
    paradigms = {name: {"accuracy": statistics.fmean(o), "ties": sum(x == 0.5 for x in o) / len(o), "pairs": len(o),
                        "phenomenon": phenomenon[name]} for name, o in by_paradigm.items()}
    phenomena: dict[str, list[float]] = {}
    for r in paradigms.values():
        phenomena.setdefault(r["phenomenon"], []).append(r["accuracy"])
    ties = sum(r["ties"] * r["pairs"] for r in paradigms.values())
    return {"accuracy": statistics.fmean(r["accuracy"] for r in paradigms.values()),
            "tie_rate": ties / len(pairs), "pairs": len(pairs), "off_chance": off_chance(paradigms),
            "phenomena": {k: statistics.fmean(v) for k, v in sorted(phenomena.items())},
            "paradigms": paradigms}


def reference(paradigms) -> dict[str, float] | None:
    """BLiMP's published figures (%) when ``paradigms`` are exactly the shared 36, else None."""
    return REFERENCE_36 if set(paradigms) == BLIMP_SHARED_36 else None


# ------------------------------------------------------------------------------ tables


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def headline_of(result: dict | None) -> dict | None:
    """The headline scorer's record of an ``eval.json`` ``minimal_pairs`` block (None when it has none)."""
    return result.get("scores", {}).get(result.get("headline")) if isinstance(result, dict) else None


def twin_mismatch(result: dict | None, twin: dict | None) -> str | None:
    """Why the twin cannot stand beside the run: scored by another headline scorer (another
    eval.minimal_pairs.pll: word-l2r against original) or on other pairs (other paradigms or other pair
    counts: another max_pairs, other files), so a margin would compare different tests; None when it can
    (or either is missing)."""
    mine, base = headline_of(result), headline_of(twin)
    if not mine or not base:
        return None
    if result["headline"] != twin["headline"]:
        return (f"the untrained twin was scored by {twin['headline']}, the run by {result['headline']}: not compared; "
                "evaluate both with the same eval.minimal_pairs")
    a, b = ({k: r["pairs"] for k, r in h["paradigms"].items()} for h in (mine, base))
    if a == b:
        return None
    return (f"the untrained twin was scored on other pairs ({sum(b.values()):,} in {len(b)} paradigms, against "
            f"{sum(a.values()):,} in {len(a)}): not compared; evaluate both with the same eval.minimal_pairs")


def pairs_cells(result: dict, twin: dict | None = None) -> tuple[list[str], list[list[str]]]:
    """(header, rows): per phenomenon each scorer's accuracy in % (and the twin's headline, unless it
    was scored on other pairs), then the macro average over paradigms, the tie rate and the paradigms
    off chance (above / below)."""
    if twin_mismatch(result, twin):
        twin = None
    scorers = list(result["scores"])
    header = ["phenomenon", *scorers] + (["untrained twin"] if twin else [])
    head, twin_head = result["scores"][result["headline"]], (twin or {}).get("scores", {}).get((twin or {}).get("headline"))
    rows = []
    for name in head["phenomena"]:
        rows.append([name, *(_pct(result["scores"][s]["phenomena"].get(name)) for s in scorers)]
                    + ([_pct((twin_head or {}).get("phenomena", {}).get(name))] if twin else []))
    rows.append(["macro average (paradigms)", *(_pct(result["scores"][s]["accuracy"]) for s in scorers)]
                + ([_pct((twin_head or {}).get("accuracy"))] if twin else []))
    rows.append(["tie rate", *(_pct(result["scores"][s]["tie_rate"]) for s in scorers)]
                + ([_pct((twin_head or {}).get("tie_rate"))] if twin else []))
    rows.append(["paradigms off chance (above / below)", *(off_chance_cell(result["scores"][s]) for s in scorers)]
                + ([off_chance_cell(twin_head)] if twin else []))
    return header, rows


def off_chance_of(score: dict | None) -> dict[str, int] | None:
    """A scorer record's ``off_chance``, counted from its paradigms for records made before it; None
    without either."""
    if not score or not ("off_chance" in score or "paradigms" in score):
        return None
    return score.get("off_chance") or off_chance(score["paradigms"])


def off_chance_cell(score: dict | None) -> str:
    """'above / below' of ``off_chance_of``, or '-'."""
    off = off_chance_of(score)
    return "-" if off is None else f"{off['above']} / {off['below']}"


def two_se(a: float, pairs_a: int, b: float, pairs_b: int) -> float:
    """Two standard errors of the margin a - b between two accuracies, each binomial over its pairs."""
    return 2 * (a * (1 - a) / pairs_a + b * (1 - b) / pairs_b) ** 0.5


def ahead_of(a: float, pairs_a: int, b: float, pairs_b: int) -> int:
    """1 where accuracy a is above b by more than two standard errors of the margin and by more than
    2 points (not the luck of the pairs drawn, and not a hair), -1 where below by as much, else 0: the
    rule by which pretraining is ahead of or behind its untrained twin on a paradigm or phenomenon."""
    margin = a - b
    return (margin > 0) - (margin < 0) if abs(margin) > max(two_se(a, pairs_a, b, pairs_b), 0.02) else 0


def pairs_versus(result: dict | None, twin: dict | None) -> list[dict]:
    """Per paradigm: the run's headline accuracy, the untrained twin's, the margin, two standard
    errors of that margin (``two_se``) and ``ahead`` (``ahead_of``: 1, 0 or -1). Empty unless both
    were scored."""
    mine, base = headline_of(result), headline_of(twin)
    if not mine or not base or twin_mismatch(result, twin):
        return []
    out = []
    for name, p in mine["paradigms"].items():
        q = base["paradigms"].get(name)
        if q:
            a, b = p["accuracy"], q["accuracy"]
            out.append({"paradigm": name, "pretrained": a, "untrained": b, "margin": a - b,
                        "two_se": two_se(a, p["pairs"], b, q["pairs"]), "ahead": ahead_of(a, p["pairs"], b, q["pairs"])})
    return out


def pairs_verdict(result: dict | None, twin: dict | None) -> str | None:
    """One sentence on what pretraining bought zero-shot: per paradigm, ahead of the untrained twin
    or behind it by more than two standard errors (and at least 2 points), or level."""
    rows = pairs_versus(result, twin)
    if not rows:
        return None
    ahead = [r for r in rows if r["ahead"] > 0]
    behind = [r for r in rows if r["ahead"] < 0]
    paid = len(ahead) > len(rows) / 2 and not behind
    scores = ", ".join(f"{r['paradigm']} {100 * r['pretrained']:.1f} against {100 * r['untrained']:.1f}" for r in rows)
    return (f"zero-shot, pretraining {'paid' if paid else 'did not pay (yet)'}: it prefers the acceptable sentence of a "
            f"minimal pair more often than the untrained twin, by more than two standard errors, on {len(ahead)} of "
            f"{len(rows)} paradigm{'s' if len(rows) > 1 else ''}, less often on {len(behind)} "
            f"({scores}; % by {result['headline']})")


def pairs_title(result: dict) -> str:
    head = result["scores"][result["headline"]]
    ref = reference(head["paradigms"])
    refs = (", reference " + ", ".join(f"{k} {v}" for k, v in ref.items())) if ref else ""
    return (f"minimal pairs: {head['pairs']:,} pairs, {len(head['paradigms'])} paradigms, accuracy % "
            f"(ties count half; headline {result['headline']}{refs})")


def pairs_text(result: dict, twin: dict | None = None) -> str:
    """The minimal-pair table as aligned text (console)."""
    header, rows = pairs_cells(result, twin)
    cells = [header, *rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    line = lambda c: "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(c, widths))).rstrip()  # noqa: E731
    mismatch = twin_mismatch(result, twin)
    return f"{pairs_title(result)}:\n" + "\n".join(line(c) for c in cells) + "\n" + (f"{mismatch}\n" if mismatch else "")


def pairs_markdown(result: dict) -> str:
    header, rows = pairs_cells(result)
    lines = [f"**{pairs_title(result)}**", "", "| " + " | ".join(header) + " |",
             "|---|" + "---:|" * (len(header) - 1)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"
