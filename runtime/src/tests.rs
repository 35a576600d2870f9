//! The runtime without a database: a tiny host that answers commands, and replays from the
//! journal it collected.

use serde_json::{Value, json};

use crate::{CallKind, Command, JournalEntry, Limits, Outcome, Status, Vm, VmOptions};

fn options(journal: Vec<JournalEntry>) -> VmOptions {
    VmOptions {
        limits: Limits::default(),
        seed: 42,
        started_at_ms: 1_000_000,
        journal,
        logged_bytes: 0,
    }
}

/// The launch's compile check, with no bytecode kept.
fn check_script(script: &str) -> Result<(), crate::Error> {
    crate::ScriptCache::new(0).check(script, &Limits::default())
}

/// Runs `script` to the end, answering every command with `answer`; returns the status, the
/// whole journal, and how many commands the host had to carry out.
fn drive(
    script: &str,
    args: Value,
    options: VmOptions,
    mut answer: impl FnMut(&Command) -> Outcome,
) -> (Status, Vec<JournalEntry>, usize) {
    let mut journal = options.journal.clone();
    let mut vm = Vm::start(script, &args, options).expect("start");
    let mut carried_out = 0;
    for _ in 0..1_000 {
        let activation = vm.run();
        journal.extend(activation.journal);
        if activation.status != Status::Waiting {
            return (activation.status, journal, carried_out);
        }
        if activation.commands.is_empty() {
            return (Status::Waiting, journal, carried_out);
        }
        for command in activation.commands {
            carried_out += 1;
            let outcome = answer(&command);
            // An outcome over a limit is refused (and fails the run); nothing to record.
            if let Some(entry) = vm.settle(command.id, outcome, 2_000_000 + i64::from(command.seq))
            {
                let seq = entry.seq as usize;
                journal[seq] = entry;
            }
        }
    }
    panic!("the script never finished");
}

fn echo(command: &Command) -> Outcome {
    Outcome::Resolved(json!({"output": command.args["task"], "step": command.step_id}))
}

const EVERY_CALL: &str = r#"
    const first = await agent({stepId: "draft", agentRef: "writer", task: args.topic});
    const [a, b] = await parallel([
        () => agent({stepId: "left", agentRef: "writer", task: "l"}),
        () => agent({stepId: "right", agentRef: "writer", task: "r"}),
    ]);
    const captured = await captureArtifact({stepId: "cap", sourceStepId: "draft", path: "/mnt/user-data/out.txt"});
    const decision = await humanCheckpoint({stepId: "review", sourceStepId: "cap", artifactVersion: 1});
    const resumed = await pause({stepId: "wait"});
    const text = await readArtifact({artifactVersion: 1});
    return {first, a, b, captured, decision, resumed, text, now: Date.now(), later: new Date().getTime(),
            random: [Math.random(), Math.random()]};
"#;

fn every_call_answer(command: &Command) -> Outcome {
    match command.kind {
        CallKind::HumanCheckpoint => {
            Outcome::Resolved(json!({"decision": "approve", "decidedBy": "ada"}))
        }
        CallKind::Pause => Outcome::Resolved(json!({"input": 7})),
        CallKind::ReadArtifact | CallKind::Sleep | CallKind::WaitForEvent => {
            Outcome::Resolved(json!("file text"))
        }
        CallKind::CaptureArtifact => Outcome::Resolved(json!({"artifactVersion": 1, "bytes": 3})),
        CallKind::Agent => echo(command),
    }
}

#[test]
fn a_script_using_every_call_completes_and_replays_to_the_same_result_without_commands() {
    let (status, journal, carried_out) = drive(
        EVERY_CALL,
        json!({"topic": "t"}),
        options(vec![]),
        every_call_answer,
    );
    let Status::Completed(result) = status else {
        panic!("{status:?}");
    };
    assert_eq!(carried_out, 7);
    assert_eq!(result["first"]["output"], "t");
    assert_eq!(result["decision"]["decision"], "approve");
    assert_eq!(result["now"], result["later"]);
    assert_eq!(
        result["now"],
        json!(2_000_006),
        "time is the last settled step's time"
    );
    assert_ne!(result["random"][0], result["random"][1]);
    let kinds: Vec<_> = journal
        .iter()
        .map(|e| (e.seq, e.step_id.as_str()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (0, "draft"),
            (1, "left"),
            (2, "right"),
            (3, "cap"),
            (4, "review"),
            (5, "wait"),
            (6, "read:6")
        ]
    );

    let (replayed, _, carried_out) = drive(
        EVERY_CALL,
        json!({"topic": "t"}),
        options(journal),
        |command| panic!("replay carried out {command:?}"),
    );
    assert_eq!(carried_out, 0);
    assert_eq!(
        replayed,
        Status::Completed(result),
        "a replay saw different values"
    );
}

#[test]
fn a_replay_resumes_an_in_flight_step_and_runs_only_what_is_new() {
    let (_, journal, _) = drive(
        EVERY_CALL,
        json!({"topic": "t"}),
        options(vec![]),
        every_call_answer,
    );
    let mut partial: Vec<JournalEntry> = journal.into_iter().take(2).collect();
    partial[1].outcome = None;
    partial[1].settled_at_ms = None;
    let mut vm = Vm::start(EVERY_CALL, &json!({"topic": "t"}), options(partial)).expect("start");
    let activation = vm.run();
    let commands: Vec<_> = activation
        .commands
        .iter()
        .map(|c| (c.step_id.as_str(), c.in_flight_in_journal))
        .collect();
    assert_eq!(commands, vec![("left", true), ("right", false)]);
    assert_eq!(
        activation.journal.len(),
        1,
        "only the new call is a new journal entry"
    );
}

#[test]
fn a_replay_does_not_log_again_what_the_first_run_logged() {
    let script = r#"
        console.log("start");
        await agent({stepId: "a", agentRef: "w", task: "x"});
        console.log("after a");
        await agent({stepId: "b", agentRef: "w", task: "y"});
        console.log("after b");
        return 1;
    "#;
    let mut first = Vm::start(script, &json!({}), options(vec![])).expect("start");
    let activation = first.run();
    assert_eq!(activation.logs, vec!["start".to_owned()]);
    let command = activation.commands[0].clone();
    let settled = first
        .settle(command.id, echo(&command), 5)
        .expect("settled");
    let activation = first.run();
    assert_eq!(activation.logs, vec!["after a".to_owned()]);
    // The node dies with "a" done and "b" journaled; another node replays.
    let journal = vec![settled, activation.journal[0].clone()];
    let mut replay = Vm::start(script, &json!({}), options(journal)).expect("replay");
    let activation = replay.run();
    assert!(
        activation.logs.is_empty(),
        "replay logged again: {:?}",
        activation.logs
    );
    let command = activation.commands[0].clone();
    replay.settle(command.id, echo(&command), 6);
    assert_eq!(replay.run().logs, vec!["after b".to_owned()]);
}

#[test]
fn a_script_edited_to_call_another_step_fails_with_both_sides_named() {
    let original = r#"await agent({stepId: "a", agentRef: "x", task: 1}); return 1;"#;
    let edited = r#"await agent({stepId: "b", agentRef: "x", task: 1}); return 1;"#;
    let (_, journal, _) = drive(original, json!({}), options(vec![]), echo);
    let (status, _, carried_out) = drive(edited, json!({}), options(journal), echo);
    assert_eq!(carried_out, 0, "a diverging replay ran a step");
    let Status::Failed(message) = status else {
        panic!("{status:?}")
    };
    assert!(
        message.contains("non-determinism")
            && message.contains("\"a\"")
            && message.contains("\"b\""),
        "{message}"
    );
    // Catching the error does not save a diverged run.
    let catching =
        r#"try { await agent({stepId: "b", agentRef: "x", task: 1}); } catch (e) {} return 2;"#;
    let (_, journal, _) = drive(original, json!({}), options(vec![]), echo);
    let (status, _, _) = drive(catching, json!({}), options(journal), echo);
    assert!(
        matches!(status, Status::Failed(ref m) if m.contains("non-determinism")),
        "{status:?}"
    );
}

#[test]
fn failed_steps_reject_and_bad_arguments_are_clear() {
    let script = r#"
        const errors = [];
        for (const call of [
            () => agent({agentRef: "x", task: 1}),
            () => agent({stepId: "a", task: 1}),
            () => agent({stepId: "a", agentRef: "x"}),
            () => readArtifact({}),
            () => humanCheckpoint({stepId: "h", sourceStepId: "a"}),
            () => agent("not an object"),
            () => agent({stepId: "r", agentRef: "x", task: 1, retries: 3}),
            () => agent({stepId: "t", agentRef: "x", task: 1, timeout: 1000}),
            () => agent({stepId: "m", agentRef: "x", task: 1, retry: {maxAttempts: 1e9}}),
            () => pause({stepId: "p", prompt: "go?"}),
            () => readArtifact({artifactVersion: 1, stepId: "r"}),
        ]) {
            try { await call(); } catch (e) { errors.push(e.message); }
        }
        await agent({stepId: "dup", agentRef: "x", task: 1});
        try { await agent({stepId: "dup", agentRef: "x", task: 2}); } catch (e) { errors.push(e.message); }
        try { await agent({stepId: "boom", agentRef: "x", task: 3}); }
        catch (e) { errors.push(`${e.name}: ${e.message} (${e.status})`); }
        return errors;
    "#;
    let (status, _, _) = drive(script, json!({}), options(vec![]), |command| {
        if command.step_id == "boom" {
            Outcome::Rejected(json!({"message": "the model refused", "status": "error"}))
        } else {
            echo(command)
        }
    });
    let Status::Completed(errors) = status else {
        panic!("{status:?}")
    };
    assert_eq!(
        errors,
        json!([
            "agent needs a stepId (a non-empty string)",
            "agent \"a\" needs an agentRef",
            "agent \"a\" needs a task",
            "readArtifact needs an artifactVersion (a positive integer)",
            "humanCheckpoint \"h\" needs an artifactVersion (a positive integer)",
            "agent takes one object",
            "agent does not take retries: it takes stepId, agentRef, task, retry, timeout, idempotent",
            "agent \"t\": timeout must be an object: {attemptMs, idleMs, totalMs, approvalMs}",
            "agent \"m\": retry.maxAttempts is 1000000000: it must be 1 to 100",
            "pause does not take prompt: it takes stepId, message, timeoutMs, onTimeout, remindAfterMs",
            "readArtifact does not take stepId: it takes artifactVersion",
            "stepId \"dup\" is used twice",
            "StepError: the model refused (error)",
        ])
    );
    let (status, _, _) = drive(
        r#"await agent({stepId: "x", agentRef: "a", task: 1});"#,
        json!({}),
        options(vec![]),
        |_| Outcome::Rejected(json!({"message": "gone"})),
    );
    assert!(
        matches!(status, Status::Failed(ref m) if m.contains("gone")),
        "{status:?}"
    );
}

#[test]
fn a_rejected_checkpoint_throws_unless_asked_to_return() {
    let script = r#"
        const kept = await humanCheckpoint({stepId: "h1", sourceStepId: "a", artifactVersion: 2, onReject: "return"});
        try { await humanCheckpoint({stepId: "h2", sourceStepId: "a", artifactVersion: 2}); }
        catch (e) { return {kept, thrown: e.message}; }
    "#;
    let (status, _, _) = drive(script, json!({}), options(vec![]), |_| {
        Outcome::Resolved(json!({"decision": "reject", "decidedBy": "bob"}))
    });
    assert_eq!(
        status,
        Status::Completed(json!({
            "kept": {"decision": "reject", "decidedBy": "bob"},
            "thrown": "checkpoint h2 was rejected",
        }))
    );
}

#[test]
fn a_failing_parallel_branch_cancels_its_outstanding_siblings() {
    let script = r#"
        await parallel([
            () => agent({stepId: "slow", agentRef: "x", task: 1}),
            () => agent({stepId: "bad", agentRef: "x", task: 2}),
        ]);
    "#;
    let mut vm = Vm::start(script, &json!({}), options(vec![])).expect("start");
    let first = vm.run();
    assert_eq!(
        first.commands.len(),
        2,
        "both branches start in one activation"
    );
    let bad = first
        .commands
        .iter()
        .find(|c| c.step_id == "bad")
        .expect("bad");
    vm.settle(bad.id, Outcome::Rejected(json!({"message": "nope"})), 5)
        .expect("settle");
    let second = vm.run();
    let slow = first
        .commands
        .iter()
        .find(|c| c.step_id == "slow")
        .expect("slow");
    assert_eq!(second.cancels, vec![slow.id]);
    assert!(
        matches!(second.status, Status::Failed(ref m) if m.contains("nope")),
        "{:?}",
        second.status
    );
}

#[test]
fn the_sandbox_has_no_weak_refs_timers_modules_or_io() {
    let script = r#"
        const absent = ["WeakRef", "FinalizationRegistry", "setTimeout", "setInterval", "fetch",
                        "require", "process", "std", "os", "__reins_request", "__reins_settle"]
            .filter((name) => typeof globalThis[name] !== "undefined");
        let imported = "no";
        try { await import("os"); imported = "yes"; } catch (e) { imported = "refused"; }
        console.log("checked", absent.length);
        return {absent, imported};
    "#;
    let mut vm = Vm::start(script, &json!({}), options(vec![])).expect("start");
    let activation = vm.run();
    assert_eq!(
        activation.status,
        Status::Completed(json!({"absent": [], "imported": "refused"}))
    );
    assert_eq!(activation.logs, vec!["checked 0".to_owned()]);
}

#[test]
fn limits_fail_the_run_and_name_the_limit() {
    let limits = Limits {
        script_cpu_ms_max: 200,
        script_memory_bytes_max: 16 << 20,
        steps_max: 3,
        parallel_max: 2,
        frame_bytes_max: 1_000,
        ..Limits::default()
    };
    let with = |journal| VmOptions {
        limits: limits.clone(),
        ..options(journal)
    };

    let script = "x".repeat(limits.script_bytes_max as usize + 1);
    let error = Vm::start(&script, &json!({}), with(vec![]))
        .err()
        .expect("refused");
    assert!(error.to_string().contains("script_bytes_max"), "{error}");
    let error = Vm::start("return 1;", &json!({"a": "x".repeat(1_000)}), with(vec![]))
        .err()
        .expect("refused");
    assert!(error.to_string().contains("frame_bytes_max"), "{error}");

    for (script, limit) in [
        ("while (true) {}", "script_cpu_ms_max"),
        (
            "const a = []; while (true) { a.push(new Array(100000).fill(1)); }",
            "script_memory_bytes_max",
        ),
        (
            "const f = (n) => f(n + 1) + 1; f(0);",
            "script_stack_bytes_max",
        ),
        (
            "for (let i = 0; i < 4; i++) { await pause({stepId: `p${i}`}); }",
            "steps_max",
        ),
        (
            r#"await agent({stepId: "big", agentRef: "x", task: "y".repeat(2000)});"#,
            "frame_bytes_max",
        ),
        (
            "await parallel([() => 1, () => 2, () => 3]);",
            "parallel_max",
        ),
        (
            r#"try { await parallel([() => 1, () => 2, () => 3]); } catch (e) {} return "caught";"#,
            "parallel_max",
        ),
    ] {
        let (status, _, _) = drive(script, json!({}), with(vec![]), echo);
        assert!(
            matches!(&status, Status::Failed(m) if m.contains(limit)),
            "{script}: {status:?}"
        );
    }
    let (status, _, _) = drive(
        r#"await agent({stepId: "a", agentRef: "x", task: 1});"#,
        json!({}),
        with(vec![]),
        |_| Outcome::Resolved(json!("z".repeat(2_000))),
    );
    assert!(
        matches!(&status, Status::Failed(m) if m.contains("frame_bytes_max")),
        "{status:?}"
    );
}

/// Issue 29, item 3: a value nested deeper than `JSON_DEPTH_MAX` never enters the journal, so
/// every stored record stays readable.
#[test]
fn values_nested_over_the_depth_bound_fail_the_run_and_name_it() {
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    let at = crate::JSON_DEPTH_MAX;
    let nest = |n: usize| format!("let v = []; for (let i = 1; i < {n}; i++) v = [v];");
    for (script, what) in [
        (
            format!("{} return v;", nest(at + 1)),
            "the result nests 65 levels",
        ),
        (
            format!(
                r#"{} await agent({{stepId: "a", agentRef: "x", task: v}});"#,
                nest(at)
            ),
            "the input of a agent call nests 65 levels",
        ),
    ] {
        let (status, _, _) = drive(&script, json!({}), options(vec![]), echo);
        assert!(
            matches!(&status, Status::Failed(m) if m.contains(what)),
            "{script}: {status:?}"
        );
    }
    let (status, _, _) = drive(
        &format!("{} return v;", nest(at)),
        json!({}),
        options(vec![]),
        echo,
    );
    assert!(matches!(status, Status::Completed(_)), "{status:?}");
    let (status, _, _) = drive(
        r#"await agent({stepId: "a", agentRef: "x", task: 1});"#,
        json!({}),
        options(vec![]),
        |_| Outcome::Resolved(serde_json::from_str(&deep(at + 1)).expect("json")),
    );
    assert!(
        matches!(&status, Status::Failed(m) if m.contains("the outcome of step a nests 65 levels")),
        "{status:?}"
    );
}

/// Issue 29, item 7: `Promise.all` over more `agent()` calls than `parallel_max` started them all
/// in one activation; calls in flight are bounded however they are awaited.
#[test]
fn calls_in_flight_are_bounded_however_they_are_awaited() {
    let script = |n: usize| {
        format!(
            r#"const calls = [];
               for (let i = 0; i < {n}; i++) calls.push(agent({{stepId: "s" + i, agentRef: "x", task: i}}));
               return (await Promise.all(calls)).length;"#
        )
    };
    let max = Limits::default().parallel_max as usize;
    let (status, _, carried_out) = drive(&script(max), json!({}), options(vec![]), echo);
    assert_eq!(status, Status::Completed(json!(max)));
    assert_eq!(carried_out, max);
    let (status, _, carried_out) = drive(&script(3_000), json!({}), options(vec![]), echo);
    assert!(
        matches!(&status, Status::Failed(m) if m.contains("more than parallel_max (64) calls in flight")),
        "{status:?}"
    );
    assert_eq!(carried_out, 0, "nothing of the activation was carried out");
    // One after another, any number of calls is fine.
    let sequential = r#"let n = 0; for (let i = 0; i < 200; i++) { await agent({stepId: "q" + i, agentRef: "x", task: i}); n++; } return n;"#;
    let (status, _, _) = drive(sequential, json!({}), options(vec![]), echo);
    assert_eq!(status, Status::Completed(json!(200)));
}

/// Issue 29, item 8: CPU is bounded over a workflow's life, not only between two awaits: a
/// script that burns less than `script_cpu_ms_max` between each of its steps fails once all of
/// it passes `script_cpu_ms_total_max`.
#[test]
fn cpu_over_a_workflows_life_is_bounded_between_cheap_steps_too() {
    let script = r#"
        for (let round = 0; ; round++) {
            let x = 0;
            for (let i = 0; i < 300000; i++) { x += i % 7; }
            await agent({stepId: "s" + round, agentRef: "x", task: x});
        }"#;
    let limits = Limits {
        script_cpu_ms_max: 2_000,
        script_cpu_ms_total_max: 300,
        ..Limits::default()
    };
    let (status, journal, _) = drive(
        script,
        json!({}),
        VmOptions {
            limits,
            ..options(vec![])
        },
        echo,
    );
    assert!(
        matches!(&status, Status::Failed(m) if m.contains("more than script_cpu_ms_total_max (300 ms) of CPU over its life")),
        "{status:?}"
    );
    assert!(
        journal.len() > 1,
        "it failed on its life's CPU, not on one activation's"
    );
}

/// Issue 29, item 11: regular-expression literals were refused at launch ("RegExp are not
/// supported") though `new RegExp` worked: the compile-only context lacked the regexp compiler.
#[test]
fn regular_expression_literals_compile_at_launch_and_run() {
    let script = r#"const m = /b(c+)/g.exec("abccd"); return [m[1], "x-y".replace(/-/, "+"), new RegExp("a").test("a")];"#;
    check_script(script).expect("a regular-expression literal compiles");
    let (status, _, _) = drive(script, json!({}), options(vec![]), echo);
    assert_eq!(status, Status::Completed(json!(["cc", "x+y", true])));
}

#[test]
fn the_runtime_version_follows_the_limits_that_change_replay() {
    let base = crate::runtime_version(&Limits::default());
    assert_eq!(base, crate::runtime_version(&Limits::default()));
    assert_ne!(
        base,
        crate::runtime_version(&Limits {
            frame_bytes_max: 1,
            ..Limits::default()
        })
    );
    assert_eq!(
        base,
        crate::runtime_version(&Limits {
            script_cpu_ms_max: 1,
            ..Limits::default()
        }),
        "a CPU budget does not change what a replay computes"
    );
}

#[test]
fn every_value_a_script_returns_or_throws_ends_the_run() {
    let failing = [
        (
            "return () => 1;",
            "the result cannot be encoded as JSON: a function has no JSON form",
        ),
        ("return Symbol('s');", "a symbol has no JSON form"),
        (
            "return 10n;",
            "the result cannot be encoded as JSON: TypeError",
        ),
        (
            "return {toJSON() { throw 1; }};",
            "the result cannot be encoded as JSON: 1",
        ),
        (
            "const a = {}; a.a = a; return a;",
            "the result cannot be encoded as JSON: TypeError",
        ),
        (
            "return {toJSON() { throw {toString() { throw 1; }}; }};",
            "a thrown object that cannot be converted to text",
        ),
        (
            "throw {toString() { throw 1; }};",
            "a thrown object that cannot be converted to text",
        ),
        (
            "throw new Proxy({}, {get() { throw 1; }, getPrototypeOf() { throw 2; }});",
            "a thrown object that cannot be converted to text",
        ),
        ("throw 10n;", "10"),
        ("await new Promise(() => {});", "nothing can settle"),
        (
            r#"await agent({stepId: "a", agentRef: "x", task: 10n});"#,
            "the arguments of agent cannot be encoded as JSON: TypeError",
        ),
        (
            r#"await pause({stepId: "p", input: {toJSON() { throw {toString() { throw 1; }}; }}});"#,
            "the arguments of pause cannot be encoded as JSON: a thrown object",
        ),
        (
            r#"await humanCheckpoint({stepId: "h", sourceStepId: "a", artifactVersion: 1, x: () => 1, y: 1n});"#,
            "the arguments of humanCheckpoint cannot be encoded as JSON",
        ),
        (
            "await parallel([() => { throw {toString() { throw 1; }}; }]);",
            "a thrown object that cannot be converted to text",
        ),
        (
            r#"await parallel([() => agent({stepId: "a", agentRef: "x", task: 1}), () => { throw 10n; }]);"#,
            "10",
        ),
    ];
    for (script, says) in failing {
        let (status, _, _) = drive(script, json!({}), options(vec![]), echo);
        assert!(
            matches!(&status, Status::Failed(m) if m.contains(says)),
            "{script}: {status:?}"
        );
    }
    // The script's own JSON functions are not the ones its values are encoded with.
    for (script, result) in [
        ("JSON.stringify = () => 5; return {a: 1};", json!({"a": 1})),
        (
            r#"JSON.stringify = () => 5; JSON.parse = () => 6; String = () => 7;
               const a = await agent({stepId: "a", agentRef: "x", task: {n: 1}});
               return a.output;"#,
            json!({"n": 1}),
        ),
        ("return undefined;", Value::Null),
        (
            "Promise.prototype.then = function () {}; await agent({stepId: 'a', agentRef: 'x', task: 1}); return 1;",
            json!(1),
        ),
        (
            r#"Object.defineProperty(Object.prototype, "error", {get() { return "x"; }});
               Object.defineProperty(Object.prototype, "text", {get() { return "y"; }});
               await agent({stepId: "a", agentRef: "x", task: 1});
               return {a: 1};"#,
            json!({"a": 1}),
        ),
    ] {
        let (status, _, _) = drive(script, json!({}), options(vec![]), echo);
        assert_eq!(status, Status::Completed(result), "{script}");
    }
}

/// An engine limit is told by the engine's own error class, never by words in a message: a
/// step that failed saying "out of memory", or an error the script made saying "stack
/// overflow", fails the workflow with its own message, not as a limit of the script's.
#[test]
fn words_in_a_failure_do_not_make_it_an_engine_limit() {
    let limits = Limits {
        script_memory_bytes_max: 16 << 20,
        ..Limits::default()
    };
    let with = || VmOptions {
        limits: limits.clone(),
        ..options(vec![])
    };
    let gpu = |_: &Command| {
        Outcome::Rejected(json!({"message": "CUDA out of memory", "status": "error"}))
    };
    for (script, says) in [
        (
            r#"await agent({stepId: "train", agentRef: "x", task: 1});"#,
            "StepError: CUDA out of memory",
        ),
        (
            r#"throw new Error("stack overflow in the parser");"#,
            "Error: stack overflow in the parser",
        ),
        (
            r#"throw new TypeError("call stack size exceeded by the agent");"#,
            "TypeError: call stack size exceeded by the agent",
        ),
        (r#"throw "interrupted";"#, "interrupted"),
    ] {
        let (status, _, _) = drive(script, json!({}), with(), gpu);
        assert_eq!(status, Status::Failed(says.to_owned()), "{script}");
    }
    // The engine's own errors still name their limits, caught and thrown again or not.
    for (script, limit) in [
        (
            "try { const a = []; while (true) { a.push(new Array(100000).fill(1)); } } catch (e) { throw e; }",
            "script_memory_bytes_max",
        ),
        (
            "const f = (n) => f(n + 1) + 1; try { f(0); } catch (e) { throw e; }",
            "script_stack_bytes_max",
        ),
    ] {
        let (status, _, _) = drive(script, json!({}), with(), echo);
        assert!(
            matches!(&status, Status::Failed(m) if m.contains(limit)),
            "{script}: {status:?}"
        );
    }
}

#[test]
fn a_script_that_does_not_compile_is_refused_with_its_own_line_and_column() {
    for (script, says) in [
        (
            "return 1 +;",
            "SyntaxError: unexpected token in expression: ';' (line 1, column 11)",
        ),
        (
            "const a = 1;\nconst b = ;\nreturn a;",
            "(line 2, column 11)",
        ),
        ("await agent({stepId: 'a'}\n", "SyntaxError"),
        ("return 1;\u{0}", "the script does not compile"),
        (
            &format!("return {}1{};", "(".repeat(30_000), ")".repeat(30_000)),
            "RangeError: Maximum call stack size exceeded",
        ),
    ] {
        let checked = check_script(script);
        assert!(
            matches!(&checked, Err(crate::Error::Script(m)) if m.contains(says)),
            "{}: {checked:?}",
            &script[..script.len().min(40)]
        );
        let started = Vm::start(script, &json!({}), options(vec![])).err();
        assert_eq!(started, checked.err(), "the check and the start agree");
    }
    for script in [
        "return 1; // a comment on the last line",
        "with ({a: 1}) { return a + args.n; }",
        "const x = await pause({stepId: 'p'}); return x;",
        // Compiled, never run: the loop after the body's end would never end.
        "}); while (true) {} (function () {",
    ] {
        assert_eq!(check_script(script), Ok(()), "{script}");
    }
    let too_big = "1;".repeat(40_000);
    assert!(matches!(
        check_script(&too_big),
        Err(crate::Error::LimitExceeded(m)) if m.contains("script_bytes_max")
    ));
}

#[test]
fn console_log_is_bounded_per_line_per_activation_and_per_workflow() {
    let cut_x = "xxxxxxxxxx [cut: over log_line_bytes_max (10)]";
    let cut_e = "ééééé [cut: over log_line_bytes_max (10)]";
    // Room for the first two activations' six lines, the two cut lines and one line more.
    let budget = 30 + cut_x.len() as u64 + cut_e.len() as u64 + 10;
    let limits = Limits {
        log_lines_per_activation_max: 3,
        log_line_bytes_max: 10,
        log_bytes_per_workflow_max: budget,
        ..Limits::default()
    };
    let with = |logged_bytes| VmOptions {
        limits: limits.clone(),
        logged_bytes,
        ..options(vec![])
    };
    let script = r#"
        for (let i = 0; i < 3; i++) console.log(`line${i}`);
        await pause({stepId: "p1"});
        for (let i = 0; i < 5; i++) console.log(`more${i}`);
        await pause({stepId: "p2"});
        console.log("x".repeat(10000000));
        console.log("é".repeat(6));
        await pause({stepId: "p3"});
        for (let i = 0; i < 3; i++) console.log("0123456789");
        return 1;
    "#;
    let mut vm = Vm::start(script, &json!({}), with(0)).expect("start");
    let mut activations = Vec::new();
    loop {
        let activation = vm.run();
        activations.push(activation.logs.clone());
        let Some(command) = activation.commands.first() else {
            break;
        };
        vm.settle(command.id, Outcome::Resolved(Value::Null), 5);
    }
    let dropped =
        format!("2 console.log lines dropped: over log_bytes_per_workflow_max ({budget} bytes)");
    assert_eq!(
        activations,
        vec![
            // At the limit: nothing dropped, nothing said.
            vec!["line0", "line1", "line2"],
            vec![
                "more0",
                "more1",
                "more2",
                "2 console.log lines dropped: over log_lines_per_activation_max (3)"
            ],
            // Cut at a character boundary, and marked.
            vec![cut_x, cut_e],
            // The workflow's budget has room for exactly one line more.
            vec!["0123456789", dropped.as_str()],
        ]
    );
    // The count carries across a park: a VM that starts with the budget spent keeps nothing.
    let mut vm =
        Vm::start(r#"console.log("a"); return 1;"#, &json!({}), with(budget)).expect("start");
    assert_eq!(
        vm.run().logs,
        vec![format!(
            "1 console.log lines dropped: over log_bytes_per_workflow_max ({budget} bytes)"
        )]
    );
}

#[test]
fn performance_now_is_workflow_time_and_replays_the_same() {
    let script = r#"
        const before = performance.now();
        let spin = 0;
        for (let i = 0; i < 1000000; i++) spin += i;
        const same = performance.now();
        await agent({stepId: "a", agentRef: "x", task: 1});
        return [before, same, performance.now(), performance.timeOrigin, Date.now()];
    "#;
    let (first, journal, _) = drive(script, json!({}), options(vec![]), echo);
    assert_eq!(
        first,
        Status::Completed(json!([0, 0, 1_000_000, 1_000_000, 2_000_000]))
    );
    let (replayed, _, carried_out) = drive(script, json!({}), options(journal), echo);
    assert_eq!(carried_out, 0);
    assert_eq!(replayed, first, "a replay saw other values");
}

#[test]
fn step_ids_follow_the_control_planes_grammar_when_the_call_is_made() {
    let script = r#"
        const errors = [];
        for (const call of [
            () => humanCheckpoint({stepId: "ok?", sourceStepId: "a", artifactVersion: 1}),
            () => pause({stepId: "x".repeat(129)}),
            () => captureArtifact({stepId: "c", sourceStepId: "a b", path: "/mnt/user-data/f"}),
        ]) {
            try { await call(); } catch (e) { errors.push(e.message); }
        }
        await pause({stepId: "A-z_0.9" + "x".repeat(121)});
        return errors;
    "#;
    let (status, journal, _) = drive(script, json!({}), options(vec![]), echo);
    let grammar = crate::ID_GRAMMAR;
    assert_eq!(
        status,
        Status::Completed(json!([
            format!("humanCheckpoint stepId \"ok?\" is not an id ({grammar})"),
            format!(
                "pause stepId \"{}\" is not an id ({grammar})",
                "x".repeat(129)
            ),
            format!("captureArtifact sourceStepId \"a b\" is not an id ({grammar})"),
        ]))
    );
    assert_eq!(journal.len(), 1, "a refused call is not journaled");
}

#[test]
fn a_lone_surrogate_reaches_the_host_as_a_replacement_character() {
    let limits = Limits {
        log_line_bytes_max: 10,
        ..Limits::default()
    };
    let with = VmOptions {
        limits,
        ..options(vec![])
    };
    // The prelude cuts this line inside a surrogate pair.
    let script = r#"console.log("a" + "😀".repeat(50)); console.log("x\ud800"); throw "\udc00!";"#;
    let activation = Vm::start(script, &json!({}), with).expect("start").run();
    assert_eq!(
        activation.logs,
        vec![
            "a😀😀 [cut: over log_line_bytes_max (10)]".to_owned(),
            "x\u{fffd}".to_owned()
        ]
    );
    assert_eq!(activation.status, Status::Failed("\u{fffd}!".into()));
    let (status, _, _) = drive(r#"return "\ud800";"#, json!({}), options(vec![]), echo);
    assert!(
        matches!(&status, Status::Failed(m) if m.contains("the result cannot be encoded as JSON")),
        "{status:?}"
    );
}

#[test]
fn a_vms_memory_is_what_its_allocations_hold_and_grows_with_what_the_script_keeps() {
    let small = Vm::start(
        r#"await pause({stepId: "p"});"#,
        &json!({}),
        options(vec![]),
    )
    .expect("start");
    let mut small = small;
    assert_eq!(small.run().status, Status::Waiting);
    let baseline = small.memory_bytes();
    assert!(baseline > 0, "a started VM holds memory");

    // Eight million bytes of string kept across the await.
    let mut big = Vm::start(
        r#"const kept = "x".repeat(8000000); await pause({stepId: "p"}); return kept.length;"#,
        &json!({}),
        options(vec![]),
    )
    .expect("start");
    assert_eq!(big.run().status, Status::Waiting);
    let held = big.memory_bytes();
    assert!(
        held >= baseline + 8_000_000,
        "the kept string is counted: {held} bytes held, {baseline} without it"
    );
    assert!(
        held < baseline + 9_000_000,
        "nothing but the string is added: {held} bytes held, {baseline} without it"
    );
}

/// Starts `script` with `scripts`, at the most memory its limits allow, and runs it to the end
/// (or its first wait), answering nothing.
fn start_from(
    scripts: &mut crate::ScriptCache,
    script: &str,
    limits: &Limits,
) -> Result<Status, crate::Error> {
    let options = VmOptions {
        limits: limits.clone(),
        ..options(vec![])
    };
    let memory = limits.script_memory_bytes_max;
    Vm::start_within(script, &json!({"n": 2}), options, memory, scripts)
        .map(|mut vm| vm.run().status)
}

#[test]
fn a_script_started_from_kept_bytecode_ends_as_a_compiled_one_and_keeps_every_limit() {
    let limits = Limits {
        script_memory_bytes_max: 8 * 1024 * 1024,
        script_stack_bytes_max: 256 * 1024,
        script_cpu_ms_max: 100,
        ..Limits::default()
    };
    let scripts = [
        "return args.n + 1;",
        "await pause({stepId: 'p'}); return 1;",
        "const e = new Error('boom'); throw e;",
        "return 1 +;",
        "while (true) {}",
        "const a = []; while (true) { a.push(new Array(100000).fill(1)); }",
        "const f = (n) => f(n + 1) + 1; f(0);",
        "return (function named() { return 1; }).toString();",
        "return new Error('here').stack;",
        // Escapes the body: runs while the VM starts, under the same limits.
        "}); while (true) {} (function () {",
        "}); const a = []; while (true) { a.push(new Array(100000).fill(1)); } (function () {",
    ];
    let mut kept = crate::ScriptCache::new(16);
    for script in scripts {
        let compiled = start_from(&mut crate::ScriptCache::new(0), script, &limits);
        let checked = kept.check(script, &limits);
        let first = start_from(&mut kept, script, &limits);
        let again = start_from(&mut kept, script, &limits);
        assert_eq!(first, compiled, "{script}");
        assert_eq!(again, compiled, "{script}");
        assert_eq!(checked.is_err(), script == "return 1 +;", "{script}");
    }
    assert_eq!(
        kept.len(),
        scripts.len() - 1,
        "a script that does not compile is not kept"
    );
    let mut limit_of = |script: &str| match start_from(&mut kept, script, &limits) {
        Ok(Status::Failed(message)) => message,
        other => panic!("{script}: {other:?}"),
    };
    assert!(limit_of(scripts[4]).contains("script_cpu_ms_max"));
    assert!(limit_of(scripts[5]).contains("script_memory_bytes_max"));
    assert!(limit_of(scripts[6]).contains("script_stack_bytes_max"));
}

#[test]
fn vms_started_from_the_same_bytecode_share_nothing() {
    let script = r#"
        const before = [typeof globalThis.leak, typeof ({}).polluted, typeof agent.marked];
        globalThis.leak = 1;
        Object.prototype.polluted = 1;
        agent.marked = 1;
        JSON.stringify = () => "replaced";
        return before;
    "#;
    let mut kept = crate::ScriptCache::new(4);
    for _ in 0..3 {
        assert_eq!(
            start_from(&mut kept, script, &Limits::default()),
            Ok(Status::Completed(json!([
                "undefined",
                "undefined",
                "undefined"
            ])))
        );
    }
    assert_eq!(kept.len(), 1);
}

#[test]
fn kept_bytecode_is_bounded_and_named_by_the_script_and_its_compile_limits() {
    let limits = Limits::default();
    let mut kept = crate::ScriptCache::new(2);
    for script in ["return 1;", "return 2;", "return 1;", "return 3;"] {
        kept.check(script, &limits).expect("compiles");
    }
    assert_eq!(kept.len(), 2, "at most entries_max scripts");
    assert!(
        kept.holds("return 1;", &limits),
        "the most recently used stays"
    );
    assert!(
        !kept.holds("return 2;", &limits),
        "the least recently used goes"
    );
    assert!(kept.holds("return 3;", &limits));

    // Compiled under a larger stack, a deep script is still refused under a smaller one.
    let deep = format!("return {}1{};", "(".repeat(400), ")".repeat(400));
    kept.check(&deep, &limits)
        .expect("compiles in 1 MiB of stack");
    let small = Limits {
        script_stack_bytes_max: 256 * 1024,
        ..Limits::default()
    };
    let refused = kept.check(&deep, &small);
    assert!(
        matches!(&refused, Err(crate::Error::Script(m)) if m.contains("Maximum call stack size exceeded")),
        "{refused:?}"
    );
    assert!(
        matches!(
            start_from(&mut kept, &deep, &small),
            Err(crate::Error::Script(_))
        ),
        "the start compiles it under its own limits"
    );

    let none = &mut crate::ScriptCache::new(0);
    none.check("return 1;", &limits).expect("compiles");
    assert_eq!(
        start_from(none, "return 1;", &limits),
        Ok(Status::Completed(json!(1)))
    );
    assert!(none.is_empty(), "entries_max 0 keeps nothing");
}

#[test]
fn a_sleep_takes_ms_or_a_time_with_its_offset_and_journals_it_as_milliseconds() {
    let script = r#"
        const errors = [];
        for (const call of [
            () => sleep({stepId: "neg", ms: -1}),
            () => sleep({stepId: "long", ms: 30 * 86400000 + 1}),
            () => sleep({stepId: "none"}),
            () => sleepUntil({stepId: "local", at: "2026-12-03T17:00:00"}),
            () => sleepUntil({stepId: "junk", at: "tomorrow"}),
            () => sleep({stepId: "both", ms: 1, untilMs: 2}),
            () => sleepUntil({stepId: "noat"}),
            () => sleepUntil({stepId: "withms", at: 1796317200000, ms: 5}),
            () => sleep({stepId: "at", at: 1796317200000}),
            () => sleepUntil({stepId: "extra", at: 1796317200000, label: "x"}),
            () => sleepUntil({stepId: "feb30", at: "2026-02-30T09:00:00Z"}),
            () => sleepUntil({stepId: "hour24", at: "2026-12-03T24:00:00Z"}),
            () => sleepUntil({stepId: "offset", at: "2026-12-03T17:00:00+24:00"}),
            () => sleepUntil({stepId: "far", at: 8.64e15}),
            () => sleepUntil({stepId: "later", at: "2027-01-02T17:00:00Z"}),
            // A leap day is on the calendar (and too far here), a 29 February that is not is not.
            () => sleepUntil({stepId: "leap", at: "2028-02-29T00:00:00.5+01:00"}),
            () => sleepUntil({stepId: "noleap", at: "2027-02-29T00:00:00Z"}),
        ]) {
            try { await call(); } catch (e) { errors.push(e.message); }
        }
        await sleep({stepId: "nap", ms: 0});
        await sleepUntil({stepId: "utc", at: "2026-12-03T17:00:00Z"});
        await sleepUntil({stepId: "ms", at: 1796317200000});
        return errors;
    "#;
    // The workflow's now: 2026-12-01T00:00:00Z, from which 2026-12-03 is near, and 2027-01-02
    // (32 days on) too far for one sleep.
    let now = VmOptions {
        started_at_ms: 1_796_083_200_000,
        ..options(vec![])
    };
    let (status, journal, _) = drive(script, json!({}), now, |_| Outcome::Resolved(Value::Null));
    let Status::Completed(errors) = status else {
        panic!("{status:?}")
    };
    assert_eq!(
        errors,
        json!([
            "sleep \"neg\": ms is -1: it must be a whole number of milliseconds, 0 to 2592000000 (30 days)",
            "sleep \"long\": ms is 2592000001: it must be a whole number of milliseconds, 0 to 2592000000 (30 days)",
            "sleep \"none\" needs ms (a sleepUntil needs at)",
            "sleepUntil \"local\": at is \"2026-12-03T17:00:00\": it must be a time (epoch milliseconds, or an ISO 8601 text with its offset)",
            "sleepUntil \"junk\": at is \"tomorrow\": it must be a time (epoch milliseconds, or an ISO 8601 text with its offset)",
            "sleepUntil does not take ms: it takes stepId, at",
            "sleep \"noat\" needs ms (a sleepUntil needs at)",
            "sleepUntil does not take ms: it takes stepId, at",
            "sleep does not take at: it takes stepId, ms",
            "sleepUntil does not take label: it takes stepId, at",
            "sleepUntil \"feb30\": at is \"2026-02-30T09:00:00Z\": it must be a time (epoch milliseconds, or an ISO 8601 text with its offset)",
            "sleepUntil \"hour24\": at is \"2026-12-03T24:00:00Z\": it must be a time (epoch milliseconds, or an ISO 8601 text with its offset)",
            "sleepUntil \"offset\": at is \"2026-12-03T17:00:00+24:00\": it must be a time (epoch milliseconds, or an ISO 8601 text with its offset)",
            "sleepUntil \"far\": at is 8640000000000000, more than 2592000000 ms (30 days) after the workflow's now (1796083200000): sleep in steps of at most 30 days",
            "sleepUntil \"later\": at is 1798909200000, more than 2592000000 ms (30 days) after the workflow's now (1796083200000): sleep in steps of at most 30 days",
            "sleepUntil \"leap\": at is 1835391600500, more than 2592000000 ms (30 days) after the workflow's now (1796083200000): sleep in steps of at most 30 days",
            "sleepUntil \"noleap\": at is \"2027-02-29T00:00:00Z\": it must be a time (epoch milliseconds, or an ISO 8601 text with its offset)",
        ])
    );
    let args: Vec<&Value> = journal.iter().map(|entry| &entry.args).collect();
    assert_eq!(
        args,
        [
            &json!({"stepId": "nap", "ms": 0}),
            &json!({"stepId": "utc", "untilMs": 1796317200000_i64}),
            &json!({"stepId": "ms", "untilMs": 1796317200000_i64}),
        ]
    );
    assert!(journal.iter().all(|entry| entry.kind == CallKind::Sleep));
}

#[test]
fn waits_take_a_deadline_in_range_and_an_on_timeout_of_their_kind() {
    let script = r#"
        const errors = [];
        for (const call of [
            () => waitForEvent({stepId: "noname"}),
            () => waitForEvent({stepId: "badname", name: "pay ment"}),
            () => waitForEvent({stepId: "zero", name: "paid", timeoutMs: 0}),
            () => waitForEvent({stepId: "text", name: "paid", timeoutMs: "1000"}),
            () => waitForEvent({stepId: "long", name: "paid", timeoutMs: 365 * 86400000 + 1}),
            () => waitForEvent({stepId: "other", name: "paid", onTimeout: "reject"}),
            () => pause({stepId: "p1", timeoutMs: 10, onTimeout: "resume"}),
            () => pause({stepId: "p2", onTimeout: {resume: 1}}),
            () => pause({stepId: "p4", remindAfterMs: -5}),
            () => humanCheckpoint({stepId: "c1", sourceStepId: "s", artifactVersion: 1,
                                   timeoutMs: 10, onTimeout: "deny"}),
        ]) {
            try { await call(); } catch (e) { errors.push(e.message); }
        }
        const event = await waitForEvent({stepId: "paid", name: "payment.received", timeoutMs: 1000});
        await pause({stepId: "p3", timeoutMs: 10, onTimeout: {resume: null}});
        await humanCheckpoint({stepId: "c2", sourceStepId: "s", artifactVersion: 1,
                               timeoutMs: 365 * 86400000, onTimeout: "fail"});
        return {errors, event};
    "#;
    let (status, journal, _) = drive(script, json!({}), options(vec![]), |command| {
        Outcome::Resolved(match command.kind {
            CallKind::WaitForEvent => json!({"amount": 3}),
            _ => json!({"decision": "approve"}),
        })
    });
    let Status::Completed(result) = status else {
        panic!("{status:?}")
    };
    assert_eq!(
        result["errors"],
        json!([
            "waitForEvent \"noname\" needs a name (an event name)",
            "waitForEvent \"badname\": name \"pay ment\" is not an id (1 to 128 of A-Z, a-z, 0-9, '-', '_', '.')",
            "waitForEvent \"zero\": timeoutMs is 0: it must be a whole number of milliseconds, 1 to 31536000000 (a year)",
            "waitForEvent \"text\": timeoutMs is \"1000\": it must be a whole number of milliseconds, 1 to 31536000000 (a year)",
            "waitForEvent \"long\": timeoutMs is 31536000001: it must be a whole number of milliseconds, 1 to 31536000000 (a year)",
            "waitForEvent does not take onTimeout: it takes stepId, name, timeoutMs",
            "pause \"p1\": onTimeout is \"resume\": it must be {resume: VALUE} (the input it resumes with)",
            "pause \"p2\": onTimeout needs a timeoutMs (when to apply it)",
            "pause \"p4\": remindAfterMs is -5: it must be a whole number of milliseconds, 1 to 31536000000 (a year)",
            "humanCheckpoint \"c1\": onTimeout is \"deny\": it must be \"reject\", \"approve\" or \"fail\"",
        ])
    );
    assert_eq!(result["event"], json!({"amount": 3}));
    let kinds: Vec<CallKind> = journal.iter().map(|entry| entry.kind).collect();
    assert_eq!(
        kinds,
        [
            CallKind::WaitForEvent,
            CallKind::Pause,
            CallKind::HumanCheckpoint
        ]
    );
}
