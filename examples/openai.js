// An `openai` agent: one chat completion from any OpenAI-compatible endpoint (OpenAI itself, or a
// local server such as Ollama, vLLM or llama.cpp's). The task is the user message; the step's
// output is {"content", "model", "finish_reason"}, and the tokens the endpoint counted are
// recorded with the child run.
//
// Needs the agent "llm" of the examples' configuration (examples/README.md says how to point it
// at your endpoint):
//   reins run examples/openai.js --args '{"question": "What is a journal?"}' --wait
//
// Ends `completed` with {"answer": "<the model's reply>", "model": "<the model that answered>"}.
const reply = await agent({stepId: "ask", agentRef: "llm",
                           task: args?.question ?? "In one sentence: what is a durable workflow?"});
return {answer: reply.output.content, model: reply.output.model};
