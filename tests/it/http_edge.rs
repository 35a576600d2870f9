//! The HTTP edge of the real `reins` binary against a stranger: stored bytes that must never run
//! as a page of the API's origin, sign-in under a burst of guesses, slow and oversized requests,
//! cross-site sign-in, and the shape of emails and passwords.

use serde_json::json;

use crate::http_api::{Db, Node, initialize, launch, wait_for};

/// The policy every reply carries (`api/src/http/mod.rs`).
const SANDBOX_POLICY: &str = "sandbox; default-src 'none'; frame-ancestors 'none'";

/// One test per backend from one async body taking `postgres: bool`.
macro_rules! both_backends {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                super::$name(false).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                super::$name(true).await
            }
        }
    };
}

fn header<'a>(answer: &'a crate::http_client::Answer, name: &str) -> &'a str {
    answer
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_captured_html_artifact_is_served_as_an_attachment_that_cannot_run() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let page = "<html><script>fetch('/api/v1/auth/users')</script></html>";
    let script = format!(
        r#"
        await agent({{stepId: "a", agentRef: "scripted", task: {{
            write: [{{path: "/mnt/user-data/outputs/x.html", content: {page:?}}},
                    {{path: "/mnt/user-data/outputs/y.svg", content: "<svg onload='alert(1)'/>"}},
                    {{path: "/mnt/user-data/outputs/notes.txt", content: "plain"}}],
            output: "wrote"}}}});
        const html = await captureArtifact({{stepId: "h", sourceStepId: "a",
                                            path: "/mnt/user-data/outputs/x.html"}});
        const svg = await captureArtifact({{stepId: "s", sourceStepId: "a",
                                           path: "/mnt/user-data/outputs/y.svg"}});
        const text = await captureArtifact({{stepId: "t", sourceStepId: "a",
                                            path: "/mnt/user-data/outputs/notes.txt"}});
        return [html.artifactVersion, svg.artifactVersion, text.artifactVersion];
        "#
    );
    let run = launch(&mut api, &script).await;
    let record = wait_for(&mut api, &run, "completed").await;
    let versions: Vec<i64> = record["result"]
        .as_array()
        .expect("three versions")
        .iter()
        .map(|v| v.as_i64().expect("version"))
        .collect();

    for (version, name) in [(versions[0], "x.html"), (versions[1], "y.svg")] {
        let answer = api
            .call(
                "GET",
                &format!("/api/v1/workflows/{run}/artifacts/{version}"),
                None,
            )
            .await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(
            header(&answer, "content-disposition"),
            format!("attachment; filename=\"{name}\"")
        );
        assert_eq!(
            header(&answer, "content-type"),
            "application/octet-stream",
            "{name}"
        );
        assert_eq!(header(&answer, "x-content-type-options"), "nosniff");
        assert_eq!(header(&answer, "content-security-policy"), SANDBOX_POLICY);
        // A range of it is stored bytes too.
        let part = api
            .send(
                "GET",
                &format!("/api/v1/workflows/{run}/artifacts/{version}"),
                None,
                Vec::new(),
                &[("range", "bytes=0-5")],
            )
            .await;
        assert_eq!(part.status, 206);
        assert!(header(&part, "content-disposition").starts_with("attachment"));
        assert_eq!(header(&part, "content-security-policy"), SANDBOX_POLICY);
    }
    // Plain text may be shown, still sandboxed and never sniffed.
    let text = api
        .call(
            "GET",
            &format!("/api/v1/workflows/{run}/artifacts/{}", versions[2]),
            None,
        )
        .await;
    assert_eq!(
        header(&text, "content-disposition"),
        "inline; filename=\"notes.txt\""
    );
    assert_eq!(header(&text, "content-type"), "text/plain; charset=utf-8");
    assert_eq!(header(&text, "x-content-type-options"), "nosniff");
    assert_eq!(header(&text, "content-security-policy"), SANDBOX_POLICY);
    // The compatible action carries the same bytes in JSON, with the same headers.
    let chunk = api
        .action(
            "get_artifact",
            json!({"run_id": run, "version": versions[0]}),
        )
        .await;
    assert_eq!(chunk.status, 200, "{chunk:?}");
    assert_eq!(header(&chunk, "content-type"), "application/json");
    assert_eq!(header(&chunk, "x-content-type-options"), "nosniff");
    assert_eq!(header(&chunk, "content-security-policy"), SANDBOX_POLICY);
    assert_eq!(header(&chunk, "x-frame-options"), "DENY");
    // Every other answer too, refusals included.
    let refused = node.api().call("GET", "/api/v1/auth/me", None).await;
    assert_eq!(refused.status, 401);
    assert_eq!(header(&refused, "x-content-type-options"), "nosniff");
    assert_eq!(header(&refused, "content-security-policy"), SANDBOX_POLICY);
}

/// Emails are one address whatever their case; weak passwords and addresses shaped like markup
/// are refused; users from before normalisation are lowered by the migration unless two of them
/// would merge, and those still sign in as stored.
async fn emails_are_normalised_and_passwords_have_a_minimum(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(&db, &[]);
    let mut admin = initialize(&node).await;
    let password = "twelve chars";
    let create = |email: &str, password: &str| json!({"email": email, "password": password});
    let created = admin
        .call(
            "POST",
            "/api/v1/auth/users",
            Some(create(" BOB@X.io ", password)),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(created.json()["email"], "bob@x.io");
    let again = admin
        .call(
            "POST",
            "/api/v1/auth/users",
            Some(create("bob@x.io", password)),
        )
        .await;
    assert_eq!(again.status, 409, "{again:?}");
    for typed in ["bob@x.io", "Bob@X.IO", "  bob@x.io"] {
        let signed_in = node.api().login(typed, "twelve%20chars").await;
        assert_eq!(signed_in.status, 200, "{typed}: {signed_in:?}");
    }
    for (email, weak, status) in [
        ("<script>@x", password, 400),
        ("a b@x.io", password, 400),
        ("carol@x.io", "aaaaaaaa", 422),
        ("carol@x.io", "elevenchars", 422),
        ("carol@x.io", "CAROL@x.io", 422),
    ] {
        let refused = admin
            .call("POST", "/api/v1/auth/users", Some(create(email, weak)))
            .await;
        assert_eq!(refused.status, status, "{email} {weak}: {refused:?}");
    }
    let weak_first = node
        .api()
        .call(
            "POST",
            "/api/v1/auth/initialize",
            Some(create("x@y.io", "short")),
        )
        .await;
    assert_eq!(weak_first.status, 422, "{weak_first:?}");

    // Users from before: put the schema back one version, add mixed-case rows, migrate again.
    drop(node);
    let hash = db
        .sql("SELECT password_hash FROM users WHERE email = 'bob@x.io'")
        .await
        .expect("bob's hash");
    for (id, email, created_at) in [
        ("old-1", "Dave@Example.COM", 1),
        ("old-2", "DAVE@example.com", 2),
        ("old-3", "Erin@X.io", 3),
        ("old-4", "erin@x.io", 4),
        ("old-5", "Frank@X.io", 5),
    ] {
        db.sql(&format!(
            "INSERT INTO users (id, email, password_hash, created_at) \
             VALUES ('{id}', '{email}', '{hash}', {created_at})"
        ))
        .await;
    }
    db.sql("DELETE FROM schema_migrations WHERE version = 13")
        .await;
    let node = Node::start(&db, &[]);
    let email_of = |id: &'static str| {
        let db = &db;
        async move {
            db.sql(&format!("SELECT email FROM users WHERE id = '{id}'"))
                .await
                .expect("row")
        }
    };
    assert_eq!(
        email_of("old-1").await,
        "dave@example.com",
        "the oldest is lowered"
    );
    assert_eq!(
        email_of("old-2").await,
        "DAVE@example.com",
        "its twin is kept"
    );
    assert_eq!(
        email_of("old-3").await,
        "Erin@X.io",
        "a lowercase twin exists"
    );
    assert_eq!(email_of("old-5").await, "frank@x.io");
    for (typed, id) in [
        ("dave@example.com", "old-1"),
        ("Dave@Example.COM", "old-1"),
        ("FRANK@x.io", "old-5"),
        ("ERIN@x.io", "old-4"),
        // The twins the migration kept sign in exactly as stored.
        ("DAVE@example.com", "old-2"),
        ("Erin@X.io", "old-3"),
    ] {
        let signed_in = node.api().login(typed, "twelve%20chars").await;
        assert_eq!(signed_in.status, 200, "{typed}: {signed_in:?}");
        assert_eq!(signed_in.json()["id"], id, "{typed}");
    }
}

both_backends!(emails_are_normalised_and_passwords_have_a_minimum);
