//! The `tollgate serve` configuration that decides exactly as a library guard does:
//! its guard as `[guard.default]` (every key written out, so no default of either side
//! matters) and its policy set's `[policy]` section (absolute paths). `tollgate policy
//! replay --config` takes it, so a library guard's local audit log (the Python package's,
//! an embedder's) replays under the very settings that wrote it (issue 19).
//!
//! Not written: a guard's `parent_guard_id` (no `[guard]` key holds it; it decides
//! nothing).

use std::fmt::Write as _;
use std::path::Path;

use tollgate_core::GuardConfig;
use tollgate_policy::files::Settings;

/// A TOML basic string holding `s` (quotes, backslashes and control characters escaped).
pub fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A path as a TOML string; a path that is not UTF-8 cannot be written.
fn path(p: &Path) -> Result<String, String> {
    p.to_str().map(quoted).ok_or_else(|| {
        format!(
            "`{}` is not UTF-8: it cannot be written in TOML",
            p.display()
        )
    })
}

/// The configuration text: `[guard.default]` with every key of `guard`, then, with a set,
/// `[policy]` as `policy` says (its files and schema as absolute paths, resolved against
/// `cwd` when relative).
pub fn candidate_toml(
    guard: &GuardConfig,
    policy: Option<&Settings>,
    cwd: &Path,
) -> Result<String, String> {
    let mut t = String::from(
        "# The settings of a library guard, as a `tollgate serve` configuration: replay its\n\
         # audit log with `tollgate policy replay --config THIS.toml --key PUB LOG`.\n\
         [guard.default]\n",
    );
    let g = guard;
    let _ = writeln!(t, "budget_usd = {:?}", g.budget.to_usd());
    let _ = writeln!(t, "budget_scope = {}", quoted(g.budget_scope.as_str()));
    let _ = writeln!(t, "max_repeat_calls = {}", g.max_repeat_calls);
    let _ = writeln!(t, "error_amplification = {}", g.error_amplification);
    let _ = writeln!(t, "timeout_seconds = {}", g.timeout_seconds);
    let _ = writeln!(t, "window_duration_s = {}", g.window_duration_s);
    let _ = writeln!(t, "window_max_calls = {}", g.window_max_calls);
    let _ = writeln!(t, "max_total_calls = {}", g.max_total_calls);
    let _ = writeln!(t, "probabilistic_deny = {}", g.probabilistic_deny);
    let _ = writeln!(t, "deny_jitter_ratio = {:?}", g.deny_jitter_ratio.to_f64());
    let _ = writeln!(t, "hitl_mode = {}", quoted(g.hitl_mode.as_str()));
    let _ = writeln!(
        t,
        "hitl_budget_threshold = {:?}",
        g.hitl_budget_threshold.to_f64()
    );
    let _ = writeln!(t, "settlement = {}", quoted(g.settlement.as_str()));
    let _ = writeln!(t, "nonce_window = {}", g.nonce_window);
    let _ = writeln!(t, "max_reservations = {}", g.max_reservations);
    let _ = writeln!(t, "max_held_calls = {}", g.max_held_calls);
    if let Some(p) = policy {
        let abs = |f: &Path| {
            if f.is_absolute() {
                f.to_owned()
            } else {
                cwd.join(f)
            }
        };
        let files = p
            .files
            .iter()
            .map(|f| path(&abs(f)))
            .collect::<Result<Vec<_>, _>>()?;
        t.push_str("\n[policy]\n");
        let _ = writeln!(t, "files = [{}]", files.join(", "));
        let _ = writeln!(t, "default = {}", quoted(p.default.as_str()));
        if let Some(s) = &p.schema {
            let _ = writeln!(t, "schema = {}", path(&abs(s))?);
        }
        let _ = writeln!(t, "trip_on_refusal = {}", p.trip_on_refusal);
        let _ = writeln!(
            t,
            "mode = {}",
            quoted(if p.shadow { "shadow" } else { "enforce" })
        );
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::{HitlMode, Money, Ratio};

    #[test]
    fn strings_and_numbers_are_written_as_toml_reads_them() {
        assert_eq!(quoted("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000A\"");
        let g = GuardConfig {
            budget: Money(1_234_567_891),
            deny_jitter_ratio: Ratio::from_ppm(123_457),
            hitl_mode: HitlMode::OnThreshold,
            ..GuardConfig::default()
        };
        let t = candidate_toml(&g, None, Path::new("/")).unwrap();
        assert!(t.contains("budget_usd = 1.234567891\n"), "{t}");
        assert!(t.contains("deny_jitter_ratio = 0.123457\n"), "{t}");
        assert!(t.contains("hitl_mode = \"on_threshold\"\n"), "{t}");
        assert!(!t.contains("[policy]"), "{t}");
    }
}
