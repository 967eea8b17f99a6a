"""tools/quality/mutants.py: every mutant still applies to the code it names, so moving code
cannot silently retire one (the tool would refuse the whole list at its next run)."""

from __future__ import annotations

import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools" / "quality"))

import mutants


def test_every_mutant_applies_exactly_once():
    assert mutants.stale_mutants(mutants.MUTANTS) == []


def test_a_stale_mutant_is_named_with_why(capsys):
    moved = mutants.Mutant("moved", "minirt/llm.py", "text that is nowhere", "x", "a test")
    gone = mutants.Mutant("gone", "minirt/no_such_file.py", "x", "y", "a test")
    twice = mutants.Mutant("twice", "minirt/llm.py", "import", "x", "a test")
    stale = mutants.stale_mutants([moved, gone, twice, mutants.MUTANTS[0]])
    assert [(m.name, why) for m, why in stale] == [
        ("moved", "its old text occurs 0 times in minirt/llm.py, not once"),
        ("gone", "minirt/no_such_file.py does not exist"),
        ("twice", stale[2][1]),
    ]
    assert stale[2][1].startswith("its old text occurs ") and "times" in stale[2][1]
    assert mutants.main(["--check", "--only", mutants.MUTANTS[0].name]) == 0
    assert capsys.readouterr().out.strip() == "1 of 1 mutants apply"
