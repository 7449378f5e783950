"""Where the trained weights come from."""

from __future__ import annotations

from gdnctl.validate.findings import Issue, Severity, rule


@rule("TRN001", Severity.WARNING, "A released model trained from random weights")
def released_model_without_weights(run):
    """
    What it checks: a training job on a released checkpoint's architecture (model.id) with no model.path.

    Why: the catalog holds architectures, not weights, and nothing is downloaded at run time, so the trainer
    initialises the model randomly: fine for a throughput test, surprising for fine-tuning.

    Fix: set model.path to the downloaded checkpoint directory (its safetensors are loaded), or keep it unset
    on purpose for a benchmark.
    """
    p = run.preset
    if run.is_training and p.model.path is None and run.model.released:
        yield Issue("model.path", f"{run.model.label} has released weights but model.path is unset, so the "
                                  "trainer starts from random weights.",
                    "Set model.path to the downloaded checkpoint directory, or ignore this for a benchmark.")


@rule("TRN002", Severity.ERROR, "gdnctl's trainer is TE-free: no context parallel, no FP8")
def te_free_trainer(run):
    """
    What it checks: a training job (sft, pretrain, rl) with parallel.cp > 1 or train.precision fp8.

    Why: gdnctl's runtime builds the Qwen3.5 model from Megatron-Core modules alone, without Transformer Engine
    (gdnctl/runtime/megatron_model.py), on every machine, TE installed or not: a build through megatron-bridge's
    TE providers is not implemented. Megatron-Core's context-parallel attention and FP8 exist only in TE's
    modules, so the trainer would stop at model build, after the job had been scheduled.

    Fix: set parallel.cp: 1 (fit long sequences with TP, recompute or optimizer offload instead) and
    train.precision: bf16.
    """
    p = run.preset
    if not run.is_training:
        return
    if p.parallel.cp > 1:
        yield Issue("parallel.cp", f"cp={p.parallel.cp} needs Transformer Engine's context-parallel attention, and "
                                   "gdnctl's trainer builds the model without TE.",
                    "Set parallel.cp: 1; fit long sequences with TP, recompute or optimizer offload instead.")
    if p.train.precision != "bf16":
        yield Issue("train.precision", f"precision {p.train.precision} needs Transformer Engine, and gdnctl's "
                                       "trainer builds the model without TE.",
                    "Set train.precision: bf16.")
