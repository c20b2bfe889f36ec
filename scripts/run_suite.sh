#!/usr/bin/env bash
# The suite's main job on the embedded default: levels 1 to 6 for this platform's default config,
# then the summary table and the level 4/5 report. Extra arguments go to pytest (e.g. --config=...).
set -uo pipefail
cd "$(dirname "$0")/.."
py=$(bash scripts/setup.sh | tail -n 1) || exit 1
"$py" -m pytest -p no:cacheprovider -m "level1 or level1_5 or level2 or level3 or level4 or level5 or level6" \
  --junitxml=runs/junit.xml "$@"
rc=$?
[ $rc -eq 5 ] && echo "run_suite.sh: no level test was collected" >&2
exit $rc
