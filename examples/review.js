// Review with capture and approval: an agent writes a file, the file is captured as an immutable
// artifact, a person approves it, and a second agent reads the approved text.
//
//   reins run examples/review.js --wait      # exits 3: it waits at the checkpoint "review"
//   reins artifact RUN_ID 2 -o -             # read what you are asked to approve
//   reins approve RUN_ID --comment "looks right"
//
// Ends `completed` with {"decision": "approve", "by": "<your email>",
// "summary": {"echo": "the evidence\n"}}.
const draft = await agent({stepId: "draft", agentRef: "scripted", task: {
  write: [{path: "/mnt/user-data/outputs/evidence.txt", content: "the evidence\n"}],
  output: "drafted"}});
const file = await captureArtifact({stepId: "file", sourceStepId: "draft",
                                    path: "/mnt/user-data/outputs/evidence.txt"});
const review = await humanCheckpoint({stepId: "review", sourceStepId: "file",
                                      artifactVersion: file.artifactVersion});
const text = await readArtifact({artifactVersion: file.artifactVersion});
const summary = await agent({stepId: "summary", agentRef: "scripted", task: text});
return {decision: review.decision, by: review.decidedBy, summary: summary.output};
