//! Verify and export chains stored in PostgreSQL with the file verifier: each chain is
//! its signed header (from `chains`) followed by its records in index order (from
//! `entries`), checked exactly as one log file is.

use tokio_postgres::Client;
use tollgate_audit::{
    AuditEntry, Break, BreakKind, KeyId, Summary, Verifier, VerifyOptions, VerifyingKey,
};

use crate::conn::check_schema;
use crate::schema::quoted;
use crate::PgError;

/// A chain as registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainInfo {
    /// Its id.
    pub chain_id: String,
    /// Its key id as registered (text).
    pub key_id: String,
    /// Its public key as registered.
    pub public_key: Vec<u8>,
    /// Its signed header (170 bytes, format version 8, or 3 to 7 for an older chain; file 0, index 0, genesis).
    pub header: Vec<u8>,
}

/// What verifying one chain found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainReport {
    /// The chain.
    pub chain_id: String,
    /// Its registered key id.
    pub key_id: String,
    /// The summary when whole, or the first break. The break's `file` is
    /// [`chain_name`]`(chain_id)`, its `index` the entry's index, its `offset` the byte
    /// offset in the chain's header-then-records sequence.
    pub result: Result<Summary, Break>,
}

/// How a chain is named in a [`Break`]: `chain <id>`.
pub fn chain_name(chain_id: &str) -> String {
    format!("chain {chain_id}")
}

/// The registered chains (one, when `chain` names it), by id.
pub async fn list_chains(
    client: &Client,
    schema: &str,
    chain: Option<&str>,
) -> Result<Vec<ChainInfo>, PgError> {
    check_schema(schema)?;
    let s = quoted(schema);
    let rows = client
        .query(
            &format!(
                "SELECT chain_id, key_id, public_key, header FROM {s}.chains
                 WHERE $1::text IS NULL OR chain_id = $1 ORDER BY chain_id"
            ),
            &[&chain],
        )
        .await
        .map_err(PgError::db("list chains"))?;
    rows.iter()
        .map(|r| {
            Ok(ChainInfo {
                chain_id: r.try_get(0)?,
                key_id: r.try_get(1)?,
                public_key: r.try_get(2)?,
                header: r.try_get(3)?,
            })
        })
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()
        .map_err(PgError::db("list chains"))
}

/// How many entries the chains of `schema` hold (every chain's rows): the total a
/// progress display counts toward.
pub async fn count_entries(client: &Client, schema: &str) -> Result<u64, PgError> {
    check_schema(schema)?;
    let s = quoted(schema);
    let row = client
        .query_one(&format!("SELECT count(*) FROM {s}.entries"), &[])
        .await
        .map_err(PgError::db("count entries"))?;
    let n: i64 = row.try_get(0).map_err(PgError::db("count entries"))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Verify one chain. The starting key is trusted from `keys` (the one whose bytes equal
/// the registered key, else the first given: a chain signed by another key then breaks
/// with an unknown key) or, with no keys given, from the `chains` table. `visit` sees
/// every verified entry in order.
pub async fn verify_chain(
    client: &Client,
    schema: &str,
    chain: &ChainInfo,
    keys: &[VerifyingKey],
    visit: &mut dyn FnMut(&AuditEntry),
) -> Result<ChainReport, PgError> {
    check_schema(schema)?;
    let s = quoted(schema);
    let name = chain_name(&chain.chain_id);
    let registered = <[u8; 32]>::try_from(chain.public_key.as_slice())
        .ok()
        .and_then(|b| tollgate_audit::format::public_key(&b));
    let trusted = keys
        .iter()
        .find(|k| k.as_bytes().as_slice() == chain.public_key.as_slice())
        .or(keys.first())
        .copied()
        .or(registered);
    let report = |result| ChainReport {
        chain_id: chain.chain_id.clone(),
        key_id: chain.key_id.clone(),
        result,
    };
    let Some(trusted) = trusted else {
        return Ok(report(Err(Break {
            file: name,
            index: None,
            offset: 0,
            kind: BreakKind::BadHeader(tollgate_audit::format::HeaderError::PublicKey),
        })));
    };
    let rows = client
        .query(
            &format!("SELECT record FROM {s}.entries WHERE chain_id = $1 ORDER BY idx"),
            &[&chain.chain_id],
        )
        .await
        .map_err(PgError::db("read chain"))?;
    let mut bytes = chain.header.clone();
    for r in &rows {
        let rec: &[u8] = r.try_get(0).map_err(PgError::db("read chain"))?;
        bytes.extend_from_slice(rec);
    }
    let mut v = Verifier::new(VerifyOptions {
        trusted_key: Some(trusted),
        ..VerifyOptions::default()
    });
    let result = v.feed_file(&name, &bytes, visit).and_then(|()| v.finish());
    let result = result.and_then(|sum| {
        // The registered key id must name the key that signs.
        if KeyId::of(trusted.as_bytes()).to_string() == chain.key_id {
            Ok(sum)
        } else {
            Err(Break {
                file: name.clone(),
                index: None,
                offset: 0,
                kind: BreakKind::UnknownKey {
                    expected: KeyId::of(trusted.as_bytes()),
                    found: sum.key_id,
                },
            })
        }
    });
    Ok(report(result))
}

/// Verify every chain in `schema` (or the one named `chain`), in chain-id order;
/// `visit` sees each verified entry with its chain id. A chain named but not registered
/// is [`PgError::NoSuchChain`].
pub async fn verify(
    client: &Client,
    schema: &str,
    chain: Option<&str>,
    keys: &[VerifyingKey],
    visit: &mut dyn FnMut(&str, &AuditEntry),
) -> Result<Vec<ChainReport>, PgError> {
    let chains = list_chains(client, schema, chain).await?;
    if let (Some(c), true) = (chain, chains.is_empty()) {
        return Err(PgError::NoSuchChain(c.to_owned()));
    }
    let mut out = Vec::with_capacity(chains.len());
    for c in &chains {
        let id = c.chain_id.clone();
        out.push(verify_chain(client, schema, c, keys, &mut |e| visit(&id, e)).await?);
    }
    Ok(out)
}
