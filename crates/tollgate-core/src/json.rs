//! Bounded JSON values, a strict parser, and the canonical writer.
//!
//! The canonical form is byte-for-byte what Python writes with
//! `json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`:
//! keys sorted by code point, no whitespace, non-ASCII left as UTF-8, `/` not escaped,
//! `"` and `\` escaped, control characters as `\n \r \t \b \f` or `\u00xx` (lowercase hex),
//! integers with every digit they were written with, floats as Python's `repr`
//! (`1e16` -> `1e+16`, `1e-7` -> `1e-07`, `1.0` -> `1.0`). SP/1.0's `canonical_hash` and
//! the board protocol's request digest are SHA-256 over these bytes.
//!
//! The parser is strict where Python is lenient, because every leniency is a way for two
//! parsers to disagree about what a document means: duplicate keys, lone surrogates, raw
//! control characters in strings, `NaN`/`Infinity` tokens and trailing data are errors. Every
//! parse is bounded in bytes and in nesting depth, so no input can exhaust the stack.

use std::collections::BTreeMap;
use std::fmt;

use sha2::{Digest as _, Sha256};

use crate::digest::Digest;

/// A JSON value. Objects are ordered by key (code point order, which for UTF-8 is byte
/// order), so iteration order is canonical order.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `null`
    Null,
    /// `true` or `false`
    Bool(bool),
    /// A number, integer or float, as written.
    Number(Number),
    /// A string.
    String(String),
    /// An array.
    Array(Vec<Value>),
    /// An object. Keys are unique by construction.
    Object(BTreeMap<String, Value>),
}

/// A JSON number, keeping Python's distinction between `int` and `float`.
#[derive(Debug, Clone, PartialEq)]
pub enum Number {
    /// An integer that fits in 128 bits.
    Int(i128),
    /// An integer too large for 128 bits: its canonical decimal digits (optional `-`, no
    /// leading zeros). Python keeps such integers exactly, so we do too.
    BigInt(Box<str>),
    /// A number written with a fraction or an exponent. May be non-finite when built in
    /// code or when the text overflows (`1e400`); such a value is not canonicalizable.
    Float(f64),
}

impl Value {
    /// A short name for the value's JSON type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(Number::Float(_)) => "number",
            Value::Number(_) => "integer",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }

    /// The object's map, if this is an object.
    pub fn as_object(&self) -> Option<&BTreeMap<String, Value>> {
        match self {
            Value::Object(m) => Some(m),
            _ => None,
        }
    }

    /// The array's items, if this is an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The string, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The boolean, if this is a boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// Whether this is `null`.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The number as an `i64`, if it is an integer in range.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Number(Number::Int(i)) => i64::try_from(*i).ok(),
            _ => None,
        }
    }

    /// The number as a `u64`, if it is a non-negative integer in range.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Number(Number::Int(i)) => u64::try_from(*i).ok(),
            _ => None,
        }
    }

    /// The number as an `f64` (integers are converted; big integers are not).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            #[allow(clippy::cast_precision_loss)]
            Value::Number(Number::Int(i)) => Some(*i as f64),
            Value::Number(Number::Float(f)) => Some(*f),
            _ => None,
        }
    }

    /// Member `key` of an object; `None` for a missing key or a non-object.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_object().and_then(|m| m.get(key))
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::String(s.to_owned())
    }
}

impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Number(Number::Int(i128::from(i)))
    }
}

impl From<f64> for Value {
    fn from(f: f64) -> Self {
        Value::Number(Number::Float(f))
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

// ---------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------

/// Bounds for one parse. Both are hard limits: exceeding either is an error, never a
/// truncation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Maximum input size in bytes.
    pub max_bytes: usize,
    /// Maximum container nesting: the outermost array or object is at depth 1.
    pub max_depth: usize,
}

impl Default for Limits {
    /// 16 MiB and depth 128: roomy for vector files, far below anything that threatens the
    /// stack.
    fn default() -> Self {
        Limits {
            max_bytes: 16 * 1024 * 1024,
            max_depth: 128,
        }
    }
}

/// Why a document is not accepted, with the byte offset where the parser stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} at line {line}, column {column}")]
pub struct ParseError {
    /// What went wrong.
    pub kind: ParseErrorKind,
    /// Byte offset into the input.
    pub offset: usize,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in bytes.
    pub column: usize,
}

/// The kinds of parse failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseErrorKind {
    /// The input is larger than [`Limits::max_bytes`].
    #[error("input is {size} bytes, over the limit of {limit}")]
    TooLarge {
        /// Input size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Containers nest deeper than [`Limits::max_depth`].
    #[error("nesting deeper than {limit} levels")]
    TooDeep {
        /// The limit.
        limit: usize,
    },
    /// The input ended inside a value.
    #[error("unexpected end of input")]
    UnexpectedEnd,
    /// A byte that cannot start or continue a value here.
    #[error("unexpected character `{0}`")]
    UnexpectedChar(char),
    /// Something other than whitespace follows the document.
    #[error("trailing data after the document")]
    TrailingData,
    /// An object has the same key twice.
    #[error("duplicate key `{0}`")]
    DuplicateKey(String),
    /// A malformed number.
    #[error("invalid number")]
    InvalidNumber,
    /// A bad escape sequence.
    #[error("invalid escape sequence")]
    InvalidEscape,
    /// A `\u` escape for half of a surrogate pair with no other half.
    #[error("lone surrogate `\\u{0:04x}`")]
    LoneSurrogate(u16),
    /// A raw control character inside a string.
    #[error("raw control character U+{0:04X} in a string")]
    ControlCharacter(u32),
    /// The input is not UTF-8.
    #[error("input is not valid UTF-8")]
    InvalidUtf8,
    /// `NaN`, `Infinity` or `-Infinity`, which JSON does not have.
    #[error("`{0}` is not a JSON value")]
    NonFiniteToken(&'static str),
}

/// Parse one JSON document from bytes, within `limits`.
pub fn parse(input: &[u8], limits: Limits) -> Result<Value, ParseError> {
    let mut p = Parser {
        src: input,
        pos: 0,
        limits,
    };
    if input.len() > limits.max_bytes {
        return Err(p.error(ParseErrorKind::TooLarge {
            size: input.len(),
            limit: limits.max_bytes,
        }));
    }
    // Validate UTF-8 once, up front, so string slicing below cannot split a character.
    if let Err(e) = std::str::from_utf8(input) {
        p.pos = e.valid_up_to();
        return Err(p.error(ParseErrorKind::InvalidUtf8));
    }
    p.skip_ws();
    let v = p.value(0)?;
    p.skip_ws();
    if p.pos < p.src.len() {
        return Err(p.error(ParseErrorKind::TrailingData));
    }
    Ok(v)
}

/// Parse one JSON document from a string with the default [`Limits`].
pub fn parse_str(input: &str) -> Result<Value, ParseError> {
    parse(input.as_bytes(), Limits::default())
}

struct Parser<'a> {
    src: &'a [u8],
    pos: usize,
    limits: Limits,
}

impl Parser<'_> {
    fn error(&self, kind: ParseErrorKind) -> ParseError {
        let end = self.pos.min(self.src.len());
        let before = self.src.get(..end).unwrap_or_default();
        let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        ParseError {
            kind,
            offset: self.pos,
            line,
            column: end - line_start + 1,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn unexpected(&self) -> ParseError {
        match self.peek() {
            None => self.error(ParseErrorKind::UnexpectedEnd),
            Some(_) => {
                let c = self
                    .src
                    .get(self.pos..)
                    .and_then(|rest| std::str::from_utf8(rest).ok())
                    .and_then(|s| s.chars().next())
                    .unwrap_or('\u{fffd}');
                self.error(ParseErrorKind::UnexpectedChar(c))
            }
        }
    }

    fn eat_literal(&mut self, lit: &[u8]) -> bool {
        if self.src.get(self.pos..self.pos + lit.len()) == Some(lit) {
            self.pos += lit.len();
            true
        } else {
            false
        }
    }

    /// `depth` is the number of containers already open around this value.
    fn value(&mut self, depth: usize) -> Result<Value, ParseError> {
        match self.peek() {
            None => Err(self.error(ParseErrorKind::UnexpectedEnd)),
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b't') if self.eat_literal(b"true") => Ok(Value::Bool(true)),
            Some(b'f') if self.eat_literal(b"false") => Ok(Value::Bool(false)),
            Some(b'n') if self.eat_literal(b"null") => Ok(Value::Null),
            Some(b'N') if self.eat_literal(b"NaN") => {
                self.pos -= 3;
                Err(self.error(ParseErrorKind::NonFiniteToken("NaN")))
            }
            Some(b'I') if self.eat_literal(b"Infinity") => {
                self.pos -= 8;
                Err(self.error(ParseErrorKind::NonFiniteToken("Infinity")))
            }
            Some(b'-') if self.src.get(self.pos + 1) == Some(&b'I') => {
                Err(self.error(ParseErrorKind::NonFiniteToken("-Infinity")))
            }
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.unexpected()),
        }
    }

    fn enter(&self, depth: usize) -> Result<(), ParseError> {
        if depth > self.limits.max_depth {
            Err(self.error(ParseErrorKind::TooDeep {
                limit: self.limits.max_depth,
            }))
        } else {
            Ok(())
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, ParseError> {
        self.enter(depth)?;
        self.pos += 1; // '{'
        let mut map = BTreeMap::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Value::Object(map));
        }
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err(self.unexpected());
            }
            let key_pos = self.pos;
            let key = self.string()?;
            self.skip_ws();
            if self.peek() != Some(b':') {
                return Err(self.unexpected());
            }
            self.pos += 1;
            self.skip_ws();
            let v = self.value(depth)?;
            if map.contains_key(&key) {
                self.pos = key_pos;
                return Err(self.error(ParseErrorKind::DuplicateKey(key)));
            }
            map.insert(key, v);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(map));
                }
                _ => return Err(self.unexpected()),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, ParseError> {
        self.enter(depth)?;
        self.pos += 1; // '['
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth)?);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                _ => return Err(self.unexpected()),
            }
        }
    }

    fn hex4(&mut self) -> Result<u16, ParseError> {
        let digits = self
            .src
            .get(self.pos..self.pos + 4)
            .ok_or_else(|| self.error(ParseErrorKind::InvalidEscape))?;
        let mut v: u16 = 0;
        for &d in digits {
            let nibble = match d {
                b'0'..=b'9' => d - b'0',
                b'a'..=b'f' => d - b'a' + 10,
                b'A'..=b'F' => d - b'A' + 10,
                _ => return Err(self.error(ParseErrorKind::InvalidEscape)),
            };
            v = (v << 4) | u16::from(nibble);
        }
        self.pos += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, ParseError> {
        self.pos += 1; // opening quote
        let mut out = String::new();
        loop {
            let start = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            if let Some(run) = self.src.get(start..self.pos) {
                // The whole input was validated as UTF-8 and the run stops only at ASCII
                // bytes, so it is a whole number of characters.
                out.push_str(std::str::from_utf8(run).unwrap_or_default());
            }
            match self.peek() {
                None => return Err(self.error(ParseErrorKind::UnexpectedEnd)),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let esc = self
                        .peek()
                        .ok_or_else(|| self.error(ParseErrorKind::UnexpectedEnd))?;
                    self.pos += 1;
                    match esc {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => out.push(self.unicode_escape()?),
                        _ => {
                            self.pos -= 1;
                            return Err(self.error(ParseErrorKind::InvalidEscape));
                        }
                    }
                }
                Some(b) => return Err(self.error(ParseErrorKind::ControlCharacter(u32::from(b)))),
            }
        }
    }

    /// After `\u`: one code point, joining a surrogate pair; a lone half is an error.
    fn unicode_escape(&mut self) -> Result<char, ParseError> {
        let at = self.pos - 2;
        let hi = self.hex4()?;
        let code = match hi {
            0xD800..=0xDBFF => {
                if self.src.get(self.pos..self.pos + 2) != Some(b"\\u") {
                    self.pos = at;
                    return Err(self.error(ParseErrorKind::LoneSurrogate(hi)));
                }
                self.pos += 2;
                let lo = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&lo) {
                    self.pos = at;
                    return Err(self.error(ParseErrorKind::LoneSurrogate(hi)));
                }
                0x10000 + ((u32::from(hi) - 0xD800) << 10) + (u32::from(lo) - 0xDC00)
            }
            0xDC00..=0xDFFF => {
                self.pos = at;
                return Err(self.error(ParseErrorKind::LoneSurrogate(hi)));
            }
            _ => u32::from(hi),
        };
        char::from_u32(code).ok_or_else(|| self.error(ParseErrorKind::InvalidEscape))
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        self.pos - start
    }

    fn number(&mut self) -> Result<Value, ParseError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        let int_start = self.pos;
        let n = self.digits();
        if n == 0 || (n > 1 && self.src.get(int_start) == Some(&b'0')) {
            return Err(self.error(ParseErrorKind::InvalidNumber));
        }
        let mut is_float = false;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return Err(self.error(ParseErrorKind::InvalidNumber));
            }
            is_float = true;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return Err(self.error(ParseErrorKind::InvalidNumber));
            }
            is_float = true;
        }
        let text = self
            .src
            .get(start..self.pos)
            .and_then(|t| std::str::from_utf8(t).ok())
            .ok_or_else(|| self.error(ParseErrorKind::InvalidNumber))?;
        if is_float {
            // Rust's parse is correctly rounded, like Python's float(); overflow gives
            // ±inf, which canonicalization then rejects, as Python's dumps does.
            let f: f64 = text
                .parse()
                .map_err(|_| self.error(ParseErrorKind::InvalidNumber))?;
            return Ok(Value::Number(Number::Float(f)));
        }
        Ok(Value::Number(match text.parse::<i128>() {
            // `-0` is the integer 0, as in Python.
            Ok(i) => Number::Int(i),
            Err(_) => Number::BigInt(text.into()),
        }))
    }
}

// ---------------------------------------------------------------------------------------
// Canonical writing
// ---------------------------------------------------------------------------------------

/// Where canonical bytes go: a buffer, or straight into a hash with no allocation.
pub trait Sink {
    /// Append bytes.
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

impl Sink for Sha256 {
    fn put(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

/// A float that JSON cannot carry (NaN or ±infinity) was found while writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("non-finite number has no canonical JSON form")]
pub struct NonFinite;

/// Write `v` in canonical form.
pub fn write_canonical<S: Sink + ?Sized>(v: &Value, out: &mut S) -> Result<(), NonFinite> {
    match v {
        Value::Null => out.put(b"null"),
        Value::Bool(true) => out.put(b"true"),
        Value::Bool(false) => out.put(b"false"),
        Value::Number(n) => write_number(n, out)?,
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.put(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.put(b",");
                }
                write_canonical(item, out)?;
            }
            out.put(b"]");
        }
        Value::Object(map) => {
            out.put(b"{");
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.put(b",");
                }
                write_string(k, out);
                out.put(b":");
                write_canonical(item, out)?;
            }
            out.put(b"}");
        }
    }
    Ok(())
}

/// Writes one canonical JSON object straight into bytes, member by member: for hot paths
/// (a session record on every decision) that would otherwise build a [`Value`] tree only
/// to write it. The caller gives the keys in canonical order (byte order, as
/// [`write_canonical`] sorts them; debug builds check it) and writes each member's value
/// with [`ObjectWriter::str`], [`ObjectWriter::int`], [`ObjectWriter::value`] or a nested
/// writer from [`ObjectWriter::object`]. The bytes equal [`write_canonical`]'s of the same
/// object.
#[derive(Debug)]
pub struct ObjectWriter<'a> {
    out: &'a mut Vec<u8>,
    members: usize,
    #[cfg(debug_assertions)]
    last: Option<String>,
}

impl<'a> ObjectWriter<'a> {
    /// Open an object at the end of `out`.
    pub fn new(out: &'a mut Vec<u8>) -> ObjectWriter<'a> {
        out.push(b'{');
        ObjectWriter {
            out,
            members: 0,
            #[cfg(debug_assertions)]
            last: None,
        }
    }

    /// Write `"key":`, and return the buffer the member's value goes to.
    pub fn key(&mut self, key: &str) -> &mut Vec<u8> {
        #[cfg(debug_assertions)]
        {
            debug_assert!(
                self.last
                    .as_deref()
                    .is_none_or(|l| l.as_bytes() < key.as_bytes()),
                "keys out of canonical order: {:?} then {key:?}",
                self.last
            );
            self.last = Some(key.to_owned());
        }
        if self.members > 0 {
            self.out.push(b',');
        }
        self.members += 1;
        write_string(key, &mut *self.out);
        self.out.push(b':');
        &mut *self.out
    }

    /// A string member.
    pub fn str(&mut self, key: &str, v: &str) {
        let out = self.key(key);
        write_string(v, out);
    }

    /// An integer member.
    pub fn int(&mut self, key: &str, v: impl Into<i128>) {
        let out = self.key(key);
        write_int(v.into(), out);
    }

    /// A boolean member.
    pub fn bool(&mut self, key: &str, v: bool) {
        let out = self.key(key);
        out.extend_from_slice(if v { b"true" } else { b"false" });
    }

    /// A `null` member.
    pub fn null(&mut self, key: &str) {
        self.key(key).extend_from_slice(b"null");
    }

    /// A member whose value is a [`Value`], written canonically.
    pub fn value(&mut self, key: &str, v: &Value) -> Result<(), NonFinite> {
        let out = self.key(key);
        write_canonical(v, out)
    }

    /// A member that is itself an object, written by `f` (closed when it returns).
    pub fn object<R>(&mut self, key: &str, f: impl FnOnce(&mut ObjectWriter<'_>) -> R) -> R {
        let out = self.key(key);
        let mut inner = ObjectWriter::new(out);
        let r = f(&mut inner);
        inner.end();
        r
    }

    /// Close the object.
    pub fn end(self) {
        self.out.push(b'}');
    }
}

/// Write the canonical form of a JSON string (quotes and escapes included).
pub fn write_canonical_str(s: &str, out: &mut Vec<u8>) {
    write_string(s, out);
}

/// Write the canonical form of an integer.
pub fn write_canonical_int(i: i128, out: &mut Vec<u8>) {
    write_int(i, out);
}

/// The canonical bytes of `v`.
pub fn to_canonical_vec(v: &Value) -> Result<Vec<u8>, NonFinite> {
    let mut out = Vec::new();
    write_canonical(v, &mut out)?;
    Ok(out)
}

/// SHA-256 over the canonical bytes of `v`, computed without allocating.
pub fn canonical_hash(v: &Value) -> Result<Digest, NonFinite> {
    let mut h = HashSink {
        hasher: Sha256::new(),
        buf: [0; HASH_CHUNK],
        len: 0,
    };
    write_canonical(v, &mut h)?;
    Ok(h.finish())
}

const HASH_CHUNK: usize = 512;

/// Feeds the hash in chunks: the canonical writer emits many tiny pieces (`"`, `:`, `,`),
/// and handing each to SHA-256 on its own costs more than the hashing.
struct HashSink {
    hasher: Sha256,
    buf: [u8; HASH_CHUNK],
    len: usize,
}

impl HashSink {
    fn flush(&mut self) {
        self.hasher
            .update(self.buf.get(..self.len).unwrap_or_default());
        self.len = 0;
    }

    fn finish(mut self) -> Digest {
        self.flush();
        Digest(self.hasher.finalize().into())
    }
}

impl Sink for HashSink {
    fn put(&mut self, bytes: &[u8]) {
        if self.len + bytes.len() > HASH_CHUNK {
            self.flush();
            if bytes.len() > HASH_CHUNK {
                self.hasher.update(bytes);
                return;
            }
        }
        if let Some(slot) = self.buf.get_mut(self.len..self.len + bytes.len()) {
            slot.copy_from_slice(bytes);
            self.len += bytes.len();
        }
    }
}

fn write_number<S: Sink + ?Sized>(n: &Number, out: &mut S) -> Result<(), NonFinite> {
    match n {
        Number::Int(i) => write_int(*i, out),
        Number::BigInt(digits) => out.put(digits.as_bytes()),
        Number::Float(f) => write_py_float(*f, out)?,
    }
    Ok(())
}

fn write_int<S: Sink + ?Sized>(i: i128, out: &mut S) {
    if i < 0 {
        out.put(b"-");
    }
    let mut n = i.unsigned_abs();
    // 39 digits hold any u128.
    let mut buf = [0u8; 40];
    let mut at = buf.len();
    loop {
        at -= 1;
        // Narrow to u64 as soon as possible: 128-bit division is slow.
        let digit = if let Ok(small) = u64::try_from(n) {
            n = u128::from(small / 10);
            (small % 10) as u8
        } else {
            let d = (n % 10) as u8;
            n /= 10;
            d
        };
        if let Some(slot) = buf.get_mut(at) {
            *slot = b'0' + digit;
        }
        if n == 0 || at == 0 {
            break;
        }
    }
    out.put(buf.get(at..).unwrap_or_default());
}

/// Python's `repr(float)`: the shortest digits that round-trip (ties broken to even, as
/// David Gay's dtoa does; Ryu guarantees the same), in fixed notation when the decimal
/// point falls in -4..16 and in scientific notation (`1e+16`, `1.5e-07`) otherwise.
fn write_py_float<S: Sink + ?Sized>(f: f64, out: &mut S) -> Result<(), NonFinite> {
    if !f.is_finite() {
        return Err(NonFinite);
    }
    if f == 0.0 {
        out.put(if f.is_sign_negative() {
            b"-0.0"
        } else {
            b"0.0"
        });
        return Ok(());
    }
    let mut ryu_buf = ryu::Buffer::new();
    let text = ryu_buf.format_finite(f.abs()).as_bytes();
    // Read Ryu's text ("1.5e-7", "1e16", "0.0001", "123.45") as DIGITS and a decimal
    // point position DECPT: value = 0.DIGITS × 10^DECPT, DIGITS without leading or
    // trailing zeros.
    let e_at = text.iter().position(|&b| b == b'e').unwrap_or(text.len());
    let mantissa = text.get(..e_at).unwrap_or_default();
    let exp: i32 = text
        .get(e_at + 1..)
        .and_then(|e| std::str::from_utf8(e).ok())
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    let dot = mantissa
        .iter()
        .position(|&b| b == b'.')
        .unwrap_or(mantissa.len());
    let mut digits = StackBuf::<32>::new();
    let mut decpt = i32::try_from(dot).unwrap_or(0) + exp;
    for &b in mantissa {
        if b == b'.' {
            continue;
        }
        if b == b'0' && digits.len == 0 {
            decpt -= 1; // a leading zero
        } else {
            digits.push(b);
        }
    }
    while digits.len > 1 && digits.as_bytes().last() == Some(&b'0') {
        digits.len -= 1;
    }
    let digits = digits.as_bytes();
    let nd = i32::try_from(digits.len()).unwrap_or(i32::MAX);

    if f.is_sign_negative() {
        out.put(b"-");
    }
    if decpt > -4 && decpt <= 16 {
        if decpt <= 0 {
            out.put(b"0.");
            for _ in 0..(-decpt) {
                out.put(b"0");
            }
            out.put(digits);
        } else if decpt >= nd {
            out.put(digits);
            for _ in 0..(decpt - nd) {
                out.put(b"0");
            }
            out.put(b".0");
        } else {
            let split = usize::try_from(decpt).unwrap_or(0);
            let (int_part, frac_part) = digits.split_at(split.min(digits.len()));
            out.put(int_part);
            out.put(b".");
            out.put(frac_part);
        }
    } else {
        let (first, rest) = digits.split_at(1.min(digits.len()));
        out.put(first);
        if !rest.is_empty() {
            out.put(b".");
            out.put(rest);
        }
        let e = decpt - 1;
        out.put(if e < 0 { b"e-" } else { b"e+" });
        let mut eb = StackBuf::<8>::new();
        let _ = fmt::Write::write_fmt(&mut eb, format_args!("{:02}", e.unsigned_abs()));
        out.put(eb.as_bytes());
    }
    Ok(())
}

fn write_string<S: Sink + ?Sized>(s: &str, out: &mut S) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.put(b"\"");
    let bytes = s.as_bytes();
    let mut run_start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: Option<&[u8]> = match b {
            b'"' => Some(b"\\\""),
            b'\\' => Some(b"\\\\"),
            b'\n' => Some(b"\\n"),
            b'\r' => Some(b"\\r"),
            b'\t' => Some(b"\\t"),
            0x08 => Some(b"\\b"),
            0x0c => Some(b"\\f"),
            0x00..=0x1f => None,
            _ => continue,
        };
        out.put(bytes.get(run_start..i).unwrap_or_default());
        match esc {
            Some(e) => out.put(e),
            None => {
                let hi = HEX.get(usize::from(b >> 4)).copied().unwrap_or(b'0');
                let lo = HEX.get(usize::from(b & 0xf)).copied().unwrap_or(b'0');
                out.put(&[b'\\', b'u', b'0', b'0', hi, lo]);
            }
        }
        run_start = i + 1;
    }
    out.put(bytes.get(run_start..).unwrap_or_default());
    out.put(b"\"");
}

/// A fixed-size byte buffer used for number formatting without touching the heap.
struct StackBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> StackBuf<N> {
    fn new() -> Self {
        StackBuf {
            buf: [0; N],
            len: 0,
        }
    }

    fn push(&mut self, b: u8) {
        if let Some(slot) = self.buf.get_mut(self.len) {
            *slot = b;
            self.len += 1;
        }
    }

    fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or_default()
    }
}

impl<const N: usize> fmt::Write for StackBuf<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        let slot = self.buf.get_mut(self.len..end).ok_or(fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        let v = parse_str(text).unwrap();
        String::from_utf8(to_canonical_vec(&v).unwrap()).unwrap()
    }

    fn float(f: f64) -> String {
        String::from_utf8(to_canonical_vec(&Value::from(f)).unwrap()).unwrap()
    }

    #[test]
    // The tie cases below are written at full precision on purpose: they are exact.
    #[allow(clippy::excessive_precision)]
    fn floats_print_as_python_repr() {
        // Each expected string is what CPython 3.11 prints for repr(x).
        let cases: &[(f64, &str)] = &[
            (1.0, "1.0"),
            (0.1, "0.1"),
            (0.15, "0.15"),
            (10.0, "10.0"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1.5e16, "1.5e+16"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1e-7, "1e-07"),
            (1.5e-7, "1.5e-07"),
            (0.00012345, "0.00012345"),
            (1e22, "1e+22"),
            (1e100, "1e+100"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (123.456, "123.456"),
            (9999999999999998.0, "9999999999999998.0"),
            // Exact ties between two shortest candidates go to the even digit, as in
            // Python (1951601819917218.25 is exactly representable).
            (1951601819917218.25, "1951601819917218.2"),
            (34595157129853.8125, "34595157129853.812"),
            (0.3, "0.3"),
            (2.0f64.powi(60), "1.152921504606847e+18"),
        ];
        for (f, want) in cases {
            assert_eq!(float(*f), *want, "repr of {f:e}");
        }
    }

    #[test]
    fn non_finite_floats_have_no_canonical_form() {
        for f in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(to_canonical_vec(&Value::from(f)), Err(NonFinite));
        }
        // Overflowing text parses (as Python's does) but cannot be written.
        let v = parse_str("[1e400]").unwrap();
        assert_eq!(to_canonical_vec(&v), Err(NonFinite));
    }

    #[test]
    fn canonical_form_sorts_keys_and_compacts() {
        assert_eq!(
            canon(r#" { "b" : 1 , "a" : [ true , null , 2.50 ] , "é": "ü/" } "#),
            r#"{"a":[true,null,2.5],"b":1,"é":"ü/"}"#
        );
        // Code point order, not UTF-16 order: U+FFFF sorts before U+10000 either way,
        // and "Z" before "a".
        assert_eq!(
            canon(r#"{"a":1,"Z":2,"\uffff":3,"😀":4}"#),
            "{\"Z\":2,\"a\":1,\"\u{ffff}\":3,\"😀\":4}"
        );
    }

    #[test]
    fn integers_keep_every_digit() {
        assert_eq!(
            canon("123456789012345678901234567890"),
            "123456789012345678901234567890"
        );
        assert_eq!(
            canon("-1234567890123456789012345678901234567890123"),
            "-1234567890123456789012345678901234567890123"
        );
        assert_eq!(canon("-0"), "0");
        assert_eq!(
            canon("[0,7,-7,10,-170141183460469231731687303715884105728]"),
            "[0,7,-7,10,-170141183460469231731687303715884105728]"
        );
        assert_eq!(
            canon("[18446744073709551615,18446744073709551616]"),
            "[18446744073709551615,18446744073709551616]"
        );
        assert_eq!(canon("1E2"), "100.0");
        assert_eq!(canon("1.0e-7"), "1e-07");
    }

    #[test]
    fn strings_escape_as_python_does() {
        assert_eq!(
            canon(r#""q\" b\\ \/ \n\r\t\b\f \u0001 \u001f \u007f é \ud83d\ude00""#),
            "\"q\\\" b\\\\ / \\n\\r\\t\\b\\f \\u0001 \\u001f \u{7f} é 😀\""
        );
    }

    #[test]
    fn strict_parser_rejects_what_python_might_accept() {
        let kind = |t: &str| parse_str(t).unwrap_err().kind;
        assert_eq!(
            kind(r#"{"a":1,"a":2}"#),
            ParseErrorKind::DuplicateKey("a".into())
        );
        assert_eq!(kind("NaN"), ParseErrorKind::NonFiniteToken("NaN"));
        assert_eq!(
            kind("[-Infinity]"),
            ParseErrorKind::NonFiniteToken("-Infinity")
        );
        assert_eq!(
            kind("[Infinity]"),
            ParseErrorKind::NonFiniteToken("Infinity")
        );
        assert_eq!(kind(r#""\ud800""#), ParseErrorKind::LoneSurrogate(0xd800));
        assert_eq!(kind(r#""\udc00x""#), ParseErrorKind::LoneSurrogate(0xdc00));
        assert_eq!(
            kind(r#""\ud800\u0041""#),
            ParseErrorKind::LoneSurrogate(0xd800)
        );
        assert_eq!(kind("\"a\u{1}\""), ParseErrorKind::ControlCharacter(1));
        assert_eq!(kind("{} x"), ParseErrorKind::TrailingData);
        assert_eq!(kind("01"), ParseErrorKind::InvalidNumber);
        assert_eq!(kind("1."), ParseErrorKind::InvalidNumber);
        assert_eq!(kind("[1,]"), ParseErrorKind::UnexpectedChar(']'));
        assert_eq!(kind(""), ParseErrorKind::UnexpectedEnd);
        assert_eq!(kind(r#"{"a" 1}"#), ParseErrorKind::UnexpectedChar('1'));
        assert_eq!(kind(r#""\x""#), ParseErrorKind::InvalidEscape);
        assert_eq!(
            parse(b"\"\xff\"", Limits::default()).unwrap_err().kind,
            ParseErrorKind::InvalidUtf8
        );
    }

    #[test]
    fn parse_is_bounded_in_depth_and_size() {
        let lim = Limits {
            max_bytes: 1000,
            max_depth: 3,
        };
        assert!(parse(b"[[[1]]]", lim).is_ok());
        assert_eq!(
            parse(b"[[[[1]]]]", lim).unwrap_err().kind,
            ParseErrorKind::TooDeep { limit: 3 }
        );
        assert_eq!(
            parse(br#"{"a":{"b":{"c":{}}}}"#, lim).unwrap_err().kind,
            ParseErrorKind::TooDeep { limit: 3 }
        );
        let deep = "[".repeat(100_000);
        assert!(matches!(
            parse_str(&deep).unwrap_err().kind,
            ParseErrorKind::TooDeep { .. }
        ));
        let big = vec![b' '; 1001];
        assert_eq!(
            parse(&big, lim).unwrap_err().kind,
            ParseErrorKind::TooLarge {
                size: 1001,
                limit: 1000
            }
        );
    }

    #[test]
    fn errors_carry_a_position() {
        let e = parse_str("{\n  \"a\": tru\n}").unwrap_err();
        assert_eq!((e.line, e.column), (2, 8));
    }
}
