"""From a valid preset to a running job: the run dir (`render`; what in it is gdnctl's and whether a job holds it,
`run_dir`), running it here or on Slurm (`submit`; a local job's whole process tree stopped with gdnctl,
`process_tree`), the smoke run before it (`smoke`), the job's interpreter (`interpreter`) and the files a local job
reads at start (`local_inputs`), what a run dir says about its job (`runs`: status, logs, cancel), the kernel cache
(`prewarm`) and reading a finished run's comm profiles (`comm_report`), and a copy of a shipped preset that runs
from anywhere (`portable`)."""

from gdnctl.launch import comm_report, interpreter, local_inputs, prewarm, runs, smoke, submit
from gdnctl.launch.portable import portable_text
from gdnctl.launch.render import RenderedRun, next_step, render
from gdnctl.launch.run_dir import slurm_job_name
from gdnctl.launch.submit import default_run_dir

__all__ = [
    "RenderedRun",
    "comm_report",
    "default_run_dir",
    "interpreter",
    "local_inputs",
    "next_step",
    "portable_text",
    "prewarm",
    "render",
    "runs",
    "slurm_job_name",
    "smoke",
    "submit",
]
