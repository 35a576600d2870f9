// An agent asking for tool approval: the `command` agent examples/agents/publish.sh asks a person
// before it "publishes" (an approval request on its stdout) and waits, still running, for the
// answer on its stdin. Meanwhile the step shows `waiting_for_input` with the request's actions,
// and `reins run --wait` exits 3.
//
// Needs the agent "publisher" of the examples' configuration (examples/README.md says how):
//   reins run examples/tool-approval.js --wait
//   reins get RUN_ID --json                   # steps[0].approval: what the agent asks to do
//   reins answer RUN_ID publish --approve --comment "go ahead"
//
// Ends `completed` with {"published": true, "target": "notes.txt"}; answered with --reject,
// "published" is false. `reins get` shows the answer on the step (`approval.answer`).
const step = await agent({stepId: "publish", agentRef: "publisher",
                          task: args?.target ?? "notes.txt"});
return step.output;
