"""Every rl prompt is encoded and length-checked before step 1 (runtime/rl/prompts/check.py), in the job too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from gdnctl.errors import GdnctlError
from gdnctl.runtime.rl.prompts.check import PromptCheckError, check_prompts
from gdnctl.runtime.rl.prompts.dataset import PromptRecord

REPO = Path(__file__).resolve().parents[3]


def records(*lengths: int) -> list[PromptRecord]:
    return [PromptRecord("x" * length, "1", line) for line, length in enumerate(lengths, start=1)]


def bytes_of(record: PromptRecord) -> list[int]:
    return list(record.prompt.encode())


def test_overlong_prompts_are_left_out_and_the_rest_keep_their_tokens():
    checked = check_prompts(
        records(3, 9, 4, 12), bytes_of, max_model_len=10, max_response_tokens=4, refuse=False, where="p.jsonl"
    )
    assert [r.line for r in checked.records] == [1, 3]
    assert checked.dropped == ((2, 9), (4, 12)) and checked.limit == 6
    assert checked.encoded == {1: [120] * 3, 3: [120] * 4}


def test_refuse_stops_with_the_count_the_first_lines_and_the_fixes():
    with pytest.raises(PromptCheckError) as refused:
        check_prompts(
            records(*([20] * 7), 1), bytes_of, max_model_len=10, max_response_tokens=4, refuse=True, where="p.jsonl"
        )
    message = str(refused.value)
    assert message.startswith("7 of 8 prompts in p.jsonl are longer than the 6 tokens the rollout takes")
    assert "lines 1 (20 tokens), 2 (20 tokens), 3 (20 tokens), 4 (20 tokens), 5 (20 tokens) and 2 more" in message
    assert "rollout.overlong_prompts: drop" in message


def test_no_prompt_left_is_a_sentence():
    with pytest.raises(PromptCheckError, match="leaves no prompt to train on"):
        check_prompts(records(9), bytes_of, max_model_len=10, max_response_tokens=4, refuse=False, where="p.jsonl")


def test_a_prompt_the_tokenizer_cannot_encode_names_its_line():
    def encode(record):
        if record.line == 2:
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        return bytes_of(record)

    with pytest.raises(PromptCheckError, match=r"p.jsonl:2: the prompt cannot be encoded \(UnicodeEncodeError"):
        check_prompts(records(1, 1), encode, max_model_len=10, max_response_tokens=4, refuse=False, where="p.jsonl")


def test_the_encoders_own_sentence_goes_through_unchanged():
    def encode(record):
        raise GdnctlError(f"p.jsonl:{record.line}: the prompt encodes to no tokens.")

    with pytest.raises(GdnctlError, match="p.jsonl:1: the prompt encodes to no tokens"):
        check_prompts(records(1), encode, max_model_len=10, max_response_tokens=4, refuse=False, where="p.jsonl")


@pytest.fixture
def gloo(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_rl_job_drops_an_overlong_prompt_before_step_1_and_never_draws_it(tmp_path, gloo, capsys):
    from gdnctl.runtime.rl.job import RlJob
    from gdnctl.schema.engine import EngineConfig

    prompts = (REPO / "examples" / "toy-rl" / "prompts.jsonl").read_text().splitlines()
    prompts[4] = json.dumps({"prompt": "Q: " + "9 + " * 100 + "1 = ? A:", "answer": "901"})  # 400+ byte tokens
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(prompts) + "\n")
    run_dir = tmp_path / "run"
    rendered = subprocess.run(
        [
            sys.executable,
            "-m",
            "gdnctl",
            "render",
            "tiny-qwen3.5-rl-cpu",
            "-o",
            str(run_dir),
            "--set",
            f"train.data_path={data}",
        ],
        text=True,
        capture_output=True,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    job = RlJob(EngineConfig.from_file(run_dir / "engine.yaml"), run_dir / "engine.yaml", comm_policy=None)
    try:
        logged = capsys.readouterr().out
        assert f"1 of {len(prompts)} prompts in {data} are longer than the 240 tokens the rollout takes" in logged
        assert "line 5 (" in logged and "left out" in logged
        drawn = {r.line for step in range(job.schedule.steps_per_epoch * 3) for r in job.schedule.batch(step).records}
        assert 5 not in drawn and len(drawn) > 50
    finally:
        job.close()
