//! `tollgate policy check`: findings with file, line and column; exit codes; the digest.

use crate::{stdout, tollgate};

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_owned()
}

#[test]
fn a_good_set_exits_0_with_its_digest_and_a_bad_one_1_naming_file_line_column() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(
        dir.path(),
        "tools.cedar",
        "@id(\"no-shell\")\nforbid(principal, action == Action::\"shell\", resource);\n",
    );
    let out = tollgate(&["policy", "check", &good]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.starts_with("ok: 1 policies, 0 warnings, default allow, digest "),
        "{text}"
    );
    // The same set checked again has the same digest; with default deny another.
    assert_eq!(stdout(&tollgate(&["policy", "check", &good])), text);
    let deny = stdout(&tollgate(&["policy", "check", "--default", "deny", &good]));
    assert!(
        deny.contains("default deny")
            && deny.split("digest ").nth(1) != text.split("digest ").nth(1)
    );

    let bad = write(
        dir.path(),
        "bad.cedar",
        "@id(\"a\")\npermit(principal, action, resource)\n  when { context.args.x == };\n",
    );
    let out = tollgate(&["policy", "check", &good, &bad]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains(&format!("{bad}:3:")), "{text}");
    assert!(
        text.trim_end().ends_with("refused: 1 errors, 0 warnings"),
        "{text}"
    );
}

#[test]
fn the_schema_is_checked_and_checks_the_policies() {
    let dir = tempfile::tempdir().unwrap();
    let schema = write(dir.path(), "tools.cedarschema", "action \"pay\" appliesTo { principal: Agent, resource: Upstream,\n  context: { args: { amount: decimal } } };\n");
    let p = write(dir.path(), "pay.cedar", "@id(\"big\")\n@hitl\npermit(principal, action == Action::\"pay\", resource)\n  when { context.args.amout.greaterThan(decimal(\"100.0\")) };\n");
    let out = tollgate(&["policy", "check", "--schema", &schema, &p]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stdout(&out).contains(&format!("{p}:4:")),
        "{}",
        stdout(&out)
    );
    std::fs::write(dir.path().join("pay.cedar"), "@id(\"big\")\n@hitl\npermit(principal, action == Action::\"pay\", resource)\n  when { context.args.amount.greaterThan(decimal(\"100.0\")) };\n").unwrap();
    let out = tollgate(&["policy", "check", "--schema", &schema, &p]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}

#[test]
fn unreadable_files_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.cedar");
    let out = tollgate(&["policy", "check", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let binary = dir.path().join("bin.cedar");
    std::fs::write(&binary, [0xff, 0xfe, 0x00]).unwrap();
    let out = tollgate(&["policy", "check", binary.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not UTF-8"));
}
