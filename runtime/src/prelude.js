// The script API of reins, installed before a workflow script runs. Every call becomes a request to
// the host (`__reins_request`), which answers it from the journal on replay or later, when the
// step's outcome is known (`__reins_settle`). Nothing here reads a clock or makes a random number:
// time and randomness come from the host, so a replay sees the same values.
(() => {
  "use strict";
  const request = globalThis.__reins_request;
  const fail = globalThis.__reins_fail;
  const now = globalThis.__reins_now;
  const random = globalThis.__reins_random;
  const log = globalThis.__reins_log;
  const parallelMax = globalThis.__reins_parallel_max;
  const mark = globalThis.__reins_mark;
  const cancelFrom = globalThis.__reins_cancel_from;
  const pending = new Map();

  class StepError extends Error {
    constructor(detail) {
      super(detail.message || "step failed");
      this.name = "StepError";
      Object.assign(this, detail);
    }
  }

  globalThis.__reins_settle = (id, ok, json) => {
    const waiter = pending.get(id);
    if (!waiter) return;
    pending.delete(id);
    const value = json === undefined ? undefined : JSON.parse(json);
    if (ok) waiter.resolve(value);
    else waiter.reject(new StepError(value));
  };

  function call(kind, args) {
    if (args === null || typeof args !== "object" || Array.isArray(args)) {
      return Promise.reject(new TypeError(`${kind} takes one object`));
    }
    const answer = JSON.parse(request(kind, JSON.stringify(args)));
    if (answer.error) return Promise.reject(new TypeError(answer.error));
    return new Promise((resolve, reject) => pending.set(answer.id, { resolve, reject }));
  }

  globalThis.agent = (args) => call("agent", args);
  globalThis.pause = (args) => call("pause", args);
  globalThis.captureArtifact = (args) => call("captureArtifact", args);
  globalThis.readArtifact = (args) => call("readArtifact", args);
  globalThis.humanCheckpoint = async (args) => {
    const decision = await call("humanCheckpoint", args);
    if (decision && decision.decision === "reject" && args.onReject !== "return") {
      throw new StepError({ message: `checkpoint ${args.stepId} was rejected`, ...decision });
    }
    return decision;
  };
  globalThis.parallel = async (thunks) => {
    if (!Array.isArray(thunks)) throw new TypeError("parallel takes an array of functions");
    if (thunks.length > parallelMax) {
      fail(`parallel with ${thunks.length} thunks is over parallel_max (${parallelMax})`);
    }
    const first = mark();
    try {
      return await Promise.all(thunks.map((thunk) => thunk()));
    } catch (error) {
      // Fail fast: the siblings still outstanding are cancelled.
      cancelFrom(first);
      throw error;
    }
  };

  const RealDate = Date;
  class WorkflowDate extends RealDate {
    constructor(...args) {
      if (args.length === 0) super(now());
      else super(...args);
    }
    static now() {
      return now();
    }
  }
  globalThis.Date = WorkflowDate;
  Math.random = () => random();

  const show = (value) => (typeof value === "string" ? value : JSON.stringify(value));
  globalThis.console = {
    log: (...values) => log(values.map(show).join(" ")),
    info: (...values) => log(values.map(show).join(" ")),
    warn: (...values) => log(values.map(show).join(" ")),
    error: (...values) => log(values.map(show).join(" ")),
  };

  // Garbage collection is not deterministic; nothing may observe it.
  delete globalThis.WeakRef;
  delete globalThis.FinalizationRegistry;
  for (const name of ["__reins_request", "__reins_fail", "__reins_now", "__reins_random", "__reins_log", "__reins_parallel_max",
                      "__reins_mark", "__reins_cancel_from"]) {
    delete globalThis[name];
  }
})();
