//! Where the CLI keeps its sign-in: the server's URL, the cluster it belongs to and an API token,
//! in a file only the user can read (`$REINS_CLI_CREDENTIALS`, else
//! `$XDG_CONFIG_HOME/reins/credentials.json`, else `~/.config/reins/credentials.json`). Another
//! node's URL is signed in too when that node says it is of the same cluster (`GET /health`).

use std::path::PathBuf;

use anyhow::Context;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Credentials {
    pub url: String,
    pub email: String,
    pub token: String,
    /// The cluster of the node signed in through (`GET /health`'s `cluster`); none in a file
    /// saved before nodes said it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
}

fn path() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("REINS_CLI_CREDENTIALS") {
        return Ok(PathBuf::from(path));
    }
    let config = match std::env::var_os("XDG_CONFIG_HOME") {
        Some(config) => PathBuf::from(config),
        None => PathBuf::from(
            std::env::var_os("HOME").context("neither XDG_CONFIG_HOME nor HOME is set")?,
        )
        .join(".config"),
    };
    Ok(config.join("reins").join("credentials.json"))
}

impl Credentials {
    /// The saved sign-in, if there is one.
    pub fn load() -> anyhow::Result<Option<Credentials>> {
        let path = path()?;
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .with_context(|| format!("{} is not a reins credentials file", path.display())),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    /// Saves the sign-in (mode 0600), replacing any earlier one; returns where.
    pub fn save(&self) -> anyhow::Result<PathBuf> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = path()?;
        if let Some(folder) = path.parent() {
            std::fs::create_dir_all(folder)
                .with_context(|| format!("cannot create {}", folder.display()))?;
        }
        let partial = path.with_extension("json.partial");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&partial)
            .with_context(|| format!("cannot write {}", partial.display()))?;
        file.write_all(&serde_json::to_vec_pretty(self)?)?;
        file.sync_all()?;
        std::fs::rename(&partial, &path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(path)
    }
}
