"""launch.slurm.extra_sbatch read as sbatch reads it: each line's option, what getopt_long makes of its name
(an abbreviation selects the option it is a prefix of), and the variables an --export value sets."""

from __future__ import annotations

from dataclasses import dataclass

from gdnctl.knowledge import slurm


@dataclass(frozen=True)
class ExtraOption:
    """One extra_sbatch line, `--written[=value]` (the schema gives every line that form)."""

    index: int
    written: str  # the name as written, without the leading --
    options: tuple[str, ...]  # the sbatch options that name selects (several: ambiguous; none: unknown)
    value: str | None  # after `=`; None when written without one

    @property
    def path(self) -> str:
        return f"launch.slurm.extra_sbatch[{self.index}]"

    @property
    def spelled(self) -> str:
        """How the line names its option, for a message: `--outp (sbatch reads it as --output)`."""
        if len(self.options) != 1 or self.options == (self.written,):
            return f"--{self.written}"
        return f"--{self.written} (sbatch reads it as --{self.options[0]})"


def extra_options(lines: list[str]) -> list[ExtraOption]:
    options = []
    for index, line in enumerate(lines):
        written, sep, value = line.removeprefix("--").partition("=")
        options.append(ExtraOption(index, written, slurm.sbatch_options_named(written), value if sep else None))
    return options


def exported(option: ExtraOption) -> list[tuple[str, str | None]]:
    """(name, value) of each variable the line's --export value names: value None for a name passed from the
    submitting environment. Empty for any other option (sbatch(1), --export: comma-separated NAME or
    NAME=value, beside ALL, NONE or NIL)."""
    if option.options != ("export",) or option.value is None:
        return []
    named = []
    for word in option.value.split(","):
        name, sep, value = word.partition("=")
        if sep or name.upper() not in slurm.EXPORT_KEYWORDS:
            named.append((name, value if sep else None))
    return named
