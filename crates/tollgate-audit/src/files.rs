//! The log directory: file names, listing in chain order, reading (and decompressing)
//! files, and UTC calendar arithmetic for daily rotation and timestamps.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Nanoseconds in a day.
pub const DAY_NS: i64 = 86_400 * 1_000_000_000;
/// The largest file the reader will load (after decompression).
pub const MAX_FILE_BYTES: u64 = 1 << 30;
/// The name of the latest-checkpoint file in a log directory.
pub const CHECKPOINT_FILE: &str = "checkpoint";
/// The directory (inside the log directory) where torn tails are moved.
pub const TORN_DIR: &str = "torn";
/// The suffix of the marker file that says a log file has been archived elsewhere.
pub const ARCHIVED_SUFFIX: &str = ".archived";

/// The name of log file number `seq` created on UTC day `day` (days since the epoch):
/// `audit-<seq, 8 digits>-<YYYYMMDD>.log`.
pub fn log_file_name(seq: u64, day: i64) -> String {
    let (y, m, d) = civil_from_days(day);
    format!("audit-{seq:08}-{y:04}{m:02}{d:02}.log")
}

/// Create directory `path` and any missing parents, each with exactly `mode` whatever the
/// process's umask (the mode given to `mkdir` is filtered by the umask, so each directory
/// created here is then set to `mode`). Directories that already exist are left as they
/// are. Returns whether `path` itself was created.
pub fn create_dir_with_mode(path: &Path, mode: u32) -> std::io::Result<bool> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let mut missing = Vec::new();
    let mut at = Some(path);
    while let Some(p) = at {
        if p.as_os_str().is_empty() || p.is_dir() {
            break;
        }
        missing.push(p);
        at = p.parent();
    }
    let created = !missing.is_empty();
    for p in missing.into_iter().rev() {
        match std::fs::DirBuilder::new().mode(mode).create(p) {
            Ok(()) => std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))?,
            // Made by someone else meanwhile: theirs to set.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && p.is_dir() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(created)
}

/// Create the file `path` holding `bytes`, atomically: it appears whole or not at all,
/// never empty or cut short (a full disk, a file-size limit, a crash or a kill in the
/// middle leave no `path`, only a temporary file beside it that the next call removes).
/// Its mode is exactly `mode`, whatever the process's umask.
///
/// The bytes go to a temporary file in the same directory (created exclusively, with
/// `mode`), which is written and fsynced, then linked to `path`, which must not exist
/// (`AlreadyExists` otherwise: two starters cannot replace each other's file), and the
/// directory is fsynced so the new name is durable too.
pub fn create_atomically(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    write_atomically(path, bytes, mode, false)
}

/// Like [`create_atomically`], but `path` may exist: it is replaced in one rename, so a
/// reader sees the old file or the new one, never a mix or an empty file.
pub fn replace_atomically(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    write_atomically(path, bytes, mode, true)
}

fn write_atomically(path: &Path, bytes: &[u8], mode: u32, replace: bool) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))?
        .to_string_lossy()
        .into_owned();
    let prefix = format!(".{name}.tmp-");
    // Leftovers of attempts that died before their link (full disk, SIGXFSZ, SIGKILL).
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let tmp = dir.join(format!("{prefix}{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        // The mode given at creation is filtered by the umask; set it exactly.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        if replace {
            std::fs::rename(&tmp, path)?;
        } else {
            std::fs::hard_link(&tmp, path)?;
        }
        std::fs::File::open(dir)?.sync_all()
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

/// A log file found in a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFile {
    /// Its path.
    pub path: PathBuf,
    /// The file number in its name.
    pub seq: u64,
    /// Whether it is zstd-compressed (`.log.zst`).
    pub compressed: bool,
}

/// Parse `audit-<seq>-<date>.log[.zst]`.
pub fn parse_log_name(name: &str) -> Option<(u64, bool)> {
    let (stem, compressed) = match name.strip_suffix(".log.zst") {
        Some(s) => (s, true),
        None => (name.strip_suffix(".log")?, false),
    };
    let rest = stem.strip_prefix("audit-")?;
    let (seq, date) = rest.split_once('-')?;
    if date.len() != 8 || !date.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((seq.parse().ok()?, compressed))
}

/// The log files of a directory in file-number order. Where both `X.log` and
/// `X.log.zst` exist (a crash during compression), the uncompressed one is listed.
pub fn list_log_files(dir: &Path) -> std::io::Result<Vec<LogFile>> {
    let mut files: Vec<LogFile> = Vec::new();
    for ent in std::fs::read_dir(dir)? {
        let ent = ent?;
        if !ent.file_type()?.is_file() {
            continue;
        }
        let name = ent.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some((seq, compressed)) = parse_log_name(name) {
            files.push(LogFile {
                path: ent.path(),
                seq,
                compressed,
            });
        }
    }
    files.sort_by_key(|f| (f.seq, f.compressed));
    files.dedup_by(|later, earlier| later.seq == earlier.seq);
    Ok(files)
}

/// Why a log file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be opened or read.
    #[error("{0}")]
    Io(std::io::Error),
    /// A `.zst` file is not a whole zstd archive: its bytes were read but do not
    /// decompress (damaged, cut short, or not zstd at all).
    #[error("corrupt archive: {0}")]
    CorruptArchive(String),
    /// The file (after decompression) is larger than [`MAX_FILE_BYTES`].
    #[error("larger than 1 GiB")]
    TooLarge,
}

impl ReadError {
    /// As an I/O error (a corrupt archive or an oversized file as `InvalidData`).
    pub fn into_io(self) -> std::io::Error {
        match self {
            ReadError::Io(e) => e,
            other => std::io::Error::new(std::io::ErrorKind::InvalidData, other.to_string()),
        }
    }
}

/// Whether a path names a compressed log file (`.zst`).
pub fn is_compressed(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".zst"))
}

/// Read a log file, decompressing `.zst`, refusing more than [`MAX_FILE_BYTES`] (before
/// and after decompression). A compressed file is read whole first and then decompressed
/// from memory, so that a decompression failure is told apart from an I/O failure.
pub fn read_log_file(path: &Path) -> Result<Vec<u8>, ReadError> {
    let file = std::fs::File::open(path).map_err(ReadError::Io)?;
    let mut raw = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut raw)
        .map_err(ReadError::Io)?;
    if raw.len() as u64 > MAX_FILE_BYTES {
        return Err(ReadError::TooLarge);
    }
    if !is_compressed(path) {
        return Ok(raw);
    }
    let mut out = Vec::new();
    zstd::stream::read::Decoder::with_buffer(raw.as_slice())
        .and_then(|d| d.take(MAX_FILE_BYTES + 1).read_to_end(&mut out))
        .map_err(|e| ReadError::CorruptArchive(e.to_string()))?;
    if out.len() as u64 > MAX_FILE_BYTES {
        return Err(ReadError::TooLarge);
    }
    Ok(out)
}

/// The first `n` bytes of a log file (fewer if it is shorter), decompressing only as
/// much of a `.zst` as that needs.
pub fn read_log_prefix(path: &Path, n: usize) -> Result<Vec<u8>, ReadError> {
    let file = std::fs::File::open(path).map_err(ReadError::Io)?;
    let limit = n as u64;
    let mut out = Vec::with_capacity(n);
    if is_compressed(path) {
        zstd::stream::read::Decoder::new(file)
            .and_then(|d| d.take(limit).read_to_end(&mut out))
            .map_err(|e| ReadError::CorruptArchive(e.to_string()))?;
    } else {
        file.take(limit)
            .read_to_end(&mut out)
            .map_err(ReadError::Io)?;
    }
    Ok(out)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
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
        y,
        u32::try_from(m).unwrap_or(1),
        u32::try_from(d).unwrap_or(1),
    )
}

/// (year, month, day) to days since 1970-01-01.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The UTC day (days since the epoch) of a timestamp.
pub fn day_of(ns: i64) -> i64 {
    ns.div_euclid(DAY_NS)
}

/// RFC 3339 UTC with nanoseconds: `2026-11-30T06:36:15.123456789Z`.
pub fn rfc3339(ns: i64) -> String {
    let day = ns.div_euclid(DAY_NS);
    let rem = ns.rem_euclid(DAY_NS);
    let (y, m, d) = civil_from_days(day);
    let secs = rem / 1_000_000_000;
    let nanos = rem % 1_000_000_000;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60
    )
}

/// Parse a time given on the command line: nanoseconds since the epoch, `YYYY-MM-DD`
/// (midnight UTC), or `YYYY-MM-DDTHH:MM:SS[.fraction]Z`.
pub fn parse_time(text: &str) -> Option<i64> {
    let t = text.trim();
    if let Ok(ns) = t.parse::<i64>() {
        return Some(ns);
    }
    let num = |s: &str| -> Option<i64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    let (date, time) = match t.split_once(['T', 't', ' ']) {
        Some((d, tm)) => (d, Some(tm)),
        None => (t, None),
    };
    let mut parts = date.splitn(3, '-');
    let y = num(parts.next()?)?;
    let m = u32::try_from(num(parts.next()?)?).ok()?;
    let d = u32::try_from(num(parts.next()?)?).ok()?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let mut ns = days_from_civil(y, m, d).checked_mul(DAY_NS)?;
    if let Some(tm) = time {
        let tm = tm.strip_suffix(['Z', 'z'])?;
        let (hms, frac) = match tm.split_once('.') {
            Some((a, b)) => (a, Some(b)),
            None => (tm, None),
        };
        let mut p = hms.splitn(3, ':');
        let h = num(p.next()?)?;
        let mi = num(p.next()?)?;
        let s = num(p.next()?)?;
        if h > 23 || mi > 59 || s > 60 {
            return None;
        }
        ns = ns.checked_add((h * 3600 + mi * 60 + s) * 1_000_000_000)?;
        if let Some(f) = frac {
            if f.is_empty() || f.len() > 9 {
                return None;
            }
            let scale = 10i64.pow(9 - u32::try_from(f.len()).ok()?);
            ns = ns.checked_add(num(f)?.checked_mul(scale)?)?;
        }
    }
    Some(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_round_trips() {
        for day in [-800_000, -1, 0, 1, 19_000, 20_422, 2_000_000] {
            let (y, m, d) = civil_from_days(day);
            assert_eq!(days_from_civil(y, m, d), day);
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn names_and_times() {
        assert_eq!(log_file_name(3, 0), "audit-00000003-19700101.log");
        assert_eq!(
            parse_log_name("audit-00000003-19700101.log"),
            Some((3, false))
        );
        assert_eq!(
            parse_log_name("audit-00000003-19700101.log.zst"),
            Some((3, true))
        );
        assert_eq!(parse_log_name("audit-x-19700101.log"), None);
        assert_eq!(parse_log_name("checkpoint"), None);
        let ns = parse_time("2026-11-30T06:36:15.5Z").unwrap();
        assert_eq!(rfc3339(ns), "2026-11-30T06:36:15.500000000Z");
        assert_eq!(parse_time("1970-01-02"), Some(DAY_NS));
        assert_eq!(parse_time("42"), Some(42));
        assert_eq!(parse_time("2026-13-01"), None);
        assert_eq!(parse_time("2026-01-01T25:00:00Z"), None);
    }
}
