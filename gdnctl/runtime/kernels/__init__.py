"""The GDN kernel switch: FLA or FlashQLA behind one adapter, installed into Megatron-Core's GatedDeltaNet;
the fp32 reference the doctor compares them with; timing of first and warm calls; and what is said while
TileLang compiles (an estimate, a line per kernel, the compiler's own output in the kernel cache's log); and
whether the trainer's torch.compile'd functions compile at all; and packed offsets the GDN layers read on the
host."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {"GdnBackendUnavailable": "backends", "RuntimeFacts": "backends", "find_backend_problem": "backends",
    "install_kernel_on_layers": "backends", "patch_megatron_gdn_kernel": "backends", "resolve_backend": "backends",
    "GdnShape": "reference", "make_gdn_inputs": "reference", "parity_errors": "reference", "ShapeTiming": "warmup",
    "fwd_bwd_seconds": "warmup", "time_shapes": "warmup", "COMPILE_LOG_NAME": "compile_log",
    "CompileConsole": "compile_log", "cached_kernel_files": "compile_log", "capture_compiler_output": "compile_log",
    "kernel_cache_dir": "compile_log", "ShapeCompile": "compile_progress", "compile_estimate": "compile_progress",
    "compile_quietly": "compile_progress", "expected_kernels": "compile_progress", "watch_compiles": "compile_progress",
    "compiles_logged": "compile_progress", "apply_torch_compile": "torch_compile",
    "with_host_copy": "host_offsets", "host_copy": "host_offsets", "install_host_side_checks": "host_offsets"}
__all__ = ["COMPILE_LOG_NAME", "CompileConsole", "GdnBackendUnavailable", "GdnShape", "RuntimeFacts",
           "ShapeCompile", "ShapeTiming", "apply_torch_compile", "backends", "cached_kernel_files",
           "capture_compiler_output",
           "compile_estimate", "compile_log", "compile_progress", "compile_quietly", "compiles_logged",
           "expected_kernels", "find_backend_problem", "fwd_bwd_seconds", "host_copy", "host_offsets",
           "install_host_side_checks", "install_kernel_on_layers",
           "kernel_cache_dir", "make_gdn_inputs", "parity_errors", "patch_megatron_gdn_kernel", "reference",
           "resolve_backend", "time_shapes", "torch_compile", "warmup", "watch_compiles", "with_host_copy"]
__getattr__ = lazy_attributes(__name__, _HOMES)
