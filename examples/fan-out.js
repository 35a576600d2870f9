// Parallel fan-out with a join: three agents look at one text from three angles at the same
// time, and a fourth joins what they found. `parallel` starts every step before it awaits any,
// so the three child runs run at once (each holds one of the node's child slots); if one fails,
// the others are cancelled and the error reaches the script.
//
//   reins run examples/fan-out.js --args '{"text": "reins keeps a journal"}' --wait
//
// Ends `completed` with {"angles": ["clarity", "accuracy", "tone"], "summary":
// "clarity: fine; accuracy: fine; tone: fine (reins keeps a journal)"}.
const text = args?.text ?? "a durable orchestrator";
const angles = ["clarity", "accuracy", "tone"];
const findings = await parallel(angles.map((angle) => () =>
  agent({stepId: `review-${angle}`, agentRef: "scripted",
         task: {output: {angle, verdict: `${angle}: fine`}}})));
const verdicts = findings.map((finding) => finding.output.verdict).join("; ");
const joined = await agent({stepId: "join", agentRef: "scripted",
                            task: {output: `${verdicts} (${text})`}});
return {angles: findings.map((finding) => finding.output.angle), summary: joined.output};
