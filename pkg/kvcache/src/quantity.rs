//! Exact reading of Kubernetes quantities (`4Ti`, `500Gi`, `16777216`, `1.5G`, `2e3`).
//!
//! The floors and ceilings of the API (one bucket of 16Mi, 2^63-1 bytes) are compared exactly:
//! a quantity is held as a whole number of nano-units, the finest precision Kubernetes knows.
//! A value with more precision is rounded up (away from zero), as Kubernetes does; a value too
//! large for 128 bits of nano-units is kept as "too large", which is far above any ceiling here.

use std::cmp::Ordering;
use std::fmt;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Nano-units per unit.
const NANOS: u128 = 1_000_000_000;

/// An exactly read quantity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Amount {
    negative: bool,
    /// Magnitude in nano-units (rounded up); `None` when it does not fit in 128 bits.
    nanos: Option<u128>,
}

/// Why a string is not a quantity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a quantity: {1}")]
pub struct QuantityError(pub String, pub &'static str);

impl Amount {
    /// The amount `value` (whole units).
    pub fn from_int(value: i64) -> Self {
        Self {
            negative: value < 0,
            nanos: Some(u128::from(value.unsigned_abs()) * NANOS),
        }
    }

    /// Whether the amount is exactly zero.
    pub fn is_zero(&self) -> bool {
        self.nanos == Some(0)
    }

    /// Whether the amount is below zero.
    pub fn is_negative(&self) -> bool {
        self.negative && !self.is_zero()
    }

    /// Whether the amount is above zero.
    pub fn is_positive(&self) -> bool {
        !self.negative && !self.is_zero()
    }

    /// Compares the amount with the whole number `value`, exactly.
    pub fn cmp_int(&self, value: i64) -> Ordering {
        self.cmp(&Amount::from_int(value))
    }

    /// The amount rounded up to a whole number, when it fits in an `i64`.
    pub fn ceil_i64(&self) -> Option<i64> {
        let nanos = self.nanos?;
        if self.negative {
            // Towards zero is "up" for a negative amount.
            let whole = nanos / NANOS;
            i64::try_from(whole).ok().map(|w| -w)
        } else {
            let whole = nanos.div_ceil(NANOS);
            i64::try_from(whole).ok()
        }
    }
}

impl PartialOrd for Amount {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Amount {
    fn cmp(&self, other: &Self) -> Ordering {
        // `None` magnitudes are larger than any `Some`.
        let magnitude = |a: &Amount| match a.nanos {
            Some(n) => (0u8, n),
            None => (1u8, 0),
        };
        match (self.is_negative(), other.is_negative()) {
            (false, false) => magnitude(self).cmp(&magnitude(other)),
            (true, true) => magnitude(other).cmp(&magnitude(self)),
            (true, false) => Ordering::Less,
            (false, true) => Ordering::Greater,
        }
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.is_negative() { "-" } else { "" };
        match self.nanos {
            None => write!(f, "{sign}(beyond 2^128 nano-units)"),
            Some(n) if n % NANOS == 0 => write!(f, "{sign}{}", n / NANOS),
            Some(n) => {
                let fraction = format!("{:09}", n % NANOS);
                write!(f, "{sign}{}.{}", n / NANOS, fraction.trim_end_matches('0'))
            }
        }
    }
}

/// Reads a quantity exactly.
pub fn parse(quantity: &Quantity) -> Result<Amount, QuantityError> {
    parse_str(&quantity.0)
}

/// Longest quantity string the CRD admits (`maxLength` of every quantity field).
pub const MAX_QUANTITY_LENGTH: usize = 64;

/// Most significant decimal digits kept: any more put the magnitude far above 2^128 nano-units
/// (10^39 > 2^128), which every bound here treats alike.
const MAX_SIGNIFICANT_DIGITS: i64 = 48;

/// The largest magnitude Kubernetes keeps for a binary-suffixed quantity (`Ki` ... `Ei`):
/// `resource.ParseQuantity` caps such a value at 2^63-1 (whole units) rather than refusing it.
const BINARY_CAP_NANOS: u128 = (i64::MAX as u128) * NANOS;

/// Reads the string form of a quantity exactly, as `resource.ParseQuantity` reads it: a value
/// with a binary suffix beyond 2^63-1 is capped there (`10000000Ei` reads as
/// 9223372036854775807), a decimal one is kept as written. The work is linear in the length of
/// `text` whatever its digits: leading zeros are skipped and digits far below a nano-unit only
/// decide the rounding.
pub fn parse_str(text: &str) -> Result<Amount, QuantityError> {
    let fail = |why: &'static str| QuantityError(text.to_owned(), why);
    let bytes = text.as_bytes();
    let mut pos = 0;
    let mut negative = false;
    match bytes.first() {
        Some(b'+') => pos = 1,
        Some(b'-') => {
            negative = true;
            pos = 1;
        }
        Some(_) => {}
        None => return Err(fail("it is empty")),
    }
    let int_start = pos;
    while pos < bytes.len() && bytes[pos].is_ascii_digit() {
        pos += 1;
    }
    let int_digits = &text[int_start..pos];
    let mut frac_digits = "";
    if pos < bytes.len() && bytes[pos] == b'.' {
        pos += 1;
        let frac_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        frac_digits = &text[frac_start..pos];
    }
    if int_digits.is_empty() && frac_digits.is_empty() {
        return Err(fail("it does not start with a number"));
    }
    let suffix = &text[pos..];
    let (e10, e2): (i64, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        _ => {
            let exponent = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))
                .ok_or_else(|| fail("its suffix is none of Ki Mi Gi Ti Pi Ei n u m k M G T P E"))?;
            let digits = exponent
                .strip_prefix('+')
                .or_else(|| exponent.strip_prefix('-'))
                .unwrap_or(exponent);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(fail("its exponent is not a whole number"));
            }
            // Kubernetes reads the exponent as a 64-bit integer and refuses one beyond it.
            let value: i64 = digits
                .parse()
                .map_err(|_| fail("its exponent is beyond a 64-bit integer"))?;
            // Far beyond every bound either way; clamped so the arithmetic below cannot overflow.
            let value = value.min(1_000_000);
            (
                if exponent.starts_with('-') {
                    -value
                } else {
                    value
                },
                0,
            )
        }
    };
    let binary = e2 > 0;
    let frac_len = i64::try_from(frac_digits.len()).map_err(|_| fail("it is too long"))?;

    // The digits as one number D (leading zeros dropped), worth D * 10^scale * 2^e2 nano-units.
    let all = int_digits.bytes().chain(frac_digits.bytes());
    let significant: Vec<u8> = all.skip_while(|d| *d == b'0').collect();
    let digits = i64::try_from(significant.len()).map_err(|_| fail("it is too long"))?;
    let scale = e10 - frac_len + 9;
    let nanos = if significant.is_empty() {
        Some(0)
    } else if digits + scale > MAX_SIGNIFICANT_DIGITS {
        // At least 10^48 nano-units: beyond 2^128.
        None
    } else {
        // Keep the digits that are whole nano-units; any dropped non-zero digit rounds up
        // (away from zero), as Kubernetes rounds to its nano precision.
        let kept = usize::try_from((digits + scale.min(0)).max(0)).unwrap_or(0);
        let rounded_up = significant[kept..].iter().any(|d| *d != b'0');
        let mut big = Big::default();
        for digit in &significant[..kept] {
            big.mul_add(10, u32::from(digit - b'0'));
        }
        for _ in 0..scale.max(0) {
            big.mul_add(10, 0);
        }
        if rounded_up {
            big.mul_add(1, 1);
        }
        for _ in 0..e2 {
            big.mul_add(2, 0);
        }
        big.to_u128()
    };
    let nanos = if binary && nanos.is_none_or(|n| n > BINARY_CAP_NANOS) {
        Some(BINARY_CAP_NANOS)
    } else {
        nanos
    };
    Ok(Amount {
        negative: negative && nanos != Some(0),
        nanos,
    })
}

/// A small unsigned big integer (little-endian 32-bit limbs), enough to read a quantity string
/// of any length without overflow.
#[derive(Default)]
struct Big(Vec<u32>);

impl Big {
    fn mul_add(&mut self, mul: u32, add: u32) {
        let mut carry = u64::from(add);
        for limb in &mut self.0 {
            let value = u64::from(*limb) * u64::from(mul) + carry;
            *limb = (value & 0xffff_ffff) as u32;
            carry = value >> 32;
        }
        if carry != 0 {
            self.0.push(carry as u32);
        }
    }

    fn bits(&self) -> usize {
        let mut limbs = self.0.len();
        while limbs > 0 && self.0[limbs - 1] == 0 {
            limbs -= 1;
        }
        if limbs == 0 {
            return 0;
        }
        (limbs - 1) * 32 + (32 - self.0[limbs - 1].leading_zeros() as usize)
    }

    fn to_u128(&self) -> Option<u128> {
        if self.bits() > 128 {
            return None;
        }
        let mut value = 0u128;
        for limb in self.0.iter().rev() {
            value = (value << 32) | u128::from(*limb);
        }
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(text: &str) -> Option<i64> {
        parse_str(text).unwrap().ceil_i64()
    }

    #[test]
    fn binary_and_decimal_suffixes() {
        assert_eq!(whole("16Mi"), Some(16_777_216));
        assert_eq!(whole("4Ti"), Some(4_398_046_511_104));
        assert_eq!(whole("500Gi"), Some(536_870_912_000));
        assert_eq!(whole("1k"), Some(1000));
        assert_eq!(whole("1.5G"), Some(1_500_000_000));
        assert_eq!(whole("1.5Gi"), Some(1_610_612_736));
        assert_eq!(whole("2e3"), Some(2000));
        assert_eq!(whole("2E3"), Some(2000));
        assert_eq!(whole("1E"), Some(1_000_000_000_000_000_000));
        assert_eq!(whole("+7"), Some(7));
        assert_eq!(whole(".5"), Some(1));
        assert_eq!(whole("5."), Some(5));
        assert_eq!(whole("100m"), Some(1));
        assert_eq!(whole("-1Gi"), Some(-1_073_741_824));
    }

    #[test]
    fn exact_comparisons_at_the_floor() {
        let floor = 16_777_216;
        assert_eq!(parse_str("16Mi").unwrap().cmp_int(floor), Ordering::Equal);
        assert_eq!(
            parse_str("16777215.5").unwrap().cmp_int(floor),
            Ordering::Less
        );
        assert_eq!(
            parse_str("16777216.001").unwrap().cmp_int(floor),
            Ordering::Greater
        );
        assert_eq!(parse_str("16384Ki").unwrap(), parse_str("16Mi").unwrap());
        assert_eq!(parse_str("1.5").unwrap(), parse_str("1500m").unwrap());
        assert_ne!(parse_str("1.5").unwrap(), parse_str("1.7").unwrap());
    }

    #[test]
    fn signs_and_zero() {
        assert!(parse_str("0").unwrap().is_zero());
        assert!(parse_str("-0").unwrap().is_zero());
        assert!(!parse_str("-0").unwrap().is_negative());
        assert!(parse_str("0.0000000001").unwrap().is_positive());
        assert!(parse_str("-1m").unwrap().is_negative());
        assert!(parse_str("-1m").unwrap() < parse_str("0").unwrap());
        assert!(parse_str("-2").unwrap() < parse_str("-1").unwrap());
    }

    #[test]
    fn the_ceiling_of_2_pow_63() {
        let max = i64::MAX;
        assert_eq!(
            parse_str("9223372036854775807").unwrap().cmp_int(max),
            Ordering::Equal
        );
        assert_eq!(
            parse_str("9223372036854775808").unwrap().cmp_int(max),
            Ordering::Greater
        );
        // Binary suffixes saturate at 2^63-1, as Kubernetes' ParseQuantity caps them.
        assert_eq!(parse_str("8Ei").unwrap().cmp_int(max), Ordering::Equal);
        assert_eq!(parse_str("10000000Ei").unwrap().ceil_i64(), Some(max));
        assert_eq!(parse_str("-10000000Ei").unwrap().ceil_i64(), Some(-max));
        assert_eq!(
            parse_str("7Ei").unwrap().ceil_i64(),
            Some(8_070_450_532_247_928_832)
        );
        // Decimal ones do not.
        assert_eq!(parse_str("10E").unwrap().cmp_int(max), Ordering::Greater);
        assert_eq!(
            parse_str("9223372036854775808").unwrap().cmp_int(max),
            Ordering::Greater
        );
        assert_eq!(parse_str("1e400").unwrap().cmp_int(max), Ordering::Greater);
        assert_eq!(whole("1e400"), None);
        assert_eq!(whole("1e-400"), Some(1));
        assert_eq!(
            parse_str("1e9999999999999").unwrap().cmp_int(max),
            Ordering::Greater
        );
        assert!(parse_str("1e99999999999999999999").is_err());
        // Leading zeros of an exponent are not digits of it.
        assert_eq!(whole("1e0000003"), Some(1000));
    }

    #[test]
    fn long_digit_strings_read_in_linear_time() {
        // 400k digits: quadratic big-number arithmetic took seconds here.
        let long = format!("1{}", "0".repeat(400_000));
        let started = std::time::Instant::now();
        assert_eq!(parse_str(&long).unwrap().ceil_i64(), None);
        assert_eq!(
            parse_str(&format!("{long}Ki")).unwrap().ceil_i64(),
            Some(i64::MAX)
        );
        let tiny = format!("0.{}1", "0".repeat(400_000));
        assert_eq!(whole(&tiny), Some(1));
        let zeros = format!("{}16Mi", "0".repeat(400_000));
        assert_eq!(whole(&zeros), Some(16_777_216));
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }

    #[test]
    fn refusals() {
        for bad in [
            "", "lots", "1Gb", "1e", "1e1.5", " 1", "1 ", "--1", ".", "1ki",
        ] {
            assert!(parse_str(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn display() {
        assert_eq!(parse_str("1.5").unwrap().to_string(), "1.5");
        assert_eq!(parse_str("-4Ki").unwrap().to_string(), "-4096");
    }
}
