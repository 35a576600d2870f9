//! Each transition family driven through the machine alone: no tokio, no database, no VM.
//! `drive` plays the interpreter's part (depth first, nothing after a halt), answering each
//! effect as the test says.

use super::*;
use store::{Epoch, RunStatus};

use super::transitions::Transition;

const WORKFLOW: &str = "wf-1";
const STARTED_AT: Millis = 1_000_000;
const NOW: Millis = STARTED_AT + 10;
const TIMEOUT_MS: u64 = 60_000;

fn machine(start: Start) -> WorkflowMachine {
    let data = json!({"script": "return 1", "args": {}, "seed": 7, "started_at_ms": STARTED_AT});
    let config = MachineConfig {
        workflow_id: WORKFLOW.into(),
        fence: Fence {
            resource_id: WORKFLOW.into(),
            owner: "node-a".into(),
            epoch: Epoch::new(3),
        },
        document: WorkflowDocument::decode(&WORKFLOW.into(), &data).expect("a whole document"),
        agents: Arc::new(AgentRegistry::default()),
        limits: runtime::Limits::default(),
        slots_max: 4,
        slots_per_user_max: 2,
        slots_reserved: 0,
        stored_bytes_max: 1_000_000,
        log_events_max: 10,
        log_event_bytes_max: 1_000,
        cancel_window_ms: 2_000,
        timeout_ms: TIMEOUT_MS,
        start,
        wake_fallback: Duration::from_secs(5),
        dormant_after: None,
    };
    WorkflowMachine::new(config, tracing::Span::none())
}

/// A machine whose agent `echo` is configured idempotent.
fn idempotent_machine(start: Start) -> WorkflowMachine {
    let mut m = machine(start);
    let echo = crate::agents::AgentConfig::Scripted {
        name: "echo".into(),
        retry: runtime::policy::RetryOptions {
            max_attempts: Some(3),
            ..Default::default()
        },
        timeout: runtime::policy::TimeoutOptions::default(),
        idempotent: true,
    };
    m.config.agents = Arc::new(AgentRegistry::new(&[echo]).expect("an agent"));
    m
}

fn call(seq: u32, kind: CallKind, step_id: &str, args: Value) -> (JournalEntry, Command) {
    let entry = JournalEntry {
        seq,
        kind,
        step_id: step_id.into(),
        args: args.clone(),
        outcome: None,
        settled_at_ms: None,
    };
    let command = Command {
        id: CallId(seq),
        seq,
        kind,
        step_id: step_id.into(),
        args,
        in_flight_in_journal: false,
    };
    (entry, command)
}

fn agent(seq: u32, step_id: &str) -> (JournalEntry, Command) {
    call(
        seq,
        CallKind::Agent,
        step_id,
        json!({"agentRef": "echo", "task": "t"}),
    )
}

/// A journal row of call 0 (`step_id`, of `kind`) as a takeover reads it.
fn stored(step_id: &str, kind: &str, attempt: i32, status: StepStatus, data: Value) -> StepRow {
    StepRow {
        seq: 0,
        step_id: step_id.into(),
        attempt,
        status,
        record: store::StepRecord::decode(kind, &data).map_err(|e| e.to_string()),
        created_at: 0.0,
        run_started_at: None,
    }
}

/// A replay's activation: it re-made `commands`, calls the journal holds with no outcome.
fn replayed(commands: Vec<Command>) -> Event {
    Event::Activated {
        result: Ok(Activation {
            commands,
            cancels: Vec::new(),
            journal: Vec::new(),
            status: Status::Waiting,
            logs: Vec::new(),
        }),
        run_id: "unused".into(),
    }
}

fn activation(calls: Vec<(JournalEntry, Command)>, status: Status) -> Event {
    let (journal, commands) = calls.into_iter().unzip();
    Event::Activated {
        result: Ok(Activation {
            commands,
            cancels: Vec::new(),
            journal,
            status,
            logs: Vec::new(),
        }),
        run_id: "run-new".into(),
    }
}

fn run_row(run_id: &RunId, status: RunStatus) -> RunRow {
    RunRow {
        run_id: run_id.clone(),
        thread_id: thread_for(&WorkflowId::from(WORKFLOW), "a"),
        workflow: Some(WORKFLOW.into()),
        step_id: Some("a".into()),
        attempt: Some(1),
        agent: "echo".into(),
        status,
        owner_worker_id: None,
        lease_expires_at: None,
        cancel_action: None,
        error: None,
        output: Some(json!("hello")),
        idempotency_key: None,
        idempotency_request: None,
        metadata: json!({}),
        total_tokens: 0,
        message_count: 0,
        stop_reason: None,
        revision: 1,
        created_at: 0.0,
        updated_at: 0.0,
    }
}

fn control(id: i64, kind: ControlKind, step_id: &str, attempt: i32, body: Value) -> ControlRow {
    ControlRow {
        id,
        workflow_id: WORKFLOW.into(),
        kind,
        step_id: step_id.into(),
        attempt,
        body,
        created_by: Some("ann".into()),
        created_at: 0.0,
        applied: false,
    }
}

fn op(op: &WriteOp) -> String {
    match op {
        WriteOp::SetWorkflow { status, .. } => format!("workflow {status}"),
        WriteOp::PutStep {
            step_id, status, ..
        } => format!("step {step_id} {status}"),
        WriteOp::MarkControlApplied { control_id } => format!("applied {control_id}"),
        WriteOp::TakeEvent { seq, step_id, .. } => format!("take event {seq} for {step_id}"),
        WriteOp::PutArtifact { version, .. } => format!("artifact {version}"),
        WriteOp::CancelRuns { .. } => "cancel runs".into(),
        WriteOp::ReleaseSlot { step_id, .. } => format!("release slot {step_id}"),
        WriteOp::ReleaseSlots { .. } => "release slots".into(),
        WriteOp::TakeStorage { bytes, .. } => format!("take storage {bytes}"),
        WriteOp::ReturnStorage { .. } => "return storage".into(),
        WriteOp::PutLogs { lines, .. } => format!("logs {}", lines.len()),
        WriteOp::ReleaseLease => "release lease".into(),
        other => format!("{other:?}"),
    }
}

fn describe(effect: &Effect) -> String {
    match effect {
        Effect::ReadJournal => "read journal".into(),
        Effect::Activate { start, settles } => {
            let settles: Vec<&str> = settles
                .iter()
                .map(|settle| match settle.outcome {
                    Outcome::Resolved(_) => "resolved",
                    Outcome::Rejected(_) => "rejected",
                })
                .collect();
            let how = if start.is_some() { "start" } else { "loaded" };
            format!("activate {how} {settles:?}")
        }
        Effect::Write(ops) => {
            let ops: Vec<String> = ops.iter().map(op).collect();
            format!("write [{}]", ops.join(", "))
        }
        Effect::Admit { id, request } => {
            let carried = request.step.as_ref().map_or(0, |step| step.journal.len());
            format!("admit {} carrying {carried}", id.0)
        }
        Effect::FollowChild { id } => format!("follow {}", id.0),
        Effect::CancelChildren { run_ids, awaited } => {
            let run_ids: Vec<&str> = run_ids.iter().map(RunId::as_str).collect();
            format!("cancel child {} awaited={awaited}", run_ids.join(" "))
        }
        Effect::ReadRun { run_id, .. } => format!("read run {run_id}"),
        Effect::ReadControls(_) => "read controls".into(),
        Effect::PutControl { control, .. } => {
            format!("put control {} {}", control.kind, control.body)
        }
        Effect::ReadEvents { .. } => "read events".into(),
        Effect::Capture { path, .. } => format!("capture {path}"),
        Effect::ReadArtifact { version, .. } => format!("read artifact {version}"),
        Effect::Post(event) => format!("post {event:?}"),
        Effect::After { delay, event } => format!("after {}ms {event:?}", delay.as_millis()),
        Effect::SlotWanted => "slot wanted".into(),
        Effect::Park => "park".into(),
        Effect::Count { name, .. } => format!("count {name}"),
        Effect::Fault(name) => format!("fault {name}"),
        Effect::RecordFault { name, .. } => format!("record {name}"),
        Effect::Sleep(delay) => format!("sleep {}ms", delay.as_millis()),
        Effect::Then(_) => "then".into(),
        Effect::Halt { abandoned: true } => "halt abandoned".into(),
        Effect::Halt { abandoned: false } => "halt ended".into(),
    }
}

/// Performs what `event` answers as the interpreter would: each write commits unless
/// `answer` says otherwise, [`Effect::Then`] resumes, and nothing runs after a halt. Answers
/// what was performed, described, and the effects themselves.
fn drive_with(
    machine: &mut WorkflowMachine,
    event: Event,
    now: Millis,
    mut answer: impl FnMut(&Effect) -> Option<Event>,
) -> (Vec<String>, Vec<Effect>) {
    let mut queue: VecDeque<Effect> = machine.on(event, now).into();
    let (mut described, mut performed) = (Vec::new(), Vec::new());
    while let Some(effect) = queue.pop_front() {
        described.push(describe(&effect));
        let reply = match &effect {
            Effect::Then(then) => Some(Event::Then(then.clone())),
            effect => answer(effect)
                .or_else(|| matches!(effect, Effect::Write(_)).then_some(Event::Written)),
        };
        let halts = matches!(effect, Effect::Halt { .. });
        performed.push(effect);
        if halts {
            break;
        }
        if let Some(reply) = reply {
            for effect in machine.on(reply, now).into_iter().rev() {
                queue.push_front(effect);
            }
        }
    }
    (described, performed)
}

fn drive(machine: &mut WorkflowMachine, event: Event) -> Vec<String> {
    drive_with(machine, event, NOW, |_| None).0
}

/// The ops of every write performed.
fn written(effects: &[Effect]) -> Vec<&WriteOp> {
    effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::Write(ops) => Some(ops),
            _ => None,
        })
        .flatten()
        .collect()
}

/// A fresh machine whose script made one agent call `a` and whose child run `run-new` was
/// admitted (the call's journal carried by the admission).
fn admitted_agent() -> WorkflowMachine {
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    drive(&mut m, activation(vec![agent(0, "a")], Status::Waiting));
    let started = Admission::Started(run_row(&RunId::from("run-new"), RunStatus::Running));
    let id = CallId(0);
    drive(
        &mut m,
        Event::Admission {
            id,
            result: started,
        },
    );
    m
}

#[test]
fn a_workflow_hands_itself_over_at_a_clean_stop_only_with_no_child_in_flight() {
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    assert!(m.may_hand_over(), "nothing in flight yet");
    drive(&mut m, activation(vec![agent(0, "a")], Status::Waiting));
    assert!(!m.may_hand_over(), "its admission is in flight");
    let started = Admission::Started(run_row(&RunId::from("run-new"), RunStatus::Running));
    drive(
        &mut m,
        Event::Admission {
            id: CallId(0),
            result: started,
        },
    );
    assert!(!m.may_hand_over(), "its child run is in flight");
}

#[test]
fn a_launch_runs_its_lone_agent_call_through_one_admission_and_ends_in_one_write() {
    let mut m = machine(Start::Fresh);
    assert_eq!(drive(&mut m, Event::Begin), ["activate start []"]);
    let (described, effects) = drive_with(
        &mut m,
        activation(vec![agent(0, "a")], Status::Waiting),
        NOW,
        |_| None,
    );
    // Nothing is written: the call's entry rides its admission, under the fence, with the
    // run id the activation brought.
    assert_eq!(described, ["admit 0 carrying 1"]);
    let Some(Effect::Admit { request, .. }) = effects.first() else {
        panic!("an admission");
    };
    assert_eq!(request.run_id, Some(RunId::new("run-new")));
    assert_eq!(request.idempotency_key.as_deref(), Some("wf-1/a/1"));
    let step = request.step.as_ref().expect("a workflow step");
    assert_eq!(
        (step.fence.epoch, step.slots_max, step.slots_per_user_max),
        (Epoch::new(3), 4, 2)
    );
    assert_eq!(op(&step.journal[0]), "step a running");

    let started = Admission::Started(run_row(&RunId::from("run-new"), RunStatus::Running));
    let id = CallId(0);
    assert_eq!(
        drive(
            &mut m,
            Event::Admission {
                id,
                result: started
            }
        ),
        [
            "count reins_steps_started_total",
            "count reins_child_runs_started_total",
            "fault admission",
            "follow 0",
        ]
    );
    let ended = Event::ChildEnded {
        id,
        run_id: "run-new".into(),
        committed: Some(Box::new(run_row(
            &RunId::from("run-new"),
            RunStatus::Success,
        ))),
    };
    // Its output is the workflow's first artifact: it is stored under a grant of the
    // owner's quota, which may refuse it, so the outcome reaches the script only once that
    // write committed. (An outcome with no artifact beyond the room granted is handed to the
    // script first and journaled with the next write.)
    let (described, effects) = drive_with(&mut m, ended, NOW, |_| None);
    assert_eq!(
        described,
        [
            "count reins_child_runs_finished_total",
            "count reins_step_attempts_total",
            "fault result_before",
            "write [take storage 262144, artifact 1, release slot a, step a completed]",
            "count reins_steps_finished_total",
            "fault result",
            "activate loaded [\"resolved\"]",
        ]
    );
    assert!(
        matches!(
            written(&effects)[0],
            WriteOp::TakeStorage {
                bytes_max: 1_000_000,
                ..
            }
        ),
        "the grant is checked against the configured quota"
    );
    let done = Event::Activated {
        result: Ok(Activation {
            commands: Vec::new(),
            cancels: Vec::new(),
            journal: Vec::new(),
            status: Status::Completed(json!(42)),
            logs: vec!["hi".into()],
        }),
        run_id: "unused".into(),
    };
    let (described, effects) = drive_with(&mut m, done, NOW, |_| None);
    assert_eq!(
        described,
        [
            "write [logs 1, workflow completed, cancel runs, release slots, return storage, \
             release lease]",
            "count reins_workflows_finished_total",
            "halt ended",
        ]
    );
    let Some(WriteOp::SetWorkflow { data, .. }) = written(&effects).into_iter().nth(1) else {
        panic!("the end");
    };
    assert_eq!(data["result"], json!(42));
    assert!(m.is_halted());
    assert!(
        m.on(Event::Poll, NOW).is_empty(),
        "a halted machine does nothing"
    );
}

#[test]
fn a_replay_reads_the_journal_and_an_unreadable_one_goes_to_an_operator() {
    let step = |seq: i32, attempt: i32, data: Value| StepRow {
        seq,
        step_id: "a".into(),
        attempt,
        status: StepStatus::Running,
        record: store::StepRecord::decode("agent", &data).map_err(|e| e.to_string()),
        created_at: 0.0,
        run_started_at: None,
    };
    let mut m = machine(Start::Replay);
    assert_eq!(drive(&mut m, Event::Begin), ["read journal"]);
    let outage = Event::JournalRead(Err(store::Error::Unavailable("down".into())));
    assert_eq!(drive(&mut m, outage), ["after 50ms Begin"]);
    let rows = vec![step(0, 2, json!({"args": {"agentRef": "echo"}}))];
    let (described, effects) = drive_with(&mut m, Event::JournalRead(Ok((5, rows))), NOW, |_| None);
    assert_eq!(described, ["activate start []"]);
    let Some(Effect::Activate {
        start: Some(start), ..
    }) = effects.first()
    else {
        panic!("a replay");
    };
    assert_eq!(start.options.journal.len(), 1);
    // The replayed call is admitted again under its newest attempt.
    let (_, effects) = drive_with(&mut m, replayed(vec![agent(0, "a").1]), NOW, |_| None);
    let Some(Effect::Admit { request, .. }) = effects.first() else {
        panic!("an admission");
    };
    assert_eq!(request.idempotency_key.as_deref(), Some("wf-1/a/2"));
    assert_eq!(request.run_id, None);

    let mut m = machine(Start::Replay);
    drive(&mut m, Event::Begin);
    let gap = vec![step(1, 1, json!({"args": {}}))];
    let (described, effects) = drive_with(&mut m, Event::JournalRead(Ok((0, gap))), NOW, |_| None);
    assert_eq!(
        described,
        [
            "write [workflow needs_reconciliation, return storage, release lease]",
            "count reins_workflows_finished_total",
            "count reins_reconciliations_needed_total",
            "halt ended",
        ]
    );
    let Some(WriteOp::SetWorkflow { data, .. }) = written(&effects).into_iter().next() else {
        panic!("the reconciliation");
    };
    assert_eq!(data["reconciliation"]["reason"], "journal_unreadable");
    assert_eq!(data["reconciliation"]["at_ms"], NOW);
}

#[test]
fn an_agent_step_without_a_slot_journals_itself_queued_and_waits_for_a_cue() {
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    drive(&mut m, activation(vec![agent(0, "a")], Status::Waiting));
    let id = CallId(0);
    // The carried journal was not written: it is, with the call queued, and the slot is
    // asked for again at once (a slot freed meanwhile announced nobody waiting).
    assert_eq!(
        drive(
            &mut m,
            Event::Admission {
                id,
                result: Admission::Queued
            }
        ),
        [
            "write [step a queued]",
            "count reins_steps_started_total",
            "post SlotCheck(CallId(0))",
        ]
    );
    assert_eq!(drive(&mut m, Event::SlotCheck(id)), ["admit 0 carrying 0"]);
    assert_eq!(
        drive(
            &mut m,
            Event::Admission {
                id,
                result: Admission::Queued
            }
        ),
        ["slot wanted", "after 5000ms SlotCheck(CallId(0))"]
    );
    // The cue and the fallback: whichever comes first asks, the other finds nothing to do.
    assert_eq!(drive(&mut m, Event::SlotFreed), ["admit 0 carrying 0"]);
    assert!(drive(&mut m, Event::SlotCheck(id)).is_empty());
    let outage = Admission::Failed(Error::Store(store::Error::Unavailable("down".into())));
    assert_eq!(
        drive(&mut m, Event::Admission { id, result: outage }),
        ["after 50ms RetryAdmission(CallId(0))"]
    );
    let outage = Admission::Failed(Error::Store(store::Error::DiskFull("full".into())));
    assert_eq!(
        drive(&mut m, Event::Admission { id, result: outage }),
        ["after 100ms RetryAdmission(CallId(0))"]
    );
    let started = Admission::Started(run_row(&RunId::from("run-2"), RunStatus::Running));
    assert_eq!(
        drive(
            &mut m,
            Event::Admission {
                id,
                result: started
            }
        ),
        [
            "count reins_child_runs_started_total",
            "fault admission",
            "write [step a running]",
            "follow 0",
        ]
    );
}

#[test]
fn a_refused_admission_fails_the_step_and_an_unknown_one_stops_the_owner() {
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    drive(&mut m, activation(vec![agent(0, "a")], Status::Waiting));
    let refused = Admission::Failed(Error::UnknownAgent {
        name: "echo".into(),
        known: String::new(),
    });
    let (described, effects) = drive_with(
        &mut m,
        Event::Admission {
            id: CallId(0),
            result: refused,
        },
        NOW,
        |_| None,
    );
    assert_eq!(
        described,
        [
            "write [step a queued]",
            "count reins_steps_started_total",
            "activate loaded [\"rejected\"]",
        ]
    );
    let Some(Effect::Activate { settles, .. }) = effects.last() else {
        panic!("an activation");
    };
    assert_eq!(settles[0].at_ms, NOW);
    // The step's failure is journaled with whatever the workflow writes next.
    let (described, _) = drive_with(
        &mut m,
        activation(Vec::new(), Status::Failed("boom".into())),
        NOW,
        |_| None,
    );
    assert_eq!(
        described[0],
        "write [step a failed, workflow failed, cancel runs, release slots, take storage 98, return storage, release lease]"
    );

    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    drive(&mut m, activation(vec![agent(0, "a")], Status::Waiting));
    let unknown = Admission::Failed(Error::Store(store::Error::OutcomeUnknown("?".into())));
    let id = CallId(0);
    assert_eq!(
        drive(
            &mut m,
            Event::Admission {
                id,
                result: unknown
            }
        ),
        ["halt abandoned"],
        "recovery reads what the admission did; nothing is written"
    );
}

#[test]
fn a_child_whose_end_nobody_recorded_goes_to_an_operator() {
    let mut m = admitted_agent();
    let id = CallId(0);
    let ended = Event::ChildEnded {
        id,
        run_id: "run-new".into(),
        committed: None,
    };
    assert_eq!(drive(&mut m, ended), ["read run run-new"]);
    let waiting = Event::RunRead {
        id,
        run_id: "run-new".into(),
        purpose: RunReadFor::Outcome,
        result: Ok(Some(run_row(
            &RunId::from("run-new"),
            RunStatus::WaitingForInput,
        ))),
    };
    assert_eq!(
        drive(&mut m, waiting),
        ["after 5000ms AnswerCheck(CallId(0))"]
    );
    assert_eq!(
        drive(&mut m, Event::InputChanged),
        ["post ChildEnded { id: CallId(0), run_id: \"run-new\", committed: None }"]
    );
    assert!(drive(&mut m, Event::AnswerCheck(id)).is_empty());
    let fenced = Event::RunRead {
        id,
        run_id: "run-new".into(),
        purpose: RunReadFor::Outcome,
        result: Ok(Some(run_row(&RunId::from("run-new"), RunStatus::Running))),
    };
    let (described, effects) = drive_with(&mut m, fenced, NOW, |_| None);
    assert_eq!(
        described,
        [
            "write [workflow needs_reconciliation, return storage, release lease]",
            "count reins_workflows_finished_total",
            "count reins_reconciliations_needed_total",
            "halt ended",
        ]
    );
    let Some(WriteOp::SetWorkflow { data, .. }) = written(&effects).into_iter().next() else {
        panic!("the reconciliation");
    };
    assert_eq!(data["reconciliation"]["reason"], "child_end_unrecorded");
    assert_eq!(data["reconciliation"]["step_id"], "a");
}

/// Issue 29 item 15: a node cut off from the database for longer than a lease found its
/// child's end unrecorded, decided on `needs_reconciliation`, and counted it, although the
/// database refused the write (its lease was gone). Only a committed end is counted.
#[test]
fn a_reconciliation_the_database_refused_is_not_counted() {
    let ended_unrecorded = || Event::RunRead {
        id: CallId(0),
        run_id: "run-new".into(),
        purpose: RunReadFor::Outcome,
        result: Ok(Some(run_row(&RunId::from("run-new"), RunStatus::Running))),
    };
    let refusals = [
        store::Error::LeaseLost {
            resource_id: "wf-1".into(),
            owner: "node-a".into(),
            epoch: store::Epoch::new(1),
        },
        store::Error::OutcomeUnknown("?".into()),
    ];
    for refusal in refusals {
        let mut m = admitted_agent();
        let (described, _) = drive_with(&mut m, ended_unrecorded(), NOW, |effect| {
            matches!(effect, Effect::Write(_)).then(|| Event::WriteFailed(refusal.clone()))
        });
        assert_eq!(
            described,
            [
                "write [workflow needs_reconciliation, return storage, release lease]",
                "halt abandoned"
            ],
            "{refusal}"
        );
    }
    // The same write committed, after an outage that wrote nothing, is counted once.
    let mut m = admitted_agent();
    let mut outage = true;
    let (described, _) = drive_with(&mut m, ended_unrecorded(), NOW, |effect| {
        let failed = matches!(effect, Effect::Write(_)) && std::mem::take(&mut outage);
        failed.then(|| Event::WriteFailed(store::Error::Unavailable("down".into())))
    });
    assert_eq!(
        described,
        [
            "write [workflow needs_reconciliation, return storage, release lease]",
            "sleep 50ms",
            "write [workflow needs_reconciliation, return storage, release lease]",
            "count reins_workflows_finished_total",
            "count reins_reconciliations_needed_total",
            "halt ended",
        ]
    );
}

#[test]
fn a_pause_parks_the_workflow_and_its_resume_wakes_it_with_the_input() {
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    let pause = call(0, CallKind::Pause, "p", json!({}));
    assert_eq!(
        drive(&mut m, activation(vec![pause], Status::Waiting)),
        [
            "write [step p running]",
            "count reins_steps_started_total",
            "park",
            "write [workflow paused]",
        ]
    );
    assert_eq!(drive(&mut m, Event::Poll), ["read controls"]);
    let unrelated = Event::Controls {
        purpose: ControlsFor::Poll,
        result: Ok(vec![
            control(6, ControlKind::Resume, "other", 1, json!({})),
            control(
                8,
                ControlKind::Decide,
                "p",
                1,
                json!({"decision": "approve"}),
            ),
        ]),
    };
    assert!(drive(&mut m, unrelated).is_empty());
    let resume = Event::Controls {
        purpose: ControlsFor::Poll,
        result: Ok(vec![control(
            7,
            ControlKind::Resume,
            "p",
            1,
            json!({"input": {"x": 1}}),
        )]),
    };
    let (described, effects) = drive_with(&mut m, resume, NOW, |_| None);
    // Parked: the VM starts again from the journal, which now holds the outcome.
    assert_eq!(
        described,
        [
            "write [applied 7, step p completed, workflow running]",
            "count reins_steps_finished_total",
            "activate start []",
            "then",
        ]
    );
    let Some(Effect::Activate {
        start: Some(start), ..
    }) = effects.get(2)
    else {
        panic!("a start");
    };
    assert_eq!(
        start.options.journal[0].outcome,
        Some(Outcome::Resolved(json!({"x": 1})))
    );
}

#[test]
fn a_checkpoint_waits_for_approval_and_takes_the_decision_made_for_it() {
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    let checkpoint = call(
        0,
        CallKind::HumanCheckpoint,
        "c",
        json!({"artifactVersion": 1}),
    );
    let pause = call(1, CallKind::Pause, "p", json!({}));
    assert_eq!(
        drive(&mut m, activation(vec![checkpoint, pause], Status::Waiting)),
        [
            "write [step c running, step p running]",
            "count reins_steps_started_total",
            "count reins_steps_started_total",
            "park",
            "write [workflow waiting_approval]",
        ]
    );
    // Two answers in one poll: each is applied after the activation of the one before.
    let decided = Event::Controls {
        purpose: ControlsFor::Poll,
        result: Ok(vec![
            control(
                9,
                ControlKind::Decide,
                "c",
                2,
                json!({"decision": "stale attempt"}),
            ),
            control(
                10,
                ControlKind::Decide,
                "c",
                1,
                json!({"decision": "approve", "comment": "fine"}),
            ),
            control(11, ControlKind::Resume, "p", 1, json!({})),
        ]),
    };
    let later = NOW + 5;
    let mut activations = Vec::new();
    let (described, _) = drive_with(&mut m, decided, later, |effect| match effect {
        Effect::Activate { start, settles } => {
            activations.push((start.is_some(), settles.clone()));
            Some(activation(Vec::new(), Status::Waiting))
        }
        _ => None,
    });
    assert_eq!(
        described,
        [
            "write [applied 10, step c completed, workflow running]",
            "count reins_steps_finished_total",
            "fault approval",
            "activate start []",
            "park",
            "write [workflow paused]",
            "then",
            "write [applied 11, step p completed, workflow running]",
            "count reins_steps_finished_total",
            "activate start []",
            "then",
        ]
    );
    assert_eq!(activations.len(), 2);
    let decision = m.journal[0].outcome.clone();
    assert_eq!(
        decision,
        Some(Outcome::Resolved(json!({
            "decision": "approve",
            "decidedBy": "ann",
            "decidedAt": later,
            "comment": "fine",
        })))
    );
}

#[test]
fn a_capture_becomes_the_next_artifact_version_or_fails_its_step() {
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    let capture = call(
        0,
        CallKind::CaptureArtifact,
        "cap",
        json!({"sourceStepId": "a", "path": "out.txt"}),
    );
    assert_eq!(
        drive(&mut m, activation(vec![capture], Status::Waiting)),
        [
            "write [step cap running]",
            "count reins_steps_started_total",
            "post Local { id: CallId(0) }",
        ]
    );
    let id = CallId(0);
    let (_, effects) = drive_with(&mut m, Event::Local { id }, NOW, |_| None);
    let Some(Effect::Capture { thread_id, .. }) = effects.first() else {
        panic!("a capture");
    };
    assert_eq!(thread_id, &thread_for(&WorkflowId::from(WORKFLOW), "a"));
    let captured = Event::Captured {
        id,
        result: Ok(("out.txt".into(), b"hi".to_vec())),
    };
    // The workflow's first artifact is stored under a grant of its owner's quota before the
    // script sees it.
    let (described, effects) = drive_with(&mut m, captured, NOW, |_| None);
    assert_eq!(
        described,
        [
            "fault capture",
            "write [take storage 262144, artifact 1, step cap completed]",
            "count reins_steps_finished_total",
            "activate loaded [\"resolved\"]",
            "then",
        ]
    );
    let Some(Effect::Activate { settles, .. }) = effects.get(3) else {
        panic!("an activation");
    };
    assert_eq!(
        settles[0].outcome,
        Outcome::Resolved(json!({
            "artifactVersion": 1,
            "bytes": 2,
            "sha256": "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4",
        }))
    );

    // The next fits the room that grant left: handed to the script at once, and journaled
    // with the next write.
    let again = call(
        1,
        CallKind::CaptureArtifact,
        "cap-2",
        json!({"sourceStepId": "a", "path": "out.txt"}),
    );
    drive(&mut m, activation(vec![again], Status::Waiting));
    let captured = Event::Captured {
        id: CallId(1),
        result: Ok(("out.txt".into(), b"abc".to_vec())),
    };
    assert_eq!(
        drive(&mut m, captured),
        ["fault capture", "activate loaded [\"resolved\"]", "then"]
    );
    assert_eq!(m.storage_room, super::storage::STORAGE_GRANT_BYTES - 5);
    let done = activation(Vec::new(), Status::Completed(json!(null)));
    assert_eq!(
        drive(&mut m, done)[0],
        "write [artifact 2, step cap-2 completed, workflow completed, cancel runs, \
         release slots, return storage, release lease]"
    );

    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    let capture = call(
        0,
        CallKind::CaptureArtifact,
        "cap",
        json!({"sourceStepId": "a", "path": "gone"}),
    );
    drive(&mut m, activation(vec![capture], Status::Waiting));
    let missing = Event::Captured {
        id,
        result: Err("no file gone".into()),
    };
    let (_, effects) = drive_with(&mut m, missing, NOW, |_| None);
    let Some(Effect::Activate { settles, .. }) = effects.first() else {
        panic!("an activation");
    };
    assert_eq!(
        settles[0].outcome,
        Outcome::Rejected(json!({"message": "no file gone", "status": "error"}))
    );
    assert_eq!(m.artifacts, 0, "a failed capture makes no version");
}

/// Refuses every write that takes a grant, as the store does for an owner who stores
/// `stored` bytes of the machine's quota (1,000,000).
fn over_the_quota(stored: i64) -> impl FnMut(&Effect) -> Option<Event> {
    move |effect| match effect {
        Effect::Write(ops)
            if ops
                .iter()
                .any(|op| matches!(op, WriteOp::TakeStorage { .. })) =>
        {
            Some(Event::WriteFailed(store::Error::LimitReached(
                store::Limit::StoredBytes {
                    stored,
                    max: 1_000_000,
                },
            )))
        }
        _ => None,
    }
}

/// A fresh workflow whose capture `cap` of `path` is under way, and the event of its `content`.
fn capturing(path: &str, content: Vec<u8>) -> (WorkflowMachine, Event) {
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    let capture = call(
        0,
        CallKind::CaptureArtifact,
        "cap",
        json!({"sourceStepId": "a", "path": path}),
    );
    drive(&mut m, activation(vec![capture], Status::Waiting));
    let captured = Event::Captured {
        id: CallId(0),
        result: Ok((path.into(), content)),
    };
    (m, captured)
}

#[test]
fn an_artifact_the_owners_quota_refuses_fails_its_step_with_nothing_of_it_written() {
    let (mut m, captured) = capturing("big.bin", vec![0; 45_000]);
    // A whole grant is refused, then one of the artifact's own bytes: the step fails.
    let (described, effects) = drive_with(&mut m, captured, NOW, over_the_quota(990_000));
    assert_eq!(
        described,
        [
            "fault capture",
            "write [take storage 262144, artifact 1, step cap completed]",
            "write [take storage 45000, artifact 1, step cap completed]",
            "activate loaded [\"rejected\"]",
            "then",
        ]
    );
    let Some(Effect::Activate { settles, .. }) = effects.get(3) else {
        panic!("an activation");
    };
    assert_eq!(
        settles[0].outcome,
        Outcome::Rejected(json!({
            "message": "limits.user_stored_bytes_max (1000000 bytes) refuses this step's \
                        45000 bytes: the owner's workflows store 990000; nothing of it was stored",
            "status": "error",
            "limit": "limits.user_stored_bytes_max",
            "bytes": 45_000,
            "storedBytes": 990_000,
            "storedBytesMax": 1_000_000,
        }))
    );
    assert_eq!((m.artifacts, m.storage_room), (0, 0), "no version, no room");
    // The failure is journaled with the next write, without an artifact; the next artifact
    // takes version 1.
    let done = activation(Vec::new(), Status::Completed(json!(null)));
    assert_eq!(
        drive(&mut m, done),
        [
            "write [step cap failed, workflow completed, cancel runs, release slots, \
             take storage 268, return storage, release lease]",
            "count reins_steps_finished_total",
            "count reins_workflows_finished_total",
            "halt ended",
        ]
    );

    // An agent's output: its slot is still given back, and the failure names its run.
    let mut m = admitted_agent();
    let ended = Event::ChildEnded {
        id: CallId(0),
        run_id: "run-new".into(),
        committed: Some(Box::new(run_row(
            &RunId::from("run-new"),
            RunStatus::Success,
        ))),
    };
    let (described, effects) = drive_with(&mut m, ended, NOW, over_the_quota(999_999));
    assert_eq!(
        described,
        [
            "count reins_child_runs_finished_total",
            "count reins_step_attempts_total",
            "fault result_before",
            "write [take storage 262144, artifact 1, release slot a, step a completed]",
            "write [take storage 7, artifact 1, release slot a, step a completed]",
            "activate loaded [\"rejected\"]",
        ]
    );
    let Some(Effect::Activate { settles, .. }) = effects.get(5) else {
        panic!("an activation");
    };
    let Outcome::Rejected(failure) = &settles[0].outcome else {
        panic!("a failure");
    };
    assert_eq!(
        (&failure["runId"], &failure["storedBytes"]),
        (&json!("run-new"), &json!(999_999))
    );
    let done = activation(Vec::new(), Status::Completed(json!(null)));
    assert_eq!(
        drive(&mut m, done)[0],
        "write [release slot a, step a failed, workflow completed, cancel runs, \
         release slots, take storage 278, return storage, release lease]"
    );
}

#[test]
fn an_artifact_refused_a_whole_grant_asks_for_its_own_bytes() {
    let (mut m, captured) = capturing("big.bin", vec![0; 45_000]);
    let mut refusals = 1;
    let (described, _) = drive_with(&mut m, captured, NOW, |effect| {
        let refused = over_the_quota(900_000)(effect)?;
        (std::mem::take(&mut refusals) > 0).then_some(refused)
    });
    assert_eq!(
        described,
        [
            "fault capture",
            "write [take storage 262144, artifact 1, step cap completed]",
            "write [take storage 45000, artifact 1, step cap completed]",
            "count reins_steps_finished_total",
            "activate loaded [\"resolved\"]",
            "then",
        ]
    );
    assert_eq!((m.artifacts, m.storage_room), (1, 0));
}

#[test]
fn a_capture_whose_step_write_fails_records_the_error_for_the_fault_tests() {
    let (mut m, captured) = capturing("out.txt", b"hi".to_vec());
    let lost = || {
        Event::WriteFailed(store::Error::LeaseLost {
            resource_id: WORKFLOW.into(),
            owner: "node-a".into(),
            epoch: Epoch::new(3),
        })
    };
    let (described, _) = drive_with(&mut m, captured, NOW, |effect| match effect {
        Effect::Activate { .. } => Some(activation(Vec::new(), Status::Waiting)),
        Effect::Write(_) => Some(lost()),
        _ => None,
    });
    assert_eq!(
        described,
        [
            "fault capture",
            "write [take storage 262144, artifact 1, step cap completed]",
            "record capture_error",
            "halt abandoned",
        ]
    );
}

#[test]
fn a_cancel_interrupts_the_live_children_and_ends_once_each_has_ended() {
    let mut m = admitted_agent();
    let cancel = Event::Controls {
        purpose: ControlsFor::Poll,
        result: Ok(vec![control(9, ControlKind::Cancel, "", 0, json!({}))]),
    };
    assert_eq!(
        drive(&mut m, cancel),
        [
            "park",
            "write [workflow cancelling]",
            "fault cancelling",
            "cancel child run-new awaited=true",
            "after 2000ms CancelDeadline",
            "after 250ms CheckChildren",
        ]
    );
    assert_eq!(m.phase, Phase::Cancelling { control_id: 9 });
    assert!(drive(&mut m, Event::Poll).is_empty());
    assert!(drive(&mut m, Event::TimedOut).is_empty());
    // A child's end is read, never taken from its node's word, while cancelling.
    let ended = Event::ChildEnded {
        id: CallId(0),
        run_id: "run-new".into(),
        committed: Some(Box::new(run_row(
            &RunId::from("run-new"),
            RunStatus::Success,
        ))),
    };
    assert_eq!(drive(&mut m, ended), ["read run run-new"]);
    assert_eq!(
        drive(&mut m, Event::CheckChildren),
        ["read run run-new", "after 250ms CheckChildren"]
    );
    let stopped = Event::RunRead {
        id: CallId(0),
        run_id: "run-new".into(),
        purpose: RunReadFor::Cancelling,
        result: Ok(Some(run_row(
            &RunId::from("run-new"),
            RunStatus::Interrupted,
        ))),
    };
    assert_eq!(
        drive(&mut m, stopped),
        [
            "write [step a cancelled, release slot a]",
            "write [workflow cancelled, applied 9, cancel runs, release slots, return storage, release lease]",
            "count reins_workflows_finished_total",
            "halt ended",
        ]
    );
}

#[test]
fn a_cancel_whose_child_never_ends_goes_to_an_operator_when_its_window_closes() {
    let mut m = admitted_agent();
    let cancel = Event::Controls {
        purpose: ControlsFor::Poll,
        result: Ok(vec![control(9, ControlKind::Cancel, "", 0, json!({}))]),
    };
    drive(&mut m, cancel);
    let still = Event::RunRead {
        id: CallId(0),
        run_id: "run-new".into(),
        purpose: RunReadFor::Cancelling,
        result: Ok(Some(run_row(&RunId::from("run-new"), RunStatus::Running))),
    };
    assert!(drive(&mut m, still).is_empty());
    let (described, effects) = drive_with(&mut m, Event::CancelDeadline, NOW, |_| None);
    assert_eq!(
        described,
        [
            "write [workflow needs_reconciliation, return storage, release lease]",
            "count reins_workflows_finished_total",
            "count reins_reconciliations_needed_total",
            "halt ended",
        ]
    );
    let Some(WriteOp::SetWorkflow { data, .. }) = written(&effects).into_iter().next() else {
        panic!("the reconciliation");
    };
    assert_eq!(data["reconciliation"]["reason"], "cancel_window_passed");
    assert_eq!(data["reconciliation"]["run_id"], "run-new");
}

#[test]
fn the_timeout_records_a_cancel_and_carries_it_out() {
    let mut m = admitted_agent();
    assert_eq!(
        drive(&mut m, Event::TimedOut),
        [r#"put control cancel {"reason":"timeout"}"#]
    );
    let outage = Event::ControlRecorded {
        by: ControlBy::WorkflowTimeout,
        result: Err(store::Error::Unavailable("down".into())),
    };
    assert_eq!(drive(&mut m, outage), ["after 50ms TimedOut"]);
    let recorded = Event::ControlRecorded {
        by: ControlBy::WorkflowTimeout,
        result: Ok(ControlWrite::Recorded(control(
            12,
            ControlKind::Cancel,
            "",
            0,
            json!({"reason": "timeout"}),
        ))),
    };
    assert_eq!(
        drive(&mut m, recorded)[..2],
        ["park", "write [workflow cancelling]"]
    );
    assert_eq!(m.phase, Phase::Cancelling { control_id: 12 });
}

#[test]
fn a_write_that_wrote_nothing_is_retried_until_the_deadline_and_any_other_failure_stops() {
    let pause = || call(0, CallKind::Pause, "p", json!({}));
    let outage = || Event::WriteFailed(store::Error::Unavailable("down".into()));
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    let mut failures = 2;
    let (described, _) = drive_with(
        &mut m,
        activation(vec![pause()], Status::Waiting),
        NOW,
        |effect| {
            (matches!(effect, Effect::Write(_)) && failures > 0).then(|| {
                failures -= 1;
                outage()
            })
        },
    );
    assert_eq!(
        described,
        [
            "write [step p running]",
            "sleep 50ms",
            "write [step p running]",
            "sleep 100ms",
            "write [step p running]",
            "count reins_steps_started_total",
            "park",
            "write [workflow paused]",
        ]
    );

    // Past the workflow's deadline an outage stops this owner; recovery decides.
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    let late = STARTED_AT + i64::try_from(TIMEOUT_MS).expect("small");
    let (described, _) = drive_with(
        &mut m,
        activation(vec![pause()], Status::Waiting),
        late,
        |effect| matches!(effect, Effect::Write(_)).then(outage),
    );
    assert_eq!(described, ["write [step p running]", "halt abandoned"]);

    // An unknown outcome is never retried blindly, and nothing after it is performed.
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    let (described, _) = drive_with(
        &mut m,
        activation(vec![pause()], Status::Waiting),
        NOW,
        |effect| {
            matches!(effect, Effect::Write(_))
                .then(|| Event::WriteFailed(store::Error::OutcomeUnknown("?".into())))
        },
    );
    assert_eq!(described, ["write [step p running]", "halt abandoned"]);
    assert!(m.is_halted());

    // The end's own write failing leaves the workflow live for a takeover: the halt it
    // decided on as ended is never performed.
    let mut m = admitted_agent();
    let (described, _) = drive_with(
        &mut m,
        activation(Vec::new(), Status::Completed(json!(1))),
        NOW,
        |effect| {
            matches!(effect, Effect::Write(_))
                .then(|| Event::WriteFailed(store::Error::OutcomeUnknown("?".into())))
        },
    );
    assert_eq!(
        described,
        [
            "write [workflow completed, cancel runs, release slots, return storage, release lease]",
            "halt abandoned",
        ]
    );
}

#[test]
fn a_lost_lease_stops_the_workflow_with_nothing_written() {
    let mut m = admitted_agent();
    assert_eq!(drive(&mut m, Event::LeaseLost), ["halt abandoned"]);
    let ended = Event::ChildEnded {
        id: CallId(0),
        run_id: "run-new".into(),
        committed: Some(Box::new(run_row(
            &RunId::from("run-new"),
            RunStatus::Success,
        ))),
    };
    assert!(drive(&mut m, ended).is_empty());
    assert!(drive(&mut m, Event::TimedOut).is_empty());
}

#[test]
fn a_dead_owners_cancel_waits_for_the_children_its_journal_shows_running() {
    let mut m = machine(Start::CancelOnly);
    drive(&mut m, Event::Begin);
    let running = StepRow {
        seq: 0,
        step_id: "a".into(),
        attempt: 1,
        status: StepStatus::Running,
        record: store::StepRecord::decode(
            "agent",
            &json!({"args": {"agentRef": "echo"}, "run_id": "run-old"}),
        )
        .map_err(|e| e.to_string()),
        created_at: 0.0,
        run_started_at: None,
    };
    assert_eq!(
        drive(&mut m, Event::JournalRead(Ok((0, vec![running])))),
        ["read controls"]
    );
    let cancel = Event::Controls {
        purpose: ControlsFor::DeadOwnerCancel,
        result: Ok(vec![control(4, ControlKind::Cancel, "", 0, json!({}))]),
    };
    let described = drive(&mut m, cancel);
    assert_eq!(described[3], "cancel child run-old awaited=true");
    assert_eq!(m.phase, Phase::Cancelling { control_id: 4 });

    let mut m = machine(Start::CancelOnly);
    drive(&mut m, Event::Begin);
    drive(&mut m, Event::JournalRead(Ok((0, Vec::new()))));
    let none = Event::Controls {
        purpose: ControlsFor::DeadOwnerCancel,
        result: Ok(Vec::new()),
    };
    assert_eq!(drive(&mut m, none), ["halt abandoned"]);
}

#[test]
fn a_call_the_script_no_longer_awaits_has_its_child_stopped_and_journaled_cancelled() {
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    assert_eq!(
        drive(
            &mut m,
            activation(vec![agent(0, "a"), agent(1, "b")], Status::Waiting)
        ),
        [
            "write [step a queued, step b queued]",
            "count reins_steps_started_total",
            "count reins_steps_started_total",
            "admit 0 carrying 0",
            "admit 1 carrying 0",
        ]
    );
    let started = Admission::Started(run_row(&RunId::from("run-a"), RunStatus::Running));
    drive(
        &mut m,
        Event::Admission {
            id: CallId(0),
            result: started,
        },
    );
    let failed = Event::ChildEnded {
        id: CallId(0),
        run_id: "run-a".into(),
        committed: Some(Box::new(run_row(&RunId::from("run-a"), RunStatus::Error))),
    };
    assert_eq!(drive(&mut m, failed)[3], "activate loaded [\"rejected\"]");
    // The `parallel` failed: call 1, still waiting for its admission, is left behind.
    let left_behind = Event::Activated {
        result: Ok(Activation {
            commands: Vec::new(),
            cancels: vec![CallId(1)],
            journal: Vec::new(),
            status: Status::Waiting,
            logs: Vec::new(),
        }),
        run_id: "unused".into(),
    };
    assert_eq!(
        drive(&mut m, left_behind),
        [
            "write [release slot a, step a failed, take storage 114]",
            "count reins_steps_finished_total",
            "fault result",
        ]
    );
    let started = Admission::Started(run_row(&RunId::from("run-b"), RunStatus::Running));
    assert_eq!(
        drive(
            &mut m,
            Event::Admission {
                id: CallId(1),
                result: started,
            }
        ),
        ["cancel child run-b awaited=false", "follow 1"]
    );
    let ended = Event::ChildEnded {
        id: CallId(1),
        run_id: "run-b".into(),
        committed: None,
    };
    let (described, effects) = drive_with(&mut m, ended, NOW, |_| None);
    assert_eq!(described, ["write [step b cancelled, release slot b]"]);
    let Some(WriteOp::PutStep { record, .. }) = written(&effects).into_iter().next() else {
        panic!("the step");
    };
    let data = record.encode();
    assert_eq!(
        (&data["detached"], &data["run_id"]),
        (&json!(true), &json!("run-b"))
    );
}

/// Found by the simulation (seed 2000440 of `sim_store_fault_seeds`): the stop of a
/// sibling a failed `parallel` left running went out before the failure that caused it was
/// journaled; that write's answer was lost, and the replay found the sibling interrupted
/// and the failure both in their rows, and settled the sibling's first.
#[test]
fn a_left_behind_sibling_is_stopped_only_after_the_failure_that_left_it_is_journaled() {
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    drive(
        &mut m,
        activation(vec![agent(0, "a"), agent(1, "b")], Status::Waiting),
    );
    for (id, run_id) in [(0, "run-a"), (1, "run-b")] {
        let started = Admission::Started(run_row(&RunId::from(run_id), RunStatus::Running));
        drive(
            &mut m,
            Event::Admission {
                id: CallId(id),
                result: started,
            },
        );
    }
    let failed = Event::ChildEnded {
        id: CallId(0),
        run_id: "run-a".into(),
        committed: Some(Box::new(run_row(&RunId::from("run-a"), RunStatus::Error))),
    };
    drive(&mut m, failed);
    let left_behind = || Event::Activated {
        result: Ok(Activation {
            commands: Vec::new(),
            cancels: vec![CallId(1)],
            journal: Vec::new(),
            status: Status::Waiting,
            logs: Vec::new(),
        }),
        run_id: "unused".into(),
    };
    let mut late = m;
    assert_eq!(
        drive(&mut late, left_behind()),
        [
            "write [release slot a, step a failed, take storage 114]",
            "count reins_steps_finished_total",
            "fault result",
            "cancel child run-b awaited=false",
        ]
    );
    // The write fails for good: the workflow stops, and nobody asks run-b to stop: the
    // takeover replays the failure first and stops it then.
    let mut lost = machine(Start::Fresh);
    drive(&mut lost, Event::Begin);
    drive(
        &mut lost,
        activation(vec![agent(0, "a"), agent(1, "b")], Status::Waiting),
    );
    for (id, run_id) in [(0, "run-a"), (1, "run-b")] {
        let started = Admission::Started(run_row(&RunId::from(run_id), RunStatus::Running));
        drive(
            &mut lost,
            Event::Admission {
                id: CallId(id),
                result: started,
            },
        );
    }
    let failed = Event::ChildEnded {
        id: CallId(0),
        run_id: "run-a".into(),
        committed: Some(Box::new(run_row(&RunId::from("run-a"), RunStatus::Error))),
    };
    drive(&mut lost, failed);
    let (described, _) = drive_with(&mut lost, left_behind(), NOW, |effect| {
        matches!(effect, Effect::Write(_))
            .then(|| Event::WriteFailed(store::Error::OutcomeUnknown("?".into())))
    });
    assert!(
        !described
            .iter()
            .any(|effect| effect.starts_with("cancel child")),
        "{described:?}"
    );
    assert_eq!(described.last().map(String::as_str), Some("halt abandoned"));
}

#[test]
fn a_replayed_step_whose_child_the_orphan_sweep_closed_goes_to_an_operator() {
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    drive(
        &mut m,
        activation(vec![agent(0, "a"), agent(1, "b")], Status::Waiting),
    );
    let mut orphan = run_row(&RunId::from("run-old"), RunStatus::Interrupted);
    orphan.stop_reason = Some("orphan_recovered".into());
    let (described, effects) = drive_with(
        &mut m,
        Event::Admission {
            id: CallId(0),
            result: Admission::Existing(orphan),
        },
        NOW,
        |_| None,
    );
    assert_eq!(
        described[..3],
        [
            "write [workflow needs_reconciliation, return storage, release lease]",
            "count reins_workflows_finished_total",
            "count reins_reconciliations_needed_total",
        ]
    );
    let Some(WriteOp::SetWorkflow { data, .. }) = written(&effects).into_iter().next() else {
        panic!("the reconciliation");
    };
    assert_eq!(data["reconciliation"]["reason"], "orphaned_child");
    assert_eq!(data["reconciliation"]["run_id"], "run-old");
}

#[test]
fn a_read_artifact_call_answers_its_bytes_and_waits_out_an_outage() {
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    let read = call(
        0,
        CallKind::ReadArtifact,
        "read:0",
        json!({"artifactVersion": 3}),
    );
    drive(&mut m, activation(vec![read], Status::Waiting));
    let id = CallId(0);
    assert_eq!(drive(&mut m, Event::Local { id }), ["read artifact 3"]);
    let outage = Event::ArtifactRead {
        id,
        version: 3,
        result: Err(store::Error::Unavailable("down".into())),
    };
    assert_eq!(
        drive(&mut m, outage),
        ["after 50ms Local { id: CallId(0) }"]
    );
    let bytes = Event::ArtifactRead {
        id,
        version: 3,
        result: Ok(Some(vec![0xff, 0x00])),
    };
    let (_, effects) = drive_with(&mut m, bytes, NOW, |_| None);
    let Some(Effect::Activate { settles, .. }) = effects.first() else {
        panic!("an activation");
    };
    assert_eq!(
        settles[0].outcome,
        Outcome::Resolved(json!({"base64": "/wA=", "encoding": "base64"}))
    );

    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    let read = call(
        0,
        CallKind::ReadArtifact,
        "read:0",
        json!({"artifactVersion": 3}),
    );
    drive(&mut m, activation(vec![read], Status::Waiting));
    let missing = Event::ArtifactRead {
        id,
        version: 3,
        result: Ok(None),
    };
    let (_, effects) = drive_with(&mut m, missing, NOW, |_| None);
    let Some(Effect::Activate { settles, .. }) = effects.first() else {
        panic!("an activation");
    };
    assert_eq!(
        settles[0].outcome,
        Outcome::Rejected(
            json!({"message": "artifact version 3 does not exist", "status": "error"})
        )
    );
}

/// A stored document its launch could not have written is a decoding error of the store
/// (answered 500), never a bad request of whoever asked for the takeover (400).
#[test]
fn a_document_missing_a_field_is_a_stored_value_that_cannot_be_decoded() {
    let error = WorkflowDocument::decode(&WORKFLOW.into(), &json!({"args": {}, "seed": 1}))
        .expect_err("no script");
    match error {
        store::Error::Database(message) => {
            assert!(
                message.contains("wf-1") && message.contains("script"),
                "{message}"
            );
        }
        other => panic!("expected a store decoding error, got {other:?}"),
    }
}

#[test]
fn an_admission_refused_for_a_lost_lease_stops_the_workflow_with_nothing_written() {
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    drive(&mut m, activation(vec![agent(0, "a")], Status::Waiting));
    let fenced = Admission::Failed(Error::Store(store::Error::LeaseLost {
        resource_id: WORKFLOW.into(),
        owner: "node-a".into(),
        epoch: Epoch::new(1),
    }));
    let admission = Event::Admission {
        id: CallId(0),
        result: fenced,
    };
    assert_eq!(drive(&mut m, admission), ["halt abandoned"]);
}

/// A replay asks again for the admission of a step whose run exists: what the store shows of
/// that run decides, never a second run.
#[test]
fn a_replayed_step_takes_its_runs_outcome_follows_its_waiting_run_or_asks_an_operator() {
    let existing = |row: RunRow| {
        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        drive(&mut m, activation(vec![agent(0, "a")], Status::Waiting));
        let admission = Event::Admission {
            id: CallId(0),
            result: Admission::Existing(row),
        };
        drive_with(&mut m, admission, NOW, |_| None)
    };

    // Not admitted: the carried journal is written by the machine, with the call queued.
    let queued = ["write [step a queued]", "count reins_steps_started_total"];

    // Ended: its outcome is the step's, with the output kept as the next artifact version,
    // stored under a grant of the owner's quota before the script sees it.
    let (described, effects) = existing(run_row(&RunId::from("run-old"), RunStatus::Success));
    assert_eq!(described[..2], queued);
    assert_eq!(
        described[2..],
        [
            "count reins_child_runs_finished_total",
            "count reins_step_attempts_total",
            "fault result_before",
            "write [take storage 262144, artifact 1, release slot a, step a completed]",
            "count reins_steps_finished_total",
            "fault result",
            "activate loaded [\"resolved\"]",
        ]
    );
    let Some(Effect::Activate { settles, .. }) = effects.last() else {
        panic!("an activation: {described:?}");
    };
    assert_eq!(
        settles[0].outcome,
        Outcome::Resolved(json!({"output": "hello", "artifactVersion": 1,
            "threadId": thread_for(&WorkflowId::from(WORKFLOW), "a"), "runId": "run-old",
            "status": "success", "attempts": 1}))
    );

    // Waiting for a person: the step is written again naming the run, and the run is followed.
    let (described, _) = existing(run_row(&RunId::from("run-old"), RunStatus::WaitingForInput));
    assert_eq!(described[..2], queued);
    assert_eq!(
        described[2..],
        [
            "write [step a running]",
            "post ChildEnded { id: CallId(0), run_id: \"run-old\", committed: None }",
        ]
    );

    // Live with no outcome (it may run on a node that is gone): an operator decides.
    let (described, effects) = existing(run_row(&RunId::from("run-old"), RunStatus::Running));
    assert_eq!(described[..2], queued);
    assert_eq!(
        described[2..],
        [
            "write [workflow needs_reconciliation, return storage, release lease]",
            "count reins_workflows_finished_total",
            "count reins_reconciliations_needed_total",
            "halt ended",
        ]
    );
    let Some(WriteOp::SetWorkflow { data, .. }) = written(&effects).into_iter().nth(1) else {
        panic!("the reconciliation: {described:?}");
    };
    assert_eq!(data["reconciliation"]["reason"], "child_outcome_unknown");
    assert_eq!(data["reconciliation"]["run_id"], "run-old");
}

#[test]
fn a_child_row_the_database_cannot_give_is_read_again_after_a_backoff() {
    let mut m = admitted_agent();
    let outage = Event::RunRead {
        id: CallId(0),
        run_id: RunId::from("run-new"),
        purpose: RunReadFor::Outcome,
        result: Err(store::Error::Unavailable("down".into())),
    };
    assert_eq!(
        drive(&mut m, outage),
        ["after 50ms ChildEnded { id: CallId(0), run_id: \"run-new\", committed: None }"]
    );
}

#[test]
fn an_artifact_read_that_fails_for_good_stops_the_workflow() {
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    let read = call(
        0,
        CallKind::ReadArtifact,
        "read:0",
        json!({"artifactVersion": 3}),
    );
    drive(&mut m, activation(vec![read], Status::Waiting));
    let failed = Event::ArtifactRead {
        id: CallId(0),
        version: 3,
        result: Err(store::Error::Database("stored JSON is invalid".into())),
    };
    assert_eq!(drive(&mut m, failed), ["halt abandoned"]);
}

/// Every test of this file, for the coverage check below (which checks this list against the
/// file itself, so a test left out cannot hide what it covers).
/// An agent call that retries twice, a second apart and doubling.
fn retried_agent(seq: u32, step_id: &str) -> (JournalEntry, Command) {
    call(
        seq,
        CallKind::Agent,
        step_id,
        json!({"agentRef": "echo", "task": "t",
               "retry": {"maxAttempts": 3, "initialIntervalMs": 1000, "nonRetryable": ["bad_input"]}}),
    )
}

fn failed_row(run_id: &str, failure: Value) -> RunRow {
    let mut row = run_row(&RunId::from(run_id), RunStatus::Error);
    row.error = Some("boom".into());
    row.output = None;
    row.metadata = json!({ "failure": failure });
    row
}

fn ended(id: u32, row: RunRow) -> Event {
    Event::ChildEnded {
        id: CallId(id),
        run_id: row.run_id.clone(),
        committed: Some(Box::new(row)),
    }
}

fn admitted(id: u32, run_id: &str) -> Event {
    Event::Admission {
        id: CallId(id),
        result: Admission::Started(run_row(&RunId::from(run_id), RunStatus::Running)),
    }
}

/// The outcome handed to the script by the last activation performed.
fn settled(effects: &[Effect]) -> Outcome {
    effects
        .iter()
        .rev()
        .find_map(|effect| match effect {
            Effect::Activate {
                start: Some(start), ..
            } => start
                .options
                .journal
                .iter()
                .rev()
                .find_map(|entry| entry.outcome.clone()),
            Effect::Activate { settles, .. } => settles.last().map(|s| s.outcome.clone()),
            _ => None,
        })
        .expect("an outcome handed to the script")
}

#[test]
fn a_failed_attempt_is_retried_as_a_new_run_behind_a_durable_timer_until_its_policy_says_no() {
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    drive(
        &mut m,
        activation(vec![retried_agent(0, "a")], Status::Waiting),
    );
    drive(&mut m, admitted(0, "run-1"));
    // Attempt 1 fails: it is journaled failed, its slot given back and attempt 2 queued in one
    // write; the workflow waits a second, parked (no VM, no slot).
    let (described, effects) = drive_with(
        &mut m,
        ended(0, failed_row("run-1", json!({}))),
        NOW,
        |_| None,
    );
    assert_eq!(
        described,
        [
            "count reins_child_runs_finished_total",
            "write [step a failed, release slot a, step a queued, take storage 93]",
            "count reins_step_attempts_total",
            "count reins_step_retries_scheduled_total",
            "after 1000ms TimerDue(CallId(0))",
            "park",
        ]
    );
    let ops = written(&effects);
    let attempts: Vec<i32> = ops
        .iter()
        .filter_map(|op| match op {
            WriteOp::PutStep { attempt, .. } => Some(*attempt),
            _ => None,
        })
        .collect();
    assert_eq!(attempts, [1, 2]);
    let Some(WriteOp::PutStep { record, .. }) = ops
        .iter()
        .rev()
        .find(|op| matches!(op, WriteOp::PutStep { .. }))
    else {
        panic!("the next attempt");
    };
    let StepCall::Agent {
        retry: Some(wait),
        previous_run_id,
        ..
    } = &record.call
    else {
        panic!("a queued attempt with its timer: {record:?}");
    };
    assert_eq!((wait.due_at_ms, wait.first_at_ms), (NOW + 1_000, NOW));
    assert_eq!(previous_run_id.as_ref().map(RunId::as_str), Some("run-1"));
    // Woken early, it waits on; at its time, attempt 2 is a new run under its own key.
    assert_eq!(
        drive_with(&mut m, Event::TimerDue(CallId(0)), NOW + 400, |_| None).0,
        ["after 600ms TimerDue(CallId(0))"]
    );
    let (described, effects) =
        drive_with(&mut m, Event::TimerDue(CallId(0)), NOW + 1_000, |_| None);
    assert_eq!(described, ["admit 0 carrying 0"]);
    let Some(Effect::Admit { request, .. }) = effects.first() else {
        panic!("an admission");
    };
    assert_eq!(request.idempotency_key.as_deref(), Some("wf-1/a/2"));
    assert_eq!(request.step.as_ref().map(|step| step.attempt), Some(2));
    // Attempt 2 fails at the provider's word: the wait it asks for, longer, replaces the backoff.
    drive(&mut m, admitted(0, "run-2"));
    let asked = failed_row("run-2", json!({"retry_after_ms": 5_000}));
    let described = drive_with(&mut m, ended(0, asked), NOW + 2_000, |_| None).0;
    assert!(
        described.contains(&"after 5000ms TimerDue(CallId(0))".to_owned()),
        "{described:?}"
    );
    drive_with(&mut m, Event::TimerDue(CallId(0)), NOW + 7_000, |_| None);
    drive(&mut m, admitted(0, "run-3"));
    // Attempt 3 is the last: the step fails with what the script's StepError says.
    let timeout = failed_row(
        "run-3",
        json!({"class": "timeout", "code": "idle_timeout", "retryable": true}),
    );
    let (described, effects) = drive_with(&mut m, ended(0, timeout), NOW + 9_000, |_| None);
    assert_eq!(
        described[..3],
        [
            "count reins_child_runs_finished_total",
            "count reins_step_attempts_total",
            "fault result_before"
        ]
    );
    let Outcome::Rejected(error) = settled(&effects) else {
        panic!("a failure");
    };
    assert_eq!(
        (
            &error["attempts"],
            &error["status"],
            &error["retryable"],
            &error["code"]
        ),
        (
            &json!(3),
            &json!("timeout"),
            &json!(true),
            &json!("idle_timeout")
        )
    );
}

#[test]
fn a_failure_the_agent_or_the_policy_calls_final_is_not_retried() {
    for (failure, code) in [
        (json!({"retryable": false}), Value::Null),
        (json!({"code": "bad_input"}), json!("bad_input")),
    ] {
        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        drive(
            &mut m,
            activation(vec![retried_agent(0, "a")], Status::Waiting),
        );
        drive(&mut m, admitted(0, "run-1"));
        let (described, effects) =
            drive_with(&mut m, ended(0, failed_row("run-1", failure)), NOW, |_| {
                None
            });
        assert!(
            !described.iter().any(|d| d.contains("TimerDue")),
            "{described:?}"
        );
        let Outcome::Rejected(error) = settled(&effects) else {
            panic!("a failure");
        };
        assert_eq!(
            (&error["attempts"], &error["retryable"], &error["code"]),
            (&json!(1), &json!(false), &code)
        );
    }
    // A run someone asked to stop is not run again behind their back either.
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    drive(
        &mut m,
        activation(vec![retried_agent(0, "a")], Status::Waiting),
    );
    drive(&mut m, admitted(0, "run-1"));
    let stopped = run_row(&RunId::from("run-1"), RunStatus::Interrupted);
    let (_, effects) = drive_with(&mut m, ended(0, stopped), NOW, |_| None);
    let Outcome::Rejected(error) = settled(&effects) else {
        panic!("a failure");
    };
    assert_eq!(
        (&error["status"], &error["retryable"]),
        (&json!("interrupted"), &json!(false))
    );
}

#[test]
fn a_takeover_waits_for_the_journaled_due_time_of_the_next_attempt_not_from_zero() {
    let mut m = machine(Start::Replay);
    drive(&mut m, Event::Begin);
    let args = retried_agent(0, "a").0.args;
    let row = |attempt, status, data| stored("a", "agent", attempt, status, data);
    let rows = vec![
        row(
            1,
            StepStatus::Failed,
            json!({"args": args, "run_id": "run-1",
            "outcome": {"outcome": "rejected", "value": {"message": "boom"}}}),
        ),
        row(
            2,
            StepStatus::Queued,
            json!({"args": args, "previous_run_id": "run-1",
            "retry": {"due_at_ms": NOW + 30_000, "first_at_ms": NOW - 5_000, "reason": "boom"}}),
        ),
    ];
    drive(&mut m, Event::JournalRead(Ok((0, rows))));
    let replayed = replayed(vec![retried_agent(0, "a").1]);
    let described = drive_with(&mut m, replayed, NOW + 10_000, |_| None).0;
    assert_eq!(described, ["after 20000ms TimerDue(CallId(0))", "park"]);
    let (described, effects) =
        drive_with(&mut m, Event::TimerDue(CallId(0)), NOW + 30_000, |_| None);
    assert_eq!(described, ["admit 0 carrying 0"]);
    let Some(Effect::Admit { request, .. }) = effects.first() else {
        panic!("an admission");
    };
    assert_eq!(request.idempotency_key.as_deref(), Some("wf-1/a/2"));
    // Admitted, the attempt's entry keeps when the step's first attempt began.
    let (_, effects) = drive_with(&mut m, admitted(0, "run-2"), NOW + 30_000, |_| None);
    let Some(WriteOp::PutStep {
        record, attempt: 2, ..
    }) = written(&effects).into_iter().next()
    else {
        panic!("attempt 2 journaled running");
    };
    let StepCall::Agent {
        retry: Some(wait), ..
    } = &record.call
    else {
        panic!("its timer kept: {record:?}");
    };
    assert_eq!(wait.first_at_ms, NOW - 5_000);
}

#[test]
fn an_idempotent_agents_lost_run_is_closed_and_retried_without_a_person() {
    // Orphaned: closed by the sweep already; retried as the next attempt, the reason journaled.
    let mut m = idempotent_machine(Start::Replay);
    drive(&mut m, Event::Begin);
    drive(&mut m, Event::JournalRead(Ok((0, Vec::new()))));
    drive(&mut m, activation(vec![agent(0, "a")], Status::Waiting));
    let mut orphan = run_row(&RunId::from("run-old"), RunStatus::Error);
    orphan.stop_reason = Some("orphan_recovered".into());
    let orphaned = Event::Admission {
        id: CallId(0),
        result: Admission::Existing(orphan),
    };
    let (described, effects) = drive_with(&mut m, orphaned, NOW, |_| None);
    assert!(
        described
            .iter()
            .any(|d| d.starts_with("write [step a failed, release slot a, step a queued")),
        "{described:?}"
    );
    assert!(
        !described.iter().any(|d| d.contains("needs_reconciliation")),
        "{described:?}"
    );
    let Some(WriteOp::PutStep { record, .. }) = written(&effects)
        .into_iter()
        .rev()
        .find(|op| matches!(op, WriteOp::PutStep { .. }))
    else {
        panic!("the next attempt");
    };
    let StepCall::Agent {
        retry: Some(wait), ..
    } = &record.call
    else {
        panic!("a queued attempt: {record:?}");
    };
    let reason = wait.reason.as_deref().unwrap_or_default();
    assert!(reason.contains("orphaned"), "{reason}");

    // Live, with no outcome: asked to stop and followed; a success found then is the step's.
    let mut m = idempotent_machine(Start::Replay);
    drive(&mut m, Event::Begin);
    drive(&mut m, Event::JournalRead(Ok((0, Vec::new()))));
    drive(&mut m, activation(vec![agent(0, "a")], Status::Waiting));
    let live = run_row(&RunId::from("run-old"), RunStatus::Running);
    let found = Event::Admission {
        id: CallId(0),
        result: Admission::Existing(live.clone()),
    };
    // Journaled as being closed first: a takeover meanwhile knows the interruption it may find
    // is the step's own doing.
    let (described, effects) = drive_with(&mut m, found, NOW, |_| None);
    assert_eq!(
        described[2..],
        [
            "write [step a running]",
            "cancel child run-old awaited=false",
            "after 250ms ChildEnded { id: CallId(0), run_id: \"run-old\", committed: None }",
        ]
    );
    let closing = written(&effects)
        .into_iter()
        .filter_map(|op| match op {
            WriteOp::PutStep { record, .. } => Some(record.encode()["closing"].clone()),
            _ => None,
        })
        .next_back();
    assert_eq!(closing, Some(json!(true)));
    let still = Event::RunRead {
        id: CallId(0),
        run_id: "run-old".into(),
        purpose: RunReadFor::Outcome,
        result: Ok(Some(live)),
    };
    assert_eq!(
        drive(&mut m, still),
        ["after 250ms ChildEnded { id: CallId(0), run_id: \"run-old\", committed: None }"]
    );
    let stopped = run_row(&RunId::from("run-old"), RunStatus::Interrupted);
    let closed = Event::RunRead {
        id: CallId(0),
        run_id: "run-old".into(),
        purpose: RunReadFor::Outcome,
        result: Ok(Some(stopped)),
    };
    let described = drive(&mut m, closed);
    assert!(
        described
            .iter()
            .any(|d| d.starts_with("write [step a failed, release slot a, step a queued")),
        "{described:?}"
    );

    // Found by the simulation (seed 9012087 of the retry mix with every fault): the owner that
    // asked the run to stop died; its interruption, found by the next owner, is the step's own
    // doing, as the journal says, and the step goes on with its next attempt.
    let mut m = idempotent_machine(Start::Replay);
    drive(&mut m, Event::Begin);
    let row = stored(
        "a",
        "agent",
        1,
        StepStatus::Running,
        json!({"args": agent(0, "a").0.args, "run_id": "run-old", "closing": true}),
    );
    drive(&mut m, Event::JournalRead(Ok((0, vec![row]))));
    let replayed = replayed(vec![agent(0, "a").1]);
    drive(&mut m, replayed);
    let interrupted = run_row(&RunId::from("run-old"), RunStatus::Interrupted);
    let found = Event::Admission {
        id: CallId(0),
        result: Admission::Existing(interrupted),
    };
    let described = drive(&mut m, found);
    assert!(
        described
            .iter()
            .any(|d| d.starts_with("write [step a failed, release slot a, step a queued")),
        "{described:?}"
    );

    // Not idempotent (the default): a person decides, as before.
    let mut m = machine(Start::Replay);
    drive(&mut m, Event::Begin);
    drive(&mut m, Event::JournalRead(Ok((0, Vec::new()))));
    drive(
        &mut m,
        activation(vec![retried_agent(0, "a")], Status::Waiting),
    );
    let live = run_row(&RunId::from("run-old"), RunStatus::Running);
    let found = Event::Admission {
        id: CallId(0),
        result: Admission::Existing(live),
    };
    let described = drive(&mut m, found);
    assert!(
        described.iter().any(|d| d.contains("needs_reconciliation")),
        "{described:?}"
    );
}

#[test]
fn a_sleep_journals_its_due_time_parks_and_resolves_once_due_even_after_a_takeover() {
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    let nap = call(
        0,
        CallKind::Sleep,
        "nap",
        json!({"stepId": "nap", "ms": 5_000}),
    );
    let (described, effects) = drive_with(
        &mut m,
        activation(vec![nap.clone()], Status::Waiting),
        NOW,
        |_| None,
    );
    assert_eq!(
        described,
        [
            "write [step nap running]",
            "count reins_steps_started_total",
            "after 5000ms TimerDue(CallId(0))",
            "park",
        ]
    );
    let Some(WriteOp::PutStep { record, .. }) = written(&effects).into_iter().next() else {
        panic!("the sleep journaled");
    };
    assert_eq!(
        record.call,
        StepCall::Sleep {
            due_at_ms: Some(NOW + 5_000)
        }
    );
    let (described, effects) =
        drive_with(&mut m, Event::TimerDue(CallId(0)), NOW + 5_000, |_| None);
    assert_eq!(described[0], "activate start []");
    let Some(Effect::Activate {
        start: Some(start), ..
    }) = effects.first()
    else {
        panic!("a replay of the parked script");
    };
    assert_eq!(
        start.options.journal[0].outcome,
        Some(Outcome::Resolved(Value::Null))
    );

    // A takeover waits for the journaled time, not `ms` from its own start.
    let mut m = machine(Start::Replay);
    drive(&mut m, Event::Begin);
    let row = stored(
        "nap",
        "sleep",
        1,
        StepStatus::Running,
        json!({"args": nap.0.args, "due_at_ms": NOW + 5_000}),
    );
    drive(&mut m, Event::JournalRead(Ok((0, vec![row]))));
    let replayed = replayed(vec![nap.1]);
    assert_eq!(
        drive_with(&mut m, replayed, NOW + 4_000, |_| None).0,
        ["after 1000ms TimerDue(CallId(0))", "park"]
    );
}

fn sent(seq: i64, name: &str, payload: Value) -> store::SentEvent {
    store::SentEvent {
        seq,
        workflow_id: "wf".into(),
        event_id: format!("e{seq}"),
        name: name.into(),
        payload,
        created_by: None,
        created_at: 0.0,
        taken_by: None,
    }
}

#[test]
fn an_event_wait_takes_the_oldest_event_of_its_name_once_or_resolves_null_at_its_deadline() {
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    let wait = |seq: u32, step_id: &str| {
        call(
            seq,
            CallKind::WaitForEvent,
            step_id,
            json!({"stepId": step_id, "name": "paid", "timeoutMs": 2_000}),
        )
    };
    let (described, effects) = drive_with(
        &mut m,
        activation(vec![wait(0, "w1"), wait(1, "w2")], Status::Waiting),
        NOW,
        |_| None,
    );
    assert_eq!(
        described,
        [
            "write [step w1 running, step w2 running]",
            "count reins_steps_started_total",
            "count reins_steps_started_total",
            "after 2000ms TimerDue(CallId(0))",
            "park",
            "post Poll",
            "after 2000ms TimerDue(CallId(1))",
            "post Poll",
        ]
    );
    // The poll reads the controls and, while a call waits for one, the events.
    assert_eq!(drive(&mut m, Event::Poll), ["read controls", "read events"]);
    let Some(WriteOp::PutStep { record, .. }) = written(&effects).into_iter().next() else {
        panic!("the wait journaled");
    };
    assert_eq!(record.call.deadline_at_ms(), Some(NOW + 2_000));

    // The database did not answer: read again after a backoff.
    let outage = Event::EventsRead(Err(store::Error::Unavailable("down".into())));
    assert_eq!(drive(&mut m, outage), ["after 50ms Poll"]);
    // An event of another name is left; the two of its name go one to each wait, oldest first.
    let events = vec![
        sent(4, "shipped", json!("s")),
        sent(5, "paid", json!({"n": 1})),
        sent(6, "paid", json!({"n": 2})),
    ];
    let waits_on = |effect: &Effect| {
        matches!(effect, Effect::Activate { .. }).then(|| activation(vec![], Status::Waiting))
    };
    let (described, effects) = drive_with(
        &mut m,
        Event::EventsRead(Ok(events.clone())),
        NOW + 10,
        waits_on,
    );
    assert_eq!(
        described,
        [
            "activate start []",
            "write [take event 5 for w1, step w1 completed]",
            "count reins_steps_finished_total",
            "park",
            "then",
            "activate start []",
            "write [take event 6 for w2, step w2 completed]",
            "count reins_steps_finished_total",
            "then",
        ]
    );
    let taken: Vec<(i64, StepCall)> = written(&effects)
        .into_iter()
        .filter_map(|op| match op {
            WriteOp::PutStep { record, .. } => Some(record.call.clone()),
            _ => None,
        })
        .map(|call| match &call {
            StepCall::WaitForEvent {
                event_seq: Some(seq),
                ..
            } => (*seq, call),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(taken.len(), 2);
    assert_eq!(settled(&effects), Outcome::Resolved(json!({"n": 2})));
    // The same events read again (the takes not read back yet) go to no wait twice.
    assert!(drive(&mut m, Event::EventsRead(Ok(events))).is_empty());

    // No event before the deadline: the wait resolves with null, and an early timer waits on.
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    drive(&mut m, activation(vec![wait(0, "w1")], Status::Waiting));
    assert_eq!(
        drive_with(&mut m, Event::TimerDue(CallId(0)), NOW + 1_000, |_| None).0,
        ["after 1000ms TimerDue(CallId(0))"]
    );
    let (described, effects) =
        drive_with(&mut m, Event::TimerDue(CallId(0)), NOW + 2_000, |_| None);
    assert_eq!(described, ["activate start []"]);
    assert_eq!(settled(&effects), Outcome::Resolved(Value::Null));
    // An event that comes after is left for a later wait.
    assert!(
        drive(
            &mut m,
            Event::EventsRead(Ok(vec![sent(7, "paid", json!(1))]))
        )
        .is_empty()
    );
}

#[test]
fn a_waits_deadline_records_its_answer_as_a_control_and_whichever_is_recorded_is_applied() {
    let checkpoint = |on_timeout: &str| {
        call(
            0,
            CallKind::HumanCheckpoint,
            "review",
            json!({"stepId": "review", "sourceStepId": "s", "artifactVersion": 2,
                   "timeoutMs": 1_000, "onTimeout": on_timeout}),
        )
    };
    let decided = |body: Value| Event::Controls {
        purpose: ControlsFor::Poll,
        result: Ok(vec![control(9, ControlKind::Decide, "review", 1, body)]),
    };
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    drive(
        &mut m,
        activation(vec![checkpoint("fail")], Status::Waiting),
    );
    let due = NOW + 1_000;
    assert_eq!(
        drive_with(&mut m, Event::TimerDue(CallId(0)), due, |_| None).0,
        [r#"put control decide {"artifactVersion":2,"by":"timeout","decision":"fail"}"#]
    );
    let outage = Event::ControlRecorded {
        by: ControlBy::Deadline(CallId(0)),
        result: Err(store::Error::Unavailable("down".into())),
    };
    assert_eq!(drive(&mut m, outage), ["after 50ms TimerDue(CallId(0))"]);
    // A person's decision holds the row: it is read, and applied.
    let person_first = Event::ControlRecorded {
        by: ControlBy::Deadline(CallId(0)),
        result: Err(store::Error::Conflict("decided approve by ada".into())),
    };
    assert_eq!(drive(&mut m, person_first), ["read controls"]);
    let (_, effects) = drive_with(
        &mut m,
        decided(json!({"decision": "approve", "artifactVersion": 2})),
        due,
        |_| None,
    );
    let Outcome::Resolved(decision) = settled(&effects) else {
        panic!("approved");
    };
    assert_eq!(
        (
            decision["decision"].as_str(),
            decision["decidedBy"].as_str()
        ),
        (Some("approve"), Some("ann"))
    );

    // The deadline's own `fail` fails the step as a timeout; its `reject` is decided by it.
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    drive(
        &mut m,
        activation(vec![checkpoint("fail")], Status::Waiting),
    );
    let body = json!({"decision": "fail", "artifactVersion": 2, "by": "timeout"});
    let (_, effects) = drive_with(&mut m, decided(body), due, |_| None);
    let Outcome::Rejected(error) = settled(&effects) else {
        panic!("failed");
    };
    assert_eq!(error["status"], "timeout");
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    drive(
        &mut m,
        activation(vec![checkpoint("reject")], Status::Waiting),
    );
    let body = json!({"decision": "reject", "artifactVersion": 2, "by": "timeout"});
    let (_, effects) = drive_with(&mut m, decided(body), due, |_| None);
    let Outcome::Resolved(decision) = settled(&effects) else {
        panic!("decided");
    };
    assert_eq!(
        (
            decision["decision"].as_str(),
            decision["decidedBy"].as_str()
        ),
        (Some("reject"), Some("timeout"))
    );

    // A pause's deadline: `onTimeout: {resume}` resumes with its value, none fails the step.
    for (on_timeout, body, outcome) in [
        (
            json!({"resume": {"late": true}}),
            json!({"by": "timeout", "input": {"late": true}}),
            Outcome::Resolved(json!({"late": true})),
        ),
        (
            Value::Null,
            json!({"by": "timeout"}),
            Outcome::Rejected(json!({
            "message": "pause \"p\" got no answer within 500 ms", "status": "timeout"})),
        ),
    ] {
        let mut args = json!({"stepId": "p", "timeoutMs": 500});
        if !on_timeout.is_null() {
            args["onTimeout"] = on_timeout;
        }
        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        drive(
            &mut m,
            activation(vec![call(0, CallKind::Pause, "p", args)], Status::Waiting),
        );
        let recorded = drive_with(&mut m, Event::TimerDue(CallId(0)), NOW + 500, |_| None).0;
        assert_eq!(recorded, [format!("put control resume {body}")]);
        let resumed = Event::Controls {
            purpose: ControlsFor::Poll,
            result: Ok(vec![control(3, ControlKind::Resume, "p", 1, body)]),
        };
        let (_, effects) = drive_with(&mut m, resumed, NOW + 500, |_| None);
        assert_eq!(settled(&effects), outcome);
    }
}

#[test]
fn an_attempt_runs_under_its_timeouts_and_what_total_ms_leaves_of_the_step() {
    let admitted_under = |effects: &[Effect]| {
        effects
            .iter()
            .find_map(|effect| match effect {
                Effect::Admit { request, .. } => Some(request.timeouts),
                _ => None,
            })
            .expect("an admission")
    };
    let mut m = machine(Start::Fresh);
    drive(&mut m, Event::Begin);
    let timed = call(
        0,
        CallKind::Agent,
        "a",
        json!({"agentRef": "echo", "task": "t",
               "timeout": {"attemptMs": 5000, "idleMs": 800, "totalMs": 3000},
               "retry": {"maxAttempts": 3, "initialIntervalMs": 1000, "backoffCoefficient": 1}}),
    );
    let (_, effects) = drive_with(
        &mut m,
        activation(vec![timed], Status::Waiting),
        NOW,
        |_| None,
    );
    let first = admitted_under(&effects);
    assert_eq!(
        (first.attempt_ms, first.idle_ms, first.total_ms),
        (Some(3_000), Some(800), None)
    );
    drive(&mut m, admitted(0, "run-1"));
    drive_with(
        &mut m,
        ended(0, failed_row("run-1", json!({}))),
        NOW + 1_500,
        |_| None,
    );
    let (_, effects) = drive_with(&mut m, Event::TimerDue(CallId(0)), NOW + 2_500, |_| None);
    assert_eq!(
        admitted_under(&effects).attempt_ms,
        Some(500),
        "what totalMs leaves"
    );
    drive(&mut m, admitted(0, "run-2"));
    // Another attempt could not be due before totalMs passes: the step fails.
    let (described, effects) = drive_with(
        &mut m,
        ended(0, failed_row("run-2", json!({}))),
        NOW + 2_900,
        |_| None,
    );
    assert!(
        !described.iter().any(|d| d.contains("TimerDue")),
        "{described:?}"
    );
    let Outcome::Rejected(error) = settled(&effects) else {
        panic!("a failure");
    };
    assert_eq!(error["attempts"], 2);
}

/// A machine that goes dormant after it waited 30 s.
fn dormant_machine() -> WorkflowMachine {
    let mut m = machine(Start::Fresh);
    m.config.dormant_after = Some(Duration::from_secs(30));
    m
}

/// The `GoDormant` of the writes performed, as `(wake_at_ms, event_names)`.
fn went_dormant(effects: &[Effect]) -> Option<(Option<Millis>, Vec<String>)> {
    written(effects).into_iter().find_map(|op| match op {
        WriteOp::GoDormant {
            wake_at_ms,
            event_names,
            ..
        } => Some((*wake_at_ms, event_names.clone())),
        _ => None,
    })
}

#[test]
fn a_workflow_parked_for_dormant_after_goes_dormant_in_one_write_and_stops() {
    let mut m = dormant_machine();
    drive(&mut m, Event::Begin);
    let pause = call(0, CallKind::Pause, "p", json!({}));
    let described = drive(&mut m, activation(vec![pause], Status::Waiting));
    assert!(
        described.contains(&"after 30000ms DormantCheck { parked: 1 }".to_owned()),
        "{described:?}"
    );
    let (described, effects) = drive_with(
        &mut m,
        Event::DormantCheck { parked: 1 },
        NOW + 1_000,
        |_| None,
    );
    assert_eq!(
        described.len(),
        3,
        "one write, counted once it committed, then a halt: {described:?}"
    );
    assert_eq!(
        described[1..],
        ["count reins_workflows_dormant_total", "halt ended"]
    );
    // Only a control wakes a pause, or the workflow's own `timeout_seconds`: it is woken
    // `dormant_after` (30 s) before, to be loaded when the time comes.
    assert_eq!(
        went_dormant(&effects),
        Some((Some(STARTED_AT + TIMEOUT_MS as Millis - 30_000), vec![]))
    );
    assert!(m.is_halted());
}

#[test]
fn a_dormant_workflow_wakes_at_its_earliest_due_time_and_a_wake_voids_the_check() {
    // A sleep due before the workflow's timeout: woken 30 s before it; an event wait names its
    // event.
    let mut m = dormant_machine();
    m.config.timeout_ms = 3_600_000;
    drive(&mut m, Event::Begin);
    let nap = call(
        0,
        CallKind::Sleep,
        "nap",
        json!({"stepId": "nap", "ms": 50_000}),
    );
    let paid = call(
        1,
        CallKind::WaitForEvent,
        "paid",
        json!({"stepId": "paid", "name": "payment.received"}),
    );
    drive(&mut m, activation(vec![nap, paid], Status::Waiting));
    drive(&mut m, Event::EventsRead(Ok(vec![])));
    let (_, effects) = drive_with(
        &mut m,
        Event::DormantCheck { parked: 1 },
        NOW + 3_000,
        |_| None,
    );
    assert_eq!(
        went_dormant(&effects),
        Some((Some(NOW + 20_000), vec!["payment.received".to_owned()]))
    );
    // Due within `dormant_after`: it stays, to be loaded when the time comes.
    let mut m = dormant_machine();
    drive(&mut m, Event::Begin);
    let nap = call(
        0,
        CallKind::Sleep,
        "nap",
        json!({"stepId": "nap", "ms": 20_000}),
    );
    drive(&mut m, activation(vec![nap], Status::Waiting));
    assert_eq!(
        drive(&mut m, Event::DormantCheck { parked: 1 }),
        ["after 30000ms DormantCheck { parked: 1 }"]
    );

    // Woken by its timer before the check came: the check is void.
    let mut m = dormant_machine();
    drive(&mut m, Event::Begin);
    let nap = call(
        0,
        CallKind::Sleep,
        "nap",
        json!({"stepId": "nap", "ms": 5_000}),
    );
    drive(&mut m, activation(vec![nap], Status::Waiting));
    drive_with(&mut m, Event::TimerDue(CallId(0)), NOW + 5_000, |_| None);
    drive(&mut m, activation(vec![agent(1, "a")], Status::Waiting));
    let described = drive(&mut m, Event::DormantCheck { parked: 1 });
    assert!(described.is_empty(), "{described:?}");
    assert!(!m.is_halted());
}

#[test]
fn a_workflow_with_anything_under_way_looks_again_later_instead_of_going_dormant() {
    let mut m = dormant_machine();
    drive(&mut m, Event::Begin);
    let pause = call(0, CallKind::Pause, "p", json!({}));
    drive(&mut m, activation(vec![pause], Status::Waiting));
    // An outcome decided and not yet written (it rides the next write) keeps it here.
    m.unwritten
        .ops
        .push(WriteOp::MarkControlApplied { control_id: 1 });
    assert_eq!(
        drive(&mut m, Event::DormantCheck { parked: 1 }),
        ["after 30000ms DormantCheck { parked: 1 }"]
    );
    assert!(!m.is_halted());
}

const EVERY_TEST: &[fn()] = &[
    a_workflow_parked_for_dormant_after_goes_dormant_in_one_write_and_stops,
    a_dormant_workflow_wakes_at_its_earliest_due_time_and_a_wake_voids_the_check,
    a_workflow_with_anything_under_way_looks_again_later_instead_of_going_dormant,
    an_event_wait_takes_the_oldest_event_of_its_name_once_or_resolves_null_at_its_deadline,
    a_waits_deadline_records_its_answer_as_a_control_and_whichever_is_recorded_is_applied,
    an_attempt_runs_under_its_timeouts_and_what_total_ms_leaves_of_the_step,
    a_sleep_journals_its_due_time_parks_and_resolves_once_due_even_after_a_takeover,
    a_failed_attempt_is_retried_as_a_new_run_behind_a_durable_timer_until_its_policy_says_no,
    a_failure_the_agent_or_the_policy_calls_final_is_not_retried,
    a_takeover_waits_for_the_journaled_due_time_of_the_next_attempt_not_from_zero,
    an_idempotent_agents_lost_run_is_closed_and_retried_without_a_person,
    a_workflow_hands_itself_over_at_a_clean_stop_only_with_no_child_in_flight,
    a_launch_runs_its_lone_agent_call_through_one_admission_and_ends_in_one_write,
    a_replay_reads_the_journal_and_an_unreadable_one_goes_to_an_operator,
    an_agent_step_without_a_slot_journals_itself_queued_and_waits_for_a_cue,
    a_refused_admission_fails_the_step_and_an_unknown_one_stops_the_owner,
    a_child_whose_end_nobody_recorded_goes_to_an_operator,
    a_reconciliation_the_database_refused_is_not_counted,
    a_pause_parks_the_workflow_and_its_resume_wakes_it_with_the_input,
    a_checkpoint_waits_for_approval_and_takes_the_decision_made_for_it,
    a_capture_becomes_the_next_artifact_version_or_fails_its_step,
    a_capture_whose_step_write_fails_records_the_error_for_the_fault_tests,
    a_cancel_interrupts_the_live_children_and_ends_once_each_has_ended,
    a_cancel_whose_child_never_ends_goes_to_an_operator_when_its_window_closes,
    the_timeout_records_a_cancel_and_carries_it_out,
    a_write_that_wrote_nothing_is_retried_until_the_deadline_and_any_other_failure_stops,
    a_lost_lease_stops_the_workflow_with_nothing_written,
    a_dead_owners_cancel_waits_for_the_children_its_journal_shows_running,
    a_call_the_script_no_longer_awaits_has_its_child_stopped_and_journaled_cancelled,
    a_left_behind_sibling_is_stopped_only_after_the_failure_that_left_it_is_journaled,
    a_replayed_step_whose_child_the_orphan_sweep_closed_goes_to_an_operator,
    a_read_artifact_call_answers_its_bytes_and_waits_out_an_outage,
    a_document_missing_a_field_is_a_stored_value_that_cannot_be_decoded,
    an_admission_refused_for_a_lost_lease_stops_the_workflow_with_nothing_written,
    a_replayed_step_takes_its_runs_outcome_follows_its_waiting_run_or_asks_an_operator,
    a_child_row_the_database_cannot_give_is_read_again_after_a_backoff,
    an_artifact_read_that_fails_for_good_stops_the_workflow,
    an_artifact_the_owners_quota_refuses_fails_its_step_with_nothing_of_it_written,
    an_artifact_refused_a_whole_grant_asks_for_its_own_bytes,
];

/// Every row of every call kind's table (`transitions.rs`) is taken by some test of this file:
/// a transition nobody drives is a rule nobody checks. Runs every test once more, on this
/// thread, recording the transitions the machine names.
#[test]
fn every_transition_is_covered_by_a_test() {
    let source = include_str!("tests.rs");
    let tests = source.matches("#[test]\nfn ").count();
    // This test itself is the one not in the list.
    assert_eq!(
        EVERY_TEST.len() + 1,
        tests,
        "EVERY_TEST must list every test of this file"
    );
    let taken = super::transitions::recorded(|| {
        for test in EVERY_TEST {
            test();
        }
    });
    let uncovered: Vec<Transition> = Transition::all()
        .into_iter()
        .filter(|transition| !taken.contains(transition))
        .collect();
    assert!(
        uncovered.is_empty(),
        "transitions no test takes: {uncovered:?}"
    );
}
