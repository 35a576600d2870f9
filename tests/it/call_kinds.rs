//! The call kinds are declared once (`runtime/src/call_kinds.rs`), and `runtime::CallKind`,
//! `store::StepKind` and the actors' mappings between them are generated from that list. What
//! cannot be generated is pinned here: a kind declared there and missing in any of these places,
//! or a call the script API makes that is not declared, fails this test naming it.

use std::path::Path;

use runtime::CallKind;
use store::StepKind;

fn read(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The places a call kind must be besides the declaration, each with what it must hold.
fn missing_places(name: &str) -> Vec<String> {
    let places = [
        (
            "runtime/src/prelude.js",
            format!("call(\"{name}\""),
            "the script API's function that makes the call",
        ),
        (
            "actors/src/workflow/machine/transitions.rs",
            format!("/// `{name}`:"),
            "the table of its transitions (which its module of machine/ implements)",
        ),
        (
            "docs/script-api.md",
            format!("\n## {name}\n"),
            "its section of the script API's document",
        ),
    ];
    places
        .into_iter()
        .filter(|(path, needle, _)| !read(path).contains(needle.as_str()))
        .map(|(path, needle, what)| format!("{path} has no {needle:?} ({what})"))
        .collect()
}

#[test]
fn every_declared_call_kind_is_everywhere_a_kind_must_be() {
    let mut missing = Vec::new();
    for &kind in CallKind::ALL {
        let name = kind.as_str();
        match StepKind::parse(name) {
            Some(stored) if stored.as_str() == name => {}
            other => missing.push(format!("{name}: the store reads it as {other:?}")),
        }
        missing.extend(
            missing_places(name)
                .into_iter()
                .map(|why| format!("{name}: {why}")),
        );
    }
    assert_eq!(CallKind::ALL.len(), StepKind::ALL.len());
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn every_call_the_script_api_makes_is_a_declared_kind() {
    let prelude = read("runtime/src/prelude.js");
    let made: Vec<&str> = prelude
        .split("call(\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .collect();
    assert!(made.len() >= CallKind::ALL.len(), "{made:?}");
    for name in made {
        assert!(
            CallKind::parse(name).is_some(),
            "runtime/src/prelude.js calls {name:?}, which runtime/src/call_kinds.rs does not declare"
        );
    }
}
