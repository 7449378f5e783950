"""The doctor never writes a credential's value: not in --json, not in --save-facts, not in the text report."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gdnctl.doctor.facts import CREDENTIAL_MARKERS, ENV_NAMES, ENV_PREFIXES, REDACTED, MachineFacts

# Names the probes record (their prefix) whose names look like credentials, and the usual credentials outside the
# probes' list; every value is unique so a leak anywhere is found by a plain substring search.
RECORDED_SECRETS = {
    "NCCL_IB_PKEY": "s3cret-nccl-pkey-1",
    "NCCL_PLUGIN_AUTH_TOKEN": "s3cret-nccl-token-2",
    "TORCH_NCCL_Password": "s3cret-torch-nccl-password-3",
    "NCCL_NET_CREDENTIALS": "s3cret-cred-4",
}
OTHER_SECRETS = {
    "WANDB_API_KEY": "s3cret-wandb-5",
    "HF_TOKEN": "s3cret-hf-6",
    "AWS_SECRET_ACCESS_KEY": "s3cret-aws-7",
    "DB_PASSWD": "s3cret-passwd-8",
}
SECRET_VALUES = [*RECORDED_SECRETS.values(), *OTHER_SECRETS.values()]


def doctor(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **RECORDED_SECRETS, **OTHER_SECRETS, "NCCL_DEBUG": "WARN"}
    return subprocess.run(
        [sys.executable, "-m", "gdnctl", "doctor", *args], capture_output=True, text=True, timeout=300, env=env
    )


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        leaked = [value for value in SECRET_VALUES if value in text]
        assert not leaked, leaked


def test_json_and_saved_facts_name_credentials_without_their_values(tmp_path):
    saved = tmp_path / "facts.json"
    proc = doctor("--json", "--save-facts", str(saved))
    assert_no_secret(proc.stdout, proc.stderr, saved.read_text())
    for env in (json.loads(proc.stdout)["facts"]["env"], json.loads(saved.read_text())["env"]):
        assert {name: env[name] for name in RECORDED_SECRETS} == dict.fromkeys(RECORDED_SECRETS, REDACTED)
        assert env["NCCL_DEBUG"] == "WARN"  # an ordinary variable keeps its value
        assert not set(OTHER_SECRETS) & set(env)  # outside the probes' list: not recorded at all


def test_text_report_shows_credentials_redacted():
    proc = doctor()
    assert_no_secret(proc.stdout, proc.stderr)
    assert f"NCCL_PLUGIN_AUTH_TOKEN={REDACTED}" in proc.stdout


def test_replaying_old_facts_with_a_secret_redacts_it(tmp_path):
    """Facts written before redaction (or by hand) are redacted when loaded, before any output."""
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"python_version": "3.12.3", "env": {"NCCL_SOCKET_AUTH_KEY": "s3cret-hf-6"}}))
    resaved = tmp_path / "again.json"
    proc = doctor("--facts", str(old), "--json", "--save-facts", str(resaved))
    assert_no_secret(proc.stdout, proc.stderr, resaved.read_text())
    assert json.loads(proc.stdout)["facts"]["env"] == {"NCCL_SOCKET_AUTH_KEY": REDACTED}


def test_facts_built_in_code_are_redacted_too():
    facts = MachineFacts("3.12.3", env={"NCCL_IB_HCA": "mlx5", "torch_nccl_secret": "x"})
    assert facts.env == {"NCCL_IB_HCA": "mlx5", "torch_nccl_secret": REDACTED}


def test_help_says_exactly_which_variables_are_saved_and_that_credentials_are_redacted():
    proc = subprocess.run(
        [sys.executable, "-m", "gdnctl", "doctor", "--help"], capture_output=True, text=True, timeout=60
    )
    text = " ".join(proc.stdout.split())
    for name in (*ENV_NAMES, *(f"{prefix}*" for prefix in ENV_PREFIXES), *CREDENTIAL_MARKERS, REDACTED):
        assert name in text, name
