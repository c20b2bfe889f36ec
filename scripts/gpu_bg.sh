#!/usr/bin/env bash
# A job longer than one call to a lent GPU machine (10 minutes a command): the first call starts it in the
# background in its own session, every call (the first included) waits for it up to WAIT seconds and prints its
# log's tail and packs its artifacts so far (ARTIFACT globs) and its log into $OUT/NAME.tgz and $OUT/NAME.log, so a
# machine lost between two calls loses only what came after the last one. Keep WAIT under the call's limit
# (budget_left_s of the device tool, less staging): a poll past it returns only the last minute's pack.
#   bash scripts/gpu_bg.sh NAME WAIT 'ARTIFACT GLOBS' -- command args...
# Calls must follow each other while the machine is held (it keeps /tmp only while it is up).
set -uo pipefail
name=$1; wait_s=$2; globs=$3; shift 3; [ "${1:-}" = "--" ] && shift
dir=/tmp/bg-$name; mkdir -p "$dir"
if [ ! -f "$dir/pid" ]; then
  setsid nohup bash -c "$(printf '%q ' "$@"); echo \$? > $dir/rc" > "$dir/log" 2>&1 < /dev/null &
  echo $! > "$dir/pid"
  echo "started $name (pid $(cat "$dir/pid")): $*"
fi
pack() {
  cp "$dir/log" "${OUT:-/tmp}/$name.log"
  # shellcheck disable=SC2086
  tar czf "${OUT:-/tmp}/$name.tgz.part" --exclude='*.pt.trace.json.gz' --exclude='pip_freeze.txt' $globs 2>/dev/null
  mv -f "${OUT:-/tmp}/$name.tgz.part" "${OUT:-/tmp}/$name.tgz"
}
# packed every minute as well: a call killed at its limit (the device budget can cut it below WAIT) still
# returns what $OUT held, and nothing else
deadline=$((SECONDS + wait_s)); next_pack=$((SECONDS + 60))
while [ ! -f "$dir/rc" ] && [ $SECONDS -lt $deadline ]; do
  sleep 5
  [ $SECONDS -ge $next_pack ] && { pack; next_pack=$((SECONDS + 60)); }
done
grep -vE "^\((APIServer|EngineCore|Worker)|^(INFO|WARNING|DEBUG)" "$dir/log" | tail -40
pack
if [ -f "$dir/rc" ]; then
  echo "== $name ended, rc $(cat "$dir/rc")"
  pgrep -af "vllm.entrypoints" && echo "LEFTOVER vLLM PROCESSES" || echo "no vLLM process left"
else
  echo "== $name still running after ${wait_s}s (artifacts so far in $name.tgz): call again with the same NAME"
fi
