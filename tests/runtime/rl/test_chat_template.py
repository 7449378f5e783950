"""Chat prompts through the tokenizer's chat template (rendered like transformers, without it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from gdnctl.runtime.rl.prompts.chat_template import ChatTemplateError, load_chat_template

REPO = Path(__file__).resolve().parents[3]
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]


def tokenizer_dir(tmp_path: Path, **config) -> Path:
    directory = tmp_path / "tokenizer"
    shutil.copytree(REPO / "examples" / "toy-rl" / "tokenizer", directory)
    original = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**original, **config}))
    return directory


def test_a_chatml_template_renders_like_transformers(tmp_path):
    template = load_chat_template(tokenizer_dir(tmp_path, chat_template=CHATML))
    assert template.render(CHAT) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert not template.render(CHAT, add_generation_prompt=False).endswith("assistant\n")


def test_template_sources_in_transformers_order(tmp_path):
    directory = tokenizer_dir(
        tmp_path, chat_template=[{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]
    )
    assert load_chat_template(directory).render(CHAT) == "plain"
    (directory / "chat_template.jinja").write_text("from the file")
    assert load_chat_template(directory).render(CHAT) == "from the file"
    assert load_chat_template(REPO / "examples" / "toy-rl" / "tokenizer") is None


def test_loop_controls_tojson_and_raise_exception_work_as_in_hf_templates(tmp_path):
    text = (
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{{ m | tojson }}"
        "{% endfor %}{% if messages[-1].role != 'user' %}{{ raise_exception('last must be user') }}{% endif %}"
    )
    template = load_chat_template(tokenizer_dir(tmp_path, chat_template=text))
    assert template.render(CHAT) == '{"role": "user", "content": "2+2?"}'
    with pytest.raises(ChatTemplateError, match="refused the messages: last must be user"):
        template.render(CHAT[:1])
    broken = load_chat_template(tokenizer_dir(tmp_path / "b", chat_template="{% for %}"))
    with pytest.raises(ChatTemplateError, match="cannot be rendered"):
        broken.render(CHAT)


@pytest.fixture
def gloo(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def rl_job(tmp_path: Path, tokenizer: Path):
    from gdnctl.runtime.rl.job import RlJob
    from gdnctl.schema.engine import EngineConfig

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
            f"model.tokenizer={tokenizer}",
        ],
        text=True,
        capture_output=True,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    return RlJob(EngineConfig.from_file(run_dir / "engine.yaml"), run_dir / "engine.yaml", comm_policy=None)


def test_the_rl_job_encodes_chat_prompts_through_the_template(tmp_path, gloo):
    job = rl_job(tmp_path, tokenizer_dir(tmp_path, chat_template=CHATML))
    ids = job._encode(tuple(CHAT), line=1)
    assert job.tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    assert job._encode("plain text", line=2) == list(b"plain text")


def test_a_chat_prompt_without_a_template_is_refused_with_a_sentence(tmp_path, gloo):
    from gdnctl.runtime.rl.job import RlSetupError

    job = rl_job(tmp_path, tokenizer_dir(tmp_path))
    with pytest.raises(
        RlSetupError,
        match=r"prompts.jsonl:3 is a chat prompt, but the tokenizer at .* has no chat "
        r"template",
    ):
        job._encode(tuple(CHAT), line=3)
