// The script API of reins, installed before a workflow script runs. Every call becomes a request to
// the host (`__reins_request`), which answers it from the journal on replay or later, when the
// step's outcome is known (`__reins_settle`). Nothing here reads a clock or makes a random number:
// time and randomness come from the host, so a replay sees the same values.
//
// The script may replace any global or prototype method (`JSON.stringify = () => 5`). What the API
// needs is captured here, before the script runs, and every value the script hands over (a result,
// a thrown value, a call's arguments, a logged value) is encoded inside a `try`: whatever the
// script does, the host hears of it as text, and the workflow ends instead of waiting forever.
(() => {
  "use strict";
  const request = globalThis.__reins_request;
  const fail = globalThis.__reins_fail;
  const now = globalThis.__reins_now;
  const random = globalThis.__reins_random;
  const log = globalThis.__reins_log;
  const done = globalThis.__reins_done;
  const parallelMax = globalThis.__reins_parallel_max;
  const logLineMax = globalThis.__reins_log_line_chars_max;
  const mark = globalThis.__reins_mark;
  const cancelFrom = globalThis.__reins_cancel_from;
  const stringify = JSON.stringify;
  const parse = JSON.parse;
  const toText = String;
  const RealError = Error;
  const RealTypeError = TypeError;
  const RealInternalError = InternalError;
  const RealRangeError = RangeError;
  const RealPromise = Promise;
  const promiseAll = Promise.all.bind(Promise);
  const promiseResolve = Promise.resolve.bind(Promise);
  const promiseReject = Promise.reject.bind(Promise);
  const isArray = Array.isArray;
  const assign = Object.assign;
  const hasOwn = Object.hasOwn;
  const apply = Reflect.apply;
  const toWellFormed = String.prototype.toWellFormed;
  // Text for the host: a lone surrogate (which UTF-8 cannot carry) becomes U+FFFD.
  const wellFormed = (text) => apply(toWellFormed, text, []);
  const freeze = Object.freeze;
  // Calls waiting for the host, by call id; no prototype, so no script-made method is consulted.
  const pending = Object.create(null);

  // A thrown value as text, even when its own conversion throws.
  const describe = (error) => {
    try {
      if (error !== null && typeof error === "object" && !(error instanceof RealError) && typeof error.stack === "string") {
        return error.stack;
      }
      return toText(error);
    } catch (_) {
      return `a thrown ${typeof error} that cannot be converted to text`;
    }
  };

  // The engine limit a thrown value stands for ("memory", "stack"), or "". QuickJS has no error
  // codes: it is the engine's own error class, captured above, with the fixed message the engine
  // gives it; an error a step or the script made that only says such words is none.
  const limitOf = (error) => {
    try {
      if (error instanceof RealInternalError && error.message === "out of memory") return "memory";
      if (error instanceof RealRangeError && error.message === "Maximum call stack size exceeded") return "stack";
    } catch (_) {
      // A proxy or a getter that throws is no engine error.
    }
    return "";
  };
  globalThis.__reins_limit_of = limitOf;

  // A value's JSON text with the engine's own JSON.stringify, or why it has none. (No prototype:
  // a getter the script put on Object.prototype is never read.)
  const encode = (value) => {
    try {
      const text = stringify(value);
      if (typeof text === "string") return { __proto__: null, text };
      return { __proto__: null, error: `a ${typeof value} has no JSON form` };
    } catch (error) {
      return { __proto__: null, error: describe(error) };
    }
  };

  class StepError extends RealError {
    constructor(detail) {
      super(detail.message || "step failed");
      this.name = "StepError";
      assign(this, detail);
    }
  }

  globalThis.__reins_settle = (id, ok, json) => {
    const waiter = pending[id];
    if (!waiter) return;
    delete pending[id];
    const value = json === undefined ? undefined : parse(json);
    if (ok) waiter.resolve(value);
    else waiter.reject(new StepError(value));
  };

  // Starts the script's body as the first job, and reports how it ended.
  globalThis.__reins_start = (main, argsJson) => {
    const args = parse(argsJson);
    promiseResolve().then(async () => {
      let value;
      try {
        value = await main(args);
      } catch (error) {
        done(false, wellFormed(describe(error)), limitOf(error));
        return;
      }
      const encoded = encode(value === undefined ? null : value);
      if (encoded.error === undefined) done(true, encoded.text, "");
      else done(false, `the result cannot be encoded as JSON: ${encoded.error}`, "");
    });
  };

  function call(kind, args) {
    if (args === null || typeof args !== "object" || isArray(args)) {
      return promiseReject(new RealTypeError(`${kind} takes one object`));
    }
    const encoded = encode(args);
    if (encoded.error !== undefined) {
      return promiseReject(new RealTypeError(`the arguments of ${kind} cannot be encoded as JSON: ${encoded.error}`));
    }
    const answer = parse(request(kind, encoded.text));
    if (hasOwn(answer, "error")) return promiseReject(new RealTypeError(answer.error));
    return new RealPromise((resolve, reject) => {
      pending[answer.id] = { resolve, reject };
    });
  }

  globalThis.agent = (args) => call("agent", args);
  globalThis.pause = (args) => call("pause", args);
  globalThis.captureArtifact = (args) => call("captureArtifact", args);
  globalThis.readArtifact = (args) => call("readArtifact", args);
  globalThis.sleep = (args) => call("sleep", args);
  globalThis.waitForEvent = (args) => call("waitForEvent", args);
  // An RFC 3339 time with its offset (a text without one would mean another time on a node in
  // another zone), on the calendar: the engine's own parser would take 2026-02-30 for March 2.
  const rfc3339 = /^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d)(?::(\d\d)(?:\.\d{1,9})?)?(?:Z|[+-](\d\d):(\d\d))$/;
  const timeOf = (text) => {
    const parts = rfc3339.exec(text);
    if (parts === null) return NaN;
    const [year, month, day, hour, minute, second, offsetHours, offsetMinutes] =
      parts.slice(1).map((part) => (part === undefined ? 0 : +part));
    const leap = year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0);
    const days = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1];
    const valid = days !== undefined && day >= 1 && day <= days && hour <= 23 && minute <= 59 &&
      second <= 59 && offsetHours <= 23 && offsetMinutes <= 59;
    return valid ? RealDate.parse(text) : NaN;
  };
  // `at` is epoch milliseconds or an RFC 3339 text; the journal keeps it as milliseconds.
  globalThis.sleepUntil = (args) => {
    if (args === null || typeof args !== "object" || isArray(args)) {
      return promiseReject(new RealTypeError("sleepUntil takes one object"));
    }
    const { at, ...rest } = args;
    const untilMs = typeof at !== "string" ? at : timeOf(at);
    return call("sleep", { ...rest, untilMs: untilMs === untilMs ? untilMs : String(at) });
  };
  globalThis.humanCheckpoint = async (args) => {
    const decision = await call("humanCheckpoint", args);
    if (decision && decision.decision === "reject" && args.onReject !== "return") {
      throw new StepError({ message: `checkpoint ${args.stepId} was rejected`, ...decision });
    }
    return decision;
  };
  globalThis.parallel = async (thunks) => {
    if (!isArray(thunks)) throw new RealTypeError("parallel takes an array of functions");
    if (thunks.length > parallelMax) {
      fail(`parallel with ${thunks.length} thunks is over parallel_max (${parallelMax})`);
    }
    const first = mark();
    try {
      return await promiseAll(thunks.map((thunk) => thunk()));
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
  // Milliseconds of workflow time since launch: it advances as steps settle, like `Date`.
  const origin = now();
  globalThis.performance = freeze({ now: () => now() - origin, timeOrigin: origin });

  // One line per call; a line longer than the host keeps is cut here, before it leaves the VM.
  const show = (value) => {
    if (typeof value === "string") return value;
    const encoded = encode(value);
    return encoded.error === undefined ? encoded.text : describe(value);
  };
  const print = (...values) => {
    const line = values.map(show).join(" ");
    if (line.length > logLineMax) log(wellFormed(line.slice(0, logLineMax)), true);
    else log(wellFormed(line), false);
  };
  globalThis.console = { log: print, info: print, warn: print, error: print };

  // Garbage collection is not deterministic; nothing may observe it.
  delete globalThis.WeakRef;
  delete globalThis.FinalizationRegistry;
  for (const name of ["__reins_request", "__reins_fail", "__reins_now", "__reins_random", "__reins_log", "__reins_done",
                      "__reins_parallel_max", "__reins_log_line_chars_max", "__reins_mark", "__reins_cancel_from"]) {
    delete globalThis[name];
  }
})();
