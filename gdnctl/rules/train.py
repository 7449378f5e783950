"""Where the trained weights come from."""

from __future__ import annotations

from gdnctl.findings import Issue, Severity, rule

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
