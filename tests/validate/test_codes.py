"""The code ledger (gdnctl/validate/codes.py) and the registry agree, and each prefix lives in its module."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gdnctl.cli import app
from gdnctl.validate import RULES, codes
from gdnctl.validate.findings import Severity, rule


def test_every_ledger_code_is_registered_and_every_registered_code_is_in_the_ledger():
    assert set(RULES) == set(codes.CODES)
    for code, info in RULES.items():
        assert codes.CODES[code] == info.name


def test_each_code_prefix_lives_in_its_module():
    for code, info in RULES.items():
        concern = codes.PREFIXES[codes.prefix_of(code)]
        assert info.concern == concern, code
        if info.check is not None:
            assert info.check.__module__ == f"gdnctl.validate.rules.{concern}", code


def test_retired_codes_are_never_live():
    assert not set(codes.RETIRED) & set(codes.CODES)


def test_a_rule_outside_the_ledger_is_refused_at_registration():
    def tp_divides_kv_heads(run):
        return ()

    tp_divides_kv_heads.__module__ = "gdnctl.validate.rules.heads"
    with pytest.raises(RuntimeError, match="HEAD999 is not in gdnctl/validate/codes.py"):
        rule("HEAD999", Severity.ERROR, "x")(tp_divides_kv_heads)
    assert "HEAD999" not in RULES


def test_a_code_in_the_wrong_module_is_refused():
    with pytest.raises(RuntimeError, match="belongs in the 'heads' concern"):
        codes.check_registration("HEAD002", "tp_divides_kv_heads", "layout")


def test_a_retired_code_is_refused_and_explained(monkeypatch):
    monkeypatch.setitem(codes.RETIRED, "LAY099", "folded into LAY002 in 0.2")
    with pytest.raises(RuntimeError, match="retired"):
        codes.check_registration("LAY099", "anything", "layout")
    result = CliRunner().invoke(app, ["rules", "LAY099"])
    assert result.exit_code == 0
    assert "LAY099 is retired: folded into LAY002 in 0.2" in result.output
