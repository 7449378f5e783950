"""The files a local job reads at start, checked before `gdnctl launch` writes anything.

validate reports a model.tokenizer, train.data_path or eval.data_path that is not on this machine as LCH007, a
warning: a preset is often validated on another machine than the one it runs on. A local launch runs the job on
this one, where such a path fails every rank after torchrun has started them; launch refuses it instead, with
validate's sentences, and leaves no run dir behind.
"""

from __future__ import annotations

from gdnctl.errors import GdnctlError

MISSING_LOCAL_FILE = "LCH007"  # validate's rule for these files (gdnctl/validate/rules/launch.py)


class LocalInputMissing(GdnctlError):
    pass


def check(result) -> None:
    """Raise LocalInputMissing when a file the local job reads at start is not on this machine."""
    missing = [finding for finding in result.findings if finding.code == MISSING_LOCAL_FILE]
    if missing:
        said = " ".join(f"{finding.message} {finding.hint}" for finding in missing)
        raise LocalInputMissing(f"{said} Nothing was written.")
