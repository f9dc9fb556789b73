#!/usr/bin/env bash
# usage: verdict.sh RC LOG -> CI's verdict on a pytest run: its exit status RC and its output LOG.
# Fails (exit 1, or RC) when pytest failed, collected no tests (exit 5), or exited 0 but passed
# no test at all.
set -euo pipefail
rc=$1
log=$2
if [ "$rc" -eq 5 ]; then
    echo "ci: FAILED: pytest collected no tests (exit 5)"
    exit 1
fi
if [ "$rc" -ne 0 ]; then
    echo "ci: FAILED: ./dev test exited $rc"
    exit "$rc"
fi
if ! tail -n 3 "$log" | grep -Eq '[1-9][0-9]* passed'; then
    echo "ci: FAILED: pytest exited 0 but passed no test"
    exit 1
fi
echo "ci: ok"
