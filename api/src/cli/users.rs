//! `reins users ...` (admins manage users) and `reins password` (change your own). A user is
//! named by id or by email; passwords come from standard input (or `REINS_CLI_PASSWORD`, and
//! `REINS_CLI_NEW_PASSWORD` for the new one of `reins password`), never from an argument that
//! other users could read in the process list.

use anyhow::Context;
use serde_json::{Value, json};

use super::client::Client;
use super::{Common, encode, format_time, print_table, print_value, read_password_from, text};

#[derive(Debug, clap::Subcommand)]
pub enum UsersCommand {
    /// Every user, oldest first.
    List,
    /// Create a user (the password is read from standard input).
    Create {
        email: String,
        /// `user`, `approver` (may also see and answer every workflow) or `admin`.
        #[arg(long, default_value = "user")]
        role: String,
    },
    /// Change a user's role: `user`, `approver` or `admin`.
    SetRole { user: String, role: String },
    /// Disable a user: their sessions end and their API tokens are refused until enabled.
    Disable { user: String },
    /// Enable a disabled user.
    Enable { user: String },
    /// Set a user's password (read from standard input); their sessions end.
    ResetPassword { user: String },
    /// End every session of a user.
    SignOut { user: String },
    /// Delete a user who owns no live workflow, with their sessions and API tokens.
    Delete { user: String },
}

/// The id of the user named by `who`: an email (looked up in the list) or an id.
async fn user_id(client: &Client, who: &str) -> anyhow::Result<String> {
    if !who.contains('@') {
        return Ok(who.to_owned());
    }
    let wanted = who.trim().to_ascii_lowercase();
    let users = client.json("GET", "/api/v1/auth/users", None).await?;
    users["users"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|u| u["email"].as_str() == Some(wanted.as_str()) || u["email"] == who)
        .and_then(|u| u["id"].as_str().map(str::to_owned))
        .with_context(|| format!("no user with email {who:?}"))
}

fn print_user(common: &Common, user: &Value, done: &str) {
    print_value(common, user, || {
        println!(
            "{} {} ({}{}): {done}",
            text(&user["email"]),
            text(&user["id"]),
            text(&user["role"]),
            if user["disabled"] == true {
                ", disabled"
            } else {
                ""
            }
        );
    });
}

pub async fn run(common: &Common, client: &Client, command: UsersCommand) -> anyhow::Result<u8> {
    let path = |id: &str, rest: &str| format!("/api/v1/auth/users/{}{rest}", encode(id));
    match command {
        UsersCommand::List => {
            let users = client.json("GET", "/api/v1/auth/users", None).await?;
            print_value(common, &users, || {
                let rows: Vec<Vec<String>> = users["users"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|u| {
                        vec![
                            text(&u["id"]),
                            text(&u["email"]),
                            text(&u["role"]),
                            if u["disabled"] == true { "yes" } else { "no" }.to_owned(),
                            format_time(&u["created_at"]),
                            format_time(&u["last_login_at"]),
                        ]
                    })
                    .collect();
                print_table(
                    &["ID", "EMAIL", "ROLE", "DISABLED", "CREATED", "LAST SIGN-IN"],
                    &rows,
                );
            });
        }
        UsersCommand::Create { email, role } => {
            let password = read_password_from("REINS_CLI_PASSWORD", "password")?;
            let body = json!({"email": email, "password": password, "role": role});
            let user = client
                .json("POST", "/api/v1/auth/users", Some(&body))
                .await?;
            print_user(common, &user, "created");
        }
        UsersCommand::SetRole { user, role } => {
            let id = user_id(client, &user).await?;
            let body = json!({"role": role});
            let user = client.json("PATCH", &path(&id, ""), Some(&body)).await?;
            print_user(common, &user, "role set");
        }
        UsersCommand::Disable { user } => {
            let id = user_id(client, &user).await?;
            let body = json!({"disabled": true});
            let user = client.json("PATCH", &path(&id, ""), Some(&body)).await?;
            print_user(common, &user, "disabled; their sessions ended");
        }
        UsersCommand::Enable { user } => {
            let id = user_id(client, &user).await?;
            let body = json!({"disabled": false});
            let user = client.json("PATCH", &path(&id, ""), Some(&body)).await?;
            print_user(common, &user, "enabled");
        }
        UsersCommand::ResetPassword { user } => {
            let id = user_id(client, &user).await?;
            let password = read_password_from("REINS_CLI_PASSWORD", "new password")?;
            let body = json!({"password": password});
            let user = client
                .json("POST", &path(&id, "/password"), Some(&body))
                .await?;
            print_user(common, &user, "password set; their sessions ended");
        }
        UsersCommand::SignOut { user } => {
            let id = user_id(client, &user).await?;
            let user = client
                .json("POST", &path(&id, "/sign-out"), Some(&json!({})))
                .await?;
            print_user(common, &user, "every session ended");
        }
        UsersCommand::Delete { user } => {
            let id = user_id(client, &user).await?;
            let reply = client.json("DELETE", &path(&id, ""), None).await?;
            print_value(common, &reply, || println!("deleted {user}"));
        }
    }
    Ok(0)
}

/// `reins password`: the current password, then the new one.
pub async fn change_own_password(common: &Common, client: &Client) -> anyhow::Result<u8> {
    let current = read_password_from("REINS_CLI_PASSWORD", "current password")?;
    let new = read_password_from("REINS_CLI_NEW_PASSWORD", "new password")?;
    let body = json!({"current_password": current, "new_password": new});
    let user = client
        .json("POST", "/api/v1/auth/me/password", Some(&body))
        .await?;
    print_user(common, &user, "password changed; your other sessions ended");
    Ok(0)
}
