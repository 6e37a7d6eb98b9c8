//! `tollgate policy check --mcp` (`tollgate-mcp-testkit policy-check`, which runs exactly
//! that): the real upstream is started, its tools listed, the policies checked against
//! their input schemas, and the upstream stopped.

use std::process::Command;

use crate::{Kit, TESTKIT};

fn check(kit: &Kit, files: &[&str]) -> (i32, String) {
    let o = Command::new(TESTKIT)
        .arg("policy-check")
        .arg(kit.config())
        .args(files.iter().map(|f| kit.dir.path().join(f)))
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code().unwrap(), all)
}

fn write(kit: &Kit, name: &str, text: &str) {
    std::fs::write(kit.dir.path().join(name), text).unwrap();
}

/// Library mode: the action is the upstream's own tool name, the resource its upstream;
/// the policies come from `[policy]`.
#[test]
fn the_upstreams_own_tools_check_the_configured_policies() {
    let kit = Kit::new("[policy]\nfiles = [\"tools.cedar\"]\n");
    write(
        &kit,
        "tools.cedar",
        "@id(\"small-echo\")\n\
         permit (principal, action == Action::\"echo\", resource == Upstream::\"kit\")\n\
         when { context.args has text && context.args.text like \"*hello*\" };\n\
         @id(\"no-big\")\n\
         forbid (principal, action == Action::\"big\", resource)\n\
         when { context.args has bytes && context.args.bytes > 1000 };\n",
    );
    let (code, out) = check(&kit, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("checked against 8 tools (1 upstreams of"),
        "{out}"
    );
    assert!(out.contains("ok: 2 policies, 0 warnings"), "{out}");

    // A misspelt argument, a string compared with a number, a hidden tool, and a policy
    // on an upstream the gateway does not have.
    write(
        &kit,
        "tools.cedar",
        "@id(\"no-big\")\n\
         forbid (principal, action == Action::\"big\", resource)\n\
         when { context.args.byts > 1000 };\n\
         @id(\"echo-number\")\n\
         forbid (principal, action == Action::\"echo\", resource)\n\
         when { context.args has text && context.args.text > 3 };\n\
         @id(\"hidden\")\n\
         forbid (principal, action == Action::\"delete_everything\", resource);\n\
         @id(\"elsewhere\")\n\
         forbid (principal, action == Action::\"echo\", resource == Upstream::\"other\");\n",
    );
    let (code, out) = check(&kit, &[]);
    assert_eq!(code, 1, "{out}");
    let cedar = kit.dir.path().join("tools.cedar");
    let at = |line: usize| format!("{}:{line}:", cedar.display());
    for (line, word) in [
        (3, "unknown-argument"),
        (6, "type-mismatch"),
        (8, "unknown-tool"),
        (10, "never-matches"),
    ] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&at(line)) && l.contains(word)),
            "line {line}, {word}: {out}"
        );
    }
    assert!(out.contains("refused: 3 errors"), "{out}");
    // The upstream was stopped: nothing of it is left running to answer.
    assert!(kit.invocations().is_empty());
}

/// Daemon mode: the action is the name the host sees (`UPSTREAM__TOOL` with several
/// upstreams), the resource `Upstream::"local"`; the policies are named on the command
/// line (the daemon holds its own `[policy]`).
#[test]
fn daemon_mode_checks_the_names_the_host_sees() {
    let upstream = |name: &str| {
        format!("[[upstream]]\nname = \"{name}\"\ncommand = \"{TESTKIT}\"\nargs = [\"upstream\"]\n")
    };
    let kit = Kit::with_upstreams(
        &format!("{}{}", upstream("a"), upstream("b")),
        "[gateway]\nmode = \"daemon\"\n[daemon]\nsocket = \"/nonexistent/tollgate.sock\"\nsecret_file = \"agents.secret\"\norganization = \"acme\"\n",
    );
    write(&kit, "agents.secret", "s");
    write(
        &kit,
        "p.cedar",
        "@id(\"a-echo\")\nforbid (principal, action == Action::\"a__echo\", resource == Upstream::\"local\")\nwhen { context.args has text && context.args.text == \"x\" };\n",
    );
    let (code, out) = check(&kit, &["p.cedar"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("checked against 18 tools"), "{out}");
    write(
        &kit,
        "p.cedar",
        "@id(\"echo\")\nforbid (principal, action == Action::\"echo\", resource);\n",
    );
    let (code, out) = check(&kit, &["p.cedar"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("did you mean `a__echo`?"), "{out}");
    // Without files there is nothing to check.
    let (code, out) = check(&kit, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("name the policy files"), "{out}");
}

#[test]
fn an_upstream_that_cannot_be_listed_stops_the_check() {
    let kit = Kit::with_upstreams(
        "[[upstream]]\nname = \"gone\"\ncommand = \"/nonexistent/server\"\n",
        "[policy]\nfiles = [\"p.cedar\"]\n",
    );
    write(
        &kit,
        "p.cedar",
        "@id(\"x\")\nforbid (principal, action == Action::\"echo\", resource);\n",
    );
    let (code, out) = check(&kit, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("upstream `gone`: cannot list its tools: cannot start `/nonexistent/server`"),
        "{out}"
    );
}

/// A Streamable HTTP upstream is reached as the gateway reaches it (it is not started,
/// so nothing is stopped); a stdio one next to it is started; both lists count, and a
/// name both offer merges their argument types.
#[test]
fn an_http_upstream_and_a_stdio_one_are_both_listed() {
    use std::io::BufRead;
    let mut http = Command::new(TESTKIT)
        .arg("upstream-http")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut url = String::new();
    std::io::BufReader::new(http.stdout.take().unwrap())
        .read_line(&mut url)
        .unwrap();
    let kit = Kit::with_upstreams(
        &format!(
            "[[upstream]]\nname = \"web\"\nurl = \"{}\"\n\
             [[upstream]]\nname = \"local\"\ncommand = \"{TESTKIT}\"\nargs = [\"upstream\"]\n",
            url.trim()
        ),
        "[policy]\nfiles = [\"p.cedar\"]\n",
    );
    write(
        &kit,
        "p.cedar",
        "@id(\"web-echo\")\n\
         forbid (principal, action == Action::\"echo\", resource == Upstream::\"web\")\n\
         when { context.args has text && context.args.text == \"x\" };\n\
         @id(\"local-big\")\n\
         forbid (principal, action == Action::\"big\", resource == Upstream::\"local\")\n\
         when { context.args has bytes && context.args.bytes > 10 };\n",
    );
    let (code, out) = check(&kit, &[]);
    let _ = http.kill();
    let _ = http.wait();
    assert_eq!(code, 0, "{out}");
    // Nine tools each (nothing hidden here), one action per own name.
    assert!(
        out.contains("checked against 9 tools (2 upstreams of"),
        "{out}"
    );
    assert!(out.contains("ok: 2 policies, 0 warnings"), "{out}");
}
