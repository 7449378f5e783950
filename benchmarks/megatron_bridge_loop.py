#!/usr/bin/env python3
"""Megatron-Bridge's own training loop on gdnctl's Qwen3.5-35B-A3B proxy: the loop gdnctl's trainer is measured against
(`benchmarks/trainer_throughput.py compare` runs both).

What it runs
  The model of preset `qwen3.5-35b-a3b-proxy-bench` (catalog `gdnctl/qwen3.5-35b-a3b-proxy`: 8 layers in the 3 GDN :
  1 attention pattern, hidden 2048, 16/2 attention heads of dim 256, 16/32 GDN heads of dim 128, 32 experts top-8 of
  width 512 + gated shared expert 512, vocab 248320, untied head), built from the same HF text config that gdnctl
  writes (gdnctl/runtime/model/checkpoint.py hf_text_config) through megatron-bridge 0.6.2's AutoBridge provider,
  trained by `megatron.bridge.training.pretrain.pretrain` + `gpt_step.forward_step` on Megatron-Bridge's mock GPT
  data (every token slot is a real token: no padding), NullTokenizer of the model's vocabulary (no hub access).
  With --tokens-from ENGINE_YAML the mock dataset hands out the rows gdnctl's trainer trains for that engine config
  instead of Megatron-Core's mock documents (peer_compare/token_stream.py), so both loops train one token stream.
  Megatron-Bridge prints its own per-iteration line ("elapsed time per iteration (ms)", "throughput per GPU
  (TFLOP/s/GPU)", counted by megatron/bridge/training/utils/flop_utils.py over GBS x seq_length tokens); this
  script also times each train step itself and ends with one `PEER_SUMMARY {json}` line.

Modes
  --mode matched (default): the options gdnctl's TE path sets (gdnctl/runtime/model/bridge.py provider_overrides,
      runtime/train/trainer.py DDP/optimizer): grouped GEMM, permute fusion (the bridge's own Qwen3.5 default),
      alltoall dispatcher, fp32 router, no router fusion, no bias-act / rope fusion, native CE fusion,
      gradient_accumulation_fusion off (no APEX), grad reduce in fp32, distributed optimizer, no CUDA graphs,
      no recompute, per-token loss, torch.compile off (gdnctl's kernels.torch_compile: false default).
  --mode tuned: Megatron-Bridge's H100 MoE performance-recipe options that apply to one GPU (perf_recipes/_common.py
      _benchmark_common, recipes/qwen/h100/qwen3_moe.py 16-GPU bf16, recipes/qwen/gb200/qwen35.py text 35B-A3B):
      + bias_activation_fusion, apply_rope_fusion, moe_router_fusion, TE cross entropy, TE-scoped CUDA graphs
      [attn, moe_router, moe_preprocess], grad reduce in bf16, manual GC, torch.compile on, and wgrad accumulation
      fusion in TE layers (the LM head, a non-TE ColumnParallelLinear, keeps the unfused path: no APEX needed).
  Each option can be changed: --cuda-graph-modules none, --ce-impl native, --grad-acc-fusion off, --set KEY=VALUE.

How to run (from the repository root, in the trainer's environment: torch, Transformer Engine, megatron-core and
megatron-bridge importable; measured with Python 3.12, torch 2.11, TE 2.20.2, megatron-core 0.19.2,
megatron-bridge 0.6.2):
  python3 benchmarks/megatron_bridge_loop.py                                  # matched, 1 GPU, 12 steps
  python3 benchmarks/megatron_bridge_loop.py --mode tuned --out tuned.json
  torchrun --nproc_per_node=2 benchmarks/megatron_bridge_loop.py --gbs 8      # 2 GPUs, DP2
  python3 benchmarks/megatron_bridge_loop.py --gdn-kernel flashqla           # gdnctl's kernel adapter
  Add --dry-run to build and print the configuration without training.
  `python3 benchmarks/trainer_throughput.py compare` runs gdnctl's launch and this loop in alternating rounds on the
  same GPU, with gdnctl's environment switches and token stream, and prints the ratio per round (gdnctl counts only
  real tokens; this loop's rows are all real tokens).

Steps counted: the medians and peaks of the summary start SETTLE_STEPS (2) steps after the step the CUDA graphs are
  captured before (peer_compare/steps.py): step 6 in tuned mode, whose graphs are captured after 3 eager steps, and
  step 3 without graphs. --skip changes it; the summary records the graph warm-up it ran with.

Missing packages: megatron-bridge's training modules import `nvidia_resiliency_ext`, `modelopt`, `megatron.energon`
  and `datasets` at module level, only for features this run does not use (in-process restart, distillation,
  Energon/HF data). When one is not installed (a minimal trainer environment lacks several), the script installs a
  stand-in module that raises if anything in it is actually called, and says so. --no-stubs turns that off.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.machinery
import importlib.util
import json
import os
import re
import socket
import statistics
import sys
import time
import traceback
import types

from peer_compare.plan import speed_environment
from peer_compare.steps import first_steady_step

# --------------------------------------------------------------------------------------------------------------------
# The proxy: gdnctl's hf_text_config("gdnctl/qwen3.5-35b-a3b-proxy"), written out (keeps this file standalone).
PROXY_HF_TEXT_CONFIG = {
    "num_hidden_layers": 8,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "vocab_size": 248320,
    "num_experts": 32,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "mtp_num_hidden_layers": 0,
    "rms_norm_eps": 1e-06,
    "architectures": ["Qwen3_5MoeForCausalLM"],
    "model_type": "qwen3_5_moe_text",
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "attention_bias": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    "torch_dtype": "bfloat16",
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}
H100_DENSE_BF16_TFLOPS = 989.0
TUNED_CUDA_GRAPH_MODULES = ["attn", "moe_router", "moe_preprocess"]
# Eager steps before the tuned recipe captures its graphs (model.cuda_graph_warmup_steps): they are captured before
# step 4 (megatron-bridge 0.6 training/train.py: when `step - start_iteration == cuda_graph_warmup_steps`).
TUNED_CUDA_GRAPH_WARMUP_STEPS = 3
# Optional packages megatron-bridge's training modules import at module level (checked against 0.6.2):
#   training/pretrain.py: nvidia_resiliency_ext.inprocess.CallWrapper (in-process restart)
#   training/gpt_step.py, train.py, eval.py, checkpointing.py, post_training/distillation.py: modelopt
#   data/energon/base_energon_datamodule.py: megatron.energon;  data/sources/hf.py, data/datasets/gpt_sft.py: datasets
OPTIONAL_PACKAGES = {
    "nvidia_resiliency_ext": ["nvidia_resiliency_ext", "nvidia_resiliency_ext.inprocess"],
    "modelopt": [
        "modelopt",
        "modelopt.torch",
        "modelopt.torch.distill",
        "modelopt.torch.distill.plugins",
        "modelopt.torch.distill.plugins.megatron",
        "modelopt.torch.opt",
        "modelopt.torch.opt.plugins",
    ],
    "megatron.energon": ["megatron.energon"],
    "datasets": ["datasets", "datasets.builder"],
}
# Stand-ins that are called on every step and must answer as the real package does for a non-distillation model.
STUB_FUNCTIONS = {
    (
        "modelopt.torch.distill.plugins.megatron",
        "get_tensor_shapes_adjust_fn_for_distillation",
    ): lambda *args, **kwargs: None,
}


def log(message: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"[peer] {message}", flush=True)


def is_report_rank() -> bool:
    """Megatron-Bridge prints its iteration line on the last rank (print_rank_last); the summary is made there."""
    return int(os.environ.get("RANK", "0")) == int(os.environ.get("WORLD_SIZE", "1")) - 1


def fail(message: str, code: int = 2) -> None:
    print(f"[peer] ERROR: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


# --------------------------------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--mode", choices=["matched", "tuned"], default="matched")
    p.add_argument("--steps", type=int, default=12, help="training iterations (default 12)")
    p.add_argument(
        "--skip",
        type=int,
        default=None,
        help="first steps left out of the medians and peaks (default: up to two steps after the CUDA-graph "
        "capture, 5 in tuned mode; 2 without graphs)",
    )
    p.add_argument("--mbs", type=int, default=1, help="micro-batch size (gdnctl preset: 1)")
    p.add_argument("--gbs", type=int, default=4, help="global batch size in sequences (gdnctl preset: 4)")
    p.add_argument("--seq", type=int, default=8192, help="sequence length (gdnctl preset: 8192)")
    p.add_argument("--layers", type=int, default=8, help="decoder layers (proxy: 8; multiple of 4 keeps 3:1)")
    p.add_argument("--experts", type=int, default=32, help="routed experts (proxy: 32)")
    p.add_argument("--ep", type=int, default=1, help="expert parallel size (needs that many GPUs)")
    p.add_argument(
        "--gdn-kernel",
        choices=["megatron", "fla", "flashqla"],
        default="megatron",
        help="megatron: Megatron-Core's own FLA import; fla/flashqla: gdnctl's kernels "
        "(gdnctl importable, e.g. PYTHONPATH=...:. from the repository root)",
    )
    p.add_argument(
        "--torch-compile",
        choices=["auto", "on", "off"],
        default="auto",
        help="auto: off in matched (gdnctl's default), on in tuned (Megatron's default)",
    )
    p.add_argument(
        "--grad-acc-fusion",
        choices=["auto", "on", "off"],
        default="auto",
        help="TE wgrad accumulation into main_grad; auto: off in matched, on in tuned",
    )
    p.add_argument(
        "--cuda-graph-modules",
        default="auto",
        help="comma list for TE-scoped CUDA graphs, or 'none'; auto: none in matched, "
        + ",".join(TUNED_CUDA_GRAPH_MODULES)
        + " in tuned",
    )
    p.add_argument(
        "--ce-impl",
        choices=["auto", "native", "te"],
        default="auto",
        help="cross_entropy_fusion_impl; auto: native in matched, te in tuned",
    )
    p.add_argument("--recompute", choices=["none", "selective", "full"], default="none")
    p.add_argument(
        "--recompute-modules",
        default="",
        help="with --recompute selective, e.g. 'moe_act,layernorm' (Megatron's names)",
    )
    p.add_argument(
        "--precision-aware-optimizer",
        action="store_true",
        help="bf16 Adam moments (Megatron-Bridge's 16-H100 recipes); default off as in gdnctl",
    )
    p.add_argument(
        "--force-balance",
        action="store_true",
        help="moe_router_force_load_balancing (benchmark-only; Megatron-Bridge's published MoE numbers "
        "use it; default off: learned routing as in gdnctl)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override any ConfigContainer field, e.g. model.moe_router_fusion=True (repeatable, applied last)",
    )
    p.add_argument(
        "--tokens-from",
        default=None,
        metavar="ENGINE_YAML",
        help="train the rows gdnctl's trainer trains for this engine config (gdnctl render's engine.yaml; packing "
        "concat, layout bshd) instead of Megatron-Core's mock documents (gdnctl importable)",
    )
    p.add_argument("--peak-tflops", type=float, default=H100_DENSE_BF16_TFLOPS, help="for MFU (H100 bf16: 989)")
    p.add_argument("--out", default=None, help="write the summary JSON here")
    p.add_argument("--no-stubs", action="store_true", help="do not stand in for missing optional packages")
    p.add_argument("--dry-run", action="store_true", help="build and print the configuration, do not train")
    args = p.parse_args(argv)
    if args.gbs % args.mbs:
        fail(f"--gbs {args.gbs} is not a multiple of --mbs {args.mbs}")
    if args.layers % 4:
        fail("--layers must be a multiple of 4 (full_attention_interval 4)")
    if args.tokens_from and not os.path.isfile(args.tokens_from):
        fail(f"--tokens-from {args.tokens_from}: no such file; pass the engine.yaml `gdnctl render` wrote")
    resolve_mode_defaults(args)
    return args


def resolve_mode_defaults(args: argparse.Namespace) -> None:
    tuned = args.mode == "tuned"
    if args.torch_compile == "auto":
        args.torch_compile = "on" if tuned else "off"
    if args.grad_acc_fusion == "auto":
        args.grad_acc_fusion = "on" if tuned else "off"
    if args.ce_impl == "auto":
        args.ce_impl = "te" if tuned else "native"
    if args.cuda_graph_modules == "auto":
        args.cuda_graph_modules = ",".join(TUNED_CUDA_GRAPH_MODULES) if tuned else "none"
    args.graph_modules = [] if args.cuda_graph_modules in ("", "none") else args.cuda_graph_modules.split(",")
    if args.skip is None:
        args.skip = first_steady_step(TUNED_CUDA_GRAPH_WARMUP_STEPS if args.graph_modules else None) - 1
    if args.steps <= args.skip:
        fail(f"--steps {args.steps} leaves nothing after the {args.skip} warm-up steps; raise --steps")


def set_process_environment(args: argparse.Namespace) -> None:
    """Before torch touches CUDA: single-process defaults for torch.distributed, and the recipe environment."""
    if "RANK" not in os.environ:  # plain `python3 megatron_bridge_loop.py`: one rank
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
    if args.mode == "tuned":
        # Megatron-Bridge's H100 MoE perf recipes (perf_recipes/qwen/h100/qwen3_moe.py env_vars); with CUDA graphs
        # and expandable segments the recipes also set NCCL_GRAPH_REGISTER=0.
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        os.environ.setdefault("NCCL_GRAPH_REGISTER", "0")
        os.environ.setdefault("TORCH_NCCL_AVOID_RECORD_STREAMS", "1")
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")


# --------------------------------------------------------------------------------------------------------------------
class _StubError(RuntimeError):
    pass


def _stub_class(module_name: str, attr: str):
    def _refuse(*_args, **_kwargs):
        raise _StubError(
            f"{module_name}.{attr} was called, but {module_name.split('.')[0]} is not installed "
            "(megatron_bridge_loop.py stood in for it); install the package or use a path that does not "
            "need it"
        )

    return type(
        attr, (), {"__init__": _refuse, "__module__": module_name, "__doc__": "megatron_bridge_loop.py stand-in"}
    )


class _StubModule(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        value = STUB_FUNCTIONS.get((self.__name__, attr)) or _stub_class(self.__name__, attr)
        setattr(self, attr, value)
        return value


def install_stubs(enabled: bool) -> list[str]:
    """Stand in for the optional packages that are not installed; returns the packages stood in for."""
    missing = []
    for top, names in OPTIONAL_PACKAGES.items():
        try:
            present = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            present = False
        if present:
            continue
        missing.append(top)
        if not enabled:
            continue
        for name in names:
            module = _StubModule(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
            module.__path__ = []  # a package with no submodules: `import top.other` still fails cleanly
            sys.modules[name] = module
            parent, _, child = name.rpartition(".")
            if parent and parent in sys.modules:
                setattr(sys.modules[parent], child, module)
        for (module_name, attr), fn in STUB_FUNCTIONS.items():
            if module_name in sys.modules and isinstance(sys.modules[module_name], _StubModule):
                setattr(sys.modules[module_name], attr, fn)
    if missing and not enabled:
        fail(
            "not installed: " + ", ".join(missing) + ". megatron-bridge 0.6.2's training modules import them at "
            "module level; install them next to megatron-bridge, or drop --no-stubs."
        )
    return missing


def enable_te_wgrad_fusion_without_apex() -> str:
    """gradient_accumulation_fusion for Transformer Engine layers only.

    Megatron-Core 0.19.2 refuses gradient_accumulation_fusion at build time in its own (non-TE) ColumnParallelLinear
    when APEX's fused_weight_gradient_mlp_cuda is missing (tensor_parallel/layers.py); in a TE-built GPT model that
    class is only the LM head. TE layers do the fusion themselves (fuse_wgrad_accumulation). So: pass the build-time
    check, and keep every non-TE tensor-parallel linear on its unfused weight-gradient path.
    """
    import megatron.core.tensor_parallel.layers as tpl

    if tpl._grad_accum_fusion_available:
        return "APEX fused_weight_gradient_mlp_cuda present: all layers fused"
    tpl._grad_accum_fusion_available = True
    for cls in (tpl.ColumnParallelLinear, tpl.RowParallelLinear):
        original = cls.__init__

        def __init__(self, *args, _original=original, **kwargs):
            _original(self, *args, **kwargs)
            self.gradient_accumulation_fusion = False  # no APEX: this non-TE layer accumulates through DDP's hook

        cls.__init__ = __init__
    return "no APEX: TE layers fuse wgrad into main_grad, non-TE linears (the LM head) stay unfused"


# --------------------------------------------------------------------------------------------------------------------
class StdoutTee:
    """Forward stdout and keep Megatron-Bridge's own per-iteration numbers from its log lines."""

    ITERATION = re.compile(r"iteration\s+(\d+)/\s*(\d+)\s*\|")
    ELAPSED = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.]+)")
    TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([0-9.]+)")

    def __init__(self, stream):
        self._stream, self._buffer, self.records = stream, "", []

    def write(self, text):
        self._stream.write(text)
        self._buffer += text
        while "\n" in self._buffer:
            line, self._buffer = self._buffer.split("\n", 1)
            self._parse(line)
        return len(text)

    def _parse(self, line):
        it, ms = self.ITERATION.search(line), self.ELAPSED.search(line)
        if it and ms:
            tf = self.TFLOPS.search(line)
            self.records.append(
                {
                    "iteration": int(it.group(1)),
                    "elapsed_ms": float(ms.group(1)),
                    "tflops_per_gpu": float(tf.group(1)) if tf else None,
                }
            )

    def flush(self):
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


# --------------------------------------------------------------------------------------------------------------------
def parse_set(value: str):
    key, sep, raw = value.partition("=")
    if not sep or "." not in key:
        fail(f"--set {value!r}: expected SECTION.KEY=VALUE, e.g. model.moe_router_fusion=True")
    try:
        parsed = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        parsed = raw
    return key.split("."), parsed


def build_config(args: argparse.Namespace):
    import torch
    from megatron.bridge import AutoBridge
    from megatron.bridge.training.config import (
        CheckpointConfig,
        ConfigContainer,
        DistributedDataParallelConfig,
        DistributedInitConfig,
        GPTDatasetConfig,
        LoggerConfig,
        OptimizerConfig,
        RerunStateMachineConfig,
        RNGConfig,
        SchedulerConfig,
        TokenizerConfig,
        TrainingConfig,
        ValidationConfig,
    )
    from megatron.bridge.training.mixed_precision import bf16_mixed
    from megatron.bridge.utils.cuda_graph import set_cuda_graph_modules
    from transformers import AutoConfig

    tuned = args.mode == "tuned"
    document = dict(PROXY_HF_TEXT_CONFIG, num_hidden_layers=args.layers, num_experts=args.experts)
    model_type = document.pop("model_type")
    hf_config = AutoConfig.for_model(model_type, **document)
    model = AutoBridge.from_hf_config(hf_config).to_megatron_provider(load_weights=False)

    # gdnctl/runtime/model/bridge.py provider_overrides (both modes)
    model.tensor_model_parallel_size = 1
    model.pipeline_model_parallel_size = 1
    model.virtual_pipeline_model_parallel_size = None
    model.context_parallel_size = 1
    model.sequence_parallel = False
    model.expert_model_parallel_size = args.ep
    model.expert_tensor_parallel_size = 1
    model.pipeline_dtype = torch.bfloat16
    model.calculate_per_token_loss = True
    model.init_method_std = 0.02
    model.mtp_num_layers = None
    model.moe_grouped_gemm = True
    model.moe_router_dtype = "fp32"
    model.seq_length = args.seq
    model.variable_seq_lengths = False
    model.gradient_accumulation_fusion = args.grad_acc_fusion == "on"
    model.moe_router_force_load_balancing = args.force_balance
    model.cross_entropy_loss_fusion = True
    model.cross_entropy_fusion_impl = args.ce_impl
    # matched keeps the provider's (= gdnctl's) values; tuned turns on Megatron-Bridge's perf-recipe fusions
    model.bias_activation_fusion = tuned
    model.apply_rope_fusion = tuned
    model.moe_router_fusion = tuned
    model.moe_permute_fusion = True  # the bridge's Qwen3.5-MoE default (qwen35_bridge.py), gdnctl keeps it
    model.moe_shared_expert_overlap = False
    if args.recompute == "full":
        model.recompute_granularity, model.recompute_method, model.recompute_num_layers = "full", "uniform", 1
    elif args.recompute == "selective":
        model.recompute_granularity = "selective"
        if args.recompute_modules:
            model.recompute_modules = args.recompute_modules.split(",")
    else:
        model.recompute_granularity, model.recompute_method, model.recompute_num_layers = None, None, None
    if args.graph_modules:
        model.cuda_graph_impl = "transformer_engine"
        set_cuda_graph_modules(model, args.graph_modules)
        model.cuda_graph_warmup_steps = TUNED_CUDA_GRAPH_WARMUP_STEPS
        model.use_te_rng_tracker = True
    else:
        model.cuda_graph_impl = "none"

    grad_reduce_fp32 = not tuned  # gdnctl: grad_reduce_in_fp32=True; MB perf recipes: False
    mixed_precision = bf16_mixed()
    mixed_precision.grad_reduce_in_fp32 = grad_reduce_fp32

    optimizer = OptimizerConfig(  # gdnctl/runtime/train/trainer.py: adam, constant lr 1e-5, wd 0.01, clip 1.0
        optimizer="adam",
        lr=1e-5,
        min_lr=1e-5,
        weight_decay=0.01,
        adam_beta1=0.9,
        adam_beta2=0.95,
        adam_eps=1e-8,
        clip_grad=1.0,
        bf16=True,
        use_distributed_optimizer=True,
        use_precision_aware_optimizer=args.precision_aware_optimizer,
    )
    if args.precision_aware_optimizer:
        optimizer.main_grads_dtype, optimizer.main_params_dtype = torch.float32, torch.float32
        optimizer.exp_avg_dtype, optimizer.exp_avg_sq_dtype = torch.bfloat16, torch.bfloat16
    scheduler = SchedulerConfig(
        lr_decay_style="constant",
        lr_warmup_iters=0,
        lr_decay_iters=args.steps,
        start_weight_decay=0.01,
        end_weight_decay=0.01,
        weight_decay_incr_style="constant",
        override_opt_param_scheduler=True,
    )
    dataset = GPTDatasetConfig(  # blend=None: Megatron's mock GPT data (recipes/common.py _pretrain_common)
        seq_length=args.seq,
        random_seed=1234,
        reset_attention_mask=False,
        reset_position_ids=False,
        eod_mask_loss=False,
        num_dataset_builder_threads=1,
        blend=None,
        blend_per_split=None,
        split="9999,8,2",
        data_sharding=True,
        dataloader_type="single",
        skip_getting_attention_mask_from_dataset=True,
        num_workers=1,
    )
    cfg = ConfigContainer(
        model=model,
        train=TrainingConfig(
            train_iters=args.steps,
            global_batch_size=args.gbs,
            micro_batch_size=args.mbs,
            manual_gc=tuned,
            manual_gc_interval=100 if tuned else 0,
        ),
        validation=ValidationConfig(eval_iters=0, eval_interval=None),
        optimizer=optimizer,
        scheduler=scheduler,
        ddp=DistributedDataParallelConfig(
            grad_reduce_in_fp32=grad_reduce_fp32,
            overlap_grad_reduce=False,
            overlap_param_gather=False,
            use_distributed_optimizer=True,
            check_for_nan_in_grad=False,
            # per-token loss asserts average_in_collective=False (mcore DDP)
            average_in_collective=False,
        ),
        dataset=dataset,
        logger=LoggerConfig(log_interval=1, log_throughput=True, tensorboard_dir=None, log_timers_to_tensorboard=False),
        tokenizer=TokenizerConfig(
            tokenizer_type="NullTokenizer",
            tokenizer_model=None,
            vocab_size=PROXY_HF_TEXT_CONFIG["vocab_size"],
            use_tokenizer_vocab_size=False,
        ),
        checkpoint=CheckpointConfig(save=None, load=None, save_interval=None),
        rng=RNGConfig(seed=1234, te_rng_tracker=bool(args.graph_modules)),
        rerun_state_machine=RerunStateMachineConfig(check_for_nan_in_loss=False, check_for_spiky_loss=False),
        dist=DistributedInitConfig(),
        comm_overlap=None,
        mixed_precision=mixed_precision,
    )
    for value in args.set:
        path, parsed = parse_set(value)
        target = cfg
        for part in path[:-1]:
            target = getattr(target, part)
        if not hasattr(target, path[-1]):
            fail(f"--set {value!r}: {type(target).__name__} has no field {path[-1]!r}")
        setattr(target, path[-1], parsed)
    return cfg


REPORTED_OPTIONS = [
    "num_layers",
    "hidden_size",
    "num_moe_experts",
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "vocab_size",
    "seq_length",
    "experimental_attention_variant",
    "linear_attention_freq",
    "moe_grouped_gemm",
    "moe_permute_fusion",
    "moe_router_fusion",
    "moe_token_dispatcher_type",
    "moe_router_dtype",
    "moe_router_load_balancing_type",
    "moe_router_force_load_balancing",
    "moe_shared_expert_overlap",
    "cross_entropy_loss_fusion",
    "cross_entropy_fusion_impl",
    "bias_activation_fusion",
    "apply_rope_fusion",
    "masked_softmax_fusion",
    "gradient_accumulation_fusion",
    "calculate_per_token_loss",
    "recompute_granularity",
    "recompute_modules",
    "cuda_graph_impl",
    "cuda_graph_modules",
    "cuda_graph_warmup_steps",
    "use_te_rng_tracker",
    "use_transformer_engine_op_fuser",
    "expert_model_parallel_size",
    "bf16",
]


def describe(cfg) -> dict:
    out = {f"model.{k}": _plain(getattr(cfg.model, k, "<absent>")) for k in REPORTED_OPTIONS}
    out.update(
        {
            "train.micro_batch_size": cfg.train.micro_batch_size,
            "train.global_batch_size": cfg.train.global_batch_size,
            "train.manual_gc": cfg.train.manual_gc,
            "ddp.grad_reduce_in_fp32": cfg.ddp.grad_reduce_in_fp32,
            "ddp.overlap_grad_reduce": cfg.ddp.overlap_grad_reduce,
            "ddp.use_distributed_optimizer": cfg.ddp.use_distributed_optimizer,
            "optimizer.use_precision_aware_optimizer": cfg.optimizer.use_precision_aware_optimizer,
            "dataset.seq_length": cfg.dataset.seq_length,
        }
    )
    return out


def _plain(value):
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "name") and not isinstance(value, (str, int, float, bool)):
        return value.name
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


# --------------------------------------------------------------------------------------------------------------------
def flops_per_token(cfg, args) -> dict:
    """Megatron-Bridge's model FLOPs per token (its TFLOP/s/GPU numerator), and gdnctl's when gdnctl imports."""
    result = {}
    try:
        from megatron.bridge.training.utils.flop_utils import num_floating_point_operations

        result["megatron_bridge"] = num_floating_point_operations(cfg, batch_size=1) / args.seq
    except Exception as error:  # informational only
        result["megatron_bridge_error"] = f"{type(error).__name__}: {error}"
    try:
        from gdnctl.knowledge import catalog, flops

        arch = catalog.from_catalog("gdnctl/qwen3.5-35b-a3b-proxy")
        arch = arch.model_copy(update={"num_layers": args.layers, "num_experts": args.experts})
        result["gdnctl_full_rows"] = flops.train_flops_per_token(arch, args.seq)
    except Exception as error:
        result["gdnctl_error"] = f"{type(error).__name__}: {error}"
    if "megatron_bridge" in result and "gdnctl_full_rows" in result:
        result["gdnctl_over_megatron_bridge"] = result["gdnctl_full_rows"] / result["megatron_bridge"]
    return result


def make_callback(args, holder: dict):
    import torch
    import torch.distributed as dist
    from megatron.bridge.training.callbacks import Callback

    class StepTimer(Callback):
        """Times each train step (cuda-synchronized) and reads Megatron-Bridge's FLOP counter between steps."""

        def __init__(self):
            self.steps, self._t0, self._flops0, self._last_flops = [], None, None, None

        def _rank0(self):
            return not dist.is_initialized() or dist.get_rank() == 0

        def on_train_start(self, context):
            holder["cfg"] = context.state.cfg
            if self._rank0():
                log(
                    "resolved options (after Megatron-Bridge's finalize): "
                    + json.dumps(describe(context.state.cfg), sort_keys=True)
                )

        def _close_previous(self, context):
            if self.steps and self.steps[-1].get("flops") is None and self._flops0 is not None:
                now = float(context.state.train_state.floating_point_operations_so_far)
                self.steps[-1]["flops"] = now - self._flops0

        def on_train_step_start(self, context):
            self._close_previous(context)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._flops0 = float(context.state.train_state.floating_point_operations_so_far)
            self._t0 = time.perf_counter()

        def on_train_step_end(self, context):
            torch.cuda.synchronize()
            seconds = time.perf_counter() - self._t0
            self.steps.append(
                {
                    "step": len(self.steps) + 1,
                    "seconds": seconds,
                    "flops": None,
                    "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
                    # with CUDA graphs, their pools' tensors are reserved, not counted as allocated
                    "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
                    "skipped": bool(context.skipped_iter),
                }
            )

        def on_train_end(self, context):
            self._close_previous(context)
            world = dist.get_world_size() if dist.is_initialized() else 1
            for s in self.steps:
                if s["flops"]:
                    s["tflops_per_gpu"] = s["flops"] / s["seconds"] / world / 1e12
            holder["steps"] = self.steps

    return StepTimer()


def graph_warmup_steps(cfg) -> int | None:
    """The eager steps before this run captured its CUDA graphs, from its resolved configuration; None without
    graphs."""
    if cfg is None or getattr(cfg.model, "cuda_graph_impl", "none") in (None, "none"):
        return None
    return int(cfg.model.cuda_graph_warmup_steps)


def summarise(args, holder, tee, stubbed, wgrad_note) -> dict:
    steps = holder.get("steps", [])
    cfg = holder.get("cfg")
    measured = [s for s in steps if s["step"] > args.skip]
    mb = [r for r in tee.records if r["iteration"] > args.skip]
    tokens = args.gbs * args.seq
    median = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    mb_tflops = median([r["tflops_per_gpu"] for r in mb if r["tflops_per_gpu"] is not None])
    own_tflops = median([s["tflops_per_gpu"] for s in measured if s.get("tflops_per_gpu")])
    own_step = median([s["seconds"] for s in measured])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return {
        "mode": args.mode,
        "world_size": world,
        "steps": args.steps,
        "skipped_warmup_steps": args.skip,
        "shape": {
            "micro_batch_size": args.mbs,
            "global_batch_size": args.gbs,
            "seq_length": args.seq,
            "tokens_per_step": tokens,
            "micro_batches_per_gpu": args.gbs // (args.mbs * world),
            "layers": args.layers,
            "experts": args.experts,
        },
        "megatron_bridge_log": {
            "median_elapsed_ms": median([r["elapsed_ms"] for r in mb]),
            "median_tflops_per_gpu": mb_tflops,
            "mfu": mb_tflops / args.peak_tflops if mb_tflops else None,
            "per_iteration": tee.records,
        },
        "train_step_timer": {
            "median_step_s": own_step,
            "median_tokens_per_s_per_gpu": tokens / own_step / world if own_step else None,
            "median_tflops_per_gpu": own_tflops,
            "mfu": own_tflops / args.peak_tflops if own_tflops else None,
            "max_peak_memory_gib": max((s["peak_gib"] for s in measured), default=None),
            "max_peak_reserved_gib": max((s["peak_reserved_gib"] for s in measured), default=None),
            "per_step": steps,
        },
        "flops_per_token": flops_per_token(cfg, args) if cfg is not None else None,
        "options": describe(cfg) if cfg is not None else None,
        "graph_warmup_steps": graph_warmup_steps(cfg),
        "token_stream": (
            f"gdnctl's rows for {args.tokens_from}" if args.tokens_from else "Megatron-Core's mock documents"
        ),
        # the variables the step's speed can depend on, as this process had them (its recipe's own included)
        "environment": speed_environment(dict(os.environ)),
        "gdn_kernel": args.gdn_kernel,
        "torch_compile": args.torch_compile,
        "wgrad_fusion": wgrad_note,
        "stood_in_for": stubbed,
    }


# --------------------------------------------------------------------------------------------------------------------
HINTS = [
    (
        "fused_weight_gradient_mlp_cuda",
        "gradient_accumulation_fusion needs APEX in Megatron-Core's non-TE linears: "
        "use --grad-acc-fusion on (TE layers only) or off.",
    ),
    (
        "out of memory",
        "CUDA OOM: try --recompute selective --recompute-modules moe_act,layernorm, "
        "--precision-aware-optimizer, --ce-impl te, a smaller --mbs, or --cuda-graph-modules none.",
    ),
    ("graph", "a CUDA-graph problem: rerun with --cuda-graph-modules none (or only moe_router,moe_preprocess)."),
    (
        "No module named",
        "a package is missing from PYTHONPATH (Transformer Engine, megatron-core and megatron-bridge must import).",
    ),
    (
        "not installed (megatron_bridge_loop.py stood in",
        "this run reached a feature of a package that is not installed.",
    ),
]


def main(argv=None) -> int:
    args = parse_args(argv)
    set_process_environment(args)
    tee = StdoutTee(sys.stdout)
    sys.stdout = tee
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401  (imported before any stand-in, so its package probes see the truth)
    except Exception as error:
        fail(
            f"cannot import torch/transformers ({type(error).__name__}: {error}); "
            "run where Transformer Engine, megatron-core and megatron-bridge import"
        )
    stubbed = install_stubs(enabled=not args.no_stubs)
    if stubbed:
        log("not installed, stood in for (only imported, never used by this run): " + ", ".join(stubbed))
    holder: dict = {}
    wgrad_note = "off"
    try:
        import megatron.bridge  # noqa: F401
        import megatron.core

        log(
            f"megatron-core {getattr(megatron.core, '__version__', '?')}, megatron-bridge "
            f"{getattr(megatron.bridge, '__version__', '?')}, torch {torch.__version__}, mode {args.mode}"
        )
        if args.torch_compile == "off":
            torch.compiler.set_stance("force_eager")  # what gdnctl's trainer does by default
        if args.grad_acc_fusion == "on":
            wgrad_note = enable_te_wgrad_fusion_without_apex()
            log(f"gradient_accumulation_fusion: {wgrad_note}")
        if args.gdn_kernel != "megatron":
            from gdnctl.runtime.kernels import patch_megatron_gdn_kernel, resolve_backend

            patched = patch_megatron_gdn_kernel(resolve_backend(args.gdn_kernel, training=True))
            log(f"GDN kernel: gdnctl's {args.gdn_kernel} patched into {', '.join(patched)}")
        cfg = build_config(args)
        log("requested options: " + json.dumps(describe(cfg), sort_keys=True))
        if args.dry_run:
            from megatron.bridge.training.config import runtime_config_update

            runtime_config_update(cfg)  # what pretrain() does first: mixed precision, DP size, validate/finalize
            log("--dry-run: resolved options: " + json.dumps(describe(cfg), sort_keys=True))
            log("--dry-run: configuration built and validated; not training")
            return 0
        import megatron.bridge.training.initialize as _mb_init
        from megatron.bridge.training.gpt_step import forward_step
        from megatron.bridge.training.pretrain import pretrain

        # The megatron-core wheel ships helpers_cpp prebuilt but no Makefile, so the runtime `make` step fails;
        # the prebuilt extension is what the mock dataset uses.
        _mb_init.compile_helpers = lambda: None
        if args.tokens_from:
            from peer_compare.token_stream import serve_gdnctl_rows

            serve_gdnctl_rows(args.tokens_from, args.seq)
            log(f"token stream: the rows gdnctl's trainer trains for {args.tokens_from}")

        pretrain(cfg, forward_step, callbacks=[make_callback(args, holder)])
    except SystemExit:
        raise
    except BaseException as error:
        text = f"{type(error).__name__}: {error}"
        traceback.print_exc()
        hint = next((h for key, h in HINTS if key.lower() in text.lower()), None)
        fail(f"the run stopped: {text[:600]}" + (f"\n[peer] hint: {hint}" if hint else ""), code=1)
    finally:
        sys.stdout = tee._stream
    if is_report_rank():
        summary = summarise(args, holder, tee, stubbed, wgrad_note)
        short = dict(
            summary,
            options=None,
            megatron_bridge_log={k: v for k, v in summary["megatron_bridge_log"].items() if k != "per_iteration"},
            train_step_timer={k: v for k, v in summary["train_step_timer"].items() if k != "per_step"},
        )
        print("PEER_SUMMARY " + json.dumps(short, default=str), flush=True)
        t, m = summary["train_step_timer"], summary["megatron_bridge_log"]
        print(
            f"[peer] median step {t['median_step_s']} s (train_step timer), {m['median_elapsed_ms']} ms "
            f"(Megatron-Bridge log); TFLOP/s/GPU {m['median_tflops_per_gpu']} (Megatron-Bridge log), "
            f"{t['median_tflops_per_gpu']} (timer); MFU {m['mfu']} of {args.peak_tflops} TFLOPS; "
            f"peak {t['max_peak_memory_gib']} GiB",
            flush=True,
        )
        if args.out:
            with open(args.out, "w") as f:
                f.write(json.dumps(summary, default=str, indent=1) + "\n")
            print(f"[peer] full summary (per step, resolved options) written to {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
