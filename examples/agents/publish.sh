#!/bin/sh
# A `command` agent that asks a person before it uses a tool (see docs/agents.md). It reads its
# task, asks for approval to "publish" it, waits for the answer on stdin, and acts on it.
#
#   stdin:  {"run_id":"...","task":"notes.txt","thread_id":"...","type":"task"}
#   stdout: {"type":"approval_request","request_id":"publish-1","actions":[...]}
#   stdin:  {"answer":{"decision":"approve",...},"request_id":"publish-1","type":"approval_answer"}
#   stdout: {"type":"output","output":{"published":true,...}}
#
# While it waits, its step shows `waiting_for_input`; `reins answer RUN_ID STEP --approve` (or
# --reject) answers. Stdin stays open for the answer, so read the task as one line.
set -eu

read -r line
target=$(printf '%s\n' "$line" | sed -n 's/.*"task":"\([^"\\]*\)".*/\1/p')

echo "{\"type\":\"approval_request\",\"request_id\":\"publish-1\",\"actions\":[{\"tool\":\"publish\",\"target\":\"$target\"}]}"
read -r answer
case $answer in
  *'"decision":"approve"'*)
    mkdir -p outputs
    printf 'published %s\n' "$target" > outputs/published.txt
    echo "{\"type\":\"output\",\"output\":{\"published\":true,\"target\":\"$target\"}}"
    ;;
  *)
    echo "{\"type\":\"output\",\"output\":{\"published\":false,\"target\":\"$target\"}}"
    ;;
esac
