// A retry-until-approved loop: an agent drafts, a person reviews the captured draft, and a
// rejection (with `onReject: "return"`, the checkpoint returns it instead of throwing) sends its
// comment back to the next draft. Every round has its own step ids: a step id names one step for
// good, and a replay after a crash makes the same calls in the same order.
//
//   reins run examples/retry-until-approved.js --wait     # exits 3 at "review-1"
//   reins reject RUN_ID --comment "shorter, please"       # round 2 drafts again
//   reins approve RUN_ID                                  # approves "review-2"
//
// Ends `completed` with {"approvedRound": 2, "artifactVersion": 4, "feedback": ["shorter, please"]}.
// After `rounds` rejections (default 3) it fails with "not approved after 3 rounds".
const rounds = args?.rounds ?? 3;
const feedback = [];
for (let round = 1; round <= rounds; round++) {
  const asked = feedback.length ? ` (after: ${feedback.join("; ")})` : "";
  await agent({stepId: `draft-${round}`, agentRef: "scripted", task: {
    write: [{path: "/mnt/user-data/outputs/draft.txt", content: `draft ${round}${asked}\n`}],
    output: round}});
  const file = await captureArtifact({stepId: `file-${round}`, sourceStepId: `draft-${round}`,
                                      path: "/mnt/user-data/outputs/draft.txt"});
  const review = await humanCheckpoint({stepId: `review-${round}`, sourceStepId: `file-${round}`,
                                        artifactVersion: file.artifactVersion,
                                        onReject: "return"});
  if (review.decision === "approve") {
    return {approvedRound: round, artifactVersion: file.artifactVersion, feedback};
  }
  feedback.push(review.comment || "rejected");
}
throw new Error(`not approved after ${rounds} rounds`);
