//! The results table of a sweep: one row per member with what changed and how it went, written
//! as markdown (to read) and CSV (to load into anything else), from the members' metrics files.

use std::fmt::Write as _;
use std::path::Path;

use ferrotron_plan::Plan;

use crate::SweepError;
use crate::expand::{short_key, short_value};
use crate::metrics_log::MetricsLog;
use crate::resolve::{METRICS_FILE, Member};
use crate::runner::{MemberStatus, member_dir};

/// Results file names in the sweep directory.
pub const RESULTS_MD: &str = "results.md";
pub const RESULTS_CSV: &str = "results.csv";

/// One member's line in the results.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultRow {
    pub member: String,
    pub hash: String,
    /// The varied values, `lr=3e-4 tp=1`.
    pub changed: String,
    pub last_interval_loss: Option<f64>,
    pub best_eval_loss: Option<f64>,
    pub tokens_per_second: Option<f64>,
    /// 0–1.
    pub mfu: Option<f64>,
    pub status: String,
}

/// `lr=3e-4 tp=1 s=2` for a member.
pub fn changed_values(member: &Member) -> String {
    member
        .spec
        .varied
        .iter()
        .map(|(k, v)| format!("{}={}", short_key(k), short_value(v)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Rows for `members` (with their `statuses`), reading each member's metrics under `out_dir`.
pub fn result_rows(
    members: &[Member],
    statuses: &[MemberStatus],
    out_dir: &Path,
) -> Vec<ResultRow> {
    members
        .iter()
        .zip(statuses)
        .map(|(member, status)| {
            let metrics = MetricsLog::read(&member_dir(out_dir, member).join(METRICS_FILE))
                .unwrap_or_default();
            ResultRow {
                member: member.spec.name.clone(),
                hash: member.short_hash().unwrap_or("-").to_owned(),
                changed: changed_values(member),
                last_interval_loss: metrics.last_interval_loss(),
                best_eval_loss: metrics.best_eval_loss(),
                tokens_per_second: metrics.mean_tokens_per_second(),
                mfu: metrics.mean_mfu(),
                status: status.label(),
            }
        })
        .collect()
}

const HEADERS: [&str; 8] = [
    "member",
    "hash",
    "changed",
    "last interval loss",
    "best validation loss",
    "tokens/s",
    "MFU %",
    "status",
];

fn cells(row: &ResultRow) -> [String; 8] {
    let num = |v: Option<f64>, digits: usize| {
        v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
    };
    [
        row.member.clone(),
        row.hash.clone(),
        row.changed.clone(),
        num(row.last_interval_loss, 4),
        num(row.best_eval_loss, 4),
        num(row.tokens_per_second, 0),
        num(row.mfu.map(|m| m * 100.0), 2),
        row.status.clone(),
    ]
}

/// A markdown table.
pub fn render_markdown(rows: &[ResultRow]) -> String {
    let mut out = format!("| {} |\n|", HEADERS.join(" | "));
    out.push_str(&"---|".repeat(HEADERS.len()));
    out.push('\n');
    for row in rows {
        let _ = writeln!(out, "| {} |", cells(row).join(" | "));
    }
    out
}

/// CSV with a header line; numbers unrounded, empty where unknown.
pub fn render_csv(rows: &[ResultRow]) -> String {
    let mut out = String::from(
        "member,hash,changed,last_interval_loss,best_eval_loss,tokens_per_second,mfu,status\n",
    );
    let num = |v: Option<f64>| v.map_or_else(String::new, |v| v.to_string());
    for row in rows {
        let fields = [
            csv_field(&row.member),
            csv_field(&row.hash),
            csv_field(&row.changed),
            num(row.last_interval_loss),
            num(row.best_eval_loss),
            num(row.tokens_per_second),
            num(row.mfu),
            csv_field(&row.status),
        ];
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out
}

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

/// Writes `results.md` and `results.csv` into `out_dir`.
pub fn write_results(out_dir: &Path, rows: &[ResultRow]) -> Result<(), SweepError> {
    for (name, text) in [
        (RESULTS_MD, render_markdown(rows)),
        (RESULTS_CSV, render_csv(rows)),
    ] {
        let path = out_dir.join(name);
        std::fs::write(&path, text).map_err(|source| SweepError::Write { path, source })?;
    }
    Ok(())
}

/// One line of a plan for the dry run: degrees, memory, predicted step time and MFU.
pub fn plan_line(plan: &Plan) -> String {
    let d = &plan.degrees;
    let gib = plan.memory.per_gpu_bytes.total as f64 / f64::from(1u32 << 30);
    format!(
        "world {} (tp{} pp{} cp{} ep{} dp{}) | {:.2}M params | {:.2} GiB/GPU{} | step {} | MFU {:.1}%",
        plan.world_size,
        d.tp,
        d.pp,
        d.cp,
        d.ep,
        d.dp,
        plan.parameters.total as f64 / 1e6,
        gib,
        if plan.memory.fits {
            ""
        } else {
            " (does not fit)"
        },
        seconds(plan.predicted.step_seconds),
        plan.predicted.mfu * 100.0
    )
}

fn seconds(s: f64) -> String {
    if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(status: &str) -> ResultRow {
        ResultRow {
            member: "s-000-lr1e-3".into(),
            hash: "abcdef012345".into(),
            changed: "lr=1e-3".into(),
            last_interval_loss: Some(3.25),
            best_eval_loss: None,
            tokens_per_second: Some(1234.4),
            mfu: Some(0.125),
            status: status.into(),
        }
    }

    #[test]
    fn markdown_and_csv_hold_every_column() {
        let md = render_markdown(&[row("finished")]);
        assert_eq!(md.lines().count(), 3);
        assert!(
            md.contains(
                "| s-000-lr1e-3 | abcdef012345 | lr=1e-3 | 3.2500 | - | 1234 | 12.50 | finished |"
            ),
            "{md}"
        );
        let csv = render_csv(&[row("failed (exit 1), twice")]);
        assert_eq!(
            csv.lines().nth(1),
            Some("s-000-lr1e-3,abcdef012345,lr=1e-3,3.25,,1234.4,0.125,\"failed (exit 1), twice\"")
        );
    }
}
