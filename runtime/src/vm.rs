//! One workflow's QuickJS runtime. [`Vm::start`] installs the script API and starts the script;
//! [`Vm::run`] is one activation: it runs the script until nothing more can happen without the
//! host, resolving calls the journal already answers, and hands back the new calls (commands), the
//! new journal entries and the run's status. The host carries the commands out, reports each
//! outcome with [`Vm::settle`], and runs the next activation. The VM performs no IO and reads no
//! clock except to enforce its CPU limit; `Date` and `Math.random` come from the journal and a seed.

use std::cell::RefCell;
use std::collections::{HashSet, VecDeque};
use std::rc::Rc;
use std::time::Duration;

use crate::cpu_clock::thread_cpu_time;

use rquickjs::{CatchResultExt, Context, Ctx, Function, Persistent, Runtime};
use serde_json::{Value, json};

use crate::Limits;
use crate::allocator::Held;
use crate::bytecode::{self, ScriptCache, check_size, engine, sandbox_runtime};
use crate::error::Error;
use crate::journal::{Activation, CallId, CallKind, Command, JournalEntry, Outcome, Status};

/// What a VM needs besides the script: the run's inputs and its replay material.
#[derive(Debug, Clone)]
pub struct VmOptions {
    pub limits: Limits,
    /// Seeds `Math.random`; derive it from the run id so every replay sees the same numbers.
    pub seed: u64,
    /// Workflow time at launch (epoch ms): what `Date.now()` shows before any step settles.
    pub started_at_ms: i64,
    /// The run's journal so far, in call order.
    pub journal: Vec<JournalEntry>,
    /// `console.log` bytes the script already logged in earlier lives of its VM on this node
    /// (the host keeps the count across parks; see `log_bytes_per_workflow_max`).
    pub logged_bytes: u64,
}

/// A running workflow script.
pub struct Vm {
    // Field order is drop order: the saved function must be released before its context, and the
    // context before the runtime, or QuickJS finds live objects when the runtime is freed.
    settle_fn: Persistent<Function<'static>>,
    /// The prelude's `limitOf`: the engine limit a thrown value stands for.
    limit_of_fn: Persistent<Function<'static>>,
    context: Context,
    runtime: Runtime,
    host: Rc<RefCell<Host>>,
    /// The thread CPU time (`thread_cpu_time`) past which the running script is interrupted.
    deadline: Rc<RefCell<Duration>>,
    /// Set by the interrupt handler when it stops the script: the one way an activation
    /// learns that its CPU limit ended it (the engine's error says only "interrupted").
    interrupted: Rc<std::cell::Cell<bool>>,
    /// The CPU time this runtime's finished activations used (`script_cpu_ms_total_max`).
    cpu_used: std::cell::Cell<Duration>,
    /// The thread CPU time when the running activation began.
    activation_started: std::cell::Cell<Duration>,
    /// What the runtime's allocations hold, counted by its allocator.
    held: Held,
}

/// An engine limit a script's failure stands for, as the prelude's `limitOf` tells it by the
/// engine's own error class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EngineLimit {
    Memory,
    Stack,
}

impl EngineLimit {
    fn from_tag(tag: &str) -> Option<EngineLimit> {
        match tag {
            "memory" => Some(EngineLimit::Memory),
            "stack" => Some(EngineLimit::Stack),
            _ => None,
        }
    }
}

/// How a script ended without a result: its message, and the engine limit it stands for.
#[derive(Debug, Clone, PartialEq)]
struct Failure {
    message: String,
    limit: Option<EngineLimit>,
}

/// The VM's side of the script API, shared with the functions the script calls.
struct Host {
    limits: Limits,
    journal: Vec<JournalEntry>,
    /// How many journal entries came from the store (replay) rather than from this VM.
    replayed: usize,
    next_seq: u32,
    step_ids: HashSet<String>,
    /// Calls that have no outcome yet.
    outstanding: HashSet<CallId>,
    /// Outcomes to hand to the script at the next opportunity.
    ///
    /// Invariant: every `CallId` here or in `outstanding` indexes `journal` (a call's entry is in
    /// the journal from the moment it is made).
    ready: VecDeque<(CallId, Outcome)>,
    commands: Vec<Command>,
    new_entries: Vec<JournalEntry>,
    cancels: Vec<CallId>,
    fatal: Option<String>,
    result: Option<Result<Value, Failure>>,
    clock_ms: i64,
    rng: u64,
    logs: Vec<String>,
    /// `console.log` bytes kept in this VM's life, plus `VmOptions::logged_bytes`.
    logged_bytes: u64,
    /// Lines kept and dropped in this activation.
    log_lines: u64,
    log_lines_dropped: u64,
    /// Bytes the host let this VM use, when less than `script_memory_bytes_max` (the node's
    /// scripts together were near their total): an out-of-memory error then says so.
    memory_grant: Option<u64>,
}

impl Vm {
    /// Checks the script and arguments against their limits, installs the API and starts the
    /// script. Nothing runs past the first await until [`Vm::run`].
    pub fn start(script: &str, args: &Value, options: VmOptions) -> Result<Vm, Error> {
        let memory_bytes = options.limits.script_memory_bytes_max;
        Vm::start_within(
            script,
            args,
            options,
            memory_bytes,
            &mut ScriptCache::new(0),
        )
    }

    /// [`Vm::start`] with at most `memory_bytes` of memory (the host's share for this VM, at most
    /// `script_memory_bytes_max`), starting the script from its bytecode in `scripts` when it is
    /// there (and keeping it there when it is not).
    pub fn start_within(
        script: &str,
        args: &Value,
        options: VmOptions,
        memory_bytes: u64,
        scripts: &mut ScriptCache,
    ) -> Result<Vm, Error> {
        let limits = options.limits.clone();
        check_size(script, &limits)?;
        let args_json = args.to_string();
        if args_json.len() as u64 > limits.frame_bytes_max {
            return Err(Error::LimitExceeded(format!(
                "args are {} bytes, over frame_bytes_max ({})",
                args_json.len(),
                limits.frame_bytes_max
            )));
        }
        let memory_bytes = memory_bytes.min(limits.script_memory_bytes_max);
        let (runtime, held) = sandbox_runtime(&limits, memory_bytes)?;
        let deadline = Rc::new(RefCell::new(
            thread_cpu_time() + limits.cpu_between_awaits(),
        ));
        let interrupted = Rc::new(std::cell::Cell::new(false));
        let (watched, stopped) = (Rc::clone(&deadline), Rc::clone(&interrupted));
        runtime.set_interrupt_handler(Some(Box::new(move || {
            let over = thread_cpu_time() > *watched.borrow();
            if over {
                stopped.set(true);
            }
            over
        })));
        let context = Context::full(&runtime).map_err(engine)?;

        let step_ids = options
            .journal
            .iter()
            .map(|entry| entry.step_id.clone())
            .collect();
        let host = Rc::new(RefCell::new(Host {
            limits: limits.clone(),
            replayed: options.journal.len(),
            journal: options.journal,
            next_seq: 0,
            step_ids,
            outstanding: HashSet::new(),
            ready: VecDeque::new(),
            commands: Vec::new(),
            new_entries: Vec::new(),
            cancels: Vec::new(),
            fatal: None,
            result: None,
            clock_ms: options.started_at_ms,
            rng: options.seed,
            logs: Vec::new(),
            logged_bytes: options.logged_bytes,
            log_lines: 0,
            log_lines_dropped: 0,
            memory_grant: (memory_bytes < limits.script_memory_bytes_max).then_some(memory_bytes),
        }));
        // Step ids are claimed as calls are made, not up front: a replay claims them again.
        host.borrow_mut().step_ids.clear();

        let (settle_fn, limit_of_fn) = context.with(|ctx| -> Result<_, Error> {
            install(&ctx, &host)?;
            let globals = ctx.globals();
            bytecode::run_prelude(&ctx)?;
            let settle: Function = globals.get("__reins_settle").map_err(engine)?;
            let begin: Function = globals.get("__reins_start").map_err(engine)?;
            let limit_of: Function = globals.get("__reins_limit_of").map_err(engine)?;
            globals.remove("__reins_settle").map_err(engine)?;
            globals.remove("__reins_start").map_err(engine)?;
            globals.remove("__reins_limit_of").map_err(engine)?;
            let main = scripts.evaluate_body(&ctx, script, &limits)?;
            // The body starts as a job of the first activation, under its limits.
            begin
                .call::<_, ()>((main, args_json))
                .catch(&ctx)
                .map_err(|e| Error::Engine(format!("the script could not start: {e}")))?;
            Ok((
                Persistent::save(&ctx, settle),
                Persistent::save(&ctx, limit_of),
            ))
        })?;
        Ok(Vm {
            settle_fn,
            limit_of_fn,
            context,
            runtime,
            host,
            deadline,
            interrupted,
            cpu_used: std::cell::Cell::new(Duration::ZERO),
            activation_started: std::cell::Cell::new(thread_cpu_time()),
            held,
        })
    }

    /// Hands the outcome of call `id` (a command this VM issued) to the script at its next
    /// activation. `at_ms` is the workflow time the outcome was recorded at. Returns the journal
    /// entry to persist, or `None` for a call that is not outstanding.
    pub fn settle(&mut self, id: CallId, outcome: Outcome, at_ms: i64) -> Option<JournalEntry> {
        let mut host = self.host.borrow_mut();
        if !host.outstanding.contains(&id) {
            return None;
        }
        let text = match &outcome {
            Outcome::Resolved(value) | Outcome::Rejected(value) => value.to_string(),
        };
        let size = text.len();
        let step_id = &host.journal[id.0 as usize].step_id;
        if let Err(message) =
            crate::check_text_depth(text.as_bytes(), &format!("the outcome of step {step_id}"))
        {
            host.fail(message);
            return None;
        }
        if size as u64 > host.limits.frame_bytes_max {
            let message = format!(
                "the outcome of step {} is {size} bytes, over frame_bytes_max ({})",
                host.journal[id.0 as usize].step_id, host.limits.frame_bytes_max
            );
            host.fail(message);
            return None;
        }
        let entry = &mut host.journal[id.0 as usize];
        entry.outcome = Some(outcome.clone());
        entry.settled_at_ms = Some(at_ms);
        let entry = entry.clone();
        host.ready.push_back((id, outcome));
        Some(entry)
    }

    /// One activation: runs the script until it waits on the host, finishes or fails.
    pub fn run(&mut self) -> Activation {
        self.activation_started.set(thread_cpu_time());
        self.rearm();
        loop {
            if let Err(message) = self.drain_jobs() {
                self.host.borrow_mut().fail(message);
            }
            if self.host.borrow().fatal.is_some() || self.host.borrow().result.is_some() {
                break;
            }
            let next = self.host.borrow_mut().ready.pop_front();
            let Some((id, outcome)) = next else {
                break;
            };
            self.deliver(id, outcome);
        }
        self.cpu_used.set(self.cpu_spent(thread_cpu_time()));
        let mut host = self.host.borrow_mut();
        if host.fatal.is_none() && host.result.is_none() && host.outstanding.is_empty() {
            // No step is outstanding and no job is pending: nothing can ever settle what the
            // script awaits (a promise it never resolves, or a script that broke the API).
            host.fail(
                "the script waits for a promise that nothing can settle (no step is outstanding)"
                    .into(),
            );
        }
        host.say_dropped_logs();
        let status = match (&host.fatal, &host.result) {
            (Some(message), _) => Status::Failed(message.clone()),
            (None, Some(Ok(value))) => {
                let size = value.to_string().len() as u64;
                if size > host.limits.frame_bytes_max {
                    Status::Failed(format!(
                        "the result is {size} bytes, over frame_bytes_max ({})",
                        host.limits.frame_bytes_max
                    ))
                } else {
                    Status::Completed(value.clone())
                }
            }
            (None, Some(Err(failure))) => Status::Failed(name_the_limit(
                &failure.message,
                failure.limit,
                &host.limits,
                host.memory_grant,
            )),
            (None, None) => Status::Waiting,
        };
        Activation {
            commands: std::mem::take(&mut host.commands),
            cancels: std::mem::take(&mut host.cancels),
            journal: std::mem::take(&mut host.new_entries),
            status,
            logs: std::mem::take(&mut host.logs),
        }
    }

    /// Memory the runtime holds, in bytes (what its allocator counts: no walk of the heap).
    pub fn memory_bytes(&self) -> u64 {
        u64::try_from(self.held.bytes()).unwrap_or(u64::MAX)
    }

    /// Lets the VM use at most `bytes` of memory from now on (at most `script_memory_bytes_max`):
    /// the host's share for it while the node's scripts together are near their total.
    pub fn set_memory_grant(&mut self, bytes: u64) {
        let mut host = self.host.borrow_mut();
        let bytes = bytes.min(host.limits.script_memory_bytes_max);
        host.memory_grant = (bytes < host.limits.script_memory_bytes_max).then_some(bytes);
        self.runtime
            .set_memory_limit(usize::try_from(bytes).unwrap_or(usize::MAX));
    }

    fn rearm(&self) {
        self.interrupted.set(false);
        let limits = &self.host.borrow().limits;
        let now = thread_cpu_time();
        let life_left = limits.cpu_over_life().saturating_sub(self.cpu_spent(now));
        *self.deadline.borrow_mut() = now + limits.cpu_between_awaits().min(life_left);
    }

    /// The CPU this runtime has used, the running activation's so far included.
    fn cpu_spent(&self, now: Duration) -> Duration {
        self.cpu_used.get() + now.saturating_sub(self.activation_started.get())
    }

    fn drain_jobs(&self) -> Result<(), String> {
        loop {
            match self.runtime.execute_pending_job() {
                Ok(true) => {}
                Ok(false) => return Ok(()),
                Err(exception) => {
                    let (limits, grant) = {
                        let host = self.host.borrow();
                        (host.limits.clone(), host.memory_grant)
                    };
                    let interrupted =
                        self.interrupted.get() || thread_cpu_time() > *self.deadline.borrow();
                    let failure = exception.0.with(|ctx| {
                        // Caught in every case, so that no exception stays pending.
                        let thrown = ctx.catch();
                        (!interrupted).then(|| self.failure_of(&ctx, thrown))
                    });
                    let life_spent = self.cpu_spent(thread_cpu_time()) >= limits.cpu_over_life();
                    return Err(match failure {
                        None if life_spent => format!(
                            "the script used more than script_cpu_ms_total_max ({} ms) of CPU \
                             over its life (a replay counts what it runs again)",
                            limits.script_cpu_ms_total_max
                        ),
                        None => format!(
                            "the script ran for more than script_cpu_ms_max ({} ms) without awaiting",
                            limits.script_cpu_ms_max
                        ),
                        Some(failure) => {
                            name_the_limit(&failure.message, failure.limit, &limits, grant)
                        }
                    });
                }
            }
        }
    }

    /// What a value thrown out of a job says, and the engine limit it stands for.
    fn failure_of<'js>(&self, ctx: &Ctx<'js>, thrown: rquickjs::Value<'js>) -> Failure {
        let limit = self
            .limit_of_fn
            .clone()
            .restore(ctx)
            .and_then(|limit_of| limit_of.call::<_, String>((thrown.clone(),)))
            .ok()
            .as_deref()
            .and_then(EngineLimit::from_tag);
        let message = thrown.as_exception().map_or_else(
            || "the script stopped with an uncatchable error".to_owned(),
            |e| e.message().unwrap_or_default(),
        );
        Failure { message, limit }
    }

    fn deliver(&self, id: CallId, outcome: Outcome) {
        self.rearm();
        let (ok, value) = match outcome {
            Outcome::Resolved(value) => (true, value),
            Outcome::Rejected(value) => (false, value),
        };
        {
            let mut host = self.host.borrow_mut();
            host.outstanding.remove(&id);
            if let Some(at) = host.journal[id.0 as usize].settled_at_ms {
                host.clock_ms = host.clock_ms.max(at);
            }
        }
        let delivered = self.context.with(|ctx| {
            let settle = self.settle_fn.clone().restore(&ctx)?;
            settle.call::<_, ()>((id.0, ok, value.to_string()))
        });
        if let Err(error) = delivered {
            self.host.borrow_mut().fail(format!(
                "cannot hand a step's outcome to the script: {error}"
            ));
        }
    }
}

impl Host {
    fn fail(&mut self, message: String) {
        if self.fatal.is_none() {
            self.fatal = Some(message);
        }
    }

    /// A `console.log` line, kept within the log limits.
    /// `cut`: the prelude already cut the line (to `log_line_bytes_max` UTF-16 units).
    fn log(&mut self, mut line: String, cut: bool) {
        if self.log_lines >= self.limits.log_lines_per_activation_max {
            self.log_lines_dropped += 1;
            return;
        }
        let line_max = usize::try_from(self.limits.log_line_bytes_max).unwrap_or(usize::MAX);
        if cut || line.len() > line_max {
            line.truncate(line.floor_char_boundary(line_max));
            line.push_str(&format!(" [cut: over log_line_bytes_max ({line_max})]"));
        }
        let bytes = line.len() as u64;
        if self.logged_bytes + bytes > self.limits.log_bytes_per_workflow_max {
            self.log_lines_dropped += 1;
            return;
        }
        self.log_lines += 1;
        self.logged_bytes += bytes;
        self.logs.push(line);
    }

    /// Ends an activation's log: one line saying how many lines were dropped, if any.
    fn say_dropped_logs(&mut self) {
        let dropped = std::mem::take(&mut self.log_lines_dropped);
        let kept = std::mem::take(&mut self.log_lines);
        if dropped > 0 {
            let limit = if kept >= self.limits.log_lines_per_activation_max {
                format!(
                    "log_lines_per_activation_max ({})",
                    self.limits.log_lines_per_activation_max
                )
            } else {
                format!(
                    "log_bytes_per_workflow_max ({} bytes)",
                    self.limits.log_bytes_per_workflow_max
                )
            };
            self.logs
                .push(format!("{dropped} console.log lines dropped: over {limit}"));
        }
    }

    /// A call from the script: checks it, matches it against the journal, and answers with
    /// `{"id"}` or `{"error"}` (a rejected promise for the script).
    fn request(&mut self, kind: &str, args_json: &str) -> Value {
        if let Some(message) = &self.fatal {
            return json!({ "error": message });
        }
        let Some(kind) = CallKind::parse(kind) else {
            return json!({ "error": format!("unknown call {kind:?}") });
        };
        if args_json.len() as u64 > self.limits.frame_bytes_max {
            let message = format!(
                "the input of a {} call is {} bytes, over frame_bytes_max ({})",
                kind.as_str(),
                args_json.len(),
                self.limits.frame_bytes_max
            );
            self.fail(message.clone());
            return json!({ "error": message });
        }
        if u64::from(self.next_seq) >= self.limits.steps_max {
            let message = format!(
                "the workflow made more than steps_max ({}) steps",
                self.limits.steps_max
            );
            self.fail(message.clone());
            return json!({ "error": message });
        }
        // Calls in flight (made, not yet settled), however the script awaits them: a
        // `Promise.all` over thousands of `agent()` calls is bounded like a `parallel`.
        let in_flight = self
            .outstanding
            .iter()
            .filter(|id| self.journal[id.0 as usize].outcome.is_none())
            .count();
        if in_flight as u64 >= self.limits.parallel_max {
            let message = format!(
                "more than parallel_max ({}) calls in flight at once: await some before making \
                 more",
                self.limits.parallel_max
            );
            self.fail(message.clone());
            return json!({ "error": message });
        }
        if let Err(message) = crate::check_text_depth(
            args_json.as_bytes(),
            &format!("the input of a {} call", kind.as_str()),
        ) {
            self.fail(message.clone());
            return json!({ "error": message });
        }
        let args: Value = match serde_json::from_str(args_json) {
            Ok(args) => args,
            Err(e) => return json!({ "error": format!("arguments are not JSON: {e}") }),
        };
        let step_id = match check_args(kind, &args, self.next_seq)
            .and_then(|step_id| check_until(kind, &args, self.clock_ms).map(|()| step_id))
        {
            Ok(step_id) => step_id,
            Err(message) => return json!({ "error": message }),
        };
        if !self.step_ids.insert(step_id.clone()) {
            return json!({ "error": format!("stepId {step_id:?} is used twice") });
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let id = CallId(seq);
        self.outstanding.insert(id);
        if (seq as usize) < self.replayed {
            let entry = &self.journal[seq as usize];
            if entry.kind != kind || entry.step_id != step_id || entry.args != args {
                let message = format!(
                    "non-determinism at call {seq}: the journal has {} {:?} with {}, the script \
                     now calls {} {:?} with {}",
                    entry.kind.as_str(),
                    entry.step_id,
                    entry.args,
                    kind.as_str(),
                    step_id,
                    args
                );
                self.fail(message.clone());
                return json!({ "error": message });
            }
            match &entry.outcome {
                Some(outcome) => self.ready.push_back((id, outcome.clone())),
                None => self.commands.push(Command {
                    id,
                    seq,
                    kind,
                    step_id,
                    args,
                    in_flight_in_journal: true,
                }),
            }
        } else {
            let entry = JournalEntry {
                seq,
                kind,
                step_id: step_id.clone(),
                args: args.clone(),
                outcome: None,
                settled_at_ms: None,
            };
            self.journal.push(entry.clone());
            self.new_entries.push(entry);
            self.commands.push(Command {
                id,
                seq,
                kind,
                step_id,
                args,
                in_flight_in_journal: false,
            });
        }
        json!({ "id": seq })
    }

    /// The next number of a splitmix64 sequence, as a float in [0, 1).
    fn random(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Outstanding calls made at or after `seq`: the siblings of a failed `parallel`.
    fn cancel_from(&mut self, seq: u32) {
        let mut cancels: Vec<CallId> = self
            .outstanding
            .iter()
            .copied()
            .filter(|id| id.0 >= seq)
            .collect();
        cancels.sort();
        for id in &cancels {
            self.outstanding.remove(id);
        }
        self.ready.retain(|(id, _)| !cancels.contains(id));
        self.cancels.extend(cancels);
    }
}

/// The longest `sleep` (`ms`): 30 days.
pub const SLEEP_MS_MAX: u64 = 30 * 86_400_000;

/// The longest deadline of a wait (`timeoutMs` of `pause`, `humanCheckpoint`, `waitForEvent`):
/// a year.
pub const WAIT_TIMEOUT_MS_MAX: u64 = 365 * 86_400_000;

/// What a `humanCheckpoint` may do when its `timeoutMs` passes with no decision.
pub const CHECKPOINT_ON_TIMEOUT: [&str; 3] = ["reject", "approve", "fail"];

/// The options each call takes: any other is refused, naming it (an option a script believes
/// it set, say `retries`, is never silently ignored).
///
/// `sleepUntil` reaches the runtime as a `sleep` whose `untilMs` holds its `at` in epoch
/// milliseconds (the journal keeps it so): a `sleep` with `untilMs` is judged, and named in
/// messages, as the `sleepUntil` it is, which takes no `ms`.
fn options_of(kind: CallKind, args: &Value) -> &'static [&'static str] {
    match kind {
        CallKind::Sleep if args.get("untilMs").is_some() => &["stepId", "untilMs"],
        CallKind::Sleep => &["stepId", "ms"],
        CallKind::Agent => &[
            "stepId",
            "agentRef",
            "task",
            "retry",
            "timeout",
            "idempotent",
        ],
        CallKind::Pause => &[
            "stepId",
            "message",
            "timeoutMs",
            "onTimeout",
            "remindAfterMs",
        ],
        CallKind::HumanCheckpoint => &[
            "stepId",
            "sourceStepId",
            "artifactVersion",
            "onReject",
            "timeoutMs",
            "onTimeout",
            "remindAfterMs",
        ],
        CallKind::CaptureArtifact => &["stepId", "sourceStepId", "path"],
        CallKind::ReadArtifact => &["artifactVersion"],
        CallKind::WaitForEvent => &["stepId", "name", "timeoutMs"],
    }
}

/// What a wait accepts as its `onTimeout`: a test of the value, and its description for the
/// message that refuses another.
type OnTimeout<'a> = (fn(&Value) -> bool, &'a str);

/// Checks a wait's `timeoutMs` and `onTimeout` (`on_timeout`: what its kind accepts, or `None`
/// when it takes no `onTimeout`).
/// A `sleepUntil` is due at most [`SLEEP_MS_MAX`] after the workflow's time `now_ms` (what
/// `Date.now()` shows, so a replay decides the same), as a `sleep` lasts at most that long.
fn check_until(kind: CallKind, args: &Value, now_ms: i64) -> Result<(), String> {
    let until_ms = match (kind, args.get("untilMs").and_then(Value::as_u64)) {
        (CallKind::Sleep, Some(until_ms)) => until_ms,
        _ => return Ok(()),
    };
    let latest_ms = u64::try_from(now_ms)
        .unwrap_or(0)
        .saturating_add(SLEEP_MS_MAX);
    if until_ms > latest_ms {
        let step_id = args["stepId"].as_str().unwrap_or_default();
        return Err(format!(
            "sleepUntil {step_id:?}: at is {until_ms}, more than {SLEEP_MS_MAX} ms (30 days) \
             after the workflow's now ({now_ms}): sleep in steps of at most 30 days"
        ));
    }
    Ok(())
}

fn check_deadline(
    name: &str,
    step_id: &str,
    args: &Value,
    on_timeout: Option<OnTimeout<'_>>,
) -> Result<(), String> {
    for key in ["timeoutMs", "remindAfterMs"] {
        if let Some(ms) = args.get(key)
            && ms
                .as_u64()
                .is_none_or(|ms| ms == 0 || ms > WAIT_TIMEOUT_MS_MAX)
        {
            return Err(format!(
                "{name} {step_id:?}: {key} is {ms}: it must be a whole number of milliseconds, \
                 1 to {WAIT_TIMEOUT_MS_MAX} (a year)"
            ));
        }
    }
    if let (Some(given), Some((valid, described))) = (args.get("onTimeout"), on_timeout) {
        if !valid(given) {
            return Err(format!(
                "{name} {step_id:?}: onTimeout is {given}: it must be {described}"
            ));
        }
        if args.get("timeoutMs").is_none() {
            return Err(format!(
                "{name} {step_id:?}: onTimeout needs a timeoutMs (when to apply it)"
            ));
        }
    }
    Ok(())
}

/// Checks a call's arguments; returns its step id.
fn check_args(kind: CallKind, args: &Value, seq: u32) -> Result<String, String> {
    let takes = options_of(kind, args);
    let unknown: Vec<&str> = args
        .as_object()
        .into_iter()
        .flat_map(|options| options.keys())
        .map(String::as_str)
        .filter(|option| !takes.contains(option))
        .collect();
    if !unknown.is_empty() {
        // A `sleepUntil`'s `untilMs` is its `at`, as the script wrote it.
        let until = takes.contains(&"untilMs");
        let said: Vec<&str> = takes
            .iter()
            .map(|option| if *option == "untilMs" { "at" } else { *option })
            .collect();
        return Err(format!(
            "{} does not take {}: it takes {}",
            if until { "sleepUntil" } else { kind.as_str() },
            unknown.join(", "),
            said.join(", ")
        ));
    }
    let text = |field: &str| {
        args.get(field)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let version = |field: &str| args.get(field).and_then(Value::as_u64).filter(|v| *v > 0);
    let name = kind.as_str();
    if !kind.has_step_id() {
        version("artifactVersion")
            .ok_or_else(|| format!("{name} needs an artifactVersion (a positive integer)"))?;
        return Ok(format!("read:{seq}"));
    }
    let step_id = text("stepId")
        .ok_or_else(|| format!("{name} needs a stepId (a non-empty string)"))?
        .to_owned();
    // The control plane names steps by the same grammar (`reins approve RUN --step ID`).
    let check_id = |field: &str| match text(field) {
        Some(id) if !crate::is_id(id) => Err(format!(
            "{name} {field} {id:?} is not an id ({})",
            crate::ID_GRAMMAR
        )),
        _ => Ok(()),
    };
    check_id("stepId")?;
    check_id("sourceStepId")?;
    match kind {
        CallKind::Agent => {
            text("agentRef").ok_or_else(|| format!("{name} {step_id:?} needs an agentRef"))?;
            if args.get("task").is_none_or(Value::is_null) {
                return Err(format!("{name} {step_id:?} needs a task"));
            }
            crate::policy::CallPolicy::from_call(args)
                .map_err(|problem| format!("{name} {step_id:?}: {problem}"))?;
        }
        CallKind::HumanCheckpoint => {
            text("sourceStepId")
                .ok_or_else(|| format!("{name} {step_id:?} needs a sourceStepId"))?;
            version("artifactVersion").ok_or_else(|| {
                format!("{name} {step_id:?} needs an artifactVersion (a positive integer)")
            })?;
            let valid = |given: &Value| {
                given
                    .as_str()
                    .is_some_and(|given| CHECKPOINT_ON_TIMEOUT.contains(&given))
            };
            check_deadline(
                name,
                &step_id,
                args,
                Some((valid, "\"reject\", \"approve\" or \"fail\"")),
            )?;
        }
        CallKind::Pause => {
            let valid = |given: &Value| {
                given
                    .as_object()
                    .is_some_and(|given| given.len() == 1 && given.contains_key("resume"))
            };
            check_deadline(
                name,
                &step_id,
                args,
                Some((valid, "{resume: VALUE} (the input it resumes with)")),
            )?;
        }
        CallKind::WaitForEvent => {
            match text("name") {
                Some(event) if crate::is_id(event) => {}
                Some(event) => {
                    return Err(format!(
                        "{name} {step_id:?}: name {event:?} is not an id ({})",
                        crate::ID_GRAMMAR
                    ));
                }
                None => return Err(format!("{name} {step_id:?} needs a name (an event name)")),
            }
            check_deadline(name, &step_id, args, None)?;
        }
        CallKind::CaptureArtifact => {
            text("sourceStepId")
                .ok_or_else(|| format!("{name} {step_id:?} needs a sourceStepId"))?;
            text("path").ok_or_else(|| format!("{name} {step_id:?} needs a path"))?;
        }
        CallKind::Sleep => match (args.get("ms"), args.get("untilMs")) {
            (Some(ms), None) => {
                if ms.as_u64().is_none_or(|ms| ms > SLEEP_MS_MAX) {
                    return Err(format!(
                        "sleep {step_id:?}: ms is {ms}: it must be a whole number of \
                         milliseconds, 0 to {SLEEP_MS_MAX} (30 days)"
                    ));
                }
            }
            (None, Some(at)) => {
                if at.as_u64().is_none() {
                    return Err(format!(
                        "sleepUntil {step_id:?}: at is {at}: it must be a time (epoch \
                         milliseconds, or an ISO 8601 text with its offset)"
                    ));
                }
            }
            // Either is refused above when the other is given: here neither was.
            _ => {
                return Err(format!(
                    "sleep {step_id:?} needs ms (a sleepUntil needs at)"
                ));
            }
        },
        CallKind::ReadArtifact => {}
    }
    Ok(step_id)
}

/// A failure that stands for an engine limit, said in terms of the limit.
fn name_the_limit(
    message: &str,
    limit: Option<EngineLimit>,
    limits: &Limits,
    memory_grant: Option<u64>,
) -> String {
    match (limit, memory_grant) {
        (Some(EngineLimit::Memory), Some(grant)) => format!(
            "the script used more than the {grant} bytes it was given: the node's scripts \
             together were near js_memory_total_bytes (script_memory_bytes_max is {}): {message}",
            limits.script_memory_bytes_max
        ),
        (Some(EngineLimit::Memory), None) => format!(
            "the script used more than script_memory_bytes_max ({} bytes): {message}",
            limits.script_memory_bytes_max
        ),
        (Some(EngineLimit::Stack), _) => format!(
            "the script used more than script_stack_bytes_max ({} bytes): {message}",
            limits.script_stack_bytes_max
        ),
        (None, _) => message.to_owned(),
    }
}

/// Installs the host functions the prelude captures and then removes from the global scope.
fn install(ctx: &rquickjs::Ctx<'_>, host: &Rc<RefCell<Host>>) -> Result<(), Error> {
    let globals = ctx.globals();
    let h = Rc::clone(host);
    let request = Function::new(ctx.clone(), move |kind: String, args: String| -> String {
        h.borrow_mut().request(&kind, &args).to_string()
    })
    .map_err(engine)?;
    let h = Rc::clone(host);
    let fail = Function::new(ctx.clone(), move |message: String| {
        h.borrow_mut().fail(message);
    })
    .map_err(engine)?;
    let h = Rc::clone(host);
    let now = Function::new(ctx.clone(), move || -> f64 { h.borrow().clock_ms as f64 })
        .map_err(engine)?;
    let h = Rc::clone(host);
    let random =
        Function::new(ctx.clone(), move || -> f64 { h.borrow_mut().random() }).map_err(engine)?;
    let h = Rc::clone(host);
    let log = Function::new(ctx.clone(), move |line: String, cut: bool| {
        let mut host = h.borrow_mut();
        // Before the script has made every call of the journal, it is replaying what already
        // ran, and what it logged then was logged then: once is the truth.
        if host.next_seq as usize >= host.replayed {
            host.log(line, cut);
        }
    })
    .map_err(engine)?;
    let h = Rc::clone(host);
    let done = Function::new(ctx.clone(), move |ok: bool, text: String, limit: String| {
        let mut host = h.borrow_mut();
        host.result = Some(if ok {
            // What the engine's JSON.stringify writes and serde refuses: a lone surrogate.
            crate::check_text_depth(text.as_bytes(), "the result")
                .map_err(|message| Failure {
                    message,
                    limit: None,
                })
                .and_then(|()| {
                    serde_json::from_str(&text).map_err(|e| Failure {
                        message: format!("the result cannot be encoded as JSON: {e}"),
                        limit: None,
                    })
                })
        } else {
            Err(Failure {
                message: text,
                limit: EngineLimit::from_tag(&limit),
            })
        });
    })
    .map_err(engine)?;
    let h = Rc::clone(host);
    let mark =
        Function::new(ctx.clone(), move || -> u32 { h.borrow().next_seq }).map_err(engine)?;
    let h = Rc::clone(host);
    let cancel_from = Function::new(ctx.clone(), move |seq: u32| {
        h.borrow_mut().cancel_from(seq);
    })
    .map_err(engine)?;
    let (parallel_max, log_line_max) = {
        let limits = &host.borrow().limits;
        (limits.parallel_max, limits.log_line_bytes_max)
    };
    for (name, function) in [
        ("__reins_request", request),
        ("__reins_fail", fail),
        ("__reins_now", now),
        ("__reins_random", random),
        ("__reins_log", log),
        ("__reins_done", done),
        ("__reins_mark", mark),
        ("__reins_cancel_from", cancel_from),
    ] {
        globals.set(name, function).map_err(engine)?;
    }
    globals
        .set("__reins_parallel_max", parallel_max as f64)
        .map_err(engine)?;
    // A line's UTF-16 units at most, so that no longer string leaves the VM; the host cuts to
    // bytes.
    globals
        .set("__reins_log_line_chars_max", log_line_max as f64)
        .map_err(engine)?;
    Ok(())
}

impl Limits {
    fn cpu_over_life(&self) -> Duration {
        Duration::from_millis(self.script_cpu_ms_total_max)
    }

    fn cpu_between_awaits(&self) -> Duration {
        Duration::from_millis(self.script_cpu_ms_max)
    }
}
