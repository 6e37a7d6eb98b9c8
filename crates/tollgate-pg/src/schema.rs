//! Versioned, idempotent migrations, the append-only triggers and the writer role.

use tokio_postgres::Client;

use crate::conn::{check_schema, connect, lock_key, PgSettings};
use crate::PgError;

/// The role migrations create (NOLOGIN) and grant INSERT and SELECT on the tables; make
/// the daemon's login role a member of it.
pub const WRITER_ROLE: &str = "tollgate_writer";

/// The migrations, in order: (version, SQL with `{s}` for the quoted schema).
const MIGRATIONS: &[(i32, &str)] = &[(
    1,
    r#"
CREATE TABLE {s}.chains (
    chain_id       text        PRIMARY KEY,
    key_id         text        NOT NULL,
    public_key     bytea       NOT NULL CHECK (length(public_key) = 32),
    format_version smallint    NOT NULL,
    header         bytea       NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE {s}.entries (
    chain_id    text        NOT NULL REFERENCES {s}.chains (chain_id),
    idx         bigint      NOT NULL CHECK (idx >= 0),
    record      bytea       NOT NULL,
    entry_hash  bytea       NOT NULL,
    session_id  text        NULL,
    session_seq bigint      NULL,
    kind        smallint    NOT NULL,
    written_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, idx)
);
CREATE TABLE {s}.claims (
    session_id  text   NOT NULL,
    session_seq bigint NOT NULL,
    kind        text   NOT NULL CHECK (kind IN ('entry', 'void')),
    chain_id    text   NOT NULL,
    idx         bigint NOT NULL,
    PRIMARY KEY (session_id, session_seq),
    FOREIGN KEY (chain_id, idx) REFERENCES {s}.entries (chain_id, idx) DEFERRABLE INITIALLY DEFERRED
);
CREATE FUNCTION {s}.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    RAISE EXCEPTION 'tollgate: % on %.% is refused: the audit trail is append-only',
        TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END
$f$;
CREATE TRIGGER chains_append_only BEFORE UPDATE OR DELETE ON {s}.chains
    FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change();
CREATE TRIGGER chains_no_truncate BEFORE TRUNCATE ON {s}.chains
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_change();
CREATE TRIGGER entries_append_only BEFORE UPDATE OR DELETE ON {s}.entries
    FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change();
CREATE TRIGGER entries_no_truncate BEFORE TRUNCATE ON {s}.entries
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_change();
CREATE TRIGGER claims_append_only BEFORE UPDATE OR DELETE ON {s}.claims
    FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change();
CREATE TRIGGER claims_no_truncate BEFORE TRUNCATE ON {s}.claims
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_change();
"#,
)];

/// The newest schema version this crate knows.
pub const SCHEMA_VERSION: i32 = 1;

/// What happened to the writer role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoleOutcome {
    /// Created now (NOLOGIN), and granted.
    Created,
    /// It existed; granted (again).
    Existed,
    /// The migrating user may not create roles or grant: the role and grants were left
    /// alone. A superuser must run the GRANTs docs/postgres.md lists.
    NotPermitted(String),
}

/// What [`migrate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateReport {
    /// The schema.
    pub schema: String,
    /// The version before.
    pub from: i32,
    /// The version now ([`SCHEMA_VERSION`]).
    pub to: i32,
    /// The versions applied by this call (empty: already up to date).
    pub applied: Vec<i32>,
    /// The writer role.
    pub role: RoleOutcome,
}

pub(crate) fn quoted(schema: &str) -> String {
    format!("\"{schema}\"")
}

/// Bring `schema` up to [`SCHEMA_VERSION`]: create it and `schema_migrations` if
/// missing, then apply each missing migration, all in one transaction under an advisory
/// lock (so concurrent callers wait and then find nothing to do). Then make sure the
/// writer role exists with INSERT and SELECT only (see [`RoleOutcome`]). A database at a
/// newer version than this crate knows is refused ([`PgError::SchemaTooNew`]).
pub async fn migrate(client: &mut Client, schema: &str) -> Result<MigrateReport, PgError> {
    check_schema(schema)?;
    let s = quoted(schema);
    let tx = client
        .transaction()
        .await
        .map_err(PgError::db("migrate: begin"))?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1)",
        &[&lock_key(&["tollgate-migrate", schema])],
    )
    .await
    .map_err(PgError::db("migrate: lock"))?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {s};
         CREATE TABLE IF NOT EXISTS {s}.schema_migrations (
             version    integer     PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         );"
    ))
    .await
    .map_err(PgError::db("migrate: schema_migrations"))?;
    let row = tx
        .query_one(
            &format!("SELECT COALESCE(max(version), 0) FROM {s}.schema_migrations"),
            &[],
        )
        .await
        .map_err(PgError::db("migrate: read version"))?;
    let from: i32 = row
        .try_get(0)
        .map_err(PgError::db("migrate: read version"))?;
    if from > SCHEMA_VERSION {
        return Err(PgError::SchemaTooNew {
            found: from,
            known: SCHEMA_VERSION,
        });
    }
    let mut applied = Vec::new();
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > from) {
        tx.batch_execute(&sql.replace("{s}", &s))
            .await
            .map_err(PgError::db("migrate: apply"))?;
        tx.execute(
            &format!("INSERT INTO {s}.schema_migrations (version) VALUES ($1)"),
            &[version],
        )
        .await
        .map_err(PgError::db("migrate: record version"))?;
        applied.push(*version);
    }
    tx.commit().await.map_err(PgError::db("migrate: commit"))?;
    let role = writer_role(client, &s).await?;
    Ok(MigrateReport {
        schema: schema.to_owned(),
        from,
        to: SCHEMA_VERSION,
        applied,
        role,
    })
}

/// Connect with `settings` and [`migrate`] its schema (what a daemon may do at start).
pub async fn migrate_with(settings: &PgSettings) -> Result<MigrateReport, PgError> {
    let mut client = connect(settings).await?;
    migrate(&mut client, &settings.schema).await
}

/// Create the writer role if missing and grant it INSERT and SELECT (and nothing else).
/// In its own transaction: a user without the privilege gets [`RoleOutcome::NotPermitted`]
/// and the migrated schema stays.
async fn writer_role(client: &mut Client, s: &str) -> Result<RoleOutcome, PgError> {
    let tx = client
        .transaction()
        .await
        .map_err(PgError::db("migrate: begin role"))?;
    // Roles are per cluster: serialise creators across databases and schemas.
    tx.execute(
        "SELECT pg_advisory_xact_lock($1)",
        &[&lock_key(&["tollgate-role", WRITER_ROLE])],
    )
    .await
    .map_err(PgError::db("migrate: lock role"))?;
    let exists = tx
        .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&WRITER_ROLE])
        .await
        .map_err(PgError::db("migrate: read roles"))?
        .is_some();
    let sql = format!(
        "{create}
         GRANT USAGE ON SCHEMA {s} TO {WRITER_ROLE};
         GRANT SELECT, INSERT ON {s}.chains, {s}.entries, {s}.claims TO {WRITER_ROLE};
         GRANT SELECT ON {s}.schema_migrations TO {WRITER_ROLE};",
        create = if exists {
            String::new()
        } else {
            format!("CREATE ROLE {WRITER_ROLE} NOLOGIN;")
        }
    );
    match tx.batch_execute(&sql).await {
        Ok(()) => {}
        Err(e) if is_privilege_error(&e) => {
            return Ok(RoleOutcome::NotPermitted(
                e.as_db_error()
                    .map_or_else(|| e.to_string(), |d| d.message().to_owned()),
            ));
        }
        Err(e) => return Err(PgError::db("migrate: writer role")(e)),
    }
    tx.commit()
        .await
        .map_err(PgError::db("migrate: commit role"))?;
    Ok(if exists {
        RoleOutcome::Existed
    } else {
        RoleOutcome::Created
    })
}

fn is_privilege_error(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.code()
        .is_some_and(|c| *c == SqlState::INSUFFICIENT_PRIVILEGE)
}
