#!/usr/bin/env bash
# Create the comparators' virtual environments used by benchmarks/run.py:
#   benchmarks/.envs/monarch  PyTorch Monarch (torchmonarch==0.7.0; its actors need no torch)
#   benchmarks/.envs/ray      Ray (num_cpus=0 actors, 127.0.0.1, no dashboard)
# Each is optional: run.py skips a system whose environment is missing.
#
# Usage: bash benchmarks/setup_comparators.sh [monarch] [ray]   (default: both)
#
# Never lets a comparator pull a CUDA build of torch: every install runs with a
# constraint file pinning torch==2.13.0 (the CPU build served here), and the
# script fails if a torch wheel carrying CUDA libraries ends up installed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
envs="$here/.envs"
PY="${PYTHON:-python3}"
mkdir -p "$envs"

constraints="$envs/constraints.txt"
cat >"$constraints" <<'C'
torch==2.13.0
C

want=("$@")
[ ${#want[@]} -eq 0 ] && want=(monarch ray)

check_no_cuda() {
    local py="$1"
    if "$py" -m pip show torch >/dev/null 2>&1; then
        echo "note: torch got installed into $(dirname "$(dirname "$py")")"
        if "$py" -m pip list 2>/dev/null | grep -qiE '^nvidia-'; then
            echo "error: a CUDA build of torch was pulled (nvidia-* packages present)" >&2
            exit 1
        fi
    fi
}

make_env() {
    local name="$1"; shift
    local dir="$envs/$name"
    if [ ! -x "$dir/bin/python" ]; then
        echo "== creating $dir"
        "$PY" -m venv "$dir"
    fi
    "$dir/bin/python" -m pip install -q --upgrade pip
    echo "== installing into $name: $*"
    "$dir/bin/python" -m pip install -q -c "$constraints" "$@"
    check_no_cuda "$dir/bin/python"
}

for sys in "${want[@]}"; do
    case "$sys" in
        monarch)
            # torchmonarch 0.7.0 does not depend on torch; the constraint keeps any
            # transitive torch on the CPU build all the same.
            make_env monarch "torchmonarch==0.7.0" numpy
            "$envs/monarch/bin/python" -c "import monarch.actor; print('monarch ok')"
            ;;
        ray)
            make_env ray "ray" numpy
            "$envs/ray/bin/python" -c "import ray; print('ray', ray.__version__, 'ok')"
            ;;
        *)
            echo "unknown comparator: $sys (expected monarch or ray)" >&2
            exit 2
            ;;
    esac
done
echo "comparator environments ready under $envs"
