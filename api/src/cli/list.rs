//! `reins list`: a page of workflows, newest first, as a table, and the command that lists the
//! next page.

use std::collections::HashMap;

use serde_json::Value;

use super::client::Client;
use super::{Common, cells, encode, format_time, print_table, print_value, rows, text, waits};

/// `reins list`: one page of workflows (filtered by `status` and `waiting_for`), after `after`.
pub(super) async fn list(
    common: &Common,
    client: &Client,
    status: Option<String>,
    waiting_for: Option<String>,
    limit: u32,
    after: Option<String>,
) -> anyhow::Result<u8> {
    let (path, more) = page_request(status, waiting_for, limit, after);
    let page = client.json("GET", &path, None).await?;
    let now = waits::now();
    let names = if common.json {
        Default::default()
    } else {
        cells::owner_names(client).await
    };
    print_value(common, &page, || print_page(&page, &names, now, &more));
    Ok(0)
}

/// The page's request path, and the command (without `--after`) that lists the next page with
/// the same filters.
fn page_request(
    status: Option<String>,
    waiting_for: Option<String>,
    limit: u32,
    after: Option<String>,
) -> (String, String) {
    let mut path = format!("/api/v1/workflows?limit={limit}");
    let mut more = format!("reins list --limit {limit}");
    if let Some(status) = status {
        path.push_str(&format!("&status={}", encode(&status)));
        more.push_str(&format!(" --status {status}"));
    }
    if let Some(kind) = waiting_for {
        path.push_str(&format!("&waiting_for={}", encode(&kind)));
        more.push_str(&format!(" --waiting-for {kind}"));
    }
    if let Some(after) = after {
        path.push_str(&format!("&after={}", encode(&after)));
    }
    (path, more)
}

/// The page as a table, then the `more:` line when there is a next page.
fn print_page(page: &Value, names: &HashMap<String, String>, now: f64, more: &str) {
    // OWNER is the person the workflow is for (as the console names them), NODE the node that
    // runs it (the record's `owner`).
    let table = rows(&page["workflows"], |w| {
        vec![
            text(&w["run_id"]),
            text(&w["status"]),
            waits::lines(&w["waiting_for"], now).join("; "),
            cells::owner_name(names, &w["user_id"]),
            text(&w["owner"]),
            format_time(&w["created_at"]),
            text(&w["title"]),
        ]
    });
    print_table(
        &[
            "RUN ID",
            "STATUS",
            "WAITING FOR",
            "OWNER",
            "NODE",
            "CREATED",
            "TITLE",
        ],
        &table,
    );
    if let Some(next) = page["next"].as_str() {
        println!("more: {more} --after {next}");
    }
}
