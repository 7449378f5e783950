"""sbatch's long options and how it reads the #SBATCH lines of a script.

Source: Slurm's src/common/slurm_opt.c (the `common_options` table: every option with `set_func` or
`set_func_sbatch`), read at tag slurm-22-05-8-1 (Debian 12's Slurm, which the tests run) and at master
commit 284c3b95f0; this is their union. src/sbatch/opt.c `_opt_batch_script` joins the arguments of every
#SBATCH line of a script into one argv and hands it to glibc's getopt_long, so a later line overrides an
earlier one, a long option may be abbreviated to any prefix that names one option alone, and an option that
takes a value without `=` takes the next line's argument as that value.
"""

from __future__ import annotations

from typing import Literal

ArgumentKind = Literal["required", "optional", "none"]

_REQUIRED = (
    "account acctg-freq array autocomplete batch bb bbf begin chdir cluster cluster-constraint clusters comment "
    "constraint container container-id context core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task "
    "deadline delay-boot dependency distribution error exclude export export-file extra extra-node-info gid "
    "gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags hint input job-name "
    "kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mem-update "
    "mincpus network nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node "
    "ntasks-per-socket ntasks-per-tres open-mode output partition power prefer priority profile qos reservation "
    "resources runtime segment signal sockets-per-node switches tasks-per-node thread-spec threads-per-core time "
    "time-min tmp tres-bind tres-per-task uid wait-all-nodes wckey wrap"
)
# requeue and get-user-env take an optional value in one release and none in the other: optional here.
_OPTIONAL = "exclusive get-user-env nice no-kill oom-kill-step propagate requeue resv-ports"
_NONE = (
    "consolidate-segments contiguous external help hold ignore-pbs no-requeue overcommit oversubscribe parsable "
    "quiet reboot spread-job spread-segments stepmgr test-only usage use-min-nodes verbose version wait"
)

SBATCH_LONG_OPTIONS: dict[str, ArgumentKind] = {
    **{name: "required" for name in _REQUIRED.split()},
    **{name: "optional" for name in _OPTIONAL.split()},
    **{name: "none" for name in _NONE.split()},
}

# --export's words that are not variable names (sbatch(1), --export).
EXPORT_KEYWORDS = frozenset({"ALL", "NONE", "NIL"})


def sbatch_options_named(written: str) -> tuple[str, ...]:
    """The long options `--written` selects, as getopt_long resolves it: the option of that exact name, else
    every option it is a prefix of (one: an abbreviation; several: sbatch refuses it as ambiguous; none: not
    an sbatch option)."""
    if written in SBATCH_LONG_OPTIONS:
        return (written,)
    return tuple(name for name in SBATCH_LONG_OPTIONS if name.startswith(written))
