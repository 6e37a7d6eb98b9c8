//! Shadow policies (issue 19): a `@shadow` policy is not enforced; its candidate is the
//! set with it enforced too; a set in shadow mode enforces nothing.

use tollgate_policy::files::{self, Section, Settings};
use tollgate_policy::load::MAX_SHADOW_POLICIES;
use tollgate_policy::{load, shadow, DefaultEffect, Effect, Options, Source};

use crate::common::{eval, reason, set, set_with};

const SET: &str = r#"
@id("tools") permit (principal, action, resource);
@id("no-pay") @shadow forbid (principal, action == Action::"pay", resource);
@id("hold-search") @shadow("new hold") @hitl permit (principal, action == Action::"search", resource);
@id("no-shell") forbid (principal, action == Action::"shell", resource);
"#;

#[test]
fn a_shadow_policy_is_not_enforced_and_its_candidate_enforces_it() {
    let p = set(SET);
    assert_eq!((p.len(), p.shadow_len()), (4, 2));
    assert!(!p.is_shadow_set());
    // Enforced: the shadow forbid does not refuse, the shadow hold does not hold.
    assert_eq!(reason(&eval(&p, "pay", None)), "-");
    assert_eq!(reason(&eval(&p, "search", None)), "-");
    assert_eq!(reason(&eval(&p, "shell", None)), "policy:no-shell");
    assert_eq!(
        p.ids().map(|i| i.as_str()).collect::<Vec<_>>(),
        ["tools", "no-shell"]
    );
    // The candidates, in set order: the set with that one policy enforced too.
    let names: Vec<&str> = p.shadows().iter().map(|s| s.name()).collect();
    assert_eq!(names, ["no-pay", "hold-search"]);
    let no_pay = &p.shadows()[0];
    assert_eq!(
        reason(&eval(no_pay.policies(), "pay", None)),
        "policy:no-pay"
    );
    assert_eq!(reason(&eval(no_pay.policies(), "search", None)), "-");
    assert_eq!(
        reason(&eval(no_pay.policies(), "shell", None)),
        "policy:no-shell"
    );
    let hold = &p.shadows()[1];
    assert!(matches!(
        eval(hold.policies(), "search", None).effect,
        Effect::Hitl { .. }
    ));
    // Whether a candidate can differ at all for a tool.
    assert!(no_pay.applies_to("pay") && !no_pay.applies_to("search"));
    assert!(hold.applies_to("search") && !hold.applies_to("pay"));
    // A candidate's own set has no shadows of its own.
    assert!(no_pay.policies().shadows().is_empty());
}

#[test]
fn the_shadow_annotation_is_in_the_digest() {
    let enforced = set(&SET
        .replace("@shadow(\"new hold\") ", "")
        .replace("@shadow ", ""));
    assert_ne!(set(SET).digest(), enforced.digest());
    assert!(enforced.shadows().is_empty());
}

#[test]
fn shadow_policies_are_bounded() {
    let many = |n: usize| -> String {
        (0..n)
            .map(|i| format!("@id(\"s{i}\") @shadow forbid (principal, action == Action::\"t{i}\", resource);\n"))
            .collect()
    };
    assert_eq!(
        set(&many(MAX_SHADOW_POLICIES)).shadows().len(),
        MAX_SHADOW_POLICIES
    );
    let e = load(
        &[Source::new("p.cedar", many(MAX_SHADOW_POLICIES + 1))],
        &Options::default(),
    )
    .unwrap_err();
    assert!(
        e.findings
            .iter()
            .any(|f| f.code == "tollgate::too-many-shadow"),
        "{e}"
    );
}

#[test]
fn a_set_in_shadow_mode_enforces_nothing() {
    let p = set_with(&[("p.cedar", SET)], DefaultEffect::Deny, None);
    let s = shadow::whole_set(p.clone());
    assert!(s.is_shadow_set());
    assert_eq!((s.len(), s.shadow_len()), (4, 4));
    assert_eq!(s.digest(), shadow::shadow_digest(p.digest()));
    assert_ne!(s.digest(), p.digest());
    // Nothing enforced, not even the default deny or a forbid.
    assert_eq!(s.default_effect(), DefaultEffect::Allow);
    for tool in ["shell", "pay", "anything"] {
        assert_eq!(reason(&eval(&s, tool, None)), "-", "{tool}");
    }
    assert!(s
        .denies_unconditionally(&crate::common::actor(&s), "shell")
        .is_none());
    // The whole set first (named `*`), then its own shadow candidates.
    let names: Vec<&str> = s.shadows().iter().map(|c| c.name()).collect();
    assert_eq!(names, [shadow::SET, "no-pay", "hold-search"]);
    let whole = &s.shadows()[0];
    assert!(whole.applies_to("anything"));
    assert_eq!(
        reason(&eval(whole.policies(), "shell", None)),
        "policy:no-shell"
    );
    assert_eq!(reason(&eval(whole.policies(), "other", None)), "-");
}

#[test]
fn the_section_names_the_mode() {
    let dir = std::env::temp_dir().join(format!("tollgate-shadow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("p.cedar"), SET).unwrap();
    let section = |mode: Option<&str>| Section {
        files: vec!["p.cedar".into()],
        mode: mode.map(str::to_owned),
        ..Section::default()
    };
    let s = Settings::from_section(section(Some("shadow")), &dir).unwrap();
    assert!(s.shadow);
    let (loaded, _) = files::load(&s).unwrap();
    assert!(loaded.is_shadow_set());
    let s = Settings::from_section(section(None), &dir).unwrap();
    assert!(!s.shadow);
    assert!(!files::load(&s).unwrap().0.is_shadow_set());
    assert!(
        !Settings::from_section(section(Some("enforce")), &dir)
            .unwrap()
            .shadow
    );
    let e = Settings::from_section(section(Some("Shadow")), &dir).unwrap_err();
    assert_eq!(e.key, "policy.mode");
    std::fs::remove_dir_all(&dir).unwrap();
}
