//! Loading: every problem named by file, line and column; the digest.

use tollgate_policy::{load, DefaultEffect, Finding, Options, Severity, Source};

use crate::common::{set, set_with};

fn findings(files: &[(&str, &str)], schema: Option<&str>) -> Vec<Finding> {
    let sources: Vec<Source> = files.iter().map(|(n, t)| Source::new(*n, *t)).collect();
    let options = Options {
        default: DefaultEffect::Allow,
        schema: schema.map(|s| Source::new("tools.cedarschema", s)),
    };
    match load(&sources, &options) {
        Ok(l) => l.warnings,
        Err(e) => e.findings,
    }
}

/// The errors as `file:line:col code`.
fn errors(files: &[(&str, &str)], schema: Option<&str>) -> Vec<String> {
    findings(files, schema)
        .into_iter()
        .filter(|f| f.severity == Severity::Error)
        .map(|f| match &f.location {
            Some(l) => format!("{}:{}:{} {}", l.file, l.line, l.column, f.code),
            None => format!("{} {}", f.file.clone().unwrap_or_default(), f.code),
        })
        .collect()
}

#[test]
fn parse_errors_name_file_line_and_column_in_every_file() {
    let good = "@id(\"ok\")\npermit(principal, action, resource);\n";
    let bad1 = "@id(\"a\")\npermit(principal, action, resource)\n  when { context.args.x == };\n";
    let bad2 =
        "// two lines of comment\n//\nforbid(principal, action == Action::\"shell\" resource);\n";
    let e = errors(
        &[
            ("good.cedar", good),
            ("one.cedar", bad1),
            ("two.cedar", bad2),
        ],
        None,
    );
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(e[0].starts_with("one.cedar:3:"), "{e:?}");
    assert!(e[1].starts_with("two.cedar:3:"), "{e:?}");
    // The message says what is wrong, and the Display form leads with the place.
    let f = findings(&[("one.cedar", bad1)], None);
    let text = f
        .iter()
        .find(|f| f.severity == Severity::Error)
        .unwrap()
        .to_string();
    assert!(text.starts_with("one.cedar:3:"), "{text}");
    assert!(text.contains("error["), "{text}");
}

#[test]
fn validation_against_the_schema_names_the_offending_expression() {
    let schema = r#"
        action "pay" appliesTo { principal: Agent, resource: Upstream,
          context: { args: { amount: decimal, currency: String } } };
        action "search" appliesTo { principal: Agent, resource: Upstream,
          context: { args: { query: String } } };
    "#;
    let policies = "@id(\"fine\")\nforbid(principal, action == Action::\"pay\", resource)\n  when { context.args.amount.greaterThan(decimal(\"100.0\")) };\n\n@id(\"typo\")\nforbid(principal, action == Action::\"pay\", resource)\n  when { context.args.amonut.greaterThan(decimal(\"1.0\")) };\n@id(\"type\")\nforbid(principal, action == Action::\"search\", resource)\n  when { context.args.query > 3 };\n@id(\"tool\")\nforbid(principal, action == Action::\"sehll\", resource);\n";
    let e = errors(&[("tools.cedar", policies)], Some(schema));
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(e[0].starts_with("tools.cedar:7:"), "{e:?}");
    assert!(e[1].starts_with("tools.cedar:10:"), "{e:?}");
    assert!(e[2].starts_with("tools.cedar:12:"), "{e:?}");
    // Without the schema the same file loads (typos then fail closed at run time).
    assert!(errors(&[("tools.cedar", policies)], None).is_empty());
}

#[test]
fn tollgates_own_checks() {
    let cases: &[(&str, &str)] = &[
        (
            "@hitl\nforbid(principal, action, resource);",
            "p.cedar:1:1 tollgate::forbid-annotation",
        ),
        (
            "@label(\"x\")\nforbid(principal, action, resource);",
            "p.cedar:1:1 tollgate::forbid-annotation",
        ),
        (
            "\n@hitll\npermit(principal, action, resource);",
            "p.cedar:2:1 tollgate::unknown-annotation",
        ),
        (
            "@shadows\npermit(principal, action, resource);",
            "p.cedar:1:1 tollgate::unknown-annotation",
        ),
        (
            "@label(\"ok, not ok\")\npermit(principal, action, resource);",
            "p.cedar:1:1 tollgate::bad-label",
        ),
        (
            "@id(\"has space\")\npermit(principal, action, resource);",
            "p.cedar:1:1 tollgate::bad-id",
        ),
        (
            "permit(principal == ?principal, action, resource);",
            "p.cedar:1:1 tollgate::template",
        ),
    ];
    for (text, want) in cases {
        assert_eq!(
            errors(&[("p.cedar", text)], None),
            vec![(*want).to_owned()],
            "{text}"
        );
    }
    let deep = format!(
        "permit(principal, action, resource) when {{ {}true{} }};",
        "(".repeat(100),
        ")".repeat(100)
    );
    assert_eq!(
        errors(&[("p.cedar", &deep)], None),
        vec!["p.cedar:1:107 tollgate::nesting".to_owned()]
    );
    let big = format!(
        "// {}\npermit(principal, action, resource);",
        "x".repeat(tollgate_policy::load::MAX_FILE_BYTES)
    );
    assert_eq!(
        errors(&[("p.cedar", &big)], None),
        vec!["p.cedar tollgate::file-too-large".to_owned()]
    );
}

#[test]
fn ids_are_unique_across_files_and_the_second_use_points_at_the_first() {
    let a = "@id(\"x\")\npermit(principal, action, resource);";
    let b = "\n\n@id(\"x\")\nforbid(principal, action, resource);";
    let f = findings(&[("a.cedar", a), ("b.cedar", b)], None);
    let dup = f
        .iter()
        .find(|f| f.code == "tollgate::duplicate-id")
        .unwrap();
    assert_eq!(dup.location.as_ref().unwrap().file, "b.cedar");
    assert_eq!(dup.location.as_ref().unwrap().line, 3);
    assert!(dup.message.contains("a.cedar:1:1"), "{}", dup.message);
}

#[test]
fn policies_without_an_id_are_numbered_in_set_order_with_a_warning() {
    let p = set_with(
        &[
            ("a.cedar", "permit(principal, action, resource);\n@id(\"named\") permit(principal, action, resource);"),
            ("b.cedar", "forbid(principal, action == Action::\"x\", resource);"),
        ],
        DefaultEffect::Allow,
        None,
    );
    let ids: Vec<&str> = p.ids().map(|i| i.as_str()).collect();
    assert_eq!(ids, ["policy0", "named", "policy2"]);
    let w = findings(&[("a.cedar", "permit(principal, action, resource);")], None);
    assert_eq!(w.len(), 1);
    assert_eq!(
        (w[0].severity, w[0].code.as_str()),
        (Severity::Warning, "tollgate::no-id")
    );
}

#[test]
fn schema_errors_are_reported_and_refuse_the_set() {
    let e = errors(
        &[("p.cedar", "permit(principal, action, resource);")],
        Some("action \"x\" appliesTo { principal: Agent resource: Upstream };"),
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].starts_with("tools.cedarschema:1:"), "{e:?}");
    let e = errors(
        &[("p.cedar", "permit(principal, action, resource);")],
        Some("entity Agent;"),
    );
    assert_eq!(
        e,
        vec!["tools.cedarschema tollgate::schema-reserved".to_owned()]
    );
}

#[test]
fn the_digest_covers_rules_not_layout() {
    let a = "@id(\"a\") permit(principal, action, resource);";
    let b = "@id(\"b\") forbid(principal, action == Action::\"shell\", resource);";
    let base = set_with(
        &[("x.cedar", &format!("{a}\n{b}"))],
        DefaultEffect::Allow,
        None,
    )
    .digest();
    // Other file names, another split, comments and blank lines between policies: same.
    let same = [
        set_with(
            &[("/etc/one.cedar", a), ("two.cedar", b)],
            DefaultEffect::Allow,
            None,
        ),
        set_with(
            &[("two.cedar", b), ("one.cedar", a)],
            DefaultEffect::Allow,
            None,
        ),
        set_with(
            &[("x.cedar", &format!("// rules\n\n{a}\n\n// more\n{b}\n"))],
            DefaultEffect::Allow,
            None,
        ),
    ];
    for s in &same {
        assert_eq!(s.digest(), base);
    }
    // A policy's text, the default, or a schema: different.
    let other = [
        set_with(
            &[("x.cedar", &format!("{a}\n{}", b.replace("shell", "sh")))],
            DefaultEffect::Allow,
            None,
        ),
        set_with(
            &[("x.cedar", &format!("{a}\n{b}"))],
            DefaultEffect::Deny,
            None,
        ),
        set_with(
            &[("x.cedar", &format!("{a}\n{b}"))],
            DefaultEffect::Allow,
            Some("action \"shell\" appliesTo { principal: Agent, resource: Upstream };"),
        ),
        set(a),
    ];
    for s in &other {
        assert_ne!(s.digest(), base);
    }
}
