"""The GDN kernel switch: FLA or FlashQLA behind one adapter, installed into Megatron-Core's GatedDeltaNet;
the fp32 reference the doctor compares them with; timing of first and warm calls."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {"GdnBackendUnavailable": "backends", "RuntimeFacts": "backends", "find_backend_problem": "backends",
    "install_kernel_on_layers": "backends", "patch_megatron_gdn_kernel": "backends", "resolve_backend": "backends",
    "GdnShape": "reference", "make_gdn_inputs": "reference", "parity_errors": "reference", "ShapeTiming": "warmup",
    "fwd_bwd_seconds": "warmup", "time_shapes": "warmup"}
__all__ = ["GdnBackendUnavailable", "GdnShape", "RuntimeFacts", "ShapeTiming", "backends", "find_backend_problem",
           "fwd_bwd_seconds", "install_kernel_on_layers", "make_gdn_inputs", "parity_errors",
           "patch_megatron_gdn_kernel", "reference", "resolve_backend", "time_shapes", "warmup"]
__getattr__ = lazy_attributes(__name__, _HOMES)
