"""The communication memory guard (slime PR #1947's skip policy) and its per-rank profile."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {
    "CommGuardPolicy": "guard",
    "CountingProbe": "guard",
    "install": "guard",
    "uninstall": "guard",
    "set_policy": "guard",
}
__all__ = ["CommGuardPolicy", "CountingProbe", "guard", "install", "set_policy", "uninstall"]
__getattr__ = lazy_attributes(__name__, _HOMES)
