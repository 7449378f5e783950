"""What the rl loop trains through: the `Policy` contract (`interface`), and its two implementations,
transformers' class in plain torch on CPU (`torch_policy`; its vision-language class for image prompts,
`torch_vision_policy`) and the sft trainer's Megatron model on GPUs
(`megatron_policy`); `make_policy` picks one from the engine config's device."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {
    "Policy": "interface",
    "make_policy": "interface",
    "TorchPolicy": "torch_policy",
    "TorchVisionPolicy": "torch_vision_policy",
    "MegatronPolicy": "megatron_policy",
}
__all__ = [
    "MegatronPolicy",
    "Policy",
    "TorchPolicy",
    "TorchVisionPolicy",
    "interface",
    "make_policy",
    "megatron_policy",
    "torch_policy",
    "torch_vision_policy",
]
__getattr__ = lazy_attributes(__name__, _HOMES)
