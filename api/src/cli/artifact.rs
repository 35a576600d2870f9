//! `reins artifact`: downloads an artifact version to standard output (like curl) unless that is
//! a terminal, or to a file.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};

use super::client::{self, Client};
use super::{Common, encode};

/// `reins artifact`: writes version `version` of workflow `id`'s artifact to `output` (`-` or
/// none: standard output, which none refuses when it is a terminal).
pub(super) async fn download(
    common: &Common,
    client: &Client,
    id: &str,
    version: i64,
    output: Option<PathBuf>,
) -> anyhow::Result<u8> {
    // Bytes of any kind thrown at a terminal can garble it: there, ask for a choice.
    if output.is_none() && std::io::stdout().is_terminal() {
        bail!(
            "standard output is a terminal: pass -o FILE to save the artifact, or -o - \
             to print it here anyway"
        );
    }
    let path = format!("/api/v1/workflows/{}/artifacts/{version}", encode(id));
    let answer = client.send("GET", &path, None, Vec::new()).await?;
    client::checked(&answer)?;
    let output = output.unwrap_or_else(|| PathBuf::from("-"));
    if output.as_os_str() == "-" {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(&answer.body)?;
        stdout.flush()?;
    } else {
        std::fs::write(&output, &answer.body)
            .with_context(|| format!("cannot write {}", output.display()))?;
        if !common.json {
            eprintln!("wrote {} bytes to {}", answer.body.len(), output.display());
        }
    }
    Ok(0)
}
