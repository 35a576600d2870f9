//! User management through the real binary, on both backends: admins list, create, change the
//! role of, disable and enable, reset the password of, sign out and delete users; a user changes
//! their own password and signs out everywhere; API tokens expire. Every change counts on the
//! very next request (401), the last enabled admin cannot be taken away (409 `last_admin`), and
//! the approver role may see and answer every workflow but control only its own.

use serde_json::{Value, json};

use crate::harness::{both, eventually};
use crate::http_api::{ADMIN, Db, Node, PASSWORD, assert_refused, initialize, launch, wait_for};
use crate::http_client::Api;

const BOB: &str = "bob@example.com";
const CAROL: &str = "carol@example.com";
const NEW_PASSWORD: &str = "a brand new passphrase";

pub(crate) async fn create(admin: &mut Api, email: &str, role: Option<&str>) -> Value {
    let mut body = json!({"email": email, "password": PASSWORD});
    if let Some(role) = role {
        body["role"] = json!(role);
    }
    let created = admin.call("POST", "/api/v1/auth/users", Some(body)).await;
    assert_eq!(created.status, 201, "{created:?}");
    created.json()
}

pub(crate) async fn signed_in(node: &Node, email: &str, password: &str) -> Api {
    let mut api = node.api();
    let answer = api.login(email, password).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    api
}

async fn bearer(node: &Node, api: &mut Api, body: Value) -> Api {
    let created = api.call("POST", "/api/v1/auth/tokens", Some(body)).await;
    assert_eq!(created.status, 201, "{created:?}");
    let mut machine = node.api();
    machine.bearer = Some(created.json()["token"].as_str().expect("token").to_owned());
    machine
}

async fn me(api: &mut Api) -> u16 {
    api.call("GET", "/api/v1/auth/me", None).await.status
}

async fn patch(admin: &mut Api, id: &str, body: Value) -> crate::http_client::Answer {
    admin
        .call("PATCH", &format!("/api/v1/auth/users/{id}"), Some(body))
        .await
}

fn id_of(user: &Value) -> String {
    user["id"].as_str().expect("id").to_owned()
}

both!(admins_manage_users_and_every_change_counts_on_the_next_request);
async fn admins_manage_users_and_every_change_counts_on_the_next_request(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(&db, &[]);
    let mut admin = initialize(&node).await;

    let bob = create(&mut admin, BOB, None).await;
    assert_eq!(bob["role"], "user");
    assert_eq!(bob["is_admin"], false);
    assert_eq!(bob["disabled"], false);
    assert_eq!(bob["last_login_at"], Value::Null);
    let bob_id = id_of(&bob);
    let carol = create(&mut admin, CAROL, Some("approver")).await;
    assert_eq!(carol["role"], "approver");
    let carol_id = id_of(&carol);
    let disagree = admin
        .call(
            "POST",
            "/api/v1/auth/users",
            Some(json!({"email": "x@example.com", "password": PASSWORD,
                        "role": "user", "is_admin": true})),
        )
        .await;
    assert_refused(&disagree, 400, "bad_request", "disagree");
    let unknown_role = admin
        .call(
            "POST",
            "/api/v1/auth/users",
            Some(json!({"email": "x@example.com", "password": PASSWORD, "role": "boss"})),
        )
        .await;
    assert_refused(&unknown_role, 400, "bad_request", "role");

    // The list, oldest first, with the sign-in times.
    let mut bob_session = signed_in(&node, BOB, PASSWORD).await;
    let mut bob_machine = bearer(&node, &mut bob_session, json!({"name": "bob's"})).await;
    let listed = admin.call("GET", "/api/v1/auth/users", None).await;
    assert_eq!(listed.status, 200, "{listed:?}");
    let users = listed.json()["users"].clone();
    let emails: Vec<&str> = users
        .as_array()
        .expect("users")
        .iter()
        .map(|u| u["email"].as_str().expect("email"))
        .collect();
    assert_eq!(emails, [ADMIN, BOB, CAROL]);
    for user in users.as_array().expect("users") {
        for field in [
            "id",
            "email",
            "role",
            "disabled",
            "created_at",
            "last_login_at",
        ] {
            assert!(user.get(field).is_some(), "{field} in {user}");
        }
    }
    assert!(users[1]["last_login_at"].as_f64().is_some(), "{users}");
    assert_eq!(users[2]["last_login_at"], Value::Null);
    assert_refused(
        &bob_session.call("GET", "/api/v1/auth/users", None).await,
        403,
        "admin_only",
        "admin",
    );
    assert_refused(
        &patch(&mut bob_session, &carol_id, json!({"disabled": true})).await,
        403,
        "admin_only",
        "admin",
    );
    assert_refused(
        &patch(&mut admin, &bob_id, json!({})).await,
        400,
        "bad_request",
        "changes nothing",
    );
    assert_refused(
        &patch(&mut admin, "0123", json!({"disabled": true})).await,
        404,
        "not_found",
        "0123",
    );

    // Disabled: the session and the token are refused at once, sign-in too; enabled: the token
    // works again, the ended session stays ended.
    let disabled = patch(&mut admin, &bob_id, json!({"disabled": true})).await;
    assert_eq!(disabled.status, 200, "{disabled:?}");
    assert_eq!(disabled.json()["disabled"], true);
    assert_eq!(me(&mut bob_session).await, 401);
    assert_eq!(me(&mut bob_machine).await, 401);
    let mut refused = node.api();
    assert_refused(
        &refused.login(BOB, PASSWORD).await,
        401,
        "account_disabled",
        "disabled",
    );
    let enabled = patch(&mut admin, &bob_id, json!({"disabled": false})).await;
    assert_eq!(enabled.json()["disabled"], false, "{enabled:?}");
    assert_eq!(me(&mut bob_machine).await, 200);
    assert_eq!(me(&mut bob_session).await, 401);
    let mut bob_session = signed_in(&node, BOB, PASSWORD).await;

    // The last enabled admin can be neither disabled nor demoted; with a second admin, it can.
    let admin_id = id_of(&admin.call("GET", "/api/v1/auth/me", None).await.json());
    for change in [json!({"disabled": true}), json!({"role": "approver"})] {
        assert_refused(
            &patch(&mut admin, &admin_id, change).await,
            409,
            "last_admin",
            ADMIN,
        );
    }
    let promoted = patch(&mut admin, &carol_id, json!({"role": "admin"})).await;
    assert_eq!(promoted.json()["is_admin"], true, "{promoted:?}");
    let mut carol_session = signed_in(&node, CAROL, PASSWORD).await;
    let demoted = patch(&mut carol_session, &admin_id, json!({"disabled": true})).await;
    assert_eq!(demoted.status, 200, "{demoted:?}");
    assert_eq!(me(&mut admin).await, 401);
    assert_refused(
        &patch(&mut carol_session, &carol_id, json!({"role": "user"})).await,
        409,
        "last_admin",
        CAROL,
    );
    let back = patch(&mut carol_session, &admin_id, json!({"disabled": false})).await;
    assert_eq!(back.status, 200, "{back:?}");
    let mut admin = signed_in(&node, ADMIN, PASSWORD).await;
    let approver = patch(&mut admin, &carol_id, json!({"role": "approver"})).await;
    assert_eq!(approver.json()["role"], "approver", "{approver:?}");

    // An admin's reset: the rules of a password, then every session of the user ends, and only
    // the new password signs in; the user's API token stays.
    let weak = admin
        .call(
            "POST",
            &format!("/api/v1/auth/users/{bob_id}/password"),
            Some(json!({"password": "short"})),
        )
        .await;
    assert_refused(&weak, 422, "refused", "12 to 256");
    let reset = admin
        .call(
            "POST",
            &format!("/api/v1/auth/users/{bob_id}/password"),
            Some(json!({"password": NEW_PASSWORD})),
        )
        .await;
    assert_eq!(reset.status, 200, "{reset:?}");
    assert_eq!(me(&mut bob_session).await, 401);
    assert_eq!(me(&mut bob_machine).await, 200);
    assert_eq!(node.api().login(BOB, PASSWORD).await.status, 401);
    let mut bob_session = signed_in(&node, BOB, NEW_PASSWORD).await;

    // An admin signs a user out everywhere: sessions end, tokens stay.
    let signed_out = admin
        .call(
            "POST",
            &format!("/api/v1/auth/users/{bob_id}/sign-out"),
            None,
        )
        .await;
    assert_eq!(signed_out.status, 200, "{signed_out:?}");
    assert_eq!(me(&mut bob_session).await, 401);
    assert_eq!(me(&mut bob_machine).await, 200);

    // Changing one's own password: the current one is checked, and the other sessions end.
    let mut bob_one = signed_in(&node, BOB, NEW_PASSWORD).await;
    let mut bob_two = signed_in(&node, BOB, NEW_PASSWORD).await;
    let wrong = bob_one
        .call(
            "POST",
            "/api/v1/auth/me/password",
            Some(json!({"current_password": "not the password", "new_password": PASSWORD})),
        )
        .await;
    assert_refused(&wrong, 403, "wrong_password", "wrong");
    assert_eq!(me(&mut bob_two).await, 200, "a wrong password ends nothing");
    let changed = bob_one
        .call(
            "POST",
            "/api/v1/auth/me/password",
            Some(json!({"current_password": NEW_PASSWORD, "new_password": PASSWORD})),
        )
        .await;
    assert_eq!(changed.status, 200, "{changed:?}");
    assert_eq!(me(&mut bob_one).await, 200, "this session stays");
    assert_eq!(me(&mut bob_two).await, 401, "the other one ends");
    assert_eq!(node.api().login(BOB, NEW_PASSWORD).await.status, 401);

    // Sign out everywhere: every session of the caller, this one too.
    let mut bob_three = signed_in(&node, BOB, PASSWORD).await;
    let everywhere = bob_one
        .call("POST", "/api/v1/auth/sign-out-everywhere", None)
        .await;
    assert_eq!(everywhere.status, 200, "{everywhere:?}");
    assert_eq!(me(&mut bob_one).await, 401);
    assert_eq!(me(&mut bob_three).await, 401);
    assert_eq!(me(&mut bob_machine).await, 200);

    // Deleting: not yourself, not a user with a live workflow; then their token goes too.
    assert_refused(
        &admin
            .call("DELETE", &format!("/api/v1/auth/users/{admin_id}"), None)
            .await,
        409,
        "own_account",
        "your own",
    );
    let live = launch(&mut bob_machine, "await pause({stepId: 'p'}); return 1;").await;
    wait_for(&mut bob_machine, &live, "paused").await;
    assert_refused(
        &admin
            .call("DELETE", &format!("/api/v1/auth/users/{bob_id}"), None)
            .await,
        409,
        "live_workflows",
        "1 live workflow",
    );
    assert_eq!(
        me(&mut bob_machine).await,
        200,
        "a refused delete changes nothing"
    );
    let cancelled = admin
        .call("POST", &format!("/api/v1/workflows/{live}/cancel"), None)
        .await;
    assert_eq!(cancelled.json()["status"], "cancelled", "{cancelled:?}");
    let deleted = admin
        .call("DELETE", &format!("/api/v1/auth/users/{bob_id}"), None)
        .await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    assert_eq!(deleted.json(), json!({"id": bob_id, "deleted": true}));
    assert_eq!(me(&mut bob_machine).await, 401);
    assert_eq!(node.api().login(BOB, PASSWORD).await.status, 401);
    assert_refused(
        &admin
            .call("DELETE", &format!("/api/v1/auth/users/{bob_id}"), None)
            .await,
        404,
        "not_found",
        &bob_id,
    );
    let left = admin.call("GET", "/api/v1/auth/users", None).await.json();
    assert_eq!(left["users"].as_array().map(Vec::len), Some(2), "{left}");
    // The finished workflow stays for the admins.
    let kept = admin
        .call("GET", &format!("/api/v1/workflows/{live}"), None)
        .await;
    assert_eq!(kept.status, 200, "{kept:?}");
}

both!(tokens_expire_within_the_configured_limit);
async fn tokens_expire_within_the_configured_limit(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(&db, &[("REINS_AUTH__TOKEN_DAYS_MAX", "30".to_owned())]);
    let mut admin = initialize(&node).await;
    for days in [0, 31] {
        let refused = admin
            .call(
                "POST",
                "/api/v1/auth/tokens",
                Some(json!({"name": "t", "expires_in_days": days})),
            )
            .await;
        assert_refused(&refused, 400, "bad_request", "auth.token_days_max");
    }
    // A name is shown in terminals: a control character in it is refused (issue 45, item 5).
    let refused = admin
        .call(
            "POST",
            "/api/v1/auth/tokens",
            Some(json!({"name": "ci\u{1b}[2Jbot"})),
        )
        .await;
    assert_refused(&refused, 400, "bad_request", "control character U+001B");
    let created = admin
        .call(
            "POST",
            "/api/v1/auth/tokens",
            Some(json!({"name": "month", "expires_in_days": 30})),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let created = created.json();
    let expires_at = created["expires_at"].as_f64().expect("expires_at");
    let listed = admin.call("GET", "/api/v1/auth/tokens", None).await.json();
    let row = listed["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .find(|t| t["id"] == created["id"])
        .expect("listed")
        .clone();
    assert_eq!(row["expires_at"].as_f64(), Some(expires_at));
    let created_at = row["created_at"].as_f64().expect("created_at");
    assert!(
        (expires_at - created_at - 30.0 * 86_400.0).abs() < 5.0,
        "{row}"
    );
    let mut month = node.api();
    month.bearer = Some(created["token"].as_str().expect("token").to_owned());
    assert_eq!(me(&mut month).await, 200);
    let forever = bearer(&node, &mut admin, json!({"name": "forever"})).await;
    let listed = admin.call("GET", "/api/v1/auth/tokens", None).await.json();
    assert!(
        listed["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .any(|t| t["name"] == "forever" && t["expires_at"].is_null()),
        "{listed}"
    );

    // Its time passes (moved in the database): refused on the next request.
    let id = created["id"].as_str().expect("id");
    db.sql(&format!(
        "UPDATE api_tokens SET expires_at = created_at - 1 WHERE id = '{id}'"
    ))
    .await;
    let expired = month.call("GET", "/api/v1/auth/me", None).await;
    assert_refused(&expired, 401, "unauthorized", "API token");
    let mut forever = forever;
    assert_eq!(me(&mut forever).await, 200);
}

both!(an_approver_sees_and_answers_every_workflow_but_controls_only_their_own);
async fn an_approver_sees_and_answers_every_workflow_but_controls_only_their_own(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(&db, &[]);
    let mut admin = initialize(&node).await;
    create(&mut admin, BOB, None).await;
    create(&mut admin, CAROL, Some("approver")).await;
    create(&mut admin, "dave@example.com", None).await;
    let mut bob = signed_in(&node, BOB, PASSWORD).await;
    let mut carol = signed_in(&node, CAROL, PASSWORD).await;
    let mut dave = signed_in(&node, "dave@example.com", PASSWORD).await;

    let script = r#"
        await agent({stepId: "a", agentRef: "scripted", task: {
            write: [{path: "/mnt/user-data/outputs/r.txt", content: "to review"}], output: "ok"}});
        const f = await captureArtifact({stepId: "file", sourceStepId: "a",
                                         path: "/mnt/user-data/outputs/r.txt"});
        const resumed = await pause({stepId: "p"});
        const review = await humanCheckpoint({stepId: "review", sourceStepId: "file",
                                              artifactVersion: f.artifactVersion});
        return {resumed, decision: review.decision};
    "#;
    let run = launch(&mut bob, script).await;
    let record = wait_for(&mut bob, &run, "paused").await;

    // Seen: the listing and the record (the artifact below). A plain user sees none of it.
    let page = carol.call("GET", "/api/v1/workflows", None).await.json();
    assert!(
        page["workflows"]
            .as_array()
            .expect("workflows")
            .iter()
            .any(|w| w["run_id"] == run.as_str()),
        "{page}"
    );
    assert_eq!(
        carol
            .call("GET", &format!("/api/v1/workflows/{run}"), None)
            .await
            .status,
        200
    );
    assert_eq!(
        dave.call("GET", "/api/v1/workflows", None).await.json()["workflows"],
        json!([])
    );
    assert_refused(
        &dave
            .call("GET", &format!("/api/v1/workflows/{run}"), None)
            .await,
        404,
        "not_found",
        &run,
    );

    // Refused: cancel, recover, delete (403, they see it), reconcile and users (admins only).
    for action in ["cancel", "recover"] {
        assert_refused(
            &carol
                .call("POST", &format!("/api/v1/workflows/{run}/{action}"), None)
                .await,
            403,
            "owner_only",
            "owner or an admin",
        );
    }
    assert_refused(
        &carol
            .call("DELETE", &format!("/api/v1/workflows/{run}"), None)
            .await,
        403,
        "owner_only",
        "owner or an admin",
    );
    // Issue 39, item 9: nor send it an event (the owner's integration chooses its ids: an
    // approver sending first made the owner's own send a `repeated` answer naming the approver).
    let event = json!({"name": "payment.received", "event_id": "pay-1", "payload": 1});
    assert_refused(
        &carol
            .call(
                "POST",
                &format!("/api/v1/workflows/{run}/events"),
                Some(event.clone()),
            )
            .await,
        403,
        "owner_only",
        "send it events",
    );
    let sent = bob
        .call(
            "POST",
            &format!("/api/v1/workflows/{run}/events"),
            Some(event),
        )
        .await;
    assert_eq!(sent.status, 200, "{sent:?}");
    assert_eq!(sent.json()["status"], "stored", "{sent:?}");
    assert_refused(
        &carol
            .call(
                "POST",
                &format!("/api/v1/workflows/{run}/reconcile"),
                Some(json!({"step_id": "a", "resolution": "fail", "reason": "x"})),
            )
            .await,
        403,
        "admin_only",
        "admin",
    );
    assert_refused(
        &carol.call("GET", "/api/v1/auth/users", None).await,
        403,
        "admin_only",
        "admin",
    );

    // Allowed: resume the pause and decide the checkpoint, on both surfaces.
    let resumed = carol
        .call(
            "POST",
            &format!("/api/v1/workflows/{run}/resume"),
            Some(json!({"fingerprint": record["fingerprint"], "step_id": "p",
                        "attempt": 1, "input": "go"})),
        )
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    let waiting = wait_for(&mut bob, &run, "waiting_approval").await;
    let checkpoint = waiting["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .find(|c| c["step_id"] == "review")
        .expect("review")
        .clone();
    let artifact = format!(
        "/api/v1/workflows/{run}/artifacts/{}",
        checkpoint["artifact_version"]
    );
    assert_eq!(
        carol.call("GET", &artifact, None).await.body.as_ref(),
        b"to review"
    );
    let decided = carol
        .action(
            "decide",
            json!({"run_id": run, "step_id": "review", "attempt": checkpoint["attempt"],
                   "artifact_version": checkpoint["artifact_version"],
                   "decision": "approve", "comment": "fine"}),
        )
        .await;
    assert_eq!(decided.status, 200, "{decided:?}");
    let done = wait_for(&mut bob, &run, "completed").await;
    assert_eq!(
        done["result"],
        json!({"resumed": "go", "decision": "approve"})
    );
    let decided_by = done["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .find(|c| c["step_id"] == "review")
        .map(|c| c["decided_by"].clone());
    assert_eq!(decided_by, Some(json!(CAROL)));

    // Their own workflow, they control like anyone.
    let own = launch(&mut carol, "await pause({stepId: 'p'}); return 1;").await;
    wait_for(&mut carol, &own, "paused").await;
    let cancelled = carol
        .call("POST", &format!("/api/v1/workflows/{own}/cancel"), None)
        .await;
    assert_eq!(cancelled.json()["status"], "cancelled", "{cancelled:?}");
    assert_eq!(
        carol
            .call("DELETE", &format!("/api/v1/workflows/{run}"), None)
            .await
            .status,
        403
    );
    assert_eq!(
        bob.call("DELETE", &format!("/api/v1/workflows/{run}"), None)
            .await
            .status,
        200
    );
}

/// `reins users ...` and `reins password` through the binary, as an admin would type them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admin_manages_users_from_the_command_line() {
    use crate::cli::{cli, code, json_of};

    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path();
    let ok = |output: &std::process::Output| {
        assert_eq!(
            code(output),
            0,
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    };
    ok(&cli(home, &node, &["init", "--email", ADMIN]));

    let created = cli(
        home,
        &node,
        &["users", "create", BOB, "--role", "approver", "--json"],
    );
    ok(&created);
    let bob = json_of(&created);
    assert_eq!(bob["role"], "approver");
    let listed = cli(home, &node, &["users", "list"]);
    ok(&listed);
    let table = String::from_utf8_lossy(&listed.stdout).to_string();
    assert!(
        table.contains("LAST SIGN-IN") && table.contains(BOB),
        "{table}"
    );

    let set = cli(home, &node, &["users", "set-role", BOB, "user", "--json"]);
    ok(&set);
    assert_eq!(json_of(&set)["role"], "user");
    let disabled = cli(home, &node, &["users", "disable", BOB, "--json"]);
    ok(&disabled);
    assert_eq!(json_of(&disabled)["disabled"], true);
    assert_eq!(node.api().login(BOB, PASSWORD).await.status, 401);
    let enabled = cli(home, &node, &["users", "enable", &id_of(&bob), "--json"]);
    ok(&enabled);
    assert_eq!(json_of(&enabled)["disabled"], false);
    let mut bob_session = signed_in(&node, BOB, PASSWORD).await;
    ok(&cli(home, &node, &["users", "sign-out", BOB]));
    assert_eq!(me(&mut bob_session).await, 401);
    let mut bob_session = signed_in(&node, BOB, PASSWORD).await;
    ok(&cli(home, &node, &["users", "reset-password", BOB]));
    assert_eq!(me(&mut bob_session).await, 401);
    let last = cli(home, &node, &["users", "disable", ADMIN]);
    assert_eq!(code(&last), 1);
    assert!(
        String::from_utf8_lossy(&last.stderr).contains("last_admin"),
        "{}",
        String::from_utf8_lossy(&last.stderr)
    );

    // `reins password`: the current one from REINS_CLI_PASSWORD, the new one from
    // REINS_CLI_NEW_PASSWORD; the saved token goes on working.
    let changed = crate::harness::reins_command(
        home,
        &[
            (
                "REINS_CLI_CREDENTIALS",
                home.join("credentials.json").display().to_string(),
            ),
            ("REINS_CLI_PASSWORD", PASSWORD.to_owned()),
            ("REINS_CLI_NEW_PASSWORD", NEW_PASSWORD.to_owned()),
            ("REINS_CLI_URL", format!("http://{}", node.addr)),
        ],
    )
    .arg("password")
    .output()
    .expect("run reins");
    ok(&changed);
    assert_eq!(node.api().login(ADMIN, PASSWORD).await.status, 401);
    assert_eq!(node.api().login(ADMIN, NEW_PASSWORD).await.status, 200);
    ok(&cli(home, &node, &["users", "delete", BOB]));
    let listed = json_of(&cli(home, &node, &["users", "list", "--json"]));
    assert_eq!(
        listed["users"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
}

/// A user's live API tokens and sessions are bounded: one token more is refused until one is
/// revoked (the revoked one is then deleted), and one sign-in more ends the oldest session.
async fn tokens_and_sessions_per_user_are_bounded(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(
        &db,
        &[
            ("REINS_AUTH__TOKENS_PER_USER_MAX", "3".into()),
            ("REINS_AUTH__SESSIONS_PER_USER_MAX", "2".into()),
        ],
    );
    let mut first = initialize(&node).await;
    let mut second = signed_in(&node, ADMIN, PASSWORD).await;
    assert_eq!(me(&mut first).await, 200, "two sessions fit");
    let mut third = signed_in(&node, ADMIN, PASSWORD).await;
    assert_eq!(me(&mut first).await, 401, "the oldest session ended");
    assert_eq!(me(&mut second).await, 200);
    assert_eq!(me(&mut third).await, 200);

    let create = async |api: &mut Api, name: &str| {
        api.call("POST", "/api/v1/auth/tokens", Some(json!({"name": name})))
            .await
    };
    let mut ids = Vec::new();
    for name in ["a", "b", "c"] {
        let created = create(&mut third, name).await;
        assert_eq!(created.status, 201, "{created:?}");
        ids.push(created.json()["id"].as_str().expect("id").to_owned());
    }
    assert_refused(
        &create(&mut third, "d").await,
        422,
        "refused",
        "auth.tokens_per_user_max (3)",
    );
    let revoked = third
        .call("DELETE", &format!("/api/v1/auth/tokens/{}", ids[0]), None)
        .await;
    assert_eq!(revoked.status, 200, "{revoked:?}");
    let listed = third.call("GET", "/api/v1/auth/tokens", None).await.json();
    assert_eq!(
        listed["tokens"].as_array().map(Vec::len),
        Some(3),
        "{listed}"
    );
    assert_eq!(create(&mut third, "d").await.status, 201);
    let listed = third.call("GET", "/api/v1/auth/tokens", None).await.json();
    let mut names: Vec<_> = listed["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    // Tokens made within the same millisecond of the database clock list in either order.
    names.sort();
    assert_eq!(names, ["b", "c", "d"], "the revoked token is gone");
}

both!(tokens_and_sessions_per_user_are_bounded);

/// Issue 29, item 10: a change of access reaches a request that is already waiting. An approver
/// demoted while their `?wait=` on another user's workflow waits gets 404 when it answers (not
/// the record), and a token revoked meanwhile gets 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_request_checks_access_again_before_it_answers() {
    let db = Db::new(false).await;
    // The workflow runs until the test removes `hold_s`: after the access has changed.
    let faults = tempfile::tempdir().expect("fault dir");
    std::fs::write(faults.path().join("hold_s"), b"").expect("hold");
    let node = Node::start(
        &db,
        &[("REINS_FAULT_DIR", faults.path().display().to_string())],
    );
    let mut admin = initialize(&node).await;
    let carol_id = id_of(&create(&mut admin, CAROL, Some("approver")).await);
    let mut carol = signed_in(&node, CAROL, PASSWORD).await;
    let mut carol_waiting = signed_in(&node, CAROL, PASSWORD).await;
    let created = carol
        .call(
            "POST",
            "/api/v1/auth/tokens",
            Some(json!({"name": "waiting"})),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let token_id = created.json()["id"].as_str().expect("id").to_owned();
    let mut carol_token = node.api();
    carol_token.bearer = Some(created.json()["token"].as_str().expect("token").to_owned());
    let run = launch(
        &mut admin,
        r#"return await agent({stepId: "s", agentRef: "scripted", task: {hold_while: "hold_s"}});"#,
    )
    .await;
    let path = format!("/api/v1/workflows/{run}?wait=30s");
    let (by_session, by_token) = (path.clone(), path);
    let session_wait =
        tokio::spawn(async move { carol_waiting.call("GET", &by_session, None).await });
    let token_wait = tokio::spawn(async move { carol_token.call("GET", &by_token, None).await });
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    assert!(
        !session_wait.is_finished() && !token_wait.is_finished(),
        "the waits wait"
    );
    let revoked = carol
        .call("DELETE", &format!("/api/v1/auth/tokens/{token_id}"), None)
        .await;
    assert_eq!(revoked.status, 200, "{revoked:?}");
    let demoted = patch(&mut admin, &carol_id, json!({"role": "user"})).await;
    assert_eq!(demoted.status, 200, "{demoted:?}");
    std::fs::remove_file(faults.path().join("hold_s")).expect("release");
    wait_for(&mut admin, &run, "completed").await;
    let by_session = session_wait.await.expect("the session's wait");
    assert_refused(&by_session, 404, "not_found", &run);
    let by_token = token_wait.await.expect("the token's wait");
    assert_refused(&by_token, 401, "unauthorized", "revoked");
}

/// The statuses of a workflow's steps, in order.
async fn step_statuses(api: &mut Api, run_id: &str) -> Vec<String> {
    let record = api
        .call("GET", &format!("/api/v1/workflows/{run_id}"), None)
        .await;
    assert_eq!(record.status, 200, "{record:?}");
    let mut statuses: Vec<String> = record.json()["steps"]
        .as_array()
        .map(|steps| {
            steps
                .iter()
                .map(|step| step["status"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default();
    statuses.sort();
    statuses
}

/// A user's share of the cluster's slots (`limits.max_active_children_per_user`) binds only
/// while another user waits below theirs: alone, the admin's `parallel` takes every slot; once
/// Bob's step waits, the next slot the admin's steps give back is Bob's, while the admin's own
/// waiting steps stay `queued`. Before the share existed, the admin's queued steps could take
/// that slot first and Bob waited for the whole `parallel` (issue 29, item 7); with a share that
/// bound always, the admin alone ran two steps of six with two slots free.
async fn one_users_parallel_agents_leave_slots_for_another_user(postgres: bool) {
    let db = Db::new(postgres).await;
    let faults = tempfile::tempdir().expect("fault dir");
    let hold = |name: &str| std::fs::write(faults.path().join(name), b"").expect("hold");
    for i in 1..=6 {
        hold(&format!("hold_a{i}"));
    }
    hold("hold_bob");
    let node = Node::start(
        &db,
        &[
            ("REINS_LIMITS__MAX_ACTIVE_CHILDREN", "4".to_owned()),
            ("REINS_LIMITS__MAX_ACTIVE_CHILDREN_PER_USER", "2".to_owned()),
            // The share alone: no slot is kept for others, so the admin alone takes all four.
            ("REINS_LIMITS__ACTIVE_CHILDREN_RESERVED", "0".to_owned()),
            ("REINS_FAULT_DIR", faults.path().display().to_string()),
        ],
    );
    let mut admin = initialize(&node).await;
    create(&mut admin, BOB, None).await;
    let mut bob = signed_in(&node, BOB, PASSWORD).await;
    let six = launch(
        &mut admin,
        r#"return await parallel([1, 2, 3, 4, 5, 6].map((i) => () => agent({stepId: "a" + i,
               agentRef: "scripted", task: {hold_while: "hold_a" + i}})));"#,
    )
    .await;
    eventually(
        std::time::Duration::from_secs(60),
        "the admin alone runs four steps, twice their share",
        async || {
            step_statuses(&mut admin, &six).await
                == [
                    "queued", "queued", "running", "running", "running", "running",
                ]
        },
    )
    .await;
    let one = launch(
        &mut bob,
        r#"return await agent({stepId: "b", agentRef: "scripted", task: {hold_while: "hold_bob"}});"#,
    )
    .await;
    eventually(
        std::time::Duration::from_secs(60),
        "bob's step waits for a slot",
        async || step_statuses(&mut bob, &one).await == ["queued"],
    )
    .await;
    // Which four of the six were admitted is the race's: one of those ends.
    let record = admin
        .call("GET", &format!("/api/v1/workflows/{six}"), None)
        .await;
    let running = record.json()["steps"]
        .as_array()
        .and_then(|steps| steps.iter().find(|step| step["status"] == "running"))
        .and_then(|step| step["step_id"].as_str().map(str::to_owned))
        .expect("a running step of the admin's");
    std::fs::remove_file(faults.path().join(format!("hold_{running}"))).expect("end it");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while step_statuses(&mut bob, &one).await != ["running"] {
        assert!(
            std::time::Instant::now() < deadline,
            "bob's step never took the slot {running} gave back: bob's steps {:?}, the \
             admin's {:?}",
            step_statuses(&mut bob, &one).await,
            step_statuses(&mut admin, &six).await
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        step_statuses(&mut admin, &six).await,
        [
            "completed",
            "queued",
            "queued",
            "running",
            "running",
            "running"
        ]
    );
}

both!(one_users_parallel_agents_leave_slots_for_another_user);

/// A slot is kept for others (`limits.active_children_reserved`, 1 by default): alone, the
/// admin's `parallel` of long agents takes three slots of four, and Bob's one step runs and ends
/// while all three still run. Before, the admin alone took all four, and Bob's step waited
/// `queued` until one of the admin's agents ended (issue 39, item 5: 58 s behind agents of 60 s).
async fn a_users_step_starts_while_another_users_long_agents_hold_every_slot_they_may(
    postgres: bool,
) {
    let db = Db::new(postgres).await;
    let faults = tempfile::tempdir().expect("fault dir");
    for i in 1..=6 {
        std::fs::write(faults.path().join(format!("hold_a{i}")), b"").expect("hold");
    }
    let node = Node::start(
        &db,
        &[
            ("REINS_LIMITS__MAX_ACTIVE_CHILDREN", "4".to_owned()),
            ("REINS_LIMITS__MAX_ACTIVE_CHILDREN_PER_USER", "2".to_owned()),
            ("REINS_FAULT_DIR", faults.path().display().to_string()),
        ],
    );
    let mut admin = initialize(&node).await;
    create(&mut admin, BOB, None).await;
    let mut bob = signed_in(&node, BOB, PASSWORD).await;
    let six = launch(
        &mut admin,
        r#"return await parallel([1, 2, 3, 4, 5, 6].map((i) => () => agent({stepId: "a" + i,
               agentRef: "scripted", task: {hold_while: "hold_a" + i}})));"#,
    )
    .await;
    let running = |statuses: &[String]| statuses.iter().filter(|s| *s == "running").count();
    eventually(
        std::time::Duration::from_secs(60),
        "the admin alone runs three steps",
        async || running(&step_statuses(&mut admin, &six).await) >= 3,
    )
    .await;
    let one = launch(
        &mut bob,
        r#"return await agent({stepId: "b", agentRef: "scripted", task: {output: 1}});"#,
    )
    .await;
    // Nothing of the admin's ends until the holds go: Bob's step can only have had the kept slot.
    eventually(
        std::time::Duration::from_secs(60),
        "bob's step runs and ends while the admin's agents hold their slots",
        async || step_statuses(&mut bob, &one).await == ["completed"],
    )
    .await;
    assert_eq!(
        step_statuses(&mut admin, &six).await,
        [
            "queued", "queued", "queued", "running", "running", "running"
        ],
        "the admin's steps, with Bob's ended"
    );
    for i in 1..=6 {
        std::fs::remove_file(faults.path().join(format!("hold_a{i}"))).expect("end it");
    }
    eventually(
        std::time::Duration::from_secs(60),
        "the admin's steps end once let go",
        async || {
            step_statuses(&mut admin, &six)
                .await
                .iter()
                .all(|s| s == "completed")
        },
    )
    .await;
}

both!(a_users_step_starts_while_another_users_long_agents_hold_every_slot_they_may);
