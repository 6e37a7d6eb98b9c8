//! `tollgate certs --out DIR`: a test PKI for the gRPC binding's mutual TLS, made with
//! rcgen (no openssl): a CA, a server certificate for the daemon, and one client
//! certificate per `--client ORG/AGENT`, plus the configuration that trusts them
//! (`grpc.toml`). For trying mTLS in a minute, not for production: the CA's key sits in
//! the same directory.
//!
//! Every client certificate carries the names `spiffe://ORG/AGENT` (URI) and
//! `AGENT.ORG.agents.tollgate.test` (DNS); the configuration maps the CA's certificates
//! to their organization by the SAN pattern `spiffe://ORG/*`.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// Arguments of `tollgate certs`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where to write the files (created if missing; existing files are not overwritten).
    #[arg(long)]
    pub out: PathBuf,
    /// A client certificate for agent AGENT of organization ORG (repeatable).
    #[arg(
        long = "client",
        value_name = "ORG/AGENT",
        default_value = "default/agent"
    )]
    pub clients: Vec<String>,
    /// A name the server certificate carries: a DNS name or an IP address (repeatable).
    #[arg(
        long = "server-name",
        value_name = "NAME",
        default_values_t = ["localhost".to_owned(), "127.0.0.1".to_owned()]
    )]
    pub server_names: Vec<String>,
    /// The address the configuration's `[grpc] listen` names.
    #[arg(long, default_value = "127.0.0.1:9000")]
    pub listen: String,
    /// How long the certificates are valid, in days from today.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub days: u32,
}

/// One client certificate to make.
#[derive(Debug, Clone)]
pub struct Client {
    /// Its organization.
    pub org: String,
    /// Its agent.
    pub agent: String,
}

impl Client {
    /// `ORG/AGENT`, each 1 to 63 characters of ASCII letters, digits, `-` and `_`.
    pub fn parse(text: &str) -> anyhow::Result<Client> {
        let ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        match text.split_once('/') {
            Some((org, agent)) if ok(org) && ok(agent) => Ok(Client {
                org: org.to_owned(),
                agent: agent.to_owned(),
            }),
            _ => anyhow::bail!(
                "`--client {text}`: expected ORG/AGENT, each 1 to 63 letters, digits, `-` or `_`"
            ),
        }
    }

    /// The file stem of its certificate and key: `client-ORG-AGENT`.
    pub fn stem(&self) -> String {
        format!("client-{}-{}", self.org, self.agent)
    }
}

/// What was written, by path.
#[derive(Debug)]
pub struct Written {
    /// The CA certificate (trust it on both sides).
    pub ca: PathBuf,
    /// The daemon's certificate and key.
    pub server: (PathBuf, PathBuf),
    /// Each client's certificate and key.
    pub clients: Vec<(Client, PathBuf, PathBuf)>,
    /// The daemon configuration that trusts them (`grpc.toml`).
    pub config: PathBuf,
}

/// Run the command.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let clients = args
        .clients
        .iter()
        .map(|c| Client::parse(c))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let w = write_pki(
        &args.out,
        &args.server_names,
        &clients,
        &args.listen,
        args.days,
    )?;
    outln!("CA certificate:     {}", w.ca.display());
    outln!(
        "server certificate: {} (key {})",
        w.server.0.display(),
        w.server.1.display()
    );
    for (c, cert, key) in &w.clients {
        outln!(
            "client {}/{}: {} (key {})",
            c.org,
            c.agent,
            cert.display(),
            key.display()
        );
    }
    outln!("daemon configuration: {}", w.config.display());
    outln!(
        "next: tollgate serve --config {}   (then connect with a client certificate above)",
        w.config.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Days since 1970-01-01 as a civil (year, month, day), proleptic Gregorian.
fn civil(days: i64) -> (i32, u8, u8) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        i32::try_from(y).unwrap_or(9999),
        u8::try_from(m).unwrap_or(1),
        u8::try_from(d).unwrap_or(1),
    )
}

fn validity(p: &mut CertificateParams, days: u32) {
    let today = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs() / 86_400).unwrap_or(0));
    let (y, m, d) = civil(today - 1);
    p.not_before = rcgen::date_time_ymd(y, m, d);
    let (y, m, d) = civil(today + i64::from(days));
    p.not_after = rcgen::date_time_ymd(y, m, d);
}

/// Create `path` atomically (whole or absent, never cut short) with exactly `mode`.
fn write_file(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    tollgate_audit::files::create_atomically(path, text.as_bytes(), mode)
        .with_context(|| format!("creating {} (it must not exist yet)", path.display()))
}

/// A TOML basic string (the paths written here have no control characters).
fn quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Make and write the CA, the server certificate for `server_names`, and `clients`'
/// certificates, valid for `days`, and a configuration listening on `listen`.
pub fn write_pki(
    out: &Path,
    server_names: &[String],
    clients: &[Client],
    listen: &str,
    days: u32,
) -> anyhow::Result<Written> {
    // Exactly 0755 whatever the umask; the private keys in it are 0600 each.
    tollgate_audit::files::create_dir_with_mode(out, 0o755)
        .with_context(|| format!("creating {}", out.display()))?;
    let out = out
        .canonicalize()
        .with_context(|| format!("resolving {}", out.display()))?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "tollgate test CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity(&mut ca_params, days);
    let ca_key = KeyPair::generate()?;
    let ca_key_pem = ca_key.serialize_pem();
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key)?;

    let leaf = |sans: Vec<SanType>, cn: &str, usage: ExtendedKeyUsagePurpose| {
        let mut p = CertificateParams::new(Vec::<String>::new())?;
        p.subject_alt_names = sans;
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = vec![usage];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        validity(&mut p, days);
        let key = KeyPair::generate()?;
        let cert = p.signed_by(&key, &ca)?;
        anyhow::Ok((cert.pem(), key.serialize_pem()))
    };

    let ca_path = out.join("ca.pem");
    write_file(&ca_path, &ca.pem(), 0o644)?;
    write_file(&out.join("ca.key"), &ca_key_pem, 0o600)?;

    let mut sans = Vec::new();
    for n in server_names {
        sans.push(match n.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                n.as_str()
                    .try_into()
                    .with_context(|| format!("server name `{n}`"))?,
            ),
        });
    }
    let (cert, key) = leaf(sans, "tollgate daemon", ExtendedKeyUsagePurpose::ServerAuth)?;
    let server = (out.join("server.pem"), out.join("server.key"));
    write_file(&server.0, &cert, 0o644)?;
    write_file(&server.1, &key, 0o600)?;

    let mut written = Vec::new();
    for c in clients {
        let uri = format!("spiffe://{}/{}", c.org, c.agent);
        let dns = format!("{}.{}.agents.tollgate.test", c.agent, c.org);
        let sans = vec![
            SanType::URI(uri.as_str().try_into()?),
            SanType::DnsName(dns.as_str().try_into()?),
        ];
        let (cert, key) = leaf(sans, &uri, ExtendedKeyUsagePurpose::ClientAuth)?;
        let paths = (
            out.join(format!("{}.pem", c.stem())),
            out.join(format!("{}.key", c.stem())),
        );
        write_file(&paths.0, &cert, 0o644)?;
        write_file(&paths.1, &key, 0o600)?;
        written.push((c.clone(), paths.0, paths.1));
    }

    let mut orgs: Vec<&str> = clients.iter().map(|c| c.org.as_str()).collect();
    orgs.sort_unstable();
    orgs.dedup();
    let path = |p: &Path| quoted(&p.display().to_string());
    let mut toml = format!(
        "# Written by `tollgate certs`: the gRPC binding with mutual TLS.\n\
         [grpc]\n\
         listen = {}\n\
         cert = {}\n\
         key = {}\n",
        quoted(listen),
        path(&server.0),
        path(&server.1)
    );
    for org in orgs {
        let _ = write!(
            toml,
            "\n[[organization]]\n\
             id = {}\n\
             grpc_client_ca = {}\n\
             grpc_client_san = [{}]\n",
            quoted(org),
            path(&ca_path),
            quoted(&format!("spiffe://{org}/*"))
        );
    }
    let config = out.join("grpc.toml");
    write_file(&config, &toml, 0o644)?;
    Ok(Written {
        ca: ca_path,
        server,
        clients: written,
        config,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(19_723), (2024, 1, 1));
        assert_eq!(civil(19_782), (2024, 2, 29));
        assert_eq!(civil(-1), (1969, 12, 31));
    }

    #[test]
    fn client_names() {
        assert!(Client::parse("acme/bot-1").is_ok());
        for bad in ["acme", "/bot", "acme/", "a/b/c", "ac me/bot", "acme/bot."] {
            assert!(Client::parse(bad).is_err(), "{bad}");
        }
    }
}
