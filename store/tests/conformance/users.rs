//! Users, sessions and API tokens: the last enabled admin is never taken away, sessions end
//! together or one by one, and a disabled user, an ended session or an expired token is refused
//! by the read that finds it.

use serde_json::json;
use store::{Error, NewToken, NewUser, Role, UserChange, UserChanged, UserDeletion, WriteOp};

use crate::harness::{conformance, workflow};

fn new_user(id: &str, role: Role) -> NewUser {
    NewUser {
        id: id.to_owned(),
        email: format!("{id}@example.org"),
        password_hash: format!("hash-{id}"),
        role,
    }
}

fn token(id: &str, user_id: &str, lifetime_seconds: Option<f64>) -> NewToken {
    NewToken {
        id: id.to_owned(),
        user_id: user_id.to_owned(),
        name: format!("token {id}"),
        token_hash: format!("sha-{id}"),
        lifetime_seconds,
        live_max: 10,
    }
}

conformance! {
    async fn the_first_user_is_made_once_and_emails_and_ids_are_unique(db) {
        let store = db.store().await;
        assert!(store.create_user(new_user("ada", Role::Admin), true).await.expect("first"));
        assert!(!store.create_user(new_user("bob", Role::Admin), true).await.expect("second first"),
            "a second first user was made");
        assert_eq!(store.user_by_id("bob").await.expect("read"), None);
        assert!(store.create_user(new_user("bob", Role::User), false).await.expect("bob"));
        let same_email = NewUser { id: "carol".into(), ..new_user("bob", Role::User) };
        let taken = store.create_user(same_email, false).await;
        assert!(matches!(taken, Err(Error::Conflict(_))), "{taken:?}");

        let ada = store.user_by_email("ada@example.org").await.expect("read").expect("ada");
        assert_eq!((ada.id.as_str(), ada.role, ada.disabled, ada.token_version, ada.last_login_at),
            ("ada", Role::Admin, false, 0, None));
        assert_eq!(store.user_by_email("nobody@example.org").await.expect("read"), None);
        let listed: Vec<String> = store.list_users().await.expect("list").into_iter().map(|u| u.id).collect();
        assert_eq!(listed.len(), 2);
        assert!(listed.contains(&"ada".into()) && listed.contains(&"bob".into()));
    }
}

conformance! {
    async fn the_last_enabled_admin_stays_and_disabling_ends_every_session(db) {
        let store = db.store().await;
        store.create_user(new_user("ada", Role::Admin), false).await.expect("ada");
        store.create_user(new_user("bob", Role::User), false).await.expect("bob");
        let demote = UserChange { role: Some(Role::User), ..UserChange::default() };
        let disable = UserChange { disabled: Some(true), ..UserChange::default() };
        assert_eq!(store.change_user("ada", demote).await.expect("change"), UserChanged::LastAdmin);
        assert_eq!(store.change_user("ada", disable).await.expect("change"), UserChanged::LastAdmin);
        assert_eq!(store.delete_user("ada").await.expect("delete"), UserDeletion::LastAdmin);
        assert_eq!(store.change_user("nobody", disable).await.expect("change"), UserChanged::NotFound);

        let promote = UserChange { role: Some(Role::Admin), ..UserChange::default() };
        let UserChanged::Changed(bob) = store.change_user("bob", promote).await.expect("promote")
        else { panic!("not changed") };
        assert_eq!(bob.role, Role::Admin);
        store.open_session("s-ada", "ada", 3_600, 10).await.expect("session");
        assert!(store.session_user("s-ada").await.expect("session").is_some());
        let UserChanged::Changed(ada) = store.change_user("ada", disable).await.expect("disable")
        else { panic!("not changed") };
        assert!(ada.disabled);
        assert_eq!(ada.token_version, 1, "disabling ends every cookie too");
        assert_eq!(store.session_user("s-ada").await.expect("session"), None);
        let enable = UserChange { disabled: Some(false), ..UserChange::default() };
        store.change_user("ada", enable).await.expect("enable");
        assert_eq!(store.session_user("s-ada").await.expect("session"), None,
            "an ended session came back with its user");
    }
}

conformance! {
    async fn sessions_end_one_by_one_or_all_but_the_callers_and_expire(db) {
        let store = db.store().await;
        store.create_user(new_user("ada", Role::User), false).await.expect("ada");
        let missing = store.open_session("s-x", "nobody", 60, 10).await;
        assert!(matches!(missing, Err(Error::NotFound(_))), "{missing:?}");
        for session in ["s-1", "s-2", "s-3"] {
            store.open_session(session, "ada", 3_600, 10).await.expect("session");
        }
        let ada = store.user_by_id("ada").await.expect("read").expect("ada");
        assert!(ada.last_login_at.is_some());
        assert!(store.revoke_session("s-1").await.expect("revoke"));
        assert!(!store.revoke_session("s-none").await.expect("revoke"));
        assert_eq!(store.session_user("s-1").await.expect("session"), None);

        assert!(store.set_password("ada", "new-hash", Some("s-2")).await.expect("password"));
        assert!(store.session_user("s-2").await.expect("session").is_some(), "the caller's session ended");
        assert_eq!(store.session_user("s-3").await.expect("session"), None);
        let ada = store.user_by_id("ada").await.expect("read").expect("ada");
        assert_eq!((ada.password_hash.as_str(), ada.token_version), ("new-hash", 0));
        assert!(!store.set_password("nobody", "h", None).await.expect("password"));

        assert!(store.end_sessions("ada", None).await.expect("end"));
        assert_eq!(store.session_user("s-2").await.expect("session"), None);
        assert_eq!(store.user_by_id("ada").await.expect("read").map(|u| u.token_version), Some(1));
        assert!(!store.end_sessions("nobody", None).await.expect("end"));

        store.open_session("s-brief", "ada", 1, 10).await.expect("session");
        assert!(store.session_user("s-brief").await.expect("session").is_some());
        let deadline = store.now().await.expect("now") + 1.0;
        db.pass(&store, deadline).await;
        assert_eq!(store.session_user("s-brief").await.expect("session"), None, "an expired session held");
    }
}

conformance! {
    async fn tokens_are_refused_once_revoked_expired_or_their_user_disabled(db) {
        let store = db.store().await;
        store.create_user(new_user("ada", Role::Admin), false).await.expect("ada");
        store.create_user(new_user("bob", Role::User), false).await.expect("bob");
        let missing = store.create_token(token("t-x", "nobody", None)).await;
        assert!(matches!(missing, Err(Error::NotFound(_))), "{missing:?}");
        let forever = store.create_token(token("t-1", "bob", None)).await.expect("token");
        assert_eq!((forever.revoked, forever.expires_at), (false, None));
        let brief = store.create_token(token("t-2", "bob", Some(1.0))).await.expect("token");
        assert!(brief.expires_at.is_some_and(|at| at > brief.created_at));
        let (found, user) = store.token_user("t-1").await.expect("read").expect("valid");
        assert_eq!((found.token_hash.as_str(), user.id.as_str()), ("sha-t-1", "bob"));

        assert_eq!(store.expired_token("t-2").await.expect("read"), None, "expired before its time");
        db.pass(&store, brief.expires_at.expect("expiry")).await;
        assert_eq!(store.token_user("t-2").await.expect("read"), None, "an expired token held");
        // Issue 32: an expired token is told apart from an unknown or revoked one.
        let expired = store.expired_token("t-2").await.expect("read").expect("expired");
        assert_eq!(expired.token_hash, "sha-t-2");
        assert_eq!(store.expired_token("t-1").await.expect("read"), None, "a live token is not expired");
        assert_eq!(store.expired_token("t-none").await.expect("read"), None);
        assert!(!store.revoke_token("ada", "t-1").await.expect("revoke"), "another user revoked it");
        assert!(store.revoke_token("bob", "t-1").await.expect("revoke"));
        assert!(!store.revoke_token("bob", "t-1").await.expect("revoke"), "revoked twice");
        assert_eq!(store.token_user("t-1").await.expect("read"), None);
        let listed: Vec<(String, bool)> = store.list_tokens("bob").await.expect("list")
            .into_iter().map(|t| (t.id, t.revoked)).collect();
        assert_eq!(listed, [("t-1".to_owned(), true), ("t-2".to_owned(), false)]);

        store.create_token(token("t-3", "bob", None)).await.expect("token");
        let disable = UserChange { disabled: Some(true), ..UserChange::default() };
        store.change_user("bob", disable).await.expect("disable");
        assert_eq!(store.token_user("t-3").await.expect("read"), None, "a disabled user's token held");
    }
}

conformance! {
    async fn a_user_with_a_live_workflow_stays_and_one_without_goes_with_sessions_and_tokens(db) {
        let store = db.store().await;
        store.create_user(new_user("ada", Role::Admin), false).await.expect("ada");
        store.create_user(new_user("tester", Role::User), false).await.expect("tester");
        let lease = workflow(&*store, "wf", "node", 60_000).await;
        store.open_session("s", "tester", 3_600, 10).await.expect("session");
        store.create_token(token("t", "tester", None)).await.expect("token");
        assert_eq!(store.delete_user("tester").await.expect("delete"), UserDeletion::OwnsLiveWorkflows(1));
        store.fenced_write(&lease.fence(), vec![WriteOp::SetWorkflow {
            workflow_id: "wf".into(), status: store::WorkflowStatus::Completed, data: json!({}),
        }]).await.expect("end");
        assert_eq!(store.delete_user("tester").await.expect("delete"), UserDeletion::Deleted);
        assert_eq!(store.user_by_id("tester").await.expect("read"), None);
        assert_eq!(store.session_user("s").await.expect("session"), None);
        assert_eq!(store.token_user("t").await.expect("token"), None);
        assert!(store.list_tokens("tester").await.expect("list").is_empty());
        assert!(store.read_workflow(&store::WorkflowId::from("wf")).await.expect("read").is_some(), "a finished workflow went with its user");
        assert_eq!(store.delete_user("tester").await.expect("delete"), UserDeletion::NotFound);
    }
}

conformance! {
    async fn a_user_keeps_their_newest_sessions_up_to_the_bound(db) {
        let store = db.store().await;
        store.create_user(new_user("ada", Role::User), false).await.expect("ada");
        store.create_user(new_user("bob", Role::User), false).await.expect("bob");
        store.open_session("s-bob", "bob", 500, 1).await.expect("session");
        // Ordered by expiry, whatever the clock: s-1 ends first.
        for (session, seconds) in [("s-1", 1_000), ("s-2", 2_000), ("s-3", 3_000)] {
            store.open_session(session, "ada", seconds, 2).await.expect("session");
        }
        assert_eq!(store.session_user("s-1").await.expect("session"), None, "a session over the bound held");
        for session in ["s-2", "s-3", "s-bob"] {
            assert!(store.session_user(session).await.expect("session").is_some(), "{session} ended");
        }
        // An ended session is deleted and counts for nothing: s-3 stays beside the new one.
        assert!(store.revoke_session("s-2").await.expect("revoke"));
        store.open_session("s-4", "ada", 4_000, 2).await.expect("session");
        assert!(!store.revoke_session("s-2").await.expect("revoke"), "an ended session was kept");
        assert!(store.session_user("s-3").await.expect("session").is_some());
        assert!(store.session_user("s-4").await.expect("session").is_some());
        let taken = store.open_session("s-bob", "ada", 60, 2).await;
        assert!(matches!(taken, Err(Error::Conflict(_))), "{taken:?}");
        assert!(store.session_user("s-4").await.expect("session").is_some(), "a refused sign-in ended a session");
    }
}

conformance! {
    async fn a_user_has_at_most_their_bound_of_live_tokens_and_ended_ones_go(db) {
        let store = db.store().await;
        store.create_user(new_user("ada", Role::User), false).await.expect("ada");
        let bounded = |id: &str| NewToken { live_max: 2, ..token(id, "ada", None) };
        store.create_token(bounded("t-1")).await.expect("token");
        store.create_token(bounded("t-2")).await.expect("token");
        let over = store.create_token(bounded("t-3")).await;
        assert!(matches!(over, Err(Error::LimitReached(store::Limit::TokensPerUser { max: 2 }))), "{over:?}");
        assert!(store.revoke_token("ada", "t-1").await.expect("revoke"));
        assert_eq!(store.list_tokens("ada").await.expect("list").len(), 2, "a refused token changed the list");
        store.create_token(bounded("t-3")).await.expect("a revoked token frees its place");
        let listed: Vec<String> = store.list_tokens("ada").await.expect("list").into_iter().map(|t| t.id).collect();
        assert_eq!(listed.len(), 2);
        assert!(listed.contains(&"t-2".into()) && listed.contains(&"t-3".into()), "{listed:?}");
    }
}
