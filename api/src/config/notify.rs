//! The notification webhooks' configuration: `[[notify]]` entries (one per webhook) and the
//! `[notifications]` bounds they share, checked into [`actors::notify::NotifyOptions`].

use std::path::PathBuf;
use std::time::Duration;

use actors::notify::{NotifyFormat, NotifyOptions, NotifySink};
use serde::{Deserialize, Serialize};
use store::{NotificationKind, Role};

use super::Error;

/// The smallest `notifications.body_bytes_max`: room for the ids, the link and the time.
const BODY_BYTES_MAX_MIN: u64 = 1024;

/// One webhook (`[[notify]]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyConfig {
    /// Where notifications are POSTed: an `http://` or `https://` URL.
    pub url: String,
    /// The key of the `X-Reins-Signature` HMAC; or `secret_file`, a file holding it.
    pub secret: Option<String>,
    pub secret_file: Option<PathBuf>,
    /// Only items of workflows whose owner has one of these roles (`user`, `approver`, `admin`).
    #[serde(default)]
    pub roles: Vec<String>,
    /// Only items of workflows whose owner is one of these users (email or id).
    #[serde(default)]
    pub users: Vec<String>,
    /// `reins` (default) or `slack` (`{"text": ...}`, for Slack-compatible incoming webhooks).
    #[serde(default)]
    pub format: FormatConfig,
    /// The kinds sent: `entered`, `decided`, `timed_out`, `overdue` (default: all).
    pub events: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FormatConfig {
    #[default]
    Reins,
    Slack,
}

/// The bounds every webhook's deliveries share (`[notifications]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotificationsConfig {
    /// The console's address as people reach it (`https://reins.example.com`), for the link in
    /// every notification; empty: `http://` and the `listen` address.
    pub public_url: String,
    /// How long one POST may take, its answer included.
    pub request_timeout_ms: u64,
    /// Attempts per notification and webhook before that webhook's delivery is given up.
    pub attempts_max: u32,
    /// The wait after the first failed attempt; it doubles after each, up to `backoff_max_ms`.
    pub backoff_first_ms: u64,
    pub backoff_max_ms: u64,
    /// The largest body sent (texts are cut to fit); at least 1,024.
    pub body_bytes_max: u64,
    /// How long an undelivered notification is kept before it is deleted.
    pub outbox_retention_ms: u64,
    /// How often a node looks for notifications to deliver.
    pub poll_ms: u64,
    /// Notifications a node delivers at once to each webhook at most.
    pub batch_max: u32,
}

impl Default for NotificationsConfig {
    fn default() -> Self {
        NotificationsConfig {
            public_url: String::new(),
            request_timeout_ms: 10_000,
            attempts_max: 20,
            backoff_first_ms: 1_000,
            backoff_max_ms: 300_000,
            body_bytes_max: 16 * 1024,
            outbox_retention_ms: 7 * 86_400_000,
            poll_ms: 1_000,
            batch_max: 16,
        }
    }
}

/// Whether `url` is an absolute `http` or `https` URL with a host.
fn is_http_url(url: &str) -> bool {
    url.parse::<hyper::Uri>()
        .is_ok_and(|uri| matches!(uri.scheme_str(), Some("http" | "https")) && uri.host().is_some())
}

/// Checks the webhooks and their bounds; `None` when no webhook is configured.
pub(super) fn check(
    sinks: &[NotifyConfig],
    bounds: &NotificationsConfig,
    listen: &std::net::SocketAddr,
) -> Result<Option<NotifyOptions>, Error> {
    let invalid = |key: &'static str, message: String| Error::Invalid { key, message };
    for (key, value) in [
        (
            "notifications.request_timeout_ms",
            bounds.request_timeout_ms,
        ),
        ("notifications.attempts_max", u64::from(bounds.attempts_max)),
        ("notifications.backoff_first_ms", bounds.backoff_first_ms),
        ("notifications.backoff_max_ms", bounds.backoff_max_ms),
        (
            "notifications.outbox_retention_ms",
            bounds.outbox_retention_ms,
        ),
        ("notifications.poll_ms", bounds.poll_ms),
        ("notifications.batch_max", u64::from(bounds.batch_max)),
    ] {
        if value == 0 {
            return Err(invalid(key, "must be greater than 0".into()));
        }
    }
    if bounds.body_bytes_max < BODY_BYTES_MAX_MIN {
        return Err(invalid(
            "notifications.body_bytes_max",
            format!("{} is under {BODY_BYTES_MAX_MIN}", bounds.body_bytes_max),
        ));
    }
    if !bounds.public_url.is_empty() && !is_http_url(&bounds.public_url) {
        return Err(invalid(
            "notifications.public_url",
            format!("{:?} is not an http or https URL", bounds.public_url),
        ));
    }
    let mut checked: Vec<NotifySink> = Vec::new();
    for (index, sink) in sinks.iter().enumerate() {
        let entry = index + 1;
        if !is_http_url(&sink.url) {
            return Err(invalid(
                "notify.url",
                format!(
                    "entry {entry}: {:?} is not an http or https URL (only http:// and https:// \
                     webhooks are posted to)",
                    sink.url
                ),
            ));
        }
        if checked.iter().any(|other| other.url == sink.url) {
            return Err(invalid(
                "notify.url",
                format!("entry {entry}: {:?} is configured twice", sink.url),
            ));
        }
        let secret = match (&sink.secret, &sink.secret_file) {
            (Some(secret), None) if !secret.is_empty() => secret.clone().into_bytes(),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    invalid(
                        "notify.secret_file",
                        format!("entry {entry}: cannot read {}: {e}", path.display()),
                    )
                })?;
                let secret = text.trim();
                if secret.is_empty() {
                    return Err(invalid(
                        "notify.secret_file",
                        format!("entry {entry}: {} is empty", path.display()),
                    ));
                }
                secret.as_bytes().to_vec()
            }
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "notify.secret",
                    format!("entry {entry}: give `secret` or `secret_file`, not both"),
                ));
            }
            _ => {
                return Err(invalid(
                    "notify.secret",
                    format!(
                        "entry {entry}: every webhook needs a non-empty `secret` (or \
                         `secret_file`) to sign its notifications"
                    ),
                ));
            }
        };
        if let Some(role) = sink.roles.iter().find(|role| Role::parse(role).is_none()) {
            return Err(invalid(
                "notify.roles",
                format!("entry {entry}: {role:?} is not one of user, approver, admin"),
            ));
        }
        let kinds = match &sink.events {
            None => NotificationKind::ALL.to_vec(),
            Some(names) => names
                .iter()
                .map(|name| {
                    NotificationKind::parse(name).ok_or_else(|| {
                        invalid(
                            "notify.events",
                            format!(
                                "entry {entry}: {name:?} is not one of entered, decided, \
                                 timed_out, overdue"
                            ),
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
        };
        checked.push(NotifySink {
            url: sink.url.clone(),
            secret,
            roles: sink.roles.clone(),
            users: sink.users.clone(),
            format: match sink.format {
                FormatConfig::Reins => NotifyFormat::Reins,
                FormatConfig::Slack => NotifyFormat::Slack,
            },
            kinds,
        });
    }
    if checked.is_empty() {
        return Ok(None);
    }
    let public_url = if bounds.public_url.is_empty() {
        format!("http://{listen}")
    } else {
        bounds.public_url.trim_end_matches('/').to_owned()
    };
    Ok(Some(NotifyOptions {
        sinks: checked,
        public_url,
        request_timeout: Duration::from_millis(bounds.request_timeout_ms),
        attempts_max: bounds.attempts_max,
        backoff_first: Duration::from_millis(bounds.backoff_first_ms),
        backoff_max: Duration::from_millis(bounds.backoff_max_ms),
        body_bytes_max: usize::try_from(bounds.body_bytes_max).unwrap_or(usize::MAX),
        retention: Duration::from_millis(bounds.outbox_retention_ms),
        poll: Duration::from_millis(bounds.poll_ms),
        batch_max: bounds.batch_max,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink(url: &str) -> NotifyConfig {
        NotifyConfig {
            url: url.into(),
            secret: Some("s3cret".into()),
            secret_file: None,
            roles: Vec::new(),
            users: Vec::new(),
            format: FormatConfig::Reins,
            events: None,
        }
    }

    fn checked(sinks: &[NotifyConfig]) -> Result<Option<NotifyOptions>, Error> {
        let listen = "127.0.0.1:7420".parse().expect("an address");
        check(sinks, &NotificationsConfig::default(), &listen)
    }

    #[test]
    fn a_webhook_url_that_is_not_http_is_refused_naming_the_field() {
        for bad in [
            "ftp://example.com/hook",
            "file:///etc/passwd",
            "example.com/hook",
            "",
        ] {
            let error = checked(&[sink(bad)]).expect_err(bad).to_string();
            assert!(
                error.contains("notify.url") && error.contains("entry 1"),
                "{error}"
            );
        }
        for good in [
            "http://127.0.0.1:9000/hook",
            "https://hooks.slack.com/services/T/B/X",
        ] {
            assert!(checked(&[sink(good)]).is_ok_and(|o| o.is_some()), "{good}");
        }
    }

    #[test]
    fn a_webhook_needs_one_secret_and_known_roles_and_kinds() {
        let no_secret = NotifyConfig {
            secret: None,
            ..sink("http://h/")
        };
        assert!(checked(&[no_secret]).is_err_and(|e| e.to_string().contains("notify.secret")));
        let role = NotifyConfig {
            roles: vec!["boss".into()],
            ..sink("http://h/")
        };
        assert!(checked(&[role]).is_err_and(|e| e.to_string().contains("notify.roles")));
        let kind = NotifyConfig {
            events: Some(vec!["entered".into(), "opened".into()]),
            ..sink("http://h/")
        };
        assert!(checked(&[kind]).is_err_and(|e| e.to_string().contains("notify.events")));
        let twice = [sink("http://h/"), sink("http://h/")];
        assert!(checked(&twice).is_err_and(|e| e.to_string().contains("configured twice")));
        assert!(checked(&[]).is_ok_and(|o| o.is_none()));
    }

    #[test]
    fn the_bounds_are_positive_and_the_body_has_room_for_its_ids() {
        let listen = "127.0.0.1:7420".parse().expect("an address");
        let at = |body_bytes_max| NotificationsConfig {
            body_bytes_max,
            ..NotificationsConfig::default()
        };
        let error = check(&[sink("http://h/")], &at(1023), &listen).expect_err("under");
        assert!(error.to_string().contains("notifications.body_bytes_max"));
        assert!(check(&[sink("http://h/")], &at(1024), &listen).is_ok());
        let zero = NotificationsConfig {
            attempts_max: 0,
            ..NotificationsConfig::default()
        };
        let error = check(&[sink("http://h/")], &zero, &listen).expect_err("zero");
        assert!(error.to_string().contains("notifications.attempts_max"));
        let options = check(
            &[sink("http://h/")],
            &NotificationsConfig::default(),
            &listen,
        )
        .expect("valid")
        .expect("a sink");
        assert_eq!(options.public_url, "http://127.0.0.1:7420");
    }
}
