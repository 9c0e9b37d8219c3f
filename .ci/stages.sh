# Stages of .ci/run, timed: sourced by it, never run alone.
#
#   stage NAME CMD...      run CMD in the foreground; print "NAME: S s" as it ends
#   stage_bg NAME CMD...   start CMD in the background, beside whatever runs next (its output goes to a log)
#   stage_join NAME        wait for a background stage, print its log, fail as it failed
#
# Each stage's start and end go to $CI_STAGES (one tab-separated line: name, start, end, background). On exit,
# whether the run passed or failed, benchmarks/ci_budget.py prints the table (stage, seconds, share of the total)
# and writes the profile ($CI_PROFILE, JSON); a run that passed is then held to the budget (docs/ci.md).

CI_STAGES="$(mktemp)"
CI_T0="$(date +%s.%N)"
declare -A CI_BG_PID CI_BG_LOG
CI_CURRENT=""

_now() { date +%s.%N; }

stage() {
  local name="$1"; shift
  local t0; t0="$(_now)"
  CI_CURRENT="$name $t0"
  echo "=== stage $name"
  "$@"
  local t1; t1="$(_now)"
  CI_CURRENT=""
  printf '%s\t%s\t%s\t%s\n' "$name" "$t0" "$t1" "" >>"$CI_STAGES"
  awk -v n="$name" -v a="$t0" -v b="$t1" 'BEGIN { printf "=== stage %s: %.0f s\n", n, b - a }'
}

stage_bg() {
  local name="$1"; shift
  local log; log="$(mktemp)"
  echo "=== stage $name: started in the background"
  (
    set -euo pipefail
    t0="$(_now)"
    "$@"
    printf '%s\t%s\t%s\t%s\n' "$name" "$t0" "$(_now)" "background" >>"$CI_STAGES"
  ) >"$log" 2>&1 &
  CI_BG_PID[$name]=$!
  CI_BG_LOG[$name]="$log"
}

stage_join() {
  local name="$1" code=0
  wait "${CI_BG_PID[$name]}" || code=$?
  echo "=== stage $name (background) output:"
  cat "${CI_BG_LOG[$name]}"
  if [ "$code" != 0 ]; then
    echo "=== stage $name failed: exit $code"
    return "$code"
  fi
  awk -F'\t' -v n="$name" '$1 == n { s = $3 - $2 } END { printf "=== stage %s: %.0f s (in the background)\n", n, s }' \
    "$CI_STAGES"
}

_ci_summary() {
  local code=$?
  local pids; pids="$(jobs -p)"
  [ -z "$pids" ] || kill $pids 2>/dev/null || true  # a background stage left behind by a failure
  if [ -n "$CI_CURRENT" ]; then  # the stage that failed: its time up to the failure
    printf '%s\t%s\t%s\t%s\n' "${CI_CURRENT% *}" "${CI_CURRENT##* }" "$(_now)" "failed" >>"$CI_STAGES"
  fi
  local args=(benchmarks/ci_budget.py profile "$CI_STAGES" --start "$CI_T0" --end "$(_now)"
              --out "${CI_PROFILE:-$(mktemp --suffix=.json)}")
  if [ "$code" = 0 ]; then
    python3 "${args[@]}" --check-against reports/ci/profile.json || code=$?
  else
    python3 "${args[@]}" || true
  fi
  [ -z "${CI_WORK:-}" ] || rm -rf "$CI_WORK"  # the run's own directory (.ci/run)
  exit "$code"
}
trap _ci_summary EXIT
