#!/usr/bin/env bash
# The README's test command: install plansim with its test, validator and Ray extras, then run
# the whole suite (extra arguments go to pytest). Ray is only for tests/test_executor.py's
# local Ray instance; those tests skip without it.
#
# torch is needed by validate/ only. If this Python already has a torch (a CUDA build, say),
# it is kept: the `validate` extra's range accepts it. Otherwise we install torch==2.13.0 by
# name before the extra, so that pip never resolves a bare `torch` to the newest multi-GB
# CUDA wheel; on machines whose package index serves the CPU build for that name (as ours
# does) that is the CPU build. Elsewhere install the torch build you want first.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c 'import torch' >/dev/null 2>&1; then
  python3 -m pip install -q "torch==2.13.0"
fi
python3 -m pip install -q -e '.[test,validate,ray]'
python3 -m pytest "$@"
