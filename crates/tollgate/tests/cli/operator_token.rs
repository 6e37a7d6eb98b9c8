//! `tollgate operator-token`: a fresh token, and an `[[operator]]` entry the daemon accepts
//! that admits exactly that token.

use crate::{stdout, tollgate};
use tollgate_daemon::operators::{hex, token_sha256, Operators};
use tollgate_daemon::DaemonConfig;

#[test]
fn prints_a_token_and_the_entry_that_admits_it() {
    let out = tollgate(&[
        "operator-token",
        "--id",
        "alice",
        "--org",
        "acme",
        "--org",
        "globex",
    ]);
    assert!(out.status.success());
    let text = stdout(&out);
    let token = text
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .unwrap()
        .to_owned();
    assert!(token.starts_with("tgo_") && token.len() == 68, "{token}");
    assert!(text.contains(&format!(
        "token_sha256 = \"{}\"",
        hex(&token_sha256(&token))
    )));
    // The printed entry, pasted into a configuration, is accepted and admits the token.
    let entry = text.split_once("[[operator]]").unwrap().1;
    let config = format!(
        "[[organization]]\nid = \"acme\"\n[[organization]]\nid = \"globex\"\n[[operator]]{entry}"
    );
    let c = DaemonConfig::from_toml(&config, std::path::Path::new(".")).unwrap();
    let ops = Operators::new(c.operators);
    let alice = ops.authenticate(&token, 0).unwrap();
    assert_eq!(alice.id, "alice");
    assert_eq!(alice.organizations, ["acme", "globex"]);
    // Two runs, two tokens.
    let again = stdout(&tollgate(&["operator-token"]));
    assert!(!again.contains(&token));
}
