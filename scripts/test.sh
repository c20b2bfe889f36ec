#!/usr/bin/env bash
# The suite's own tests: harness unit tests, kernel conformance, and every level against a real
# vLLM server for this platform's default config (CPU: the embedded BF16 tiny gpt-oss).
# Extra arguments go to pytest. Exit code: pytest's, except 5 (nothing collected) which is an error too.
set -uo pipefail
cd "$(dirname "$0")/.."
py=$(bash scripts/setup.sh | tail -n 1) || exit 1
"$py" -m pytest -p no:cacheprovider --junitxml=runs/junit.xml "$@"
rc=$?
[ $rc -eq 5 ] && echo "test.sh: pytest collected no tests" >&2
exit $rc
