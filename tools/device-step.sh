# Sourced by a device call (the `run` tool of the lent H200), from the repository root:
#     export COMMIT=<12-hex> BUDGET=<seconds this call may spend>; source tools/device-step.sh
#     step NAME LIMIT_S command args...
# Each step runs under `timeout -s KILL` (a blocked CUDA call ignores pytest's own timeout),
# at most LIMIT_S and never past BUDGET (counted from when this file is sourced), its output in
# $OUT/NAME.log, one line a step in $OUT/steps.log. A call returns at most 8 files from $OUT:
# keep to a few steps a call, or tar their logs. `peers` sources the peer wheels' environment
# (tools/peer-wheels-extra.sh) and an Apex build's, where they exist on the machine.
export RMSNORM_BENCH_COMMIT=${COMMIT:?set COMMIT to the commit of the tree, git rev-parse --short=12 HEAD}
_STEP_T0=$SECONDS  # BUDGET counts from here
step() {
  local name=$1 limit=$2; shift 2
  local left=$(( ${BUDGET:-560} - (SECONDS - _STEP_T0) ))
  if [ "$left" -lt 20 ]; then echo "SKIP $name (only ${left}s left)" | tee -a "$OUT/steps.log"; return 0; fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$SECONDS
  timeout -s KILL "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc limit=${limit}s took=$((SECONDS - t0))s" | tee -a "$OUT/steps.log"
  tail -3 "$OUT/$name.log"
  return 0
}
peers() {
  [ -f ~/.rmsnorm-peers/env.sh ] && source ~/.rmsnorm-peers/env.sh
  [ -f ~/apex-env.sh ] && source ~/apex-env.sh
  return 0
}
