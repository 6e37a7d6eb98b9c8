//! The one mapping of JSON numbers to Cedar values.
//!
//! Cedar has no floating point: it has `Long` (a signed 64-bit integer, compared with
//! `<`, `>`, ...) and the `decimal` extension (a signed fixed-point number with exactly
//! four places, from -922337203685477.5808 to 922337203685477.5807, compared with
//! `.lessThan(...)`, `.greaterThan(...)`, ...). A number is mapped by this table, and by
//! nothing else:
//!
//! | JSON number                               | declared `Long` | declared `decimal` | not declared |
//! |-------------------------------------------|-----------------|--------------------|--------------|
//! | integer in i64 (`100`)                    | Long            | decimal `100.0`    | Long         |
//! | integer outside i64                       | unrepresentable | decimal if in range| unrepresentable |
//! | fraction, ≤ 4 places, in range (`100.50`) | unrepresentable | decimal `100.5`    | decimal      |
//! | float with an integral value (`100.0`)    | Long            | decimal `100.0`    | decimal      |
//! | more than 4 places (`0.12345`), or out of range | unrepresentable | unrepresentable | unrepresentable |
//!
//! "Declared" means the policy set's schema gives the argument that type. A float's
//! digits are its shortest round-trip form, the same digits Tollgate's canonical JSON (and
//! so the params hash) writes: `0.1` is `decimal("0.1")`, not the binary expansion.
//!
//! Nothing is ever rounded or truncated: `100.50` is never the Long `100` (which would
//! make `amount > 100` false), it is `decimal("100.5")`, for which
//! `amount.greaterThan(decimal("100.0"))` is true and `amount > 100` is a type error. An
//! **unrepresentable** number does not become some nearby value: every policy that reads
//! the argument holding it fails closed (`crate::Effect::Deny` with
//! `crate::DenyCause::Unrepresentable`), and policies that do not read it are unaffected.

use tollgate_core::json::Number;

/// How a schema declares a number-holding argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NumberType {
    /// Cedar `Long`.
    Long,
    /// The `decimal` extension type.
    Decimal,
}

/// A number as Cedar will see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CedarNumber {
    /// A `Long`.
    Long(i64),
    /// A `decimal`: the value times 10,000.
    Decimal(i64),
}

impl CedarNumber {
    /// The text the `decimal` constructor accepts (`-12.3400`), for a `Decimal`.
    pub fn decimal_text(scaled: i64) -> String {
        let v = i128::from(scaled);
        let sign = if v < 0 { "-" } else { "" };
        let abs = v.abs();
        format!("{sign}{}.{:04}", abs / 10_000, abs % 10_000)
    }
}

/// Why a number has no Cedar value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unrepresentable {
    /// An integer outside the declared (or, undeclared, the `Long`) range.
    OutOfRange,
    /// A fraction where the schema declares `Long`.
    NotAnInteger,
    /// More than four decimal places (decimal's precision).
    TooPrecise,
    /// Not a finite number.
    NonFinite,
}

impl Unrepresentable {
    /// A stable lowercase name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Unrepresentable::OutOfRange => "out_of_range",
            Unrepresentable::NotAnInteger => "not_an_integer",
            Unrepresentable::TooPrecise => "too_precise",
            Unrepresentable::NonFinite => "non_finite",
        }
    }
}

/// decimal's scale: four places.
const SCALE: i128 = 10_000;

/// Map `n` as the table in this module's documentation says, `declared` being the type
/// the schema gives it (if any).
pub fn map_number(
    n: &Number,
    declared: Option<NumberType>,
) -> Result<CedarNumber, Unrepresentable> {
    match n {
        Number::Int(i) => match declared {
            None | Some(NumberType::Long) => i64::try_from(*i)
                .map(CedarNumber::Long)
                .map_err(|_| Unrepresentable::OutOfRange),
            Some(NumberType::Decimal) => scaled_to_decimal(i.checked_mul(SCALE)),
        },
        // More than 128 bits: outside every Cedar range.
        Number::BigInt(_) => Err(Unrepresentable::OutOfRange),
        Number::Float(f) => {
            let scaled = float_scaled(*f)?;
            match declared {
                Some(NumberType::Long) => {
                    if scaled % SCALE != 0 {
                        return Err(Unrepresentable::NotAnInteger);
                    }
                    i64::try_from(scaled / SCALE)
                        .map(CedarNumber::Long)
                        .map_err(|_| Unrepresentable::OutOfRange)
                }
                None | Some(NumberType::Decimal) => scaled_to_decimal(Some(scaled)),
            }
        }
    }
}

fn scaled_to_decimal(scaled: Option<i128>) -> Result<CedarNumber, Unrepresentable> {
    scaled
        .and_then(|s| i64::try_from(s).ok())
        .map(CedarNumber::Decimal)
        .ok_or(Unrepresentable::OutOfRange)
}

/// A finite float's value times 10,000, exactly, from its shortest round-trip digits; an
/// error when those digits have more than four places or the value is far outside
/// decimal's range.
fn float_scaled(f: f64) -> Result<i128, Unrepresentable> {
    if !f.is_finite() {
        return Err(Unrepresentable::NonFinite);
    }
    if f == 0.0 {
        return Ok(0);
    }
    // decimal's range ends below 1e15; anything at or above cannot fit, and anything
    // nonzero below 1e-4 has more than four places. Both bounds keep the text short.
    let abs = f.abs();
    if abs >= 1e15 {
        return Err(Unrepresentable::OutOfRange);
    }
    if abs < 1e-4 {
        return Err(Unrepresentable::TooPrecise);
    }
    // Rust writes a finite f64 with `{}` as its shortest round-trip digits, without an
    // exponent: at most 16 digits before the point here, and (above 1e-4) few after.
    let text = format!("{abs}");
    let (int_part, frac_part) = match text.split_once('.') {
        Some((i, fr)) => (i, fr),
        None => (text.as_str(), ""),
    };
    if frac_part.len() > 4 {
        return Err(Unrepresentable::TooPrecise);
    }
    let int: i128 = int_part.parse().map_err(|_| Unrepresentable::OutOfRange)?;
    let mut frac: i128 = if frac_part.is_empty() {
        0
    } else {
        frac_part.parse().map_err(|_| Unrepresentable::TooPrecise)?
    };
    for _ in frac_part.len()..4 {
        frac *= 10;
    }
    let scaled = int * SCALE + frac;
    Ok(if f < 0.0 { -scaled } else { scaled })
}

#[cfg(test)]
mod tests {
    use super::*;
    use CedarNumber::{Decimal, Long};
    use NumberType as T;

    fn float(f: f64, d: Option<NumberType>) -> Result<CedarNumber, Unrepresentable> {
        map_number(&Number::Float(f), d)
    }
    fn int(i: i128, d: Option<NumberType>) -> Result<CedarNumber, Unrepresentable> {
        map_number(&Number::Int(i), d)
    }

    #[test]
    fn the_table() {
        // Integers.
        assert_eq!(int(100, None), Ok(Long(100)));
        assert_eq!(int(100, Some(T::Long)), Ok(Long(100)));
        assert_eq!(int(100, Some(T::Decimal)), Ok(Decimal(1_000_000)));
        assert_eq!(int(i128::from(i64::MAX), None), Ok(Long(i64::MAX)));
        assert_eq!(
            int(i128::from(i64::MAX) + 1, None),
            Err(Unrepresentable::OutOfRange)
        );
        assert_eq!(
            int(922_337_203_685_477, Some(T::Decimal)),
            Ok(Decimal(9_223_372_036_854_770_000))
        );
        assert_eq!(
            int(922_337_203_685_478, Some(T::Decimal)),
            Err(Unrepresentable::OutOfRange)
        );
        assert_eq!(
            map_number(&Number::BigInt("1".repeat(50).into()), Some(T::Decimal)),
            Err(Unrepresentable::OutOfRange)
        );
        // Fractions.
        assert_eq!(float(100.5, None), Ok(Decimal(1_005_000)));
        assert_eq!(float(100.5, Some(T::Decimal)), Ok(Decimal(1_005_000)));
        assert_eq!(
            float(100.5, Some(T::Long)),
            Err(Unrepresentable::NotAnInteger)
        );
        assert_eq!(float(-0.0001, None), Ok(Decimal(-1)));
        assert_eq!(float(0.1, None), Ok(Decimal(1_000)));
        assert_eq!(float(0.12345, None), Err(Unrepresentable::TooPrecise));
        assert_eq!(float(0.1 + 0.2, None), Err(Unrepresentable::TooPrecise));
        assert_eq!(float(0.00001, None), Err(Unrepresentable::TooPrecise));
        assert_eq!(float(1e15, None), Err(Unrepresentable::OutOfRange));
        assert_eq!(
            float(1e300, Some(T::Long)),
            Err(Unrepresentable::OutOfRange)
        );
        assert_eq!(float(f64::NAN, None), Err(Unrepresentable::NonFinite));
        // Integral floats.
        assert_eq!(float(100.0, None), Ok(Decimal(1_000_000)));
        assert_eq!(float(100.0, Some(T::Long)), Ok(Long(100)));
        assert_eq!(float(1e14, Some(T::Long)), Ok(Long(100_000_000_000_000)));
        assert_eq!(float(-0.0, None), Ok(Decimal(0)));
        assert_eq!(
            float(922_337_203_685_477.5, None),
            Ok(Decimal(9_223_372_036_854_775_000))
        );
    }

    #[test]
    fn decimal_text_is_what_cedar_parses() {
        assert_eq!(CedarNumber::decimal_text(1_005_000), "100.5000");
        assert_eq!(CedarNumber::decimal_text(-1), "-0.0001");
        assert_eq!(CedarNumber::decimal_text(0), "0.0000");
        assert_eq!(CedarNumber::decimal_text(i64::MIN), "-922337203685477.5808");
        assert_eq!(CedarNumber::decimal_text(i64::MAX), "922337203685477.5807");
    }
}
