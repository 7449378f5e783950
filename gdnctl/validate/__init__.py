"""`gdnctl validate`: load a preset (YAML, `base:`, `--set`), resolve it, run every rule, and report findings.

Importing the package registers every rule and load code (`RULES`)."""

from gdnctl.validate import codes
from gdnctl.validate.filesystem import preset_interpreters, replaceable_by_others, trainer_python
from gdnctl.validate.findings import RULES, Finding, RuleInfo, Severity
from gdnctl.validate.loader import LoadedPreset, load_preset, resolve_preset_path
from gdnctl.validate.pipeline import PresetHasErrors, ValidationResult, validate
from gdnctl.validate.report import (
    format_derived,
    format_findings,
    format_memory,
    format_rule_doc,
    format_rule_list,
    format_rule_table,
    summary_line,
)
from gdnctl.validate.user_code import preset_code

__all__ = [
    "Finding",
    "LoadedPreset",
    "PresetHasErrors",
    "RULES",
    "RuleInfo",
    "Severity",
    "ValidationResult",
    "codes",
    "format_derived",
    "format_findings",
    "format_memory",
    "format_rule_doc",
    "format_rule_list",
    "format_rule_table",
    "load_preset",
    "preset_code",
    "preset_interpreters",
    "replaceable_by_others",
    "resolve_preset_path",
    "summary_line",
    "trainer_python",
    "validate",
]
