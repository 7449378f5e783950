"""gdnctl.files.replace_text: run-dir files (W&B run id, metrics on resume, kernel warm-up, the rollout address)
are written without following a link planted in the run dir."""

from __future__ import annotations

import os
import stat

from gdnctl.files import replace_text


def test_a_link_at_the_name_is_replaced_and_its_target_untouched(tmp_path):
    target = tmp_path / "victim"
    target.write_text("precious\n")
    (tmp_path / "run").mkdir()
    link = tmp_path / "run" / "run_id"
    link.symlink_to(target)
    replace_text(link, "abc\n")
    assert target.read_text() == "precious\n"
    assert not link.is_symlink() and link.read_text() == "abc\n"


def test_links_planted_at_the_old_temporary_names_are_never_opened(tmp_path):
    target = tmp_path / "victim"
    target.write_text("precious\n")
    for name in ("run_id.tmp", ".run_id.tmp", "metrics.tmp"):
        (tmp_path / name).symlink_to(target)
    replace_text(tmp_path / "run_id", "abc\n")
    assert target.read_text() == "precious\n"
    assert (tmp_path / "run_id").read_text() == "abc\n"
    # nothing but the planted links and the file itself is left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".run_id.tmp",
        "metrics.tmp",
        "run_id",
        "run_id.tmp",
        "victim",
    ]


def test_the_mode_is_set_from_creation(tmp_path):
    replace_text(tmp_path / "address.json", "{}", mode=0o600)
    assert stat.S_IMODE(os.stat(tmp_path / "address.json").st_mode) == 0o600
