//! Byte sizes as people write them ("128M", "4 MiB", "1g") and as they
//! read them ("1.50 GiB").

/// Errors of size parsing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UnitsError {
    /// The text is not a size.
    #[error("'{0}' is not a size (examples: 4096, 512K, 4M, 128MiB, 1G)")]
    NotASize(String),
    /// The size does not fit in 64 bits.
    #[error("'{0}' is too large")]
    TooLarge(String),
}

/// Longest size text accepted (anything longer is not a size anyone types).
pub const MAX_SIZE_TEXT: usize = 32;

/// Parse a byte count: digits, then an optional binary suffix (K, M, G, T,
/// with optional "iB" or "B"; case-insensitive). "1M" is 1 MiB.
pub fn parse_size(text: &str) -> Result<u64, UnitsError> {
    let bad = || UnitsError::NotASize(text.chars().take(MAX_SIZE_TEXT).collect());
    let t = text.trim();
    if t.is_empty() || t.len() > MAX_SIZE_TEXT {
        return Err(bad());
    }
    let digits = t.bytes().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return Err(bad());
    }
    let n: u64 = t[..digits]
        .parse()
        .map_err(|_| UnitsError::TooLarge(t.into()))?;
    let suffix = t[digits..].trim().to_ascii_lowercase();
    let shift = match suffix.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| UnitsError::TooLarge(t.into()))
}

/// A byte count for people: "512 B", "4.00 KiB", "1.50 GiB".
pub fn format_size(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    // (What would print as "1024.00" is the next unit's 1.00.)
    while v >= 1023.995 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.2} {}", UNITS[u])
}

/// A rate for people: "1.02 GiB/s".
pub fn format_rate(bytes: u64, secs: f64) -> String {
    if secs <= 0.0 {
        return "-".into();
    }
    format!("{}/s", format_size((bytes as f64 / secs) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("128MiB"), Ok(128 << 20));
        assert_eq!(parse_size(" 3 g "), Ok(3 << 30));
        assert_eq!(parse_size("1TB"), Ok(1 << 40));
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(matches!(
            parse_size("99999999999T"),
            Err(UnitsError::TooLarge(_))
        ));
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(1_048_575), "1.00 MiB");
        assert_eq!(format_size(1_048_570), "1023.99 KiB");
        assert_eq!(format_size(3 << 30), "3.00 GiB");
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in ".{0,40}") {
            let _ = parse_size(&s);
        }

        #[test]
        fn plain_numbers_round_trip(n in 0u64..(1 << 50)) {
            prop_assert_eq!(parse_size(&n.to_string()), Ok(n));
            prop_assert_eq!(parse_size(&format!("{}k", n >> 10)), Ok((n >> 10) << 10));
        }
    }
}
