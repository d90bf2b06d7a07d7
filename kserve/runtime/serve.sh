#!/bin/sh
# TorchServe as a container's main process: `sh /mnt/models/config/serve.sh <torchserve args>`
# (the runtime's command; `make kserve-bundle` packs this file as config/serve.sh).
# Why: the container's first process is PID 1, and the kernel drops signals PID 1 has no
# handler for; `torchserve --foreground` (Python) installs none, so the kubelet's SIGTERM
# would be ignored and TorchServe SIGKILLed after the grace period. This shell traps SIGTERM
# (and SIGINT) and stops TorchServe its own way (`torchserve --stop`: SIGTERM to the Java
# frontend, which shuts down its workers), then exits with TorchServe's exit code.
stopping=
trap 'stopping=1; torchserve --stop' TERM INT
torchserve "$@" &
server=$!
wait "$server"
status=$?
if [ -n "$stopping" ]; then
  wait "$server"  # the trap interrupted the first wait: now TorchServe's own exit
  status=$?
fi
exit "$status"
