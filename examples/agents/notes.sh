#!/bin/sh
# A `command` agent in plain POSIX sh (see docs/agents.md): it reads its task, writes the task's
# text into a file of its workspace, reports progress and usage, and prints its output.
#
# reins starts it in the step's workspace (the folder scripts call /mnt/user-data/) and writes one
# JSON line to its stdin:
#   {"run_id":"...","task":"some text","thread_id":"...","type":"task"}
# It answers with JSON lines on stdout; exit status 0 ends the run with the last output.
# A real agent would parse JSON with a proper parser; to run anywhere, this one only understands
# a task that is a plain JSON string without escaped characters.
set -eu

read -r line
text=$(printf '%s\n' "$line" | sed -n 's/.*"task":"\([^"\\]*\)".*/\1/p')
if [ -z "$text" ]; then
  echo "the task must be a non-empty JSON string without escapes" >&2
  exit 1
fi

echo '{"type":"progress","stage":"writing"}'
mkdir -p outputs
printf '%s\n' "$text" > outputs/notes.txt
words=$(wc -w < outputs/notes.txt | tr -d ' ')

echo "{\"type\":\"usage\",\"total_tokens\":$words}"
echo "{\"type\":\"output\",\"output\":{\"file\":\"/mnt/user-data/outputs/notes.txt\",\"words\":$words}}"
