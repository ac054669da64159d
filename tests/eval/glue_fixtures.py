"""Tiny GLUE folders written in each task's official file layout (columns, header or not, BOM)."""

from __future__ import annotations

from pathlib import Path

P1 = "( ( The cat ) sat )"  # stand-ins for MNLI's parse columns
P2 = "(ROOT (S (NP (DT The) (NN cat)) (VP (VBD sat))))"

# folder -> file -> text (rows exactly as the GLUE download has them)
LAYOUTS: dict[str, dict[str, str]] = {
    "CoLA": {  # no header: source, label, original mark, sentence
        "train.tsv": "gj04\t1\t\tOur friends won't buy this analysis.\n"
        "gj04\t0\t*\tThey drank the pub.\n"
        "gj04\t1\t\tThe sailors rode the breeze clear of the rocks.\n",
        "dev.tsv": "gj04\t0\t*\tThe more we study verbs, the crazier they get get.\nclc95\t1\t\tDay by day the facts are getting murkier.\n",
    },
    "SST-2": {
        "train.tsv": "sentence\tlabel\nhide new secretions from the parental units \t0\ncontains no wit , only labored gags \t0\nthat loves its characters \t1\n",
        "dev.tsv": "sentence\tlabel\nit 's a charming and often affecting journey . \t1\nunflinchingly bleak and desperate \t0\n",
    },
    "MRPC": {  # label first; the files start with a UTF-8 BOM
        "train.tsv": "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        "1\t702876\t702977\tAmrozi accused his brother .\tReferring to him , Amrozi accused his brother .\n"
        "0\t2108705\t2108831\tYucaipa owned Dominick 's .\tYucaipa bought Dominick 's in 1995 .\n",
        "dev.tsv": "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        "1\t1355540\t1355592\tHe said the foodservice pie business doesn 't fit .\tThe foodservice pie business does not fit .\n"
        "0\t2029631\t2029565\tMagnarelli said Racicot hated the Iraqi regime .\tHis wife said he was 100 percent behind George Bush .\n",
    },
    "QQP": {  # one malformed row (too few fields), as in the real train.tsv
        "train.tsv": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
        "133273\t213221\t213222\tHow is the life of a math student?\tWhich level of prepration is enough?\t0\n"
        "402555\t536040\t536041\tHow do I control my horny emotions?\tHow do you control your horniness?\t1\n"
        "363362\t19\tHow can I be a good geologist?\n",
        "dev.tsv": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
        "201359\t303345\t303346\tWhy are African-Americans so beautiful?\tWhy are hispanics so beautiful?\t0\n"
        "263843\t69383\t380476\tI want to pursue PhD in Computer Science.\tI handle social media for a non-profit.\t1\n",
    },
    "STS-B": {  # regression score in the last column
        "train.tsv": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
        "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking off.\tAn air plane is taking off.\t5.000\n"
        "1\tmain-captions\tMSRvid\t2012test\t0004\tnone\tnone\tA man is playing a large flute.\tA man is playing a flute.\t3.800\n",
        "dev.tsv": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
        "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man with a hard hat is dancing.\tA man wearing a hard hat is dancing.\t5.000\n"
        "1\tmain-captions\tMSRvid\t2012test\t0002\tnone\tnone\tA young child is riding a horse.\tA child is riding a horse.\t4.750\n",
    },
    "MNLI": {  # train: label1 + gold_label; dev: label1..label5 + gold_label
        "train.tsv": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n"
        f"0\t31193\t31193n\tgovernment\t{P1}\t{P1}\t{P2}\t{P2}\tConceptually cream skimming has two dimensions.\tProduct and geography are what make it work.\tneutral\tneutral\n"
        f"1\t101457\t101457e\ttelephone\t{P1}\t{P1}\t{P2}\t{P2}\tyou know during the season i guess\tYou lose the things to the following level.\tentailment\tentailment\n"
        f"2\t134793\t134793e\tfiction\t{P1}\t{P1}\t{P2}\t{P2}\tOne of our number will carry out your instructions.\tNobody will do it.\tcontradiction\tcontradiction\n",
        "dev_matched.tsv": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n"
        f"0\t63735\t63735n\tslate\t{P1}\t{P1}\t{P2}\t{P2}\tThe new rights are nice enough\tEveryone really likes the newest benefits\tneutral\tentailment\tneutral\tneutral\tneutral\tneutral\n",
        "dev_mismatched.tsv": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n"
        f"0\t75\t75c\tletters\t{P1}\t{P1}\t{P2}\t{P2}\tYour contribution helped make it possible.\tYour contributions were of no help.\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction\n"
        f"1\t204\t204e\tverbatim\t{P1}\t{P1}\t{P2}\t{P2}\tThe dog barked.\tThere is a dog.\tentailment\tentailment\tentailment\tentailment\tentailment\tentailment\n",
    },
    "QNLI": {
        "train.tsv": "index\tquestion\tsentence\tlabel\n"
        "0\tWhen did the third Digimon series begin?\tUnlike the two seasons before it, Digimon Tamers takes a darker turn.\tnot_entailment\n"
        "1\tWhich missile batteries often have individual launchers?\tMissile batteries often have several launchers.\tentailment\n",
        "dev.tsv": "index\tquestion\tsentence\tlabel\n0\tWhat came into force after the new constitution?\tThe treaty came into force after it.\tentailment\n",
    },
    "RTE": {
        "train.tsv": "index\tsentence1\tsentence2\tlabel\n"
        "0\tNo Weapons of Mass Destruction Found in Iraq Yet.\tWeapons of Mass Destruction Found in Iraq.\tnot_entailment\n"
        "1\tA place of sorrow, after Pope John Paul II died.\tPope John Paul II died.\tentailment\n",
        "dev.tsv": "index\tsentence1\tsentence2\tlabel\n0\tDana Reeve died of lung cancer.\tChristopher Reeve had an accident.\tnot_entailment\n",
    },
    "WNLI": {
        "train.tsv": "index\tsentence1\tsentence2\tlabel\n"
        "0\tI stuck a pin through a carrot. When I pulled the pin out, it had a hole.\tThe carrot had a hole.\t1\n"
        "1\tJohn couldn't see the stage with Billy in front of him because he is so short.\tBilly is so short.\t0\n",
        "dev.tsv": "index\tsentence1\tsentence2\tlabel\n0\tThe drain is clogged with hair. It has to be cleaned.\tThe hair has to be cleaned.\t0\n",
    },
}


def without_header(text: str) -> str:
    """A file as copies in public repositories often have it: the same rows in the official
    column order, without the header row (and its BOM)."""
    return text.split("\n", 1)[1]


# MRPC and STS-B as found without header rows (issue 16.5)
HEADERLESS: dict[str, dict[str, str]] = {
    folder: {name: without_header(text) for name, text in LAYOUTS[folder].items()} for folder in ("MRPC", "STS-B")
}


def write_glue(root: Path, headerless: tuple[str, ...] = ()) -> Path:
    """The GLUE folders; the ones named in ``headerless`` without their header rows."""
    for folder, files in LAYOUTS.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            if folder in headerless:
                text = HEADERLESS[folder][name] if folder in HEADERLESS else without_header(text)
            (root / folder / name).write_text(text, encoding="utf-8")
    return root
