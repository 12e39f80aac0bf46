# A no-op that first records when it started: "<task id> <epoch seconds>"
# from bash's $EPOCHREALTIME (a builtin, so no fork), appended to a file in
# the data directory. One short O_APPEND write per task, so lines never mix.
echo "$ORCHESTRATOR_TASK_ID $EPOCHREALTIME" >> "$ORCHESTRATOR_DATA_DIR/bench-stamps.txt"
echo '{}'
