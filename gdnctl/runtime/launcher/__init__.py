"""How the rendered scripts start the job's ranks: torchrun, with a failure told in one sentence (`torchrun`)."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {"failure_sentence": "torchrun"}
__all__ = ["failure_sentence", "torchrun"]
__getattr__ = lazy_attributes(__name__, _HOMES)
