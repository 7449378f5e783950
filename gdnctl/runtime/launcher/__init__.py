"""How the rendered scripts start the job's ranks and how those processes end: torchrun, with a failure told in one
sentence (`torchrun`), the Slurm trainer step's rendezvous on a port its first node holds (`rendezvous`), the
imports a trainer process keeps out (`unused_imports`), and an exit that skips the interpreter's teardown
(`process_exit`)."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {
    "failure_sentence": "torchrun",
    "exit_without_teardown": "process_exit",
    "keep_unused_imports_out": "unused_imports",
}
__all__ = [
    "exit_without_teardown",
    "failure_sentence",
    "keep_unused_imports_out",
    "process_exit",
    "rendezvous",
    "torchrun",
    "unused_imports",
]
__getattr__ = lazy_attributes(__name__, _HOMES)
