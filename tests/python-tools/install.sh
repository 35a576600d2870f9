#!/usr/bin/env bash
# Makes, or brings up to date, the virtual environment of the Python tools the integration tests
# run (Schemathesis and openapi-python-client, tests/it/api_fuzz.rs), from requirements.txt beside
# this script:
#   tests/python-tools/install.sh   the venv in $REINS_PYTHON_TOOLS, by default target/python-tools
# A venv made from this very requirements file, whose python still runs, is left as it is; any
# other is made again from scratch. tests/run-all.sh runs this before the tests. Needs python3
# with its venv module (Debian: python3-venv) and PyPI.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${REINS_PYTHON_TOOLS:-$root/target/python-tools}
requirements="$here/requirements.txt"
# The requirements file the venv was made from, copied in once its install succeeded: the tests
# compare it with the repository's to tell a stale venv.
made_from="$venv/reins-requirements.txt"

if [ -f "$made_from" ] && cmp -s "$requirements" "$made_from" && "$venv/bin/python" -c '' 2>/dev/null; then
  echo "== Python tools up to date in $venv"
  exit 0
fi

echo "== installing the Python tools of tests/python-tools/requirements.txt in $venv"
mkdir -p "$(dirname "$venv")"
python3 -m venv --clear "$venv"
"$venv/bin/pip" install --quiet --no-input --disable-pip-version-check -r "$requirements"
"$venv/bin/pip" check --disable-pip-version-check >/dev/null
cp "$requirements" "$made_from"
