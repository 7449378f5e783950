"""Jobs whose records carry images: the data, the model, and the parts of the stack that take images."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from gdnctl.plan import Run
from gdnctl.schema import image_data
from gdnctl.validate.findings import Issue, Severity, rule


def _limits(run: Run) -> image_data.ImageLimits | None:
    images = run.preset.train.images
    return None if images is None else image_data.ImageLimits(**images.model_dump())


@rule("IMG001", Severity.ERROR, "Every image of the records is there, readable and within train.images")
def images_readable(run: Run) -> Iterator[Issue]:
    """
    What it checks: every record with images in train.data_path and eval.data_path (a jsonl on this machine): its
    form (one `<image>` per image in the prompt, or HF chat messages with image parts), and each image: a file
    relative to the dataset or inline base64 that exists, is a PNG, JPEG, GIF, WebP or BMP, and is within
    train.images (max_bytes, max_pixels, max_per_sample). A record with images while the preset sets no
    train.images is one too. Each finding names the file and line; the first five are listed.

    Why: the job reads every image at its start (runtime/data/images.py) and stops at the first that fails; found
    here, before a node is allocated, every one is named at once.

    Source: gdnctl/schema/image_data.py (the record forms, and the image headers read without PIL).

    Fix: correct the records or the image files the findings name, or raise the limit in train.images.
    """
    limits = _limits(run)
    datasets = [("train.data_path", run.preset.train.data_path)]
    if run.preset.eval is not None:
        datasets.append(("eval.data_path", run.preset.eval.data_path))
    for field, value in datasets:
        if value is None or not value.endswith(".jsonl") or not Path(value).is_file():
            continue
        problems = list(image_data.check_dataset(Path(value), limits, prompts=run.preset.job == "rl"))
        if not problems:
            continue
        listed = problems[: image_data.MAX_LISTED_PROBLEMS]
        more = len(problems) - len(listed)
        yield Issue(
            field,
            "; ".join(listed) + (f"; and {more} more" if more else "") + ".",
            "Set train.images in the preset (docs/images.md)."
            if limits is None
            else "Correct these records or image files, or raise the limit in train.images.",
        )


@rule("IMG002", Severity.ERROR, "Images need a vision-language model")
def images_need_vision_tower(run: Run) -> Iterator[Issue]:
    """
    What it checks: train.images, or train.vision: train, with a model that has no vision tower (a text-only
    class, `*ForCausalLM`, or Qwen3-Next, which has none).

    Why: the images go through the vision tower of the vision-language class (Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeForConditionalGeneration); a text-only checkpoint has no tower to encode them.

    Source: transformers' models/qwen3_5/modeling_qwen3_5.py (the vision tower `model.visual` exists only in the
    vision-language class; transformers 5.24).

    Fix: point model.id or model.path at a Qwen3.5 vision-language checkpoint, or remove train.images.
    """
    train = run.preset.train
    if run.model.vision is not None or (train.images is None and train.vision == "frozen"):
        return
    field = "train.images" if train.images is not None else "train.vision"
    yield Issue(
        field,
        f"{run.model.label} ({run.model.architecture}) has no vision tower to take images.",
        f"Use a Qwen3.5 vision-language checkpoint (architecture Qwen3_5ForConditionalGeneration), or remove {field}.",
    )


@rule("IMG003", Severity.ERROR, "An rl environment's episodes take no images")
def rl_images(run: Run) -> Iterator[Issue]:
    """
    What it checks: job: rl with train.images and rollout.environment.

    Why: an rl job on image prompts sends each prompt's images to vLLM as multi-modal data and scores its samples
    through the vision tower (runtime/rl/prompts/images.py, runtime/rl/policy/torch_vision_policy.py), but an
    environment opens each episode with messages of its own (runtime/rl/rollout/episodes.py), which carry text
    only: the records' images would reach neither the engine nor the trainer.

    Source: gdnctl/runtime/rl/environments/contract.py (an environment's opening and turns are chat messages with
    string contents).

    Fix: score the image prompts with grpo.reward instead of an environment, or remove train.images.
    """
    p = run.preset
    if p.job == "rl" and p.train.images is not None and p.rollout is not None and p.rollout.environment is not None:
        yield Issue(
            "rollout.environment",
            "an environment's episodes are text only: the records' images would reach neither vLLM nor the trainer.",
            "Score the image prompts with grpo.reward instead, or remove train.images.",
        )


@rule("IMG004", Severity.ERROR, "Images train on CPU only")
def images_on_gpus(run: Run) -> Iterator[Issue]:
    """
    What it checks: a training job with train.images on GPUs.

    Why: gdnctl's GPU trainer builds the language model alone (its TE-free Megatron-Core spec, or megatron-bridge's
    text model provider) and feeds it token ids; megatron-bridge's Qwen3.5 vision-language provider, which would
    build the vision tower beside it, is not wired into gdnctl's trainer. Images train through transformers'
    vision-language class on CPU (runtime/train/cpu_sft.py).

    Source: gdnctl/runtime/model/builders.py (the two builders, neither with a vision tower).

    Fix: set cluster.gpu: cpu for a small model, or remove train.images.
    """
    if run.is_training and run.preset.train.images is not None and run.gpu.sm is not None:
        yield Issue(
            "train.images",
            f"gdnctl's GPU trainer builds {run.model.label}'s language model without its vision tower, so it "
            "cannot take images.",
            "Set cluster.gpu: cpu for a small model, or remove train.images.",
        )


@rule("IMG005", Severity.ERROR, "Rows with images are padded, never packed")
def images_in_packed_rows(run: Run) -> Iterator[Issue]:
    """
    What it checks: an sft or pretrain job with train.images and train.layout: thd (packed rows); an rl job's rows
    are one sample each.

    Why: transformers' Qwen3.5 vision-language class computes its multimodal rotary positions (M-RoPE: each image
    token's time, row and column) once per row from the attention mask (Qwen3_5Model.get_rope_index), so a
    packed row's second document would continue the first's positions and attend across it; the class takes no
    per-document offsets. gdnctl's CPU sft job pads each record to its own row.

    Source: transformers' models/qwen3_5/modeling_qwen3_5.py, Qwen3_5Model.get_rope_index and
    compute_3d_position_ids (transformers 5.24).

    Fix: set train.layout: bshd (or leave it auto, which pads on CPU).
    """
    if run.preset.job != "rl" and run.preset.train.images is not None and run.layout.value == "thd":
        yield Issue(
            "train.layout",
            "packed (thd) rows cannot carry images: transformers' Qwen3.5 vision-language class computes its "
            "multimodal rotary positions per row (get_rope_index), across every document packed into it.",
            "Set train.layout: bshd.",
        )


@rule("IMG006", Severity.ERROR, "The CPU image sft keeps a whole model on each process")
def cpu_sft_whole_model(run: Run) -> Iterator[Issue]:
    """
    What it checks: an sft job on cpu (the image sft) with parallel.tp, pp, cp or ep above 1, or train.mtp.

    Why: the CPU sft job trains transformers' vision-language class with plain torch, a whole copy on every process
    (data parallel over gloo, DDP); it splits nothing over tensor, pipeline, context or expert parallel ranks and
    trains no MTP layer, so these settings would be ignored while the plan and the memory estimate count them.

    Source: gdnctl/runtime/train/cpu_sft.py (DistributedDataParallel over every process, no model parallel groups).

    Fix: set parallel.tp, pp, cp and ep to 1 and train.mtp to false (more processes add data parallel).
    """
    p = run.preset
    if p.job != "sft" or run.gpu.sm is not None:
        return
    split = {name: size for name in ("tp", "pp", "cp", "ep") if (size := getattr(p.parallel, name)) > 1}
    if split:
        fields = ", ".join(f"{name} {size}" for name, size in split.items())
        yield Issue(
            "parallel",
            f"sft on cpu keeps a whole model on each process, so parallel {fields} would split nothing.",
            f"Set parallel.{', parallel.'.join(split)} to 1; more processes add data parallel.",
        )
    if p.train.mtp:
        yield Issue(
            "train.mtp",
            "sft on cpu trains transformers' vision-language class, which has no MTP layer to train.",
            "Set train.mtp: false.",
        )
