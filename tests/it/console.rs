//! The browser console through the real binary and a real headless chromium (WebDriver): sign
//! in, launch, the inbox, decisions and answers, live updates, session expiry, a second user's
//! view, and stored bytes that must stay inert. Each test saves a screenshot of every page it
//! visits under `target/test-output/console/<test>/`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::both;
use crate::harness::http_get;
use crate::http_api::{ADMIN, Db, Node, PASSWORD, initialize, launch, wait_for};
use crate::webdriver::Browser;

/// Long enough for a debug build on a busy machine (only what never shows reaches it); the
/// console polls every 2 s.
pub(crate) const WAIT: Duration = Duration::from_secs(60);

/// The review example, as a newcomer would paste it into the launch form.
const REVIEW: &str = include_str!("../../examples/review.js");

/// One agent step that asks to deploy, then returns the answer it got.
const ASKING: &str = r#"
    const r = await agent({stepId: "ask", agentRef: "scripted", task: {
        ask_approval: {request_id: "deploy-1", actions: [{tool: "deploy", target: "prod"}]}}});
    return {decision: r.approval.answer.decision, comment: r.approval.answer.comment};
"#;

/// Bytes that would run if the console ever put them into the page as HTML.
const PAYLOAD: &str = r#"<script>window.__pwned = 1</script><img src="x" id="pwned-img" onerror="window.__pwned = 2"><b id="pwned-b">bold</b>"#;

pub(crate) fn url(node: &Node, hash: &str) -> String {
    format!("http://{}/{hash}", node.addr)
}

pub(crate) fn sign_in(browser: &Browser, node: &Node, email: &str) {
    browser.goto(&url(node, "#/sign-in"));
    let form_email = browser.find("#sign-in input[type=email]", WAIT);
    form_email.clear();
    form_email.type_text(email);
    browser
        .find("#sign-in input[type=password]", WAIT)
        .type_text(PASSWORD);
    browser.click_on("#sign-in button[type=submit]", WAIT);
    browser.wait_until(
        "signing in",
        "return !document.getElementById('who').hidden;",
        WAIT,
    );
}

/// Nothing of `PAYLOAD` became an element or ran: the only script is the console's own.
fn assert_inert(browser: &Browser, page: &str) {
    let checks = browser.run(
        "return {
            pwned: typeof window.__pwned,
            scripts: document.scripts.length,
            img: document.getElementById('pwned-img') !== null,
            b: document.getElementById('pwned-b') !== null,
            iframes: document.querySelectorAll('iframe, object, embed').length,
        };",
        json!([]),
    );
    assert_eq!(
        checks,
        json!({"pwned": "undefined", "scripts": 1, "img": false, "b": false, "iframes": 0}),
        "{page}: the payload became part of the page"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_console_is_one_page_with_strict_headers_and_its_own_files() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let head = |path: &str| {
        let mut stream = std::net::TcpStream::connect(node.addr).expect("connect");
        use std::io::{Read, Write};
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            node.addr
        )
        .expect("write");
        let mut reply = String::new();
        stream.read_to_string(&mut reply).expect("read");
        reply.to_ascii_lowercase()
    };
    let page = head("/");
    assert!(page.starts_with("http/1.1 200"), "{page}");
    for header in [
        "content-type: text/html; charset=utf-8",
        "content-security-policy: default-src 'self'; script-src 'self'; style-src 'self'; \
         img-src 'self' blob:; object-src 'none'; frame-ancestors 'none'; base-uri 'none'; \
         form-action 'self'",
        "x-content-type-options: nosniff",
        "referrer-policy: no-referrer",
        "x-frame-options: deny",
    ] {
        assert!(page.contains(header), "no {header:?} in {page}");
    }
    let script = head("/console/app.js");
    assert!(
        script.contains("content-type: text/javascript; charset=utf-8"),
        "{script}"
    );
    assert!(script.contains("x-content-type-options: nosniff"));
    assert!(head("/console/app.css").contains("content-type: text/css; charset=utf-8"));
    // The icon a browser asks for without being told, and the one the page names.
    for icon in ["/favicon.ico", "/console/favicon.svg"] {
        assert!(head(icon).contains("content-type: image/svg+xml"), "{icon}");
    }
    let (status, body) = http_get(node.addr, "/console/nothing.js").expect("GET");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("not_found"), "{body}");
    let (status, _) = http_get(node.addr, "/index.html").expect("GET");
    assert_eq!(status, 404);
    // The API keeps its own sandbox policy.
    let api = head("/health");
    assert!(api.contains("content-security-policy: sandbox"), "{api}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_person_signs_in_launches_the_review_and_approves_it_from_the_inbox() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    initialize(&node).await;
    let browser = Browser::start("review", 1280, 900);

    // Not signed in: the page asks to sign in, with the focus in the email field; the keyboard
    // alone signs in (Tab to the password, Enter), and the focus is always visible.
    browser.goto(&url(&node, ""));
    browser.find("#sign-in", WAIT);
    assert_eq!(
        browser.run(
            "return [document.getElementById('nav'), document.getElementById('who')] \
                 .map((e) => e.offsetParent === null);",
            json!([])
        ),
        json!([true, true]),
        "signed out, the header shows no navigation and no sign-out"
    );
    browser.wait_until(
        "the focus in the email field",
        "return document.activeElement && document.activeElement.type === 'email';",
        WAIT,
    );
    browser.keys(&format!("{ADMIN}\u{E004}"));
    assert_eq!(
        browser.run(
            "const e = document.activeElement; \
             return [e.type, getComputedStyle(e).outlineStyle, getComputedStyle(e).outlineWidth];",
            json!([])
        ),
        json!(["password", "solid", "3px"]),
        "the focused field shows its focus"
    );
    browser.screenshot("01-sign-in");
    browser.keys(&format!("{PASSWORD}\u{E007}"));
    browser.wait_for_text("Nothing waits for you.", WAIT);
    browser.screenshot("02-inbox-empty");

    // Launch the review example from the workflows page.
    browser.click_on("a[data-nav=workflows]", WAIT);
    browser.click_on("details.card summary", WAIT);
    browser
        .find("textarea[name=script]", WAIT)
        .type_text(REVIEW);
    browser.click_on("form.launch button[type=submit]", WAIT);
    browser.find("#workflow-status", WAIT);
    let run_id = browser
        .run("return location.hash.split('/')[2];", json!([]))
        .as_str()
        .expect("run id in the hash")
        .to_owned();
    browser.wait_for_text("waiting_approval", WAIT);
    browser.wait_for_text("the evidence", WAIT);
    // The page follows the workflow's event stream (its poll is only a slow safety net).
    browser.wait_until(
        "the workflow page following its event stream",
        "return document.body.dataset.live === 'stream';",
        WAIT,
    );
    browser.screenshot("03-workflow-waiting");
    // From here on the page must never load again: this marker would be gone.
    browser.run("window.__sameDocument = 'yes';", json!([]));
    let workflow_tab = browser.current_tab();

    // The inbox, in a second tab, shows the checkpoint with the artifact's text and a count.
    let inbox_tab = browser.new_tab();
    browser.switch_to(&inbox_tab);
    browser.goto(&url(&node, "#/inbox"));
    let item = format!("[data-item='{run_id}/review/1']");
    browser.find(&item, WAIT);
    browser.wait_until(
        "the artifact's text in the inbox",
        &format!(
            "const p = document.querySelector(\"{item} .preview-text\"); \
             return p !== null && p.textContent === 'the evidence\\n';"
        ),
        WAIT,
    );
    assert!(
        browser.title().starts_with("(1) Inbox"),
        "{}",
        browser.title()
    );
    browser.screenshot("04-inbox-checkpoint");
    browser
        .find(&format!("{item} textarea[name=comment]"), WAIT)
        .type_text("looks right to me");
    browser.click_on(&format!("{item} button[data-action=approve]"), WAIT);
    browser.wait_for_text("Nothing waits for you.", WAIT);
    assert!(
        browser.title().starts_with("(0) Inbox"),
        "{}",
        browser.title()
    );
    browser.screenshot("05-inbox-answered");

    // The comment reached the workflow's control.
    let mut api = node.api();
    assert_eq!(api.login(ADMIN, PASSWORD).await.status, 200);
    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(record["result"]["decision"], "approve", "{record}");
    let comment = db
        .sql("SELECT body FROM workflow_controls WHERE kind = 'decide'")
        .await
        .expect("a decide control");
    assert!(comment.contains("looks right to me"), "{comment}");

    // The first tab shows `completed` without a reload.
    browser.switch_to(&workflow_tab);
    browser.wait_until(
        "the workflow page turning completed",
        "return document.querySelector('#workflow-status').textContent === 'completed';",
        WAIT,
    );
    assert_eq!(
        browser.run("return window.__sameDocument;", json!([])),
        "yes",
        "the workflow page was loaded again"
    );
    browser.wait_for_text("decided", WAIT);
    browser.screenshot("06-workflow-completed");

    // A state-changing request without the CSRF header is refused, even from the page itself.
    let refused = browser.run_async(
        "const done = arguments[arguments.length - 1];
         fetch('/api/v1/workflows', {method: 'POST', credentials: 'same-origin',
             headers: {'Content-Type': 'application/json'},
             body: JSON.stringify({script: 'return 1;'})})
           .then(async (r) => done({status: r.status, body: await r.json()}));",
        json!([]),
    );
    assert_eq!(refused["status"], 403, "{refused}");
    assert_eq!(refused["body"]["error"]["code"], "csrf", "{refused}");

    // The list, and the same pages on a phone.
    browser.goto(&url(&node, "#/workflows"));
    browser.find(&format!("tr[data-run='{run_id}']"), WAIT);
    browser.screenshot("07-workflows");
    browser.resize(390, 844);
    browser.goto(&url(&node, "#/workflows"));
    browser.find(&format!("tr[data-run='{run_id}']"), WAIT);
    browser.screenshot("08-phone-workflows");
    browser.goto(&url(&node, &format!("#/workflows/{run_id}")));
    browser.wait_for_text("completed", WAIT);
    browser.screenshot("09-phone-workflow");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agents_request_is_answered_from_the_inbox_and_another_user_sees_nothing() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let run_id = launch(&mut api, ASKING).await;
    let browser = Browser::start("agent-request", 1280, 900);
    sign_in(&browser, &node, ADMIN);

    let item = format!("[data-item='{run_id}/ask/1']");
    browser.goto(&url(&node, "#/inbox"));
    browser.find(&format!("{item}[data-kind=agent_request]"), WAIT);
    browser.wait_until(
        "the requested action shown by name, with its fields",
        &format!(
            "const text = (css) => {{ \
                 const e = document.querySelector(\"{item} \" + css); \
                 return e === null ? null : e.textContent; }}; \
             return text('.action-name') === 'deploy' && \
                 text('.action-fields dt') === 'target' && text('.action-fields dd') === 'prod';"
        ),
        WAIT,
    );
    browser.screenshot("01-inbox-agent-request");
    browser
        .find(&format!("{item} textarea[name=comment]"), WAIT)
        .type_text("go ahead");
    browser.click_on(&format!("{item} button[data-action=approve]"), WAIT);
    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(
        record["result"],
        json!({"decision": "approve", "comment": "go ahead"}),
        "{record}"
    );
    browser.wait_for_text("Nothing waits for you.", WAIT);
    browser.goto(&url(&node, &format!("#/workflows/{run_id}")));
    browser.wait_for_text(&format!("Approved by {ADMIN}"), WAIT);
    browser.wait_until(
        "the answer's comment",
        "const c = document.querySelector('[data-step=ask] .answered q.comment'); \
         return c !== null && c.textContent === 'go ahead';",
        WAIT,
    );
    browser.screenshot("02-workflow-answered");

    // Admin pages.
    for (page, shows) in [("nodes", "running"), ("slots", "held across the cluster")] {
        browser.goto(&url(&node, &format!("#/admin/{page}")));
        browser.wait_for_text(shows, WAIT);
        browser.screenshot(&format!("03-admin-{page}"));
    }
    browser.goto(&url(&node, "#/tokens"));
    browser.find("#tokens", WAIT);
    browser.find("input[name=name]", WAIT).type_text("ci");
    browser.click_on("form.card button[type=submit]", WAIT);
    browser.wait_for_text("it is not shown again", WAIT);
    browser.find("[data-token]", WAIT);
    browser.screenshot("04-tokens");

    // The session ends behind the page's back: the next update brings back the sign-in page.
    let ended = browser.run_async(
        "const done = arguments[arguments.length - 1];
         const csrf = document.cookie.split('; ').find((c) => c.startsWith('csrf_token='))
             .split('=')[1];
         fetch('/api/v1/auth/logout', {method: 'POST', credentials: 'same-origin',
             headers: {'X-CSRF-Token': csrf}}).then((r) => done(r.status));",
        json!([]),
    );
    assert_eq!(ended, 200);
    browser.find("#sign-in", WAIT);
    browser.wait_for_text("Your session has ended", WAIT);
    browser.screenshot("05-session-ended");

    // A second user sees none of the first user's workflows.
    let created = api
        .call(
            "POST",
            "/api/v1/auth/users",
            Some(json!({"email": "bob@example.com", "password": PASSWORD})),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    sign_in(&browser, &node, "bob@example.com");
    browser.goto(&url(&node, "#/inbox"));
    browser.wait_for_text("Nothing waits for you.", WAIT);
    browser.goto(&url(&node, "#/workflows"));
    browser.wait_for_text("No workflows.", WAIT);
    assert!(!browser.page_text().contains(&run_id));
    browser.screenshot("06-second-user-workflows");
    browser.goto(&url(&node, &format!("#/workflows/{run_id}")));
    browser.wait_for_text("no workflow", WAIT);
    assert!(browser.all("[data-step]").is_empty());
    browser.screenshot("07-second-user-foreign-workflow");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stored_html_and_script_stay_inert_text_or_a_download() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let payload = serde_json::to_string(PAYLOAD).expect("json");
    let script = format!(
        r#"
        const w = await agent({{stepId: "w", agentRef: "scripted", task: {{
            write: [{{path: "/mnt/user-data/outputs/notes.txt", content: {payload}}},
                    {{path: "/mnt/user-data/outputs/page.html", content: {payload}}}],
            output: {payload}}}}});
        console.log("logged:", {payload});
        const text = await captureArtifact({{stepId: "text", sourceStepId: "w",
                                             path: "/mnt/user-data/outputs/notes.txt"}});
        const html = await captureArtifact({{stepId: "html", sourceStepId: "w",
                                             path: "/mnt/user-data/outputs/page.html"}});
        await humanCheckpoint({{stepId: "check-html", sourceStepId: "html",
                                artifactVersion: html.artifactVersion}});
        await humanCheckpoint({{stepId: "check-text", sourceStepId: "text",
                                artifactVersion: text.artifactVersion}});
        return {{payload: {payload}}};
        "#
    );
    let run_id = launch(&mut api, &script).await;
    wait_for(&mut api, &run_id, "waiting_approval").await;
    let browser = Browser::start("inert", 1280, 900);
    sign_in(&browser, &node, ADMIN);

    // The inbox previews the HTML checkpoint's artifact: a download, never a page.
    browser.goto(&url(&node, "#/inbox"));
    let item = format!("[data-item='{run_id}/check-html/1']");
    browser.find(&item, WAIT);
    browser.wait_for_text("Not shown here", WAIT);
    let html_version = browser
        .find(&format!("{item} [data-artifact]"), WAIT)
        .text();
    assert!(html_version.contains("Download version"), "{html_version}");
    assert_inert(&browser, "inbox");
    browser.screenshot("01-inbox-html-artifact");
    browser.click_on(&format!("{item} button[data-action=approve]"), WAIT);
    let item = format!("[data-item='{run_id}/check-text/1']");
    browser.wait_until(
        "the text artifact previewed as text",
        &format!(
            "const p = document.querySelector(\"{item} .preview-text\"); \
             return p !== null && p.textContent.includes('<script>window.__pwned');"
        ),
        WAIT,
    );
    assert_inert(&browser, "inbox");
    browser.screenshot("02-inbox-text-artifact");

    // The workflow page: the step's output as text, each artifact as text or a download.
    browser.goto(&url(&node, &format!("#/workflows/{run_id}")));
    browser.find("[data-step=w] .output pre", WAIT);
    browser.wait_until(
        "every preview settled",
        "return document.querySelectorAll('.preview-body').length >= 3 && \
         [...document.querySelectorAll('.preview-body')].every((b) => \
             !b.textContent.startsWith('Loading'));",
        WAIT,
    );
    // Its console.log line, from the event stream, as text.
    browser.wait_until(
        "the console.log line shown",
        "const l = document.querySelector('#logs pre'); \
         return l !== null && l.textContent.startsWith('logged: <script>');",
        WAIT,
    );
    let output = browser.find("[data-step=w] .output pre", WAIT).text();
    assert!(
        output.contains("<script>window.__pwned = 1</script>"),
        "{output}"
    );
    let previews = browser.run(
        "return [...document.querySelectorAll('.artifacts [data-artifact]')].map((a) => ({
            version: a.dataset.artifact,
            text: a.querySelector('.preview-text') ? a.querySelector('.preview-text').textContent : null,
            download: a.querySelector('a.download') !== null,
         }));",
        json!([]),
    );
    let previews = previews.as_array().expect("previews").clone();
    let texts: Vec<&Value> = previews.iter().map(|p| &p["text"]).collect();
    assert!(
        texts.iter().any(|t| t.as_str() == Some(PAYLOAD)),
        "the .txt artifact is shown as its text: {previews:?}"
    );
    assert!(
        texts.iter().any(|t| t
            .as_str()
            .is_some_and(|t| t.starts_with("\"<script>window.__pwned"))),
        "the step's output (JSON) is shown as text: {previews:?}"
    );
    assert!(
        texts.iter().any(|t| t.is_null()),
        "the .html artifact is not shown: {previews:?}"
    );
    assert!(previews.iter().all(|p| p["download"] == true));
    assert_inert(&browser, "workflow page");
    browser.screenshot("03-workflow-inert");
}

/// What a person reads first in the inbox and on a workflow's page (issue 32, item 6): titles
/// beside run ids (also in the tab's title), a pause's message, an agent's requested actions as
/// a list rather than JSON, the `waiting_for_input` status, and an approver's comment; a title
/// made of markup stays text everywhere it is shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn titles_messages_actions_and_comments_read_well_and_stay_text() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let titled = |script: &str, title: &str| json!({"script": script, "title": title});
    let mut launch_titled = async |script: &str, title: &str| {
        let answer = api.action("launch", titled(script, title)).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        answer.json()["run_id"].as_str().expect("run_id").to_owned()
    };
    // The oldest, with no reminder: the overdue pause goes before it all the same.
    let marked = launch_titled(r#"return await pause({stepId: "p"});"#, PAYLOAD).await;
    let review = launch_titled(REVIEW, "Evidence review for the audit").await;
    let numbers = launch_titled(
        r#"return await pause({stepId: "numbers", remindAfterMs: 1, message:
            "Check the Q3 numbers in the shared sheet; resume with {\"ok\": true} when they add up."});"#,
        "Quarterly numbers",
    )
    .await;
    let deploy = launch_titled(
        r##"const r = await agent({stepId: "release", agentRef: "scripted", task: {
            ask_approval: {request_id: "release-1", actions: [
                {tool: "deploy", args: {service: "billing", version: "1.2.0", target: "prod"}},
                {tool: "notify", channel: "#releases", text: "billing 1.2.0 is live"}]}}});
           return r.approval.answer.decision;"##,
        "Release billing 1.2.0",
    )
    .await;
    let mut api = node.api();
    assert_eq!(api.login(ADMIN, PASSWORD).await.status, 200);
    wait_for(&mut api, &review, "waiting_approval").await;
    wait_for(&mut api, &numbers, "paused").await;
    wait_for(&mut api, &marked, "paused").await;
    wait_for(&mut api, &deploy, "waiting_for_input").await;

    let browser = Browser::start("people", 1280, 1400);
    sign_in(&browser, &node, ADMIN);
    browser.goto(&url(&node, "#/inbox"));
    let item = |run_id: &str, step: &str| format!("[data-item='{run_id}/{step}/1']");
    browser.find(&item(&deploy, "release"), WAIT);
    browser.wait_until(
        "every item, each named by its title beside its run id",
        "return document.querySelectorAll('#inbox li.item .named .title').length === 4;",
        WAIT,
    );
    let names = browser.run(
        "return [...document.querySelectorAll('#inbox li.item')].map((li) => [
            li.dataset.item.split('/')[0],
            li.querySelector('.named .title').textContent,
            li.querySelector('.named .run-id').textContent]);",
        json!([]),
    );
    for (run_id, title) in [
        (&review, "Evidence review for the audit"),
        (&numbers, "Quarterly numbers"),
        (&deploy, "Release billing 1.2.0"),
        (&marked, PAYLOAD),
    ] {
        assert!(
            names
                .as_array()
                .expect("names")
                .contains(&json!([run_id, title, run_id])),
            "{run_id} {title:?} not in {names}"
        );
    }
    browser.wait_until(
        "the pause past its remindAfterMs marked overdue, and no other item",
        &format!(
            "const marked = [...document.querySelectorAll('#inbox [data-overdue]')]; \
             return marked.length === 1 && marked[0].closest('li.item') === \
               document.querySelector(\"{}\");",
            item(&numbers, "numbers")
        ),
        WAIT,
    );
    // Overdue first, though the marked pause has waited longer.
    browser.wait_until(
        "the overdue item first",
        &format!(
            "return document.querySelector('#inbox li.item') === document.querySelector(\"{}\");",
            item(&numbers, "numbers")
        ),
        WAIT,
    );
    let (_, metrics) = crate::harness::http_get(node.addr, "/metrics").expect("metrics");
    assert!(metrics.contains("\nreins_inbox_overdue 1\n"), "{metrics}");
    browser.wait_until(
        "the pause's message",
        &format!(
            "const m = document.querySelector(\"{} .pause-message\"); \
             return m !== null && m.textContent.startsWith('Check the Q3 numbers');",
            item(&numbers, "numbers")
        ),
        WAIT,
    );
    let actions = browser.run(
        &format!(
            "return [...document.querySelectorAll(\"{} .actions > li\")].map((li) => [
                li.querySelector('.action-name').textContent,
                [...li.querySelectorAll('dt')].map((d) => d.textContent).join(','),
                [...li.querySelectorAll('dd')].map((d) => d.textContent).join(',')]);",
            item(&deploy, "release")
        ),
        json!([]),
    );
    assert_eq!(
        actions,
        json!([
            ["deploy", "service,target,version", "billing,prod,1.2.0"],
            ["notify", "channel,text", "#releases,billing 1.2.0 is live"]
        ])
    );
    browser.wait_until(
        "the checkpoint's artifact previewed",
        &format!(
            "return document.querySelector(\"{} .preview-text\") !== null;",
            item(&review, "review")
        ),
        WAIT,
    );
    assert_inert(&browser, "inbox");
    browser.screenshot("01-inbox-titles-message-actions");

    // The list names them too, and filters on the status a person reads.
    browser.goto(&url(&node, "#/workflows"));
    browser.find(&format!("tr[data-run='{marked}'] .named .title"), WAIT);
    assert_eq!(
        browser
            .find(&format!("tr[data-run='{marked}'] .named .title"), WAIT)
            .text(),
        PAYLOAD
    );
    assert_eq!(
        browser
            .find(&format!("tr[data-run='{deploy}'] .badge"), WAIT)
            .text(),
        "waiting_for_input"
    );
    assert_inert(&browser, "workflows");
    browser.screenshot("02-workflows-titles");

    // The workflow page and the tab: the title, the run id beside it, as text.
    browser.goto(&url(&node, &format!("#/workflows/{marked}")));
    browser.wait_until(
        "the marked-up title as the page's heading",
        &format!(
            "const h = document.getElementById('workflow-title'); \
             return h !== null && h.textContent === {};",
            serde_json::to_string(PAYLOAD).expect("json")
        ),
        WAIT,
    );
    browser.wait_until(
        "the tab titled by it",
        &format!(
            "return document.title === {};",
            serde_json::to_string(&format!("{PAYLOAD} ({marked}) · reins")).expect("json")
        ),
        WAIT,
    );
    assert_inert(&browser, "workflow page");
    browser.goto(&url(&node, &format!("#/workflows/{deploy}")));
    browser.wait_until(
        "the agent's step with its actions and the answer form",
        "const s = document.querySelector('#workflow-status'); \
         return s !== null && s.textContent === 'waiting_for_input' \
             && document.querySelectorAll('[data-step=release] .actions > li').length === 2 \
             && document.querySelector('[data-step=release] button[data-action=approve]') !== null;",
        WAIT,
    );
    browser.screenshot("03-workflow-waiting-for-input");

    // An approver's comment, on the checkpoint it decided.
    browser.goto(&url(&node, "#/inbox"));
    let checkpoint = item(&review, "review");
    browser
        .find(&format!("{checkpoint} textarea[name=comment]"), WAIT)
        .type_text("The evidence matches the ledger; approved for the audit file.");
    browser.click_on(&format!("{checkpoint} button[data-action=approve]"), WAIT);
    wait_for(&mut api, &review, "completed").await;
    browser.goto(&url(&node, &format!("#/workflows/{review}")));
    browser.wait_until(
        "the approver's comment on the checkpoint",
        "const c = document.querySelector('[data-step=review] q.comment'); \
         return c !== null && c.textContent.startsWith('The evidence matches the ledger');",
        WAIT,
    );
    browser.wait_for_text(&format!("by {ADMIN}"), WAIT);
    browser.screenshot("04-workflow-approvers-comment");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pause_is_resumed_a_workflow_cancelled_and_deleted_and_the_list_pages() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let first = launch(&mut api, "return 0;").await;
    wait_for(&mut api, &first, "completed").await;
    for _ in 0..26 {
        launch(&mut api, "return 1;").await;
    }
    let pausing = launch(&mut api, PAUSING).await;
    let doomed = launch(&mut api, PAUSING).await;
    wait_for(&mut api, &pausing, "paused").await;
    wait_for(&mut api, &doomed, "paused").await;
    let browser = Browser::start("controls", 1280, 900);
    sign_in(&browser, &node, ADMIN);

    // The list: newest first, 25 a page; the oldest is on the second page.
    browser.goto(&url(&node, "#/workflows"));
    browser.find(&format!("tr[data-run='{doomed}']"), WAIT);
    let first_row = browser.run(
        "return document.querySelector('tbody tr').dataset.run;",
        json!([]),
    );
    assert_eq!(first_row, doomed.as_str(), "newest first");
    assert!(browser.all(&format!("tr[data-run='{first}']")).is_empty());
    assert_eq!(browser.all("tbody tr").len(), 25);
    browser.wait_for_text("Page 1", WAIT);
    browser.screenshot("01-workflows-page-1");
    browser.click_on(".pager button:last-child", WAIT);
    browser.find(&format!("tr[data-run='{first}']"), WAIT);
    browser.wait_for_text("Page 2", WAIT);
    assert_eq!(browser.all("tbody tr").len(), 4);
    browser.screenshot("02-workflows-page-2");
    browser.click_on(".pager button:first-child", WAIT);
    browser.find(&format!("tr[data-run='{doomed}']"), WAIT);
    // Filtered by status.
    browser.find(".filters select", WAIT);
    browser.run(
        "const s = document.querySelector('.filters select'); s.value = 'paused'; \
         s.dispatchEvent(new Event('change'));",
        json!([]),
    );
    browser.wait_until(
        "only the two paused workflows listed",
        "return document.querySelectorAll('tbody tr').length === 2;",
        WAIT,
    );
    // Found by its request id.
    let launched = api
        .call(
            "POST",
            "/api/v1/workflows",
            Some(json!({"script": "return 2;", "request_id": "nightly-7"})),
        )
        .await;
    assert_eq!(launched.status, 201, "{launched:?}");
    let nightly = launched.json()["run_id"]
        .as_str()
        .expect("run_id")
        .to_owned();
    browser
        .find("input[type=search]", WAIT)
        .type_text("nightly-7");
    browser.click_on("form.search button", WAIT);
    browser.wait_until(
        "the workflow found by its request id",
        &format!("return location.hash === '#/workflows/{nightly}';"),
        WAIT,
    );

    // A pause resumed from the inbox with an input.
    browser.goto(&url(&node, "#/inbox"));
    let item = format!("[data-item='{pausing}/wait-here/1']");
    browser
        .find(&format!("{item} textarea[name=input]"), WAIT)
        .type_text(r#"{"answer": 42}"#);
    browser.screenshot("03-inbox-pauses");
    browser.click_on(&format!("{item} button[data-action=resume]"), WAIT);
    let record = wait_for(&mut api, &pausing, "completed").await;
    assert_eq!(record["result"], json!({"answer": 42}), "{record}");

    // Cancelled from its page, then deleted (the console asks before it deletes).
    browser.goto(&url(&node, &format!("#/workflows/{doomed}")));
    browser.click_on("button[data-action=cancel]", WAIT);
    browser.wait_until(
        "the workflow page turning cancelled",
        "return document.querySelector('#workflow-status').textContent === 'cancelled';",
        WAIT,
    );
    browser.wait_for_text("unanswered", WAIT);
    assert!(
        browser.all("button[data-action=resume]").is_empty(),
        "nothing to answer in a cancelled workflow"
    );
    browser.click_on(".confirm button.danger", WAIT);
    browser.screenshot("04-delete-asks");
    browser.click_on(".confirm button.danger", WAIT);
    browser.wait_until(
        "back on the list",
        "return location.hash === '#/workflows';",
        WAIT,
    );
    let gone = api
        .call("GET", &format!("/api/v1/workflows/{doomed}"), None)
        .await;
    assert_eq!(gone.status, 404, "{gone:?}");
}

/// Twelve agent steps, each output kept as an artifact version.
const TWELVE: &str = r#"
    for (let i = 0; i < 12; i++) {
        await agent({stepId: `s${i}`, agentRef: "scripted", task: {output: i}});
    }
    return "done";
"#;

/// The workflow page follows the record's pages (issue 29, item 5): with two steps and two
/// artifact versions a page, it shows the first five pages of steps and one of artifacts, and
/// "More steps" and "More artifacts" read on until there is no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_workflow_page_reads_further_pages_of_steps_and_artifacts() {
    let db = Db::new(false).await;
    let node = Node::start(
        &db,
        &[
            ("REINS_HTTP__RECORD_STEPS_PAGE_MAX", "2".to_owned()),
            ("REINS_HTTP__RECORD_ARTIFACTS_PAGE_MAX", "2".to_owned()),
        ],
    );
    let mut api = initialize(&node).await;
    let run_id = launch(&mut api, TWELVE).await;
    wait_for(&mut api, &run_id, "completed").await;
    let browser = Browser::start("pages", 1280, 900);
    sign_in(&browser, &node, ADMIN);

    browser.goto(&url(&node, &format!("#/workflows/{run_id}")));
    let count = |css: &str| format!("return document.querySelectorAll('{css}').length;");
    browser.find("#more-steps", WAIT);
    assert_eq!(
        browser.run(&count("#workflow li[data-step]"), json!([])),
        10
    );
    browser.wait_for_text("The first 10 steps; more follow.", WAIT);
    assert_eq!(
        browser.run(&count("#workflow figure[data-artifact]"), json!([])),
        2
    );
    browser.screenshot("01-first-pages");

    browser.click_on("#more-steps", WAIT);
    browser.wait_until(
        "every step shown",
        "return document.querySelectorAll('#workflow li[data-step]').length === 12 \
           && !document.getElementById('more-steps') \
           && document.querySelector('#workflow li[data-step]:last-of-type').dataset.step \
              === 's11';",
        WAIT,
    );
    // One page at a time: a click on a button the page is about to replace could be lost.
    for shown in [4, 6, 8, 10] {
        browser.click_on("#more-artifacts", WAIT);
        browser.wait_until(
            &format!("{shown} artifact versions shown"),
            &format!(
                "return document.querySelectorAll('#workflow figure[data-artifact]').length \
                   === {shown};"
            ),
            WAIT,
        );
    }
    browser.click_on("#more-artifacts", WAIT);
    browser.wait_until(
        "every artifact version shown",
        "return document.querySelectorAll('#workflow figure[data-artifact]').length === 12 \
           && !document.getElementById('more-artifacts');",
        WAIT,
    );
    browser.screenshot("02-every-page");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admin_recovers_and_reconciles_an_uncertain_step_from_the_workflow_page() {
    let db = Db::new(false).await;
    let faults = tempfile::tempdir().expect("fault dir");
    std::fs::write(faults.path().join("hold_model"), b"").expect("hold");
    let node = Node::start(
        &db,
        &[("REINS_FAULT_DIR", faults.path().display().to_string())],
    );
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        "const r = await agent({stepId: 'held', agentRef: 'scripted', \
         task: {hold_while: 'hold_model', output: 'real'}}); return r.output;",
    )
    .await;
    let browser = Browser::start("reconcile", 1280, 900);
    sign_in(&browser, &node, ADMIN);
    browser.goto(&url(&node, &format!("#/workflows/{run_id}")));
    browser.wait_until(
        "the step running",
        "const s = document.querySelector('[data-step=held] .badge'); \
         return s !== null && s.textContent === 'running';",
        WAIT,
    );
    // The operator moves the workflow away while its child runs: recoverable, then, recovered,
    // its step's outcome is unknown.
    crate::operators::admin_json(&node.admin_socket(), &["fence", &run_id]);
    browser.find("button[data-action=recover]", WAIT);
    browser.screenshot("01-recoverable");
    browser.click_on("button[data-action=recover]", WAIT);
    browser.find("form.reconcile", WAIT);
    browser.wait_for_text("needs_reconciliation", WAIT);
    browser.screenshot("02-needs-reconciliation");
    browser.run(
        "document.querySelector('form.reconcile select[name=resolution]').value = 'complete';",
        json!([]),
    );
    browser
        .find("form.reconcile textarea[name=output]", WAIT)
        .type_text(r#""checked by hand""#);
    browser
        .find("form.reconcile input[name=reason]", WAIT)
        .type_text("the agent's effects were checked");
    browser.click_on("form.reconcile button[type=submit]", WAIT);
    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(record["result"], "checked by hand", "{record}");
    browser.wait_until(
        "the page turning completed",
        "return document.querySelector('#workflow-status').textContent === 'completed';",
        WAIT,
    );
    browser.screenshot("03-reconciled");
    // Issue 40: the reconcile's reason stays on the workflow's page, with the attempt it settled.
    browser.wait_for_text("the agent's effects were checked", WAIT);
    let entry = browser
        .find(".timeline li[data-step=held] .reconciled", WAIT)
        .text();
    assert!(
        entry.contains(&format!("Reconciled by {ADMIN} (complete)")),
        "{entry}"
    );
}

/// Issue 40: an inbox item whose workflow no node runs (recoverable) was offered for an answer
/// with no warning; it says so, and what happens to the answer. Its deadline shows too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_inbox_item_of_a_workflow_no_node_runs_says_so_and_when_its_answer_applies() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        "return await pause({stepId: 'p', message: 'sign here', timeoutMs: 86400000});",
    )
    .await;
    wait_for(&mut api, &run_id, "paused").await;
    crate::operators::admin_json(&node.admin_socket(), &["fence", &run_id]);
    wait_for(&mut api, &run_id, "recoverable").await;
    let browser = Browser::start("inbox-recoverable", 1280, 900);
    sign_in(&browser, &node, ADMIN);
    browser.goto(&url(&node, "#/inbox"));
    let item = format!("[data-item='{run_id}/p/1']");
    let warning = browser
        .find(&format!("{item} .recoverable-warning"), WAIT)
        .text();
    assert!(
        warning.contains("No node runs this workflow")
            && warning.contains("applied when a node takes it over"),
        "{warning}"
    );
    let deadline = browser.find(&format!("{item} .deadline"), WAIT).text();
    assert!(deadline.contains("its timeout decides it at"), "{deadline}");
    browser.screenshot("01-inbox-recoverable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_workflow_is_retried_from_its_page_and_the_two_name_each_other() {
    let db = Db::new(false).await;
    let files = tempfile::tempdir().expect("temp dir");
    let node = crate::retry::node_with_gate(&db, files.path(), &[]);
    let mut api = initialize(&node).await;
    let failed = launch(&mut api, crate::retry::SCRIPT).await;
    wait_for(&mut api, &failed, "failed").await;
    let browser = Browser::start("retry", 1280, 900);
    sign_in(&browser, &node, ADMIN);
    browser.goto(&url(&node, &format!("#/workflows/{failed}")));
    browser.find("button[data-action=retry]", WAIT);
    browser.wait_for_text("the gate is closed", WAIT);
    browser.screenshot("01-failed");

    std::fs::remove_file(files.path().join("gate")).expect("open the gate");
    browser.click_on("button[data-action=retry]", WAIT);
    browser.wait_until(
        "the retry's page",
        &format!(
            "return location.hash.startsWith('#/workflows/') && location.hash !== '#/workflows/{failed}';"
        ),
        WAIT,
    );
    let retry = browser
        .run(
            "return location.hash.slice('#/workflows/'.length);",
            json!([]),
        )
        .as_str()
        .expect("the retry's id")
        .to_owned();
    browser.wait_until(
        "the retry completing",
        "return document.querySelector('#workflow-status').textContent === 'completed';",
        WAIT,
    );
    let link = browser.find("#retry-of a", WAIT);
    assert_eq!(link.text(), failed);
    assert!(
        browser
            .find("#retry-of", WAIT)
            .text()
            .starts_with("Retry of "),
        "the retry names what it retries"
    );
    assert!(
        browser.all("button[data-action=retry]").is_empty(),
        "a completed workflow"
    );
    browser.screenshot("02-retry-completed");
    let record = wait_for(&mut api, &retry, "completed").await;
    assert_eq!(record["retry_of"], json!(failed), "{record}");

    // The failed one stays failed, names its retry, and offers no second one.
    browser.click_on("#retry-of a", WAIT);
    browser.find("#retried-by a", WAIT);
    assert_eq!(browser.find("#retried-by a", WAIT).text(), retry);
    assert!(
        browser
            .find("#retried-by", WAIT)
            .text()
            .starts_with("Retried as "),
        "the failed workflow names its retry"
    );
    assert_eq!(browser.find("#workflow-status", WAIT).text(), "failed");
    assert!(
        browser.all("button[data-action=retry]").is_empty(),
        "retried already"
    );
    browser.screenshot("03-failed-retried");
}

/// The id of the user with `email`, as the admin's list shows it.
async fn user_id(api: &mut crate::http_client::Api, email: &str) -> String {
    let users = api.call("GET", "/api/v1/auth/users", None).await.json();
    users["users"]
        .as_array()
        .and_then(|users| users.iter().find(|u| u["email"] == email))
        .and_then(|u| u["id"].as_str())
        .unwrap_or_else(|| panic!("no user {email} in {users}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admin_manages_users_and_an_approver_answers_anyones_checkpoint() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let mut admin = initialize(&node).await;
    let checking = launch(&mut admin, CHECKING).await;
    wait_for(&mut admin, &checking, "waiting_approval").await;
    let browser = Browser::start("users", 1280, 900);
    sign_in(&browser, &node, ADMIN);

    // Two users made from the Users page.
    browser.goto(&url(&node, "#/admin/users"));
    for (email, role) in [("ann@example.com", "approver"), ("dan@example.com", "user")] {
        browser
            .find("#new-user input[name=email]", WAIT)
            .type_text(email);
        browser
            .find("#new-user input[name=password]", WAIT)
            .type_text(PASSWORD);
        browser.run(
            "document.querySelector('#new-user select[name=role]').value = arguments[0];",
            json!([role]),
        );
        browser.click_on("#new-user button[type=submit]", WAIT);
        browser.wait_for_text(&format!("Created {email}."), WAIT);
    }
    let ann = user_id(&mut admin, "ann@example.com").await;
    let dan = user_id(&mut admin, "dan@example.com").await;
    let card = |id: &str| format!("[data-user='{id}']");
    browser.find(&card(&dan), WAIT);
    browser.screenshot("01-users");

    // Dan: disabled (his session ends), enabled, a new password, signed out everywhere, deleted.
    let mut dan_api = node.api();
    assert_eq!(dan_api.login("dan@example.com", PASSWORD).await.status, 200);
    browser.click_on(&format!("{} button[data-action=disable]", card(&dan)), WAIT);
    browser.find(&format!("{} button[data-action=enable]", card(&dan)), WAIT);
    assert_eq!(
        dan_api.call("GET", "/api/v1/auth/me", None).await.status,
        401
    );
    browser.click_on(&format!("{} button[data-action=enable]", card(&dan)), WAIT);
    browser.find(&format!("{} button[data-action=disable]", card(&dan)), WAIT);
    let fresh = "another correct horse";
    browser
        .find(&format!("{} input[name=password]", card(&dan)), WAIT)
        .type_text(fresh);
    browser.click_on(
        &format!("{} button[data-action=password]", card(&dan)),
        WAIT,
    );
    browser.wait_for_text("Password reset", WAIT);
    assert_eq!(dan_api.login("dan@example.com", PASSWORD).await.status, 401);
    assert_eq!(dan_api.login("dan@example.com", fresh).await.status, 200);
    browser.click_on(
        &format!("{} button[data-action=sign-out]", card(&dan)),
        WAIT,
    );
    browser.wait_for_text("Signed out everywhere", WAIT);
    assert_eq!(
        dan_api.call("GET", "/api/v1/auth/me", None).await.status,
        401
    );
    browser.click_on(&format!("{} .confirm button.danger", card(&dan)), WAIT);
    browser.click_on(&format!("{} .confirm button.danger", card(&dan)), WAIT);
    browser.wait_until(
        "dan's card gone",
        &format!(
            "return document.querySelector(\"{}\") === null;",
            card(&dan)
        ),
        WAIT,
    );
    // The role select saves.
    browser.run(
        "document.querySelector(arguments[0] + ' select[name=role]').value = 'approver';",
        json!([card(&ann)]),
    );
    browser.click_on(&format!("{} button[data-action=role]", card(&ann)), WAIT);
    browser.wait_for_text("Role saved", WAIT);
    browser.screenshot("02-users-changed");

    // Ann, an approver, answers the admin's checkpoint but sees no admin page.
    browser.click_on("#sign-out", WAIT);
    browser.find("#sign-in", WAIT);
    sign_in(&browser, &node, "ann@example.com");
    assert!(browser.all("[data-admin]:not([hidden])").is_empty());
    browser.goto(&url(&node, "#/inbox"));
    let item = format!("[data-item='{checking}/look/1']");
    browser.click_on(&format!("{item} button[data-action=approve]"), WAIT);
    let record = wait_for(&mut admin, &checking, "completed").await;
    assert_eq!(record["checkpoints"][0]["decided_by"], "ann@example.com");
    browser.goto(&url(&node, &format!("#/workflows/{checking}")));
    browser.wait_for_text("completed", WAIT);
    assert!(
        browser
            .all("button[data-action=cancel], .confirm")
            .is_empty(),
        "an approver may not control another's workflow"
    );
    browser.screenshot("03-approver-workflow");

    // Her account: a new password, then signed out everywhere.
    browser.goto(&url(&node, "#/account"));
    let inputs = browser.all("input[type=password]");
    inputs[0].type_text(PASSWORD);
    inputs[1].type_text("ann's brand new password");
    browser.click_on("form.card button[type=submit]", WAIT);
    browser.wait_for_text("Your password is changed", WAIT);
    browser.screenshot("04-account");
    browser.click_on(".confirm button.danger", WAIT);
    browser.click_on(".confirm button.danger", WAIT);
    browser.find("#sign-in", WAIT);
    browser.wait_for_text("signed out everywhere", WAIT);
    let mut ann_api = node.api();
    assert_eq!(
        ann_api
            .login("ann@example.com", "ann's brand new password")
            .await
            .status,
        200
    );
    assert!(!ann.is_empty());
}

/// A pause, a checkpoint and an agent's request; a pause beside a running agent (the workflow
/// stays `running`); and a completed workflow: the inbox shows exactly what waits, oldest first.
const PAUSING: &str =
    r#"return await pause({stepId: "wait-here", message: "Check the <b>numbers</b> first"});"#;
const CHECKING: &str = r#"
    const a = await agent({stepId: "a", agentRef: "scripted", task: {output: "v"}});
    return await humanCheckpoint({stepId: "look", sourceStepId: "a",
                                  artifactVersion: a.artifactVersion});
"#;
const PAUSE_BESIDE_AN_AGENT: &str = r#"
    return await parallel([
        () => pause({stepId: "side"}),
        () => agent({stepId: "slow", agentRef: "scripted", task: {sleep_ms: 600000}}),
    ]);
"#;

both!(the_inbox_shows_what_waits_for_the_caller_oldest_first_within_its_bound);
async fn the_inbox_shows_what_waits_for_the_caller_oldest_first_within_its_bound(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(&db, &[("REINS_HTTP__INBOX_WORKFLOWS_MAX", "4".to_owned())]);
    let mut admin = initialize(&node).await;
    launch(&mut admin, "return 1;").await;
    let pausing = launch(&mut admin, PAUSING).await;
    wait_for(&mut admin, &pausing, "paused").await;
    let checking = launch(&mut admin, CHECKING).await;
    wait_for(&mut admin, &checking, "waiting_approval").await;
    let asking = launch(&mut admin, ASKING).await;
    // Each waits before the next is launched: the inbox orders by how long each has waited.
    poll_inbox(&mut admin, 3).await;
    let beside = launch(&mut admin, PAUSE_BESIDE_AN_AGENT).await;

    let expected = [
        (pausing.as_str(), "pause", "wait-here"),
        (checking.as_str(), "humanCheckpoint", "look"),
        (asking.as_str(), "agent_request", "ask"),
        (beside.as_str(), "pause", "side"),
    ];
    let inbox = poll_inbox(&mut admin, expected.len()).await;
    let items = inbox["items"].as_array().expect("items");
    let seen: Vec<(&str, &str, &str)> = items
        .iter()
        .map(|i| {
            (
                i["run_id"].as_str().unwrap_or_default(),
                i["kind"].as_str().unwrap_or_default(),
                i["step_id"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(seen, expected, "{inbox}");
    assert_eq!(inbox["more"], false, "{inbox}");
    assert_eq!(items[1]["artifact_version"], 1, "{inbox}");
    assert_eq!(items[2]["approval"]["request_id"], "deploy-1", "{inbox}");
    // Issue 32: the pause's message goes with it, as the script wrote it.
    assert_eq!(
        items[0]["message"], "Check the <b>numbers</b> first",
        "{inbox}"
    );
    assert_eq!(items[3]["message"], Value::Null, "{inbox}");
    let record = admin
        .call("GET", &format!("/api/v1/workflows/{beside}"), None)
        .await;
    assert_eq!(record.json()["status"], "running", "{record:?}");
    let since: Vec<f64> = items.iter().filter_map(|i| i["since"].as_f64()).collect();
    assert!(since.windows(2).all(|w| w[0] <= w[1]), "{since:?}");

    // One more waiting workflow than the bound reads: the oldest four, and `more`.
    let fifth = launch(&mut admin, PAUSING).await;
    wait_for(&mut admin, &fifth, "paused").await;
    let inbox = admin.call("GET", "/api/v1/inbox", None).await.json();
    assert_eq!(inbox["more"], true, "{inbox}");
    assert!(
        !inbox.to_string().contains(&fifth),
        "the newest is past the bound: {inbox}"
    );

    // Answered, it leaves the inbox.
    let resumed = admin
        .call(
            "POST",
            &format!("/api/v1/workflows/{pausing}/resume"),
            Some(
                json!({"fingerprint": items[0]["fingerprint"], "step_id": "wait-here",
                        "attempt": 1, "input": 5}),
            ),
        )
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    wait_for(&mut admin, &pausing, "completed").await;
    let inbox = admin.call("GET", "/api/v1/inbox", None).await.json();
    assert!(!inbox.to_string().contains(&pausing), "{inbox}");
    // `get` shows the pause's message, and the approver's comment beside their decision.
    let decided = admin
        .call(
            "POST",
            &format!("/api/v1/workflows/{checking}/decide"),
            Some(
                json!({"step_id": "look", "attempt": 1, "artifact_version": 1,
                        "decision": "approve", "comment": "ship it"}),
            ),
        )
        .await;
    assert_eq!(decided.status, 200, "{decided:?}");
    let record = wait_for(&mut admin, &checking, "completed").await;
    assert_eq!(record["checkpoints"][0]["comment"], "ship it", "{record}");
    assert_eq!(record["checkpoints"][0]["decided_by"], ADMIN, "{record}");
    let record = admin
        .call("GET", &format!("/api/v1/workflows/{pausing}"), None)
        .await
        .json();
    assert_eq!(
        record["checkpoints"][0]["message"],
        "Check the <b>numbers</b> first"
    );
    assert!(inbox.to_string().contains(&fifth), "{inbox}");

    // Another user sees nothing of the admin's, and their own pause only; the admin lists are
    // for admins.
    let created = admin
        .call(
            "POST",
            "/api/v1/auth/users",
            Some(json!({"email": "carol@example.com", "password": PASSWORD})),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let mut carol = node.api();
    assert_eq!(carol.login("carol@example.com", PASSWORD).await.status, 200);
    assert_eq!(
        carol.call("GET", "/api/v1/inbox", None).await.json(),
        json!({"items": [], "more": false, "unreadable": []})
    );
    let hers = launch(&mut carol, PAUSING).await;
    let inbox = poll_inbox(&mut carol, 1).await;
    assert_eq!(inbox["items"][0]["run_id"], hers.as_str(), "{inbox}");

    // The list by owner and by request id: an admin may name anyone, a user only finds her own.
    let carol_id = inbox["items"][0]["user_id"]
        .as_str()
        .expect("user")
        .to_owned();
    let admin_id = items[0]["user_id"].as_str().expect("user").to_owned();
    let listed = |answer: crate::http_client::Answer| -> Vec<String> {
        assert_eq!(answer.status, 200, "{answer:?}");
        answer.json()["workflows"]
            .as_array()
            .expect("workflows")
            .iter()
            .map(|w| w["run_id"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let path = |query: &str| format!("/api/v1/workflows?{query}");
    assert_eq!(
        listed(
            admin
                .call("GET", &path(&format!("user_id={carol_id}")), None)
                .await
        ),
        vec![hers.clone()]
    );
    assert_eq!(
        listed(
            carol
                .call("GET", &path(&format!("user_id={admin_id}")), None)
                .await
        ),
        vec![hers.clone()],
        "a user's listing is her own whatever she names"
    );
    let tagged = admin
        .call(
            "POST",
            "/api/v1/workflows",
            Some(json!({"script": "return 3;", "request_id": "tag-1"})),
        )
        .await;
    let tagged = tagged.json()["run_id"].as_str().expect("run_id").to_owned();
    assert_eq!(
        listed(admin.call("GET", &path("request_id=tag-1"), None).await),
        vec![tagged]
    );
    assert!(listed(carol.call("GET", &path("request_id=tag-1"), None).await).is_empty());
    let bad = admin
        .call("GET", &path("request_id=no%20spaces"), None)
        .await;
    assert_eq!(bad.status, 400, "{bad:?}");
    for path in ["/api/v1/admin/nodes", "/api/v1/admin/slots"] {
        let refused = carol.call("GET", path, None).await;
        assert_eq!(refused.status, 403, "{path}: {refused:?}");
    }
    let nodes = admin.call("GET", "/api/v1/admin/nodes", None).await.json();
    assert_eq!(nodes["nodes"].as_array().map(Vec::len), Some(1), "{nodes}");
    assert!(nodes["nodes"][0]["stopped_at"].is_null(), "{nodes}");
    let slots = admin.call("GET", "/api/v1/admin/slots", None).await.json();
    assert!(
        slots["held"].as_i64().is_some_and(|held| held >= 1),
        "{slots}"
    );
    assert!(
        slots["slots"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["step_id"] == "slow")),
        "{slots}"
    );
}

/// Reads the inbox until it holds `count` items.
async fn poll_inbox(api: &mut crate::http_client::Api, count: usize) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let inbox = api.call("GET", "/api/v1/inbox", None).await;
        assert_eq!(inbox.status, 200, "{inbox:?}");
        let inbox = inbox.json();
        if inbox["items"].as_array().map(Vec::len) == Some(count) {
            return inbox;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the inbox never held {count} items: {inbox}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Issue 31: a step's attempts each have their entry in the timeline: the failed one with its
/// error and how it failed, the one its policy queued with when it was due and why. Issue 40:
/// each says what it waited (the backoff before a retry) apart from what it ran, and is labelled
/// by its own number (`Attempt 2 (retry of 1)`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attempt_of_a_step_is_on_the_timeline_with_its_error_and_its_due_time() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let failed = launch(
        &mut api,
        r#"await agent({stepId: "flaky", agentRef: "scripted", task: {fail: "the endpoint is busy"},
                        retry: {maxAttempts: 2, initialIntervalMs: 100}});"#,
    )
    .await;
    let record = wait_for(&mut api, &failed, "failed").await;
    // The record tells the wait before the retry apart from its run: the wait reaches at least
    // its due time, and the wait and the run together are what the attempt took, never more.
    let retried = &record["steps"][1];
    let ms = |value: &Value| {
        value
            .as_f64()
            .unwrap_or_else(|| panic!("not a number: {record}"))
    };
    let (waited, ran) = (ms(&retried["waited_ms"]), ms(&retried["ran_ms"]));
    let due_wait = (ms(&retried["retry"]["due_at"]) - ms(&retried["started_at"])) * 1000.0;
    assert!(waited >= due_wait - 1.0, "{record}");
    assert!(
        ms(&retried["run_started_at"]) >= ms(&retried["started_at"]),
        "{record}"
    );
    assert!(ms(&record["steps"][0]["ran_ms"]) >= 0.0, "{record}");
    let took = (ms(&retried["finished_at"]) - ms(&retried["started_at"])) * 1000.0;
    assert!(
        ran <= took - waited + 2.0,
        "the run counts no wait: {record}"
    );
    // So does the retry's `step_finished` event: its `duration_ms` is the run, `waited_ms` the
    // backoff before it.
    let stream = api
        .call("GET", &format!("/api/v1/workflows/{failed}/events"), None)
        .await;
    let text = String::from_utf8_lossy(&stream.body).into_owned();
    let finished: Value = text
        .split("\n\n")
        .filter(|block| block.contains("event: step_finished"))
        .filter_map(|block| block.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .find(|data| data["attempt"] == 2)
        .unwrap_or_else(|| panic!("no step_finished of attempt 2: {text}"));
    let event_waited = ms(&finished["waited_ms"]);
    assert!(event_waited >= due_wait - 1.0, "{finished}");
    // The run's end is read on two clocks (the record's from the owner, the event's from the
    // database): the event's run may differ from the record's by a little, never by half the
    // wait it would hold if it still counted the backoff.
    assert!(
        ms(&finished["duration_ms"]) < ran + event_waited / 2.0,
        "{finished}"
    );

    let browser = Browser::start("attempts", 1280, 900);
    sign_in(&browser, &node, ADMIN);
    browser.goto(&url(&node, &format!("#/workflows/{failed}")));
    browser.wait_for_text("Retry of attempt 1, due", WAIT);
    let entries = browser.all(".timeline li[data-step=flaky]");
    assert_eq!(entries.len(), 2, "one entry per attempt");
    let (first, second) = (entries[0].text(), entries[1].text());
    let of = |attempt: u32, part: &str| {
        browser
            .find(
                &format!(".timeline li[data-step=flaky][data-attempt='{attempt}'] {part}"),
                WAIT,
            )
            .text()
    };
    assert_eq!(of(1, ".attempt"), "Attempt 1");
    assert_eq!(of(2, ".attempt"), "Attempt 2 (retry of 1)");
    let took = of(1, ".took");
    assert!(
        took.starts_with("ran ") || took.contains(" · ran "),
        "attempt 1 says what it took: {took}"
    );
    assert!(!first.contains("running for"), "{first}");
    let took = of(2, ".took");
    assert!(
        took.starts_with("waited ") && took.contains(" · ran "),
        "{took}"
    );
    assert!(second.contains("after: the endpoint is busy"), "{second}");
    assert!(first.contains("the endpoint is busy"));
    browser.screenshot("01-attempts");
}

/// Issue 40: a cancelled attempt kept counting "running for ..." on the workflow's page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_attempt_stops_counting() {
    let db = Db::new(false).await;
    let faults = tempfile::tempdir().expect("fault dir");
    std::fs::write(faults.path().join("hold_model"), b"").expect("hold");
    let node = Node::start(
        &db,
        &[("REINS_FAULT_DIR", faults.path().display().to_string())],
    );
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        "await agent({stepId: 'held', agentRef: 'scripted', task: {hold_while: 'hold_model'}});",
    )
    .await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let record = wait_for(&mut api, &run_id, "running").await;
        if record["steps"][0]["status"] == "running" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{record}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cancelled = api
        .call("POST", &format!("/api/v1/workflows/{run_id}/cancel"), None)
        .await;
    assert_eq!(cancelled.status, 200, "{cancelled:?}");
    let record = wait_for(&mut api, &run_id, "cancelled").await;
    assert_eq!(record["steps"][0]["status"], "cancelled", "{record}");
    let browser = Browser::start("cancelled-attempt", 1280, 900);
    sign_in(&browser, &node, ADMIN);
    browser.goto(&url(&node, &format!("#/workflows/{run_id}")));
    let took = browser
        .find(".timeline li[data-step=held] .took", WAIT)
        .text();
    assert!(!took.contains("running for"), "{took}");
    browser.screenshot("01-cancelled-attempt");
}
