//! Users, sessions, API tokens, operator reads and nodes in the simulation store, by the rules
//! of `sqlite/users.rs` and `sqlite/operators.rs`.

use std::collections::BTreeMap;

use super::{SimStore, State};
use crate::users::leaves_no_admin;
use crate::write::CHECKPOINT_KINDS;
use crate::{
    Error, NewToken, NewUser, NodeRecord, Result, RunStatus, SlotRow, StatusCount, StepKind,
    StepStatus, TokenRow, UserChange, UserChanged, UserDeletion, UserRow, UserStorage, WorkflowId,
    WorkflowStatus,
};

/// One signed-in browser.
#[derive(Debug, Clone)]
pub(super) struct Session {
    user_id: String,
    expires_at: f64,
    revoked: bool,
}

/// What the simulation keeps of people and nodes.
#[derive(Debug, Default)]
pub(super) struct People {
    users: BTreeMap<String, UserRow>,
    sessions: BTreeMap<String, Session>,
    tokens: BTreeMap<String, TokenRow>,
    nodes: BTreeMap<String, NodeRecord>,
}

impl People {
    pub(super) fn user(&self, user_id: &str) -> Option<&UserRow> {
        self.users.get(user_id)
    }

    /// Enabled admins other than `user_id`.
    fn other_admins(&self, user_id: &str) -> i64 {
        let count = self
            .users
            .values()
            .filter(|user| user.is_admin() && !user.disabled && user.id != user_id)
            .count();
        i64::try_from(count).unwrap_or(i64::MAX)
    }

    /// Ends the user's sessions: every one (bumping `token_version`) or every one but `keep`.
    /// Whether the user exists.
    fn end_sessions(&mut self, user_id: &str, keep: Option<&str>) -> bool {
        let Some(user) = self.users.get_mut(user_id) else {
            return false;
        };
        if keep.is_none() {
            user.token_version += 1;
        }
        for (id, session) in &mut self.sessions {
            if session.user_id == user_id && Some(id.as_str()) != keep {
                session.revoked = true;
            }
        }
        true
    }

    /// The user if enabled.
    fn enabled(&self, user_id: &str) -> Option<UserRow> {
        self.user(user_id).filter(|user| !user.disabled).cloned()
    }
}

/// Counts by status, ordered by status.
fn counts<'a>(statuses: impl Iterator<Item = &'a str>) -> Vec<StatusCount> {
    let mut counted: BTreeMap<&str, i64> = BTreeMap::new();
    for status in statuses {
        *counted.entry(status).or_default() += 1;
    }
    counted
        .into_iter()
        .map(|(status, count)| StatusCount {
            status: status.to_owned(),
            count,
        })
        .collect()
}

impl State {
    /// Whether a live workflow waits for a person: a pause or checkpoint, or an agent's question.
    fn waits_for_a_person(&self, workflow_id: &WorkflowId) -> bool {
        let Some(workflow) = self.workflows.get(workflow_id) else {
            return false;
        };
        match workflow.row.status {
            WorkflowStatus::Paused | WorkflowStatus::WaitingApproval => true,
            WorkflowStatus::Running => {
                self.runs.values().any(|run| {
                    run.workflow.as_ref() == Some(workflow_id)
                        && run.status == RunStatus::WaitingForInput
                }) || workflow.steps.values().any(|step| {
                    step.row
                        .kind()
                        .is_some_and(|kind| CHECKPOINT_KINDS.contains(&kind))
                        && step.row.status == StepStatus::Running
                })
            }
            _ => false,
        }
    }
}

impl crate::Users for SimStore {
    async fn create_user(&self, user: NewUser, only_if_first: bool) -> Result<bool> {
        self.write(|state, now| {
            let people = &mut state.people;
            if only_if_first && !people.users.is_empty() {
                return Ok(false);
            }
            if people.users.contains_key(&user.id)
                || people.users.values().any(|other| other.email == user.email)
            {
                return Err(Error::Conflict(format!(
                    "a user {:?} or with email {:?} exists",
                    user.id, user.email
                )));
            }
            people.users.insert(
                user.id.clone(),
                UserRow {
                    id: user.id,
                    email: user.email,
                    password_hash: user.password_hash,
                    role: user.role,
                    disabled: false,
                    token_version: 0,
                    created_at: now,
                    last_login_at: None,
                },
            );
            Ok(true)
        })
    }

    async fn user_by_email(&self, email: &str) -> Result<Option<UserRow>> {
        self.read(|state, _| {
            Ok(state
                .people
                .users
                .values()
                .find(|user| user.email == email)
                .cloned())
        })
    }

    async fn user_by_id(&self, user_id: &str) -> Result<Option<UserRow>> {
        self.read(|state, _| Ok(state.people.user(user_id).cloned()))
    }

    async fn list_users(&self) -> Result<Vec<UserRow>> {
        self.read(|state, _| {
            let mut users: Vec<UserRow> = state.people.users.values().cloned().collect();
            users.sort_by(|a, b| {
                a.created_at
                    .total_cmp(&b.created_at)
                    .then_with(|| a.id.cmp(&b.id))
            });
            Ok(users)
        })
    }

    async fn stored_bytes(&self, user_id: Option<&str>) -> Result<Vec<UserStorage>> {
        self.read(|state, _| {
            Ok(state
                .stored_bytes
                .keys()
                .filter(|user| user_id.is_none_or(|wanted| wanted == user.as_str()))
                .map(|user| UserStorage {
                    user_id: user.clone(),
                    stored_bytes: state.stored_by(user),
                })
                .collect())
        })
    }

    async fn change_user(&self, user_id: &str, change: UserChange) -> Result<UserChanged> {
        self.write(|state, _| {
            let people = &mut state.people;
            let Some(current) = people.user(user_id) else {
                return Ok(UserChanged::NotFound);
            };
            if leaves_no_admin(current, change, people.other_admins(user_id)) {
                return Ok(UserChanged::LastAdmin);
            }
            let Some(user) = people.users.get_mut(user_id) else {
                return Ok(UserChanged::NotFound);
            };
            user.role = change.role.unwrap_or(user.role);
            user.disabled = change.disabled.unwrap_or(user.disabled);
            if change.disabled == Some(true) {
                people.end_sessions(user_id, None);
            }
            Ok(people
                .user(user_id)
                .cloned()
                .map_or(UserChanged::NotFound, UserChanged::Changed))
        })
    }

    async fn set_password(
        &self,
        user_id: &str,
        password_hash: &str,
        keep_session: Option<&str>,
    ) -> Result<bool> {
        self.write(|state, _| {
            let people = &mut state.people;
            let Some(user) = people.users.get_mut(user_id) else {
                return Ok(false);
            };
            password_hash.clone_into(&mut user.password_hash);
            Ok(people.end_sessions(user_id, keep_session))
        })
    }

    async fn end_sessions(&self, user_id: &str, keep_session: Option<&str>) -> Result<bool> {
        self.write(|state, _| Ok(state.people.end_sessions(user_id, keep_session)))
    }

    async fn delete_user(&self, user_id: &str) -> Result<UserDeletion> {
        self.write(|state, _| {
            let Some(current) = state.people.user(user_id) else {
                return Ok(UserDeletion::NotFound);
            };
            let live = state
                .workflows
                .values()
                .filter(|workflow| workflow.row.user_id == user_id && workflow.row.status.is_live())
                .count();
            if live > 0 {
                return Ok(UserDeletion::OwnsLiveWorkflows(
                    i64::try_from(live).unwrap_or(i64::MAX),
                ));
            }
            let gone = UserChange {
                disabled: Some(true),
                ..UserChange::default()
            };
            if leaves_no_admin(current, gone, state.people.other_admins(user_id)) {
                return Ok(UserDeletion::LastAdmin);
            }
            let people = &mut state.people;
            people.users.remove(user_id);
            people
                .sessions
                .retain(|_, session| session.user_id != user_id);
            people.tokens.retain(|_, token| token.user_id != user_id);
            Ok(UserDeletion::Deleted)
        })
    }

    async fn open_session(
        &self,
        session_id: &str,
        user_id: &str,
        session_seconds: u64,
        sessions_max: u32,
    ) -> Result<()> {
        self.write(|state, now| {
            let people = &mut state.people;
            if !people.users.contains_key(user_id) {
                return Err(Error::NotFound(format!("user {user_id:?}")));
            }
            // The user's ended sessions go, and their newest live ones stay up to the bound,
            // this one included.
            let keep_others = usize::try_from(sessions_max.max(1) - 1).unwrap_or(usize::MAX);
            let mut live: Vec<(f64, &String)> = people
                .sessions
                .iter()
                .filter(|(_, session)| {
                    session.user_id == user_id && !session.revoked && session.expires_at > now
                })
                .map(|(id, session)| (session.expires_at, id))
                .collect();
            live.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| b.1.cmp(a.1)));
            let kept: Vec<String> = live
                .into_iter()
                .take(keep_others)
                .map(|(_, id)| id.clone())
                .collect();
            let ends =
                |id: &String, session: &Session| session.user_id == user_id && !kept.contains(id);
            if people
                .sessions
                .get(session_id)
                .is_some_and(|session| !ends(&session_id.to_owned(), session))
            {
                return Err(Error::Conflict(format!("session {session_id:?} exists")));
            }
            people.sessions.retain(|id, session| !ends(id, session));
            if let Some(user) = people.users.get_mut(user_id) {
                user.last_login_at = Some(now);
            }
            people.sessions.insert(
                session_id.to_owned(),
                Session {
                    user_id: user_id.to_owned(),
                    // Seconds of any realistic session fit in f64 exactly.
                    expires_at: now + session_seconds as f64,
                    revoked: false,
                },
            );
            Ok(())
        })
    }

    async fn session_user(&self, session_id: &str) -> Result<Option<UserRow>> {
        self.read(|state, now| {
            let people = &state.people;
            Ok(people
                .sessions
                .get(session_id)
                .filter(|session| !session.revoked && session.expires_at > now)
                .and_then(|session| people.enabled(&session.user_id)))
        })
    }

    async fn revoke_session(&self, session_id: &str) -> Result<bool> {
        self.write(|state, _| {
            Ok(state
                .people
                .sessions
                .get_mut(session_id)
                .map(|session| session.revoked = true)
                .is_some())
        })
    }

    async fn create_token(&self, token: NewToken) -> Result<TokenRow> {
        self.write(|state, now| {
            let people = &mut state.people;
            if !people.users.contains_key(&token.user_id) {
                return Err(Error::NotFound(format!("user {:?}", token.user_id)));
            }
            // The user's revoked and expired tokens go; the rest count against the bound.
            let ended = |row: &TokenRow| {
                row.user_id == token.user_id
                    && (row.revoked || row.expires_at.is_some_and(|at| at <= now))
            };
            let live = people
                .tokens
                .values()
                .filter(|row| row.user_id == token.user_id && !ended(row))
                .count();
            if live >= usize::try_from(token.live_max).unwrap_or(usize::MAX) {
                return Err(Error::LimitReached(crate::Limit::TokensPerUser {
                    max: token.live_max,
                }));
            }
            if people.tokens.get(&token.id).is_some_and(|row| !ended(row)) {
                return Err(Error::Conflict(format!("token {:?} exists", token.id)));
            }
            people.tokens.retain(|_, row| !ended(row));
            let row = TokenRow {
                id: token.id,
                user_id: token.user_id,
                name: token.name,
                token_hash: token.token_hash,
                created_at: now,
                revoked: false,
                expires_at: token.lifetime_seconds.map(|lifetime| now + lifetime),
            };
            people.tokens.insert(row.id.clone(), row.clone());
            Ok(row)
        })
    }

    async fn token_user(&self, token_id: &str) -> Result<Option<(TokenRow, UserRow)>> {
        self.read(|state, now| {
            let people = &state.people;
            Ok(people
                .tokens
                .get(token_id)
                .filter(|token| !token.revoked && token.expires_at.is_none_or(|at| at > now))
                .and_then(|token| Some((token.clone(), people.enabled(&token.user_id)?))))
        })
    }

    async fn expired_token(&self, token_id: &str) -> Result<Option<TokenRow>> {
        self.read(|state, now| {
            let people = &state.people;
            Ok(people
                .tokens
                .get(token_id)
                .filter(|token| !token.revoked && token.expires_at.is_some_and(|at| at <= now))
                .filter(|token| people.enabled(&token.user_id).is_some())
                .cloned())
        })
    }

    async fn list_tokens(&self, user_id: &str) -> Result<Vec<TokenRow>> {
        self.read(|state, _| {
            let mut tokens: Vec<TokenRow> = state
                .people
                .tokens
                .values()
                .filter(|token| token.user_id == user_id)
                .cloned()
                .collect();
            tokens.sort_by(|a, b| {
                a.created_at
                    .total_cmp(&b.created_at)
                    .then_with(|| a.id.cmp(&b.id))
            });
            Ok(tokens)
        })
    }

    async fn revoke_token(&self, user_id: &str, token_id: &str) -> Result<bool> {
        self.write(|state, _| {
            Ok(state
                .people
                .tokens
                .get_mut(token_id)
                .filter(|token| token.user_id == user_id && !token.revoked)
                .map(|token| token.revoked = true)
                .is_some())
        })
    }
}

impl crate::Operators for SimStore {
    async fn overdue_waits(&self) -> Result<u64> {
        self.read(|state, now| {
            let overdue = state
                .workflows
                .values()
                .filter(|workflow| {
                    matches!(
                        workflow.row.status,
                        WorkflowStatus::Running
                            | WorkflowStatus::Paused
                            | WorkflowStatus::WaitingApproval
                    )
                })
                .flat_map(|workflow| workflow.steps.values())
                .filter(|step| {
                    let row = &step.row;
                    let remind_ms = row.record.as_ref().ok().and_then(|record| {
                        matches!(record.kind(), StepKind::Pause | StepKind::HumanCheckpoint)
                            .then(|| record.args["remindAfterMs"].as_f64())
                            .flatten()
                    });
                    row.status == StepStatus::Running
                        && remind_ms.is_some_and(|ms| row.created_at + ms / 1000.0 <= now)
                })
                .count();
            Ok(u64::try_from(overdue).unwrap_or(u64::MAX))
        })
    }

    async fn workflow_counts(&self, owner: Option<&str>) -> Result<Vec<StatusCount>> {
        self.read(|state, _| {
            Ok(counts(
                state
                    .workflows
                    .values()
                    .filter(|workflow| {
                        owner.is_none_or(|owner| workflow.row.owner.as_deref() == Some(owner))
                    })
                    .map(|workflow| workflow.row.status.as_str()),
            ))
        })
    }

    async fn run_counts(&self, owner: &str) -> Result<Vec<StatusCount>> {
        self.read(|state, _| {
            Ok(counts(
                state
                    .runs
                    .values()
                    .filter(|run| run.owner_worker_id.as_deref() == Some(owner))
                    .map(|run| run.status.as_str()),
            ))
        })
    }

    async fn waiting_workflows(
        &self,
        user_id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<WorkflowId>> {
        self.read(|state, _| {
            let mut waiting: Vec<_> = state
                .workflows
                .values()
                .filter(|workflow| user_id.is_none_or(|user| workflow.row.user_id == user))
                .filter(|workflow| state.waits_for_a_person(&workflow.row.workflow_id))
                .map(|workflow| (workflow.row.created_at, workflow.row.workflow_id.clone()))
                .collect();
            waiting.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
            Ok(waiting
                .into_iter()
                .take(limit as usize)
                .map(|(_, id)| id)
                .collect())
        })
    }

    async fn list_slots(&self, limit: u32) -> Result<Vec<SlotRow>> {
        self.read(|state, _| {
            let mut slots: Vec<SlotRow> = state.slots.values().cloned().collect();
            slots.sort_by(|a, b| {
                a.created_at
                    .total_cmp(&b.created_at)
                    .then_with(|| a.workflow_id.cmp(&b.workflow_id))
                    .then_with(|| a.step_id.cmp(&b.step_id))
            });
            slots.truncate(limit as usize);
            Ok(slots)
        })
    }

    async fn register_node(&self, node: &NodeRecord) -> Result<()> {
        self.write(|state, now| {
            let nodes = &mut state.people.nodes;
            if nodes.contains_key(&node.worker_id) {
                return Err(Error::Conflict(format!("node {:?} exists", node.worker_id)));
            }
            nodes.insert(
                node.worker_id.clone(),
                NodeRecord {
                    started_at: now,
                    stopped_at: None,
                    ..node.clone()
                },
            );
            Ok(())
        })
    }

    async fn mark_node_stopped(&self, worker_id: &str) -> Result<()> {
        self.write(|state, now| {
            if let Some(node) = state.people.nodes.get_mut(worker_id) {
                node.stopped_at = Some(now);
            }
            Ok(())
        })
    }

    async fn list_nodes(&self, limit: u32) -> Result<Vec<NodeRecord>> {
        self.read(|state, _| {
            let mut nodes: Vec<NodeRecord> = state.people.nodes.values().cloned().collect();
            nodes.sort_by(|a, b| {
                b.started_at
                    .total_cmp(&a.started_at)
                    .then_with(|| a.worker_id.cmp(&b.worker_id))
            });
            nodes.truncate(limit as usize);
            Ok(nodes)
        })
    }
}
