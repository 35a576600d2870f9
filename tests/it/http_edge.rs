//! The HTTP edge of the real `reins` binary against a stranger: stored bytes that must never run
//! as a page of the API's origin, sign-in under a burst of guesses, slow and oversized requests,
//! cross-site sign-in, and the shape of emails and passwords.

use serde_json::json;

use crate::http_api::{Db, Node, initialize, launch, wait_for};

/// The policy every reply carries (`api/src/http/mod.rs`).
const SANDBOX_POLICY: &str = "sandbox; default-src 'none'; frame-ancestors 'none'";

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
