"""The ledger of finding codes: every code gdnctl has ever given out, and where it lives.

A code is a promise to users (they grep logs for it, write `--strict` exceptions and wiki pages about it), so it
is never renamed or reused. Each prefix belongs to one concern, and so to one module: a rule registered under a
code the ledger does not hold, in a module its prefix does not name, or under a retired code is a bug that
import time refuses (`gdnctl.validate.findings.rule`). The same habit as ruff's `codes.rs`.

Adding a rule: take the next free number of its prefix, add the line here, and register the function under it
in the prefix's module. Retiring one: move its line to RETIRED with what replaced it.
"""

from __future__ import annotations

# Prefix -> the concern (module of gdnctl/validate/rules/, or "preset" for codes the loader reports).
PREFIXES: dict[str, str] = {
    "BRG": "bridge",
    "COM": "comm",
    "HEAD": "heads",
    "IMG": "images",
    "KRN": "kernels",
    "LAY": "layout",
    "LCH": "launch",
    "MEM": "memory",
    "PAR": "parallel",
    "PRE": "preset",
    "RLT": "rollout",
    "TRN": "train",
    "USR": "user_code",
}

# Code -> the rule's name (the check function's name, or the load code's name).
CODES: dict[str, str] = {
    "BRG003": "bridge_supports_model",
    "BRG004": "bridge_mtp_parallel",
    "BRG005": "vpp_tied_embeddings",
    "BRG006": "bridge_core_pairing",
    "COM001": "skip_op_names",
    "COM002": "threshold_fits_gpu",
    "COM003": "skip_set_edits",
    "HEAD001": "tp_divides_attention_heads",
    "HEAD002": "tp_divides_kv_heads",
    "HEAD003": "tp_cp_divide_gdn_key_heads",
    "HEAD004": "tp_cp_divide_gdn_value_heads",
    "HEAD005": "value_heads_multiple_of_key_heads",
    "IMG001": "images_readable",
    "IMG002": "images_need_vision_tower",
    "IMG003": "rl_images",
    "IMG004": "images_on_gpus",
    "IMG005": "images_in_packed_rows",
    "IMG006": "cpu_sft_whole_model",
    "KRN001": "flashqla_gpu",
    "KRN002": "flashqla_forward_only",
    "KRN003": "flashqla_head_dim",
    "KRN004": "flashqla_training_version",
    "KRN005": "flashqla_installed",
    "KRN006": "fla_pins_own_kernels",
    "KRN007": "fla_hopper_triton_backward",
    "KRN008": "fla_blackwell_backward",
    "KRN009": "flashqla_release_gpu",
    "LAY001": "mcore_has_gdn",
    "LAY002": "thd_needs_018",
    "LAY003": "cp_needs_018",
    "LAY004": "bshd_no_cp",
    "LAY005": "bshd_micro_batch",
    "LAY006": "cp_without_fused_a2a",
    "LAY007": "thd_micro_batch",
    "LAY009": "seq_length_cp",
    "LAY010": "te_packed_attention_head_dim",
    "LAY011": "fill_needs_thd",
    "LAY012": "fill_cuts_sft",
    "LCH001": "local_single_node",
    "LCH002": "obeyed_env_names",
    "LCH003": "search_path_override",
    "LCH004": "extra_sbatch_options",
    "LCH005": "credential_values",
    "LCH006": "interpreter_replaceable",
    "LCH007": "local_paths_exist",
    "LCH008": "model_path_on_cluster",
    "LCH009": "kernel_cache_replaceable",
    "MEM001": "trainer_fits",
    "MEM002": "rollout_weights_fit",
    "MEM003": "colocated_rollout_fits",
    "PAR001": "world_size_divisible",
    "PAR002": "ep_divides_experts",
    "PAR003": "ep_fits_world",
    "PAR004": "ep_on_dense",
    "PAR005": "moe_tp_needs_sp",
    "PAR006": "vpp_needs_pp",
    "PAR007": "layers_divisible",
    "PAR008": "global_batch_divisible",
    "PAR010": "cpu_only_selftest",
    "PAR011": "sp_needs_tp",
    "PRE001": "unknown-key",
    "PRE002": "invalid-value",
    "PRE003": "model-unavailable",
    "PRE004": "preset-too-complex",
    "RLT001": "rl_needs_rollout",
    "RLT002": "rollout_ignored",
    "RLT003": "prefill_backend_supported",
    "RLT004": "prefill_hang_sm90",
    "RLT006": "rollout_tp_heads",
    "RLT007": "rollout_gpus_fit",
    "RLT008": "separate_environments",
    "RLT009": "separate_rollout_whole_nodes",
    "RLT010": "batch_of_groups",
    "RLT011": "prompts_and_tokenizer",
    "RLT012": "response_fits_context",
    "RLT013": "rl_rollout_layout_untested",
    "RLT014": "in_memory_weight_sync",
    "RLT015": "vision_language_rollout",
    "RLT016": "mini_batches_split",
    "RLT017": "eval_response_fits_context",
    "RLT018": "grpo_needs_groups",
    "RLT019": "staleness_needs_separate_engines",
    "RLT020": "partial_needs_staleness",
    "RLT021": "overlong_buffer_fits_response",
    "TRN001": "released_model_without_weights",
    "TRN002": "te_free_trainer",
    "TRN003": "trainer_transformers_model_type",
    "TRN004": "mtp_not_trained",
    "TRN005": "moe_top1_router",
    "TRN006": "shared_expert_size",
    "TRN007": "vpp_not_built",
    "TRN008": "context_parallel_not_sharded",
    "TRN009": "fp8_needs_sm89",
    "TRN010": "lora_not_trained",
    "TRN011": "fp8_padded_row_length",
    "TRN013": "min_lr_above_lr",
    "TRN014": "warmup_outlasts_run",
    "TRN015": "eval_not_run",
    "TRN016": "lora_te_free",
    "TRN017": "lora_target_absent",
    "TRN018": "lora_per_expert_adapters",
    "TRN019": "lora_qwen3_next_shared_expert",
    "TRN020": "lora_qwen3_next",
    "TRN021": "cuda_graphs_cannot_capture",
    "TRN022": "lora_needs_base",
    "TRN023": "cutlass_grouped_gemm_not_taken",
    "TRN024": "lora_shared_expert_adapters_need_one_ep_rank",
    "TRN025": "lora_experts_with_expert_tensor_parallel",
    "TRN026": "model_path_in_save_dir",
    "USR001": "user_code_runs",
    "USR002": "user_code_missing",
    "USR003": "user_code_name_missing",
    "USR004": "user_code_signature",
    "USR005": "user_code_replaceable",
    "USR006": "unused_reward_settings",
}

# Code -> why it is no longer given out and what replaced it. Never reuse one of these.
RETIRED: dict[str, str] = {
    "BRG001": "was an error (Qwen3.5 with train.bridge: mbridge); train.bridge left the schema, megatron-bridge being "
    "the only bridge gdnctl builds with, so PRE001 (its hint says so) replaced it",
    "BRG002": "was a warning (train.update_weights_via_bridge asked for megatron-bridge's export where the runtime "
    "exports otherwise); the field left the schema, explain's weight_sync line says what exports, and PRE001 "
    "(its hint says so) replaced it",
    "RLT005": "was an error (Qwen3.5 rollouts need vLLM >= 0.27's text-only class); the rollout now serves the "
    "vision-language class on older vLLM, so RLT015 (warning below the first vLLM it ran on) replaced it",
    "PAR009": "was an info (sequence parallel without TP has no effect); Megatron-Core refuses it at model build, "
    "so PAR011 (error) replaced it",
    "TRN012": "was a warning (context-parallel training had not run CP=2 against CP=1 on GPUs); it ran on 2 H200s "
    "(tests/gpu/test_context_parallel_gpu.py: 20 steps within 0.08%), so nothing replaced it",
    "LAY008": "was an error (packed GDN training on Hopper needs cuDNN >= 9.19); the NaN gradients of cuDNN <= 9.18 "
    "are in the full-attention layers' fused attention, not GDN, and packed rows run torch's "
    "FlashAttention unless Transformer Engine's attention is chosen, so LAY010 (which checks cuDNN when "
    "TE's attention runs packed rows at head_dim 256) replaced it",
}


def prefix_of(code: str) -> str:
    return code.rstrip("0123456789")


def check_registration(code: str, name: str, concern: str) -> None:
    """Raise (a programming error, found at import) unless `code` is a live ledger code for `name` in `concern`."""
    if code in RETIRED:
        raise RuntimeError(f"{code} is retired ({RETIRED[code]}); give the rule a new code")
    if CODES.get(code) != name:
        raise RuntimeError(f"{code} is not in gdnctl/validate/codes.py as {name!r}; add it to CODES")
    owner = PREFIXES.get(prefix_of(code))
    if owner != concern:
        raise RuntimeError(f"{code} belongs in the {owner!r} concern, not {concern!r} (codes.PREFIXES)")
