"""Every rule: one preset that trips it and one that does not (the shipped 35B-A3B GRPO preset, changed)."""

from __future__ import annotations

import json

import pytest

from gdnctl.validate.findings import RULES, Severity
from tests.validate.helpers import codes, write_checkpoint

OLD_STACK = {"megatron_core": "0.17.0", "megatron_bridge": "0.4.0"}


def _world_writable(tmp_path):
    """A directory every user can write, without the sticky bit."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    return shared


def _existing_data(tmp_path):
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (tmp_path / "tokenizer").mkdir()
    return {
        "model": {"tokenizer": str(tmp_path / "tokenizer")},
        "train": {"data_path": str(tmp_path / "prompts.jsonl")},
    }


def _text_only(tmp_path, **extra):
    path = write_checkpoint(tmp_path / "ckpt", architectures=["Qwen3_5MoeForCausalLM"], **extra)
    return {"model": {"id": None, "path": str(path)}, "parallel": {"ep": 8, "tp": 2}}


REWARD_FILE = "def score(prompt, response, response_ids, record):\n    return 1.0\n"
ENV_FILE = (
    "class Env:\n"
    "    def __init__(self, record):\n        self.record = record\n"
    "    def start(self):\n        return 'hi'\n"
    "    def step(self, response):\n        return 1.0\n"
)


def _image_data(tmp_path, image: str):
    """A jsonl of one record whose image is `image` beside it; a real PNG is written as ok.png."""
    from PIL import Image

    Image.new("RGB", (8, 8), (200, 0, 0)).save(tmp_path / "ok.png")
    data = tmp_path / "images.jsonl"
    data.write_text(json.dumps({"prompt": "<image> colour?", "response": "red", "images": [image]}) + "\n")
    return str(data)


def _code(directory, text: str, name: str = "code.py"):
    """A file of the user's code in `directory` (made if need be)."""
    directory.mkdir(exist_ok=True)
    (directory / name).write_text(text)
    return directory / name


def _reward(tmp, text: str = REWARD_FILE, name: str = "score", directory=None):
    return {"grpo": {"reward": {"function": f"{_code(directory or tmp / 'mine', text)}:{name}"}}}


def _environment(tmp, text: str = ENV_FILE, **grpo):
    changes: dict = {"rollout": {"environment": {"class": f"{_code(tmp / 'mine', text, 'env.py')}:Env"}}}
    return {**changes, "grpo": grpo} if grpo else changes


# code -> (changes that trip it, changes that do not). A callable gets tmp_path.
CASES = {
    "PAR001": ({"cluster": {"gpus_per_node": 7}}, {}),
    "PAR002": ({"parallel": {"ep": 3}}, {"parallel": {"ep": 8}}),
    "PAR003": ({"parallel": {"ep": 16}}, {"parallel": {"ep": 8}}),
    "PAR004": (
        {"model": {"id": "Qwen/Qwen3.5-9B"}, "parallel": {"ep": 2}},
        {"model": {"id": "Qwen/Qwen3.5-9B"}, "parallel": {"ep": 1}},
    ),
    "PAR005": ({"parallel": {"sequence_parallel": False}}, {"parallel": {"sequence_parallel": True}}),
    "PAR006": ({"parallel": {"vpp": 2}}, {"cluster": {"nodes": 2}, "parallel": {"pp": 2, "vpp": 2}}),
    "PAR007": ({"cluster": {"nodes": 3}, "parallel": {"pp": 3}}, {"cluster": {"nodes": 2}, "parallel": {"pp": 2}}),
    "PAR008": ({"train": {"global_batch_size": 130}}, {"train": {"global_batch_size": 132}}),
    "PAR010": (
        {"job": "sft", "cluster": {"gpu": "cpu"}, "rollout": None},
        {"job": "selftest", "cluster": {"gpu": "cpu"}, "rollout": None},
    ),
    "IMG001": (
        lambda tmp: {"train": {"data_path": _image_data(tmp, "missing.png"), "images": {}}},
        lambda tmp: {"train": {"data_path": _image_data(tmp, "ok.png"), "images": {}}},
    ),
    "IMG002": (
        {"model": {"id": "Qwen/Qwen3-Next-80B-A3B"}, "train": {"images": {}}},
        {"train": {"images": {}}},
    ),
    "IMG003": (
        lambda tmp: {**_environment(tmp), "train": {"images": {}}},
        {"cluster": {"gpu": "cpu"}, "train": {"images": {}}},
    ),
    "IMG004": ({"train": {"images": {}}}, {"cluster": {"gpu": "cpu"}, "train": {"images": {}}}),
    "IMG005": (
        {"job": "sft", "rollout": None, "train": {"images": {}, "layout": "thd"}},
        {"job": "sft", "rollout": None, "train": {"images": {}, "layout": "bshd"}},
    ),
    "IMG006": (
        {"job": "sft", "rollout": None, "cluster": {"gpu": "cpu"}, "train": {"images": {}}},
        {
            "job": "sft",
            "rollout": None,
            "cluster": {"gpu": "cpu"},
            "parallel": {"tp": 1, "ep": 1},
            "train": {"images": {}},
        },
    ),
    "PAR011": (
        {"model": {"id": "Qwen/Qwen3.5-9B"}, "parallel": {"tp": 1, "ep": 1, "sequence_parallel": True}},
        {"model": {"id": "Qwen/Qwen3.5-9B"}, "parallel": {"tp": 1, "ep": 1}},
    ),
    "HEAD001": (
        {"model": {"id": "Qwen/Qwen3.5-27B"}, "cluster": {"nodes": 2}, "parallel": {"tp": 16, "ep": 1}},
        {"model": {"id": "Qwen/Qwen3.5-27B"}, "parallel": {"tp": 4, "ep": 1}},
    ),
    "HEAD002": ({"parallel": {"tp": 3}}, {"parallel": {"tp": 4, "ep": 2}}),
    "HEAD003": ({"cluster": {"nodes": 4}, "parallel": {"tp": 1, "cp": 32}}, {"parallel": {"tp": 2, "cp": 4}}),
    "HEAD004": (
        lambda tmp: {
            "model": {
                "id": None,
                "path": str(write_checkpoint(tmp / "c", linear_num_key_heads=16, linear_num_value_heads=24)),
            },
            "cluster": {"nodes": 2},
            "parallel": {"tp": 2, "cp": 8, "ep": 8},
        },
        {"parallel": {"tp": 2, "cp": 4}},
    ),
    "HEAD005": (
        lambda tmp: {
            "model": {
                "id": None,
                "path": str(write_checkpoint(tmp / "c", linear_num_key_heads=4, linear_num_value_heads=6)),
            },
            "parallel": {"ep": 8},
        },
        lambda tmp: {"model": {"id": None, "path": str(write_checkpoint(tmp / "c"))}, "parallel": {"ep": 8}},
    ),
    "LAY001": ({"runtime": {"megatron_core": "0.15.0"}}, {"runtime": {"megatron_core": "0.16.0"}}),
    "LAY002": ({"runtime": OLD_STACK, "train": {"layout": "thd"}}, {"runtime": OLD_STACK, "train": {"layout": "auto"}}),
    "LAY003": (
        {"runtime": OLD_STACK, "parallel": {"cp": 2}},
        {"runtime": {"megatron_core": "0.18.0"}, "parallel": {"cp": 2}},
    ),
    "LAY004": (
        {"train": {"layout": "bshd"}, "parallel": {"cp": 2}},
        {"train": {"layout": "thd"}, "parallel": {"cp": 2}},
    ),
    "LAY005": ({"train": {"layout": "bshd", "micro_batch_size": 2}}, {"train": {"layout": "bshd"}}),
    "LAY006": (
        {"runtime": {"megatron_core": "0.18.0", "megatron_bridge": "0.5.0"}, "parallel": {"cp": 2}},
        {"parallel": {"cp": 2}},
    ),
    "LAY007": ({"train": {"layout": "thd", "micro_batch_size": 2}}, {"train": {"layout": "thd"}}),
    "LAY009": ({"parallel": {"cp": 2}, "train": {"seq_length": 8190}}, {"parallel": {"cp": 2}}),
    "LAY010": ({"kernels": {"attention": "te"}}, {"kernels": {"attention": "auto"}}),
    "LAY011": ({"train": {"layout": "bshd", "packing": "fill"}}, {"train": {"layout": "bshd", "packing": "auto"}}),
    "LAY012": ({"job": "sft", "train": {"packing": "fill"}}, {"job": "sft", "train": {"packing": "auto"}}),
    "BRG003": ({"runtime": {"megatron_bridge": "0.3.0"}}, {"runtime": {"megatron_bridge": "0.4.0"}}),
    "BRG004": (
        {"runtime": {"megatron_bridge": "0.4.0"}, "train": {"mtp": True}},
        {"runtime": {"megatron_bridge": "0.6.2"}, "train": {"mtp": True}},
    ),
    "BRG005": (
        {"model": {"id": "Qwen/Qwen3.5-0.8B"}, "parallel": {"tp": 1, "ep": 1, "pp": 2, "vpp": 2}, "rollout": {"tp": 1}},
        {"model": {"id": "Qwen/Qwen3.5-9B"}, "parallel": {"tp": 1, "ep": 1, "pp": 2, "vpp": 2}},
    ),
    "BRG006": ({"runtime": {"megatron_core": "0.18.0"}}, {"runtime": {"megatron_core": "0.19.0"}}),
    "KRN001": (
        {"kernels": {"gdn_backend": "flashqla"}, "cluster": {"gpu": "a100"}},
        {"kernels": {"gdn_backend": "flashqla"}, "cluster": {"gpu": "h100"}},
    ),
    "KRN002": (
        {"kernels": {"gdn_backend": "flashqla"}, "cluster": {"gpu": "rtx-pro-6000"}, "runtime": {"flash_qla": "0.1.2"}},
        {"kernels": {"gdn_backend": "flashqla"}, "cluster": {"gpu": "rtx-pro-6000"}},
    ),
    "KRN003": (
        lambda tmp: {
            "model": {
                "id": None,
                "path": str(write_checkpoint(tmp / "c", linear_key_head_dim=64, linear_value_head_dim=64)),
            },
            "parallel": {"ep": 8},
            "kernels": {"gdn_backend": "flashqla"},
        },
        lambda tmp: {
            "model": {"id": None, "path": str(write_checkpoint(tmp / "c"))},
            "parallel": {"ep": 8},
            "kernels": {"gdn_backend": "flashqla"},
        },
    ),
    "KRN004": (
        {"kernels": {"gdn_backend": "flashqla"}, "runtime": {"flash_qla": "0.1.2"}},
        {"kernels": {"gdn_backend": "flashqla"}, "runtime": {"flash_qla": "0.1.3"}},
    ),
    "KRN005": (
        {"kernels": {"gdn_backend": "flashqla"}, "runtime": {"flash_qla": "none"}},
        {"kernels": {"gdn_backend": "fla"}, "runtime": {"flash_qla": "none"}},
    ),
    "KRN006": (
        {"kernels": {"gdn_backend": "fla"}},
        {"kernels": {"gdn_backend": "fla"}, "runtime": {"flash_qla": "none"}},
    ),
    "KRN007": ({"runtime": {"triton": "3.5.0", "fla": "0.4.1"}}, {"runtime": {"triton": "3.7.1", "fla": "0.4.1"}}),
    "KRN008": (
        {"cluster": {"gpu": "b200"}, "runtime": {"fla": "0.5.1"}},
        {"cluster": {"gpu": "b200"}, "runtime": {"fla": "0.5.2"}},
    ),
    "KRN009": (
        {"kernels": {"gdn_backend": "flashqla"}, "cluster": {"gpu": "b300"}, "runtime": {"flash_qla": "0.1.2"}},
        {"kernels": {"gdn_backend": "flashqla"}, "cluster": {"gpu": "b300"}, "runtime": {"flash_qla": "0.1.3"}},
    ),
    "RLT001": ({"rollout": None}, {}),
    "RLT002": ({"job": "sft"}, {"job": "sft", "rollout": None}),
    "RLT003": (
        {"runtime": {"vllm": "0.20.0"}, "rollout": {"gdn_prefill_backend": "cutedsl"}},
        {"runtime": {"vllm": "0.22.0"}, "rollout": {"gdn_prefill_backend": "cutedsl"}},
    ),
    "RLT004": ({"rollout": {"gdn_prefill_backend": None}}, {"rollout": {"gdn_prefill_backend": "triton"}}),
    # The vision-language release too: the rollout serves the text-only export either way.
    "RLT015": ({"runtime": {"vllm": "0.25.0"}}, {"runtime": {"vllm": "0.26.0"}}),
    "RLT006": ({"rollout": {"tp": 3}}, {"rollout": {"tp": 4}}),
    "RLT007": (
        {"rollout": {"colocate": False, "num_gpus": 8}},
        {"parallel": {"ep": 4}, "rollout": {"colocate": False, "num_gpus": 4}},
    ),
    "RLT008": ({"rollout": {"python": None}}, {"rollout": {"python": "/opt/vllm/bin/python"}}),
    "RLT009": (
        {
            "cluster": {"nodes": 2},
            "parallel": {"ep": 4},
            "launch": {"executor": "slurm"},
            "rollout": {"colocate": False, "num_gpus": 4},
        },
        {"cluster": {"nodes": 2}, "launch": {"executor": "slurm"}, "rollout": {"colocate": False, "num_gpus": 8}},
    ),
    "RLT010": ({"train": {"global_batch_size": 132}}, {"train": {"global_batch_size": 136}}),
    "RLT011": ({"train": {"data_path": None}}, {}),
    "RLT012": ({"rollout": {"max_response_tokens": 8192}}, {"rollout": {"max_response_tokens": 1024}}),
    "RLT013": ({}, {"rollout": {"tp": 1, "num_gpus": 1}}),
    "RLT014": (
        {"rollout": {"weight_sync": "cuda_ipc", "colocate": False, "num_gpus": 4}, "parallel": {"ep": 4}},
        {"rollout": {"weight_sync": "cuda_ipc"}},
    ),
    "LCH001": ({"cluster": {"nodes": 2}}, {"cluster": {"nodes": 2}, "launch": {"executor": "slurm"}}),
    "LCH002": (
        {"launch": {"env": {"PS4": "$(touch /tmp/pwned)"}}},
        {"launch": {"env": {"WANDB_PROJECT": "math"}, "pass_env": ["WANDB_API_KEY"]}},
    ),
    "LCH003": ({"launch": {"env": {"LD_LIBRARY_PATH": "/opt/other/lib"}}}, {"launch": {"env": {"NCCL_DEBUG": "INFO"}}}),
    "LCH004": (
        {"launch": {"slurm": {"extra_sbatch": ["--output=/etc/cron.d/x"]}}},
        {"launch": {"slurm": {"extra_sbatch": ["--reservation=big", "--comment=x"]}}},
    ),
    "LCH005": ({"launch": {"env": {"HF_TOKEN": "hf_abc"}}}, {"launch": {"pass_env": ["HF_TOKEN"]}}),
    "LCH006": (
        lambda tmp: {"rollout": {"python": str(_world_writable(tmp) / "venv/bin/python")}},
        lambda tmp: {"rollout": {"python": str(tmp / "venv/bin/python")}},
    ),
    "LCH007": ({"train": {"data_path": "/nonexistent/prompts.jsonl"}}, lambda tmp: _existing_data(tmp)),
    "LCH009": (
        lambda tmp: {"launch": {"kernel_cache_dir": str(_world_writable(tmp))}},
        lambda tmp: {"launch": {"kernel_cache_dir": str(tmp / "cache")}},
    ),
    "USR001": (lambda tmp: _reward(tmp), {}),
    "USR002": ({"grpo": {"reward": {"function": "/nonexistent/rewards.py:score"}}}, lambda tmp: _reward(tmp)),
    "USR003": (lambda tmp: _reward(tmp, name="scroe"), lambda tmp: _reward(tmp)),
    "USR004": (
        lambda tmp: _reward(tmp, "def score(prompt, response):\n    return 1.0\n"),
        lambda tmp: _reward(tmp, "def score(response, **rest):\n    return 1.0\n"),
    ),
    "USR005": (lambda tmp: _reward(tmp, directory=_world_writable(tmp)), lambda tmp: _reward(tmp)),
    "USR006": (lambda tmp: _environment(tmp, reward="math_exact"), lambda tmp: _environment(tmp)),
    "LCH008": (
        {"model": {"path": "/nonexistent/ckpt"}, "launch": {"executor": "slurm"}},
        {"launch": {"executor": "slurm"}},
    ),
    "COM001": ({"comm": {"skip_ops": ["all_gather_into_tnesor"]}}, {"comm": {"skip_ops": ["all_gather_into_tensor"]}}),
    "COM002": ({"comm": {"free_gb_threshold": 100}}, {"comm": {"free_gb_threshold": 3}}),
    "COM003": ({"comm": {"add_skip_ops": ["barrier"]}}, {"comm": {"add_skip_ops": ["all_reduce"]}}),
    "MEM001": ({"train": {"optimizer_cpu_offload": False, "recompute": "none"}}, {}),
    "MEM002": ({"rollout": {"tp": 1, "gpu_memory_utilization": 0.3}}, {"rollout": {"tp": 4}}),
    "MEM003": ({"rollout": {"gpu_memory_utilization": 0.7}}, {"rollout": {"gpu_memory_utilization": 0.4}}),
    "TRN001": (
        {},
        lambda tmp: {"model": {"id": None, "path": str(write_checkpoint(tmp / "c"))}, "parallel": {"ep": 8}},
    ),
    "TRN002": ({"parallel": {"cp": 2}, "runtime": {"transformer_engine": "none"}}, {"parallel": {"cp": 2}}),
    "TRN003": (
        {"cluster": {"gpu": "cpu", "gpus_per_node": 2}, "runtime": {"transformers": "5.1.0"}},
        {"cluster": {"gpu": "cpu", "gpus_per_node": 2}, "runtime": {"transformers": "5.2.0"}},
    ),
    "TRN004": ({"train": {"mtp": True}}, {"train": {"mtp": False}}),
    "TRN026": (
        lambda tmp: {
            "model": {"id": None, "path": str(write_checkpoint(tmp / "save" / "iter_0000010"))},
            "train": {"save_dir": str(tmp / "save")},
            "parallel": {"ep": 8},
        },
        lambda tmp: {
            "model": {"id": None, "path": str(write_checkpoint(tmp / "base"))},
            "train": {"save_dir": str(tmp / "save")},
            "parallel": {"ep": 8},
        },
    ),
    "TRN005": (
        lambda tmp: {
            "model": {"id": None, "path": str(write_checkpoint(tmp / "c", num_experts_per_tok=1))},
            "parallel": {"ep": 8},
        },
        lambda tmp: {"model": {"id": None, "path": str(write_checkpoint(tmp / "c"))}, "parallel": {"ep": 8}},
    ),
    "TRN006": (
        lambda tmp: {
            "model": {"id": None, "path": str(write_checkpoint(tmp / "c", shared_expert_intermediate_size=0))},
            "parallel": {"ep": 8},
        },
        lambda tmp: {"model": {"id": None, "path": str(write_checkpoint(tmp / "c"))}, "parallel": {"ep": 8}},
    ),
    "TRN007": (
        {"cluster": {"nodes": 2}, "parallel": {"pp": 2, "vpp": 2}},
        {"cluster": {"nodes": 2}, "parallel": {"pp": 2}},
    ),
    "TRN008": ({"parallel": {"cp": 2}}, {"job": "sft", "rollout": None, "parallel": {"cp": 2}}),
    "TRN009": ({"cluster": {"gpu": "a100"}, "train": {"precision": "fp8"}}, {"train": {"precision": "fp8"}}),
    "TRN010": (
        {"cluster": {"gpu": "cpu", "gpus_per_node": 1}, "train": {"lora": {"rank": 8, "alpha": 16}}},
        {"train": {"lora": {"rank": 8, "alpha": 16}}},
    ),
    "TRN022": (
        {"job": "sft", "rollout": None, "train": {"lora": {"rank": 8, "alpha": 16}}},
        lambda tmp: {
            "job": "sft",
            "rollout": None,
            "train": {"lora": {"rank": 8, "alpha": 16}},
            "model": {"id": None, "path": str(write_checkpoint(tmp / "c"))},
            "parallel": {"ep": 8},
        },
    ),
    "TRN016": (
        {"train": {"lora": {"rank": 8, "alpha": 16}}, "runtime": {"transformer_engine": "none"}},
        {"train": {"lora": {"rank": 8, "alpha": 16}}},
    ),
    "TRN017": (
        {"train": {"lora": {"rank": 8, "alpha": 16, "targets": ["gdn_in", "mlp"]}}},
        {"train": {"lora": {"rank": 8, "alpha": 16, "targets": ["gdn_in", "experts", "shared_expert"]}}},
    ),
    "TRN019": (
        {"model": {"id": "Qwen/Qwen3-Next-80B-A3B"}, "train": {"lora": {"rank": 8, "alpha": 16}}},
        {
            "model": {"id": "Qwen/Qwen3-Next-80B-A3B"},
            "train": {"lora": {"rank": 8, "alpha": 16, "targets": ["attention_qkv", "experts"]}},
        },
    ),
    "TRN020": (
        {"model": {"id": "Qwen/Qwen3-Next-80B-A3B"}, "train": {"lora": {"rank": 8, "alpha": 16}}},
        {"model": {"id": "Qwen/Qwen3-Next-80B-A3B"}},
    ),
    "TRN021": (
        {"job": "sft", "rollout": None, "train": {"recompute": "none"}, "speed": {"cuda_graphs": "on"}},
        {"job": "pretrain", "rollout": None, "train": {"recompute": "none"}, "speed": {"cuda_graphs": "on"}},
    ),
    "TRN023": (
        {"speed": {"cutlass_grouped_gemm": "on"}, "cluster": {"gpu": "a100"}},
        {"speed": {"cutlass_grouped_gemm": "on"}},
    ),
    "TRN018": (
        {"train": {"lora": {"rank": 8, "alpha": 16}}, "runtime": {"megatron_bridge": "0.4.2"}},
        {
            "train": {"lora": {"rank": 8, "alpha": 16, "targets": ["attention_qkv", "gdn_out"]}},
            "runtime": {"megatron_bridge": "0.4.2"},
        },
    ),
    "TRN024": (
        {"train": {"lora": {"rank": 8, "alpha": 16, "expert_adapters": "shared"}}},
        {"train": {"lora": {"rank": 8, "alpha": 16, "expert_adapters": "shared"}}, "parallel": {"ep": 1}},
    ),
    "TRN025": (
        {"train": {"lora": {"rank": 8, "alpha": 16}}, "parallel": {"ep": 4, "etp": 2}},
        {"train": {"lora": {"rank": 8, "alpha": 16, "targets": ["attention_qkv"]}}, "parallel": {"ep": 4, "etp": 2}},
    ),
    "TRN011": (
        {"train": {"precision": "fp8", "layout": "bshd", "seq_length": 4100}},
        {"train": {"precision": "fp8", "layout": "bshd", "seq_length": 4096}},
    ),
    "RLT016": ({"grpo": {"mini_batches": 3}}, {"grpo": {"mini_batches": 4}}),
    "RLT017": (
        {"eval": {"data_path": "/x.jsonl", "max_response_tokens": 8192}},
        {"eval": {"data_path": "/x.jsonl", "max_response_tokens": 1024}},
    ),
    "RLT018": ({"rollout": {"n_samples_per_prompt": 1}}, {"rollout": {"n_samples_per_prompt": 2}}),
    "RLT019": (
        {"rollout": {"max_staleness": 1}},
        {"rollout": {"max_staleness": 1, "colocate": False, "num_gpus": 4, "tp": 4}},
    ),
    "RLT020": (
        {"rollout": {"partial": True}},
        {"rollout": {"partial": True, "max_staleness": 1, "colocate": False, "num_gpus": 4, "tp": 4}},
    ),
    "RLT021": (
        {"grpo": {"overlong": {"buffer_tokens": 1024}}, "rollout": {"max_response_tokens": 1024}},
        {"grpo": {"overlong": {"buffer_tokens": 256}}, "rollout": {"max_response_tokens": 1024}},
    ),
    "TRN015": (
        {
            "job": "selftest",
            "rollout": None,
            "cluster": {"gpu": "cpu", "gpus_per_node": 1},
            "eval": {"data_path": "/x.jsonl"},
        },
        {"eval": {"data_path": "/x.jsonl"}},
    ),
    "TRN013": (
        {"train": {"lr": 1e-6, "min_lr": 1e-5, "lr_decay": "cosine"}},
        {"train": {"lr": 1e-6, "min_lr": 1e-7, "lr_decay": "cosine"}},
    ),
    "TRN014": (
        {"train": {"train_iters": 10, "lr_warmup_steps": 10}},
        {"train": {"train_iters": 10, "lr_warmup_steps": 9}},
    ),
}


def _changes(spec, tmp_path):
    return spec(tmp_path) if callable(spec) else spec


def test_every_rule_has_a_case():
    checked = {code for code, info in RULES.items() if info.check is not None}
    assert checked == set(CASES)


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_trips(code, tmp_path):
    found = codes(_changes(CASES[code][0], tmp_path))
    assert code in found, f"{code} did not fire; got {sorted(found)}"
    for finding in found[code]:
        assert finding.message.endswith(".") and finding.hint and finding.path


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_stays_quiet(code, tmp_path):
    found = codes(_changes(CASES[code][1], tmp_path))
    assert code not in found, found.get(code)


def test_off_policy_steps_are_refused_with_an_environment_whose_episodes_cannot_overlap(tmp_path):
    separate = {"max_staleness": 1, "colocate": False, "num_gpus": 4, "tp": 4}
    changes = _environment(tmp_path)
    changes["rollout"].update(separate)
    (finding,) = codes(_changes(changes, tmp_path))["RLT019"]
    assert "rollout.environment's episodes" in finding.message and finding.path == "rollout.max_staleness"
    changes["rollout"]["max_staleness"] = 0
    assert "RLT019" not in codes(_changes(changes, tmp_path))


def test_concatenated_rows_are_full_so_micro_batches_of_several_warn_of_no_padding_but_cut_sft_examples():
    """LAY005 is about padded rows; concatenated rows have none. LAY012 names concat's cross-example attention."""
    concat = {"job": "pretrain", "train": {"packing": "concat", "layout": "bshd", "micro_batch_size": 2}}
    assert "LAY005" not in codes(concat)
    sft = codes({"job": "sft", "train": {"packing": "concat"}})["LAY012"][0].message
    assert "attends to the ones before it" in sft


def test_tp_neither_divisor_nor_multiple_of_the_kv_heads_names_megatron_core():
    message = codes({"parallel": {"tp": 3}})["HEAD002"][0].message
    assert "neither a divisor nor a multiple of the 2 KV heads" in message and "Megatron-Core refuses it" in message


def test_tp_above_the_kv_heads_is_refused_only_by_the_versions_that_refuse_it():
    """TP 4 over Qwen3.5-35B-A3B's 2 KV heads: built by megatron-core >= 0.16 and megatron-bridge >= 0.5 (run on
    an H100: tests/gpu/test_tp_above_kv_heads_gpu.py); megatron-core 0.15 and megatron-bridge 0.4's Qwen3.5
    providers refuse it, and each message names the one that does."""
    tp4 = {"parallel": {"tp": 4, "ep": 2}}
    assert "HEAD002" not in codes(tp4)
    core = codes({**tp4, "runtime": {"megatron_core": "0.15.0"}})["HEAD002"][0].message
    assert "megatron-core 0.15.0 refuses that" in core
    bridge = codes({**tp4, "runtime": {"megatron_bridge": "0.4.1"}})["HEAD002"][0].message
    assert "megatron-bridge 0.4.1's Qwen3.5-MoE provider refuses that" in bridge
    # The TE-free builder does not go through the bridge's provider.
    assert "HEAD002" not in codes({**tp4, "runtime": {"megatron_bridge": "0.4.1", "transformer_engine": "none"}})


def test_the_removed_bridge_keys_say_what_replaced_them():
    """train.update_weights_via_bridge and train.bridge drove nothing at run time and left the schema: an old
    preset gets PRE001 with what the runtime does instead."""
    from gdnctl.validate import load_preset

    for setting, replaced_by in (
        ("train.update_weights_via_bridge=true", "exports through the model's builder"),
        ("train.bridge=mbridge", "megatron-bridge is the only bridge"),
    ):
        loaded = load_preset("qwen3.5-35b-a3b-grpo", [setting])
        (finding,) = [f for f in loaded.findings if f.code == "PRE001"]
        assert finding.path == setting.split("=")[0] and "no longer a key" in finding.message
        assert replaced_by in finding.hint


def test_explains_weight_sync_line_is_what_the_runtime_exports_through():
    from gdnctl.plan import derived_values, resolve
    from gdnctl.validate import load_preset

    def weight_sync(name, *sets):
        preset = load_preset(name, list(sets)).preset
        return next(d for d in derived_values(resolve(preset)) if d.name == "weight_sync")

    assert weight_sync("qwen3.5-35b-a3b-grpo").value == "megatron-bridge export_hf_weights"
    te_free = weight_sync("qwen3-next-80b-a3b-grpo", "runtime.transformer_engine=none")
    assert te_free.value == "gdnctl's HF name rules" and "TE-free model" in te_free.reason
    assert weight_sync("tiny-qwen3.5-rl-cpu").value == "transformers' state dict"


def test_prefill_flag_missing_before_018():
    found = codes({"runtime": {"vllm": "0.17.0"}, "rollout": {"gdn_prefill_backend": "triton"}})
    assert "no --gdn-prefill-backend flag" in found["RLT003"][0].message


def test_mtp_with_cp_needs_bridge_060():
    found = codes(
        {
            "runtime": {"megatron_bridge": "0.5.0", "megatron_core": "0.18.0"},
            "train": {"mtp": True},
            "parallel": {"cp": 2},
        }
    )
    assert any("context parallel" in f.message for f in found["BRG004"])


def test_fp8_is_refused_only_for_the_te_free_builder():
    assert "TRN002" in codes({"train": {"precision": "fp8"}, "runtime": {"transformer_engine": "none"}})
    assert "TRN002" not in codes({"train": {"precision": "fp8"}})


def test_text_only_checkpoint_needs_bridge_050(tmp_path):
    found = codes(
        {
            **_text_only(tmp_path),
            "runtime": {"megatron_bridge": "0.4.0", "megatron_core": "0.17.0"},
            "train": {"layout": "bshd"},
        }
    )
    assert "text-only" in found["BRG003"][0].message


def test_separate_rollout_gpus_not_whole_engines():
    found = codes({"parallel": {"ep": 2}, "rollout": {"colocate": False, "num_gpus": 6}})
    assert any("whole number" in f.message for f in found["RLT007"])


def test_a_rollout_engine_must_fit_one_node():
    found = codes({"cluster": {"nodes": 2, "gpus_per_node": 6}, "rollout": {"tp": 4, "num_gpus": 12}})
    messages = [f.message for f in found["RLT007"]]
    assert messages == [
        "a rollout engine of tp=4 GPUs does not fit the nodes' 6 GPUs a whole number of times; "
        "gdnctl runs each engine within one node."
    ]
    assert "RLT007" not in codes({"cluster": {"nodes": 2, "gpus_per_node": 8}, "rollout": {"tp": 4, "num_gpus": 12}})


def test_a_broadcast_to_colocated_engines_on_several_nodes_is_refused():
    cpu_nodes = {
        "cluster": {"gpu": "cpu", "nodes": 2, "gpus_per_node": 1},
        "launch": {"executor": "slurm"},
        "rollout": {"tp": 1, "weight_sync": "broadcast"},
    }
    finding = codes(cpu_nodes)["RLT014"][0]
    assert "each node's first trainer rank drives its node's engines" in finding.message


def test_rlt013_names_only_the_rollout_layouts_that_have_not_run_on_gpus():
    assert "RLT013" not in codes({"rollout": {"tp": 1, "num_gpus": 1}})
    assert "RLT013" not in codes({"rollout": {"tp": 1, "num_gpus": 2}})  # two colocated engines ran on two H100s
    assert "RLT013" not in codes({"rollout": {"tp": 2, "num_gpus": 2}})  # one colocated tp-2 engine did too
    assert "4 rollout engines" in codes({"rollout": {"tp": 1, "num_gpus": 4}})["RLT013"][0].message
    assert "2 engines of rollout.tp 2" in codes({"rollout": {"tp": 2, "num_gpus": 4}})["RLT013"][0].message


def test_skip_op_query_function_is_named_as_such():
    finding = codes({"comm": {"skip_ops": ["get_rank"]}})["COM001"][0]
    assert "query function" in finding.message and finding.path == "comm.skip_ops[0]"


def test_threshold_over_quarter_warns():
    finding = codes({"comm": {"free_gb_threshold": 30}})["COM002"][0]
    assert finding.severity is Severity.WARNING


def test_memory_warning_band():
    """Between 90% and 100% of the GPU the estimate warns instead of failing."""
    seen = set()
    for seq in range(8192, 65536, 1024):
        for finding in codes({"train": {"seq_length": seq}}).get("MEM001", []):
            seen.add(finding.severity)
    assert seen == {Severity.WARNING, Severity.ERROR}


def test_every_rule_is_documented():
    for info in RULES.values():
        for section in ("What it checks", "Why", "Fix"):
            assert section in info.doc, f"{info.code} lacks '{section}'"


# Rules whose docstring is being rewritten and gets its Source: section with the rewrite. Remove a code from here
# as soon as it has one (the test below fails until then).
SOURCE_PENDING: set[str] = set()


def test_every_rule_states_its_source():
    """Each rule's documentation names what it rests on (`Source:`, before `Fix:`): upstream files and versions,
    issues, measurements, or the component of gdnctl that refuses; the README's rule table shows it."""
    for info in RULES.values():
        if info.code in SOURCE_PENDING:
            assert not info.source, f"{info.code} has a Source: now; remove it from SOURCE_PENDING"
            continue
        assert info.source, f"{info.code} has no Source: section"
        assert info.doc.index("\n\nSource:") < info.doc.index("\n\nFix:"), f"{info.code}: Source: goes before Fix:"


def test_lay010_is_an_error_with_a_stated_old_cudnn_and_quiet_from_9_19(tmp_path):
    stated = codes({"parallel": {"cp": 2}, "runtime": {"cudnn": "9.14.0"}})["LAY010"]
    assert [(f.severity, f.path) for f in stated] == [(Severity.ERROR, "parallel.cp")]
    assert [f.severity for f in codes({"parallel": {"cp": 2}})["LAY010"]] == [Severity.WARNING]
    assert "LAY010" not in codes({"parallel": {"cp": 2}, "runtime": {"cudnn": "9.19.0"}})


def test_an_old_bridge_with_one_expert_parallel_rank_gets_shared_adapters_unless_per_expert_is_asked_for():
    old_bridge = {"parallel": {"ep": 1}, "runtime": {"megatron_bridge": "0.4.2"}}
    assert "TRN018" not in codes({"train": {"lora": {"rank": 8, "alpha": 16}}, **old_bridge})  # auto: shared
    asked = {"rank": 8, "alpha": 16, "expert_adapters": "per_expert"}
    [finding] = codes({"train": {"lora": asked}, **old_bridge})["TRN018"]
    assert finding.path == "train.lora.expert_adapters"
    assert "set train.lora.expert_adapters: shared" in finding.hint
    [beyond_one_rank] = codes({"train": {"lora": {"rank": 8, "alpha": 16}}, "runtime": {"megatron_bridge": "0.4.2"}})[
        "TRN018"
    ]
    assert beyond_one_rank.path == "train.lora" and "shared" not in beyond_one_rank.hint  # TRN024 would refuse it


def test_shared_expert_adapters_ask_nothing_of_the_per_expert_adapters_bridge():
    shared = {"rank": 8, "alpha": 16, "expert_adapters": "shared"}
    found = codes({"train": {"lora": shared}, "parallel": {"ep": 1}, "runtime": {"megatron_bridge": "0.4.2"}})
    assert "TRN018" not in found and "TRN024" not in found  # one EP rank: an ordinary dense adapter


def test_the_cpu_image_sft_refuses_lora_as_the_cpu_rl_policy_does():
    found = codes(
        {
            "job": "sft",
            "rollout": None,
            "cluster": {"gpu": "cpu"},
            "parallel": {"tp": 1, "ep": 1},
            "train": {"images": {}, "lora": {"rank": 8, "alpha": 16}},
        }
    )
    assert "sft job" in found["TRN010"][0].message and "PAR010" not in found
