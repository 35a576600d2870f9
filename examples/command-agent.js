// A `command` agent with its program: examples/agents/notes.sh (POSIX sh) reads its task on
// stdin, writes the text into a file of its workspace, reports progress and usage and prints its
// output; the script then captures the file as an artifact.
//
// Needs the agent "notes" of the examples' configuration (examples/README.md says how):
//   reins run examples/command-agent.js --args '{"text": "three small words"}' --wait
//   reins artifact RUN_ID 2 -o -            # the file the program wrote
//
// Ends `completed` with {"words": 3, "artifactVersion": 2, "bytes": 18}.
const notes = await agent({stepId: "notes", agentRef: "notes",
                           task: args?.text ?? "three small words"});
const file = await captureArtifact({stepId: "notes-file", sourceStepId: "notes",
                                    path: notes.output.file});
return {words: notes.output.words, artifactVersion: file.artifactVersion, bytes: file.bytes};
