# Sourced by the device scripts: `step LABEL UNTIL CMD...` runs CMD through step.py, in a process group and
# session of its own, its output in $R/LABEL.log (never a pipe), cut at UNTIL (seconds since the epoch) and
# stopped as a whole tree; the log's lines matching $STEP_SHOW are printed as they come. Needs HERE and R.
STEP_SHOW=${STEP_SHOW:-'^\[|RESULT|Traceback|Error|error:|IMPORT'}
step() {
  local label=$1 until=$2; shift 2
  python3 "$HERE/step.py" --until "$until" --log "$R/$label.log" --show "$STEP_SHOW" -- "$@"
}
# The deadline that leaves RESERVE seconds of the script's END for what follows; at least 5 s from now (a short
# BUDGET must not cut even a quick step at once), never past END.
until_leaving() {
  local want=$(( END - ${1:-0} )) soon=$(( $(date +%s) + 5 ))
  [ $soon -gt $END ] && soon=$END
  echo $(( want > soon ? want : soon ))
}
