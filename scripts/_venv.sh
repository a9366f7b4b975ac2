# Sourced by the other scripts: create .venv in the repository root (once) and
# install danaus with the extras named in $DANAUS_EXTRAS (idempotent: skipped
# when pyproject.toml has not changed since the last install).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv with $($py --version)"
    "$py" -m venv .venv
fi
extras="${DANAUS_EXTRAS:-}"
stamp=".venv/.danaus-installed-$(echo "$extras" | tr ',' '-')"
want="$(cat pyproject.toml scripts/_venv.sh | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "==> installing danaus${extras:+[$extras]} into .venv"
    .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
    if [[ ",$extras," == *",torch,"* ]]; then
        # The CPU build of torch first, so that the extra finds it satisfied: an
        # unpinned torch would pull a CUDA build of several GB.
        .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
    fi
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extras:+[$extras]}"
    echo "$want" > "$stamp"
fi
