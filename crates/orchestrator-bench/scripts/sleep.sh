# An I/O-bound step for workload 9: records its start in this node's ledger
# ("<task id> <epoch seconds>", one short O_APPEND write, so lines never
# mix), then sleeps 200 ms.
echo "$ORCHESTRATOR_TASK_ID $EPOCHREALTIME" >> "$ORCHESTRATOR_DATA_DIR/bench-ledger.txt"
sleep 0.2
echo '{}'
