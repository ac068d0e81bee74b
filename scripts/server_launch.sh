# Sourced by the GPU-machine scripts (gpu_e2e.sh, gpu_chaos.sh): starts a server and waits for it.
#   start_server LOG SERVER-BINARY ARGS...
# Runs the server in the background with its output in LOG and waits up to 300 s for its
# LISTENING line. Sets pid, port, mport (the metrics port) and hport (the OpenAI HTTP port), each
# when the server prints one; returns 1,
# with the log's tail printed and the process killed, when the server exits or never listens.
start_server() {
  local log=$1; shift
  "$@" > "$log" 2>&1 &
  pid=$!
  port=""
  mport=""
  hport=""
  for _ in $(seq 1 300); do
    port=$(grep -m1 '^LISTENING' "$log" | awk '{print $2}')
    [ -n "$port" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  if [ -z "$port" ]; then
    tail -20 "$log"
    kill $pid 2>/dev/null
    return 1
  fi
  mport=$(grep -m1 '^METRICS_LISTENING' "$log" | awk '{print $2}')
  hport=$(grep -m1 '^HTTP_LISTENING' "$log" | awk '{print $2}')
  return 0
}
