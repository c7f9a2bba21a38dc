//! Sizes on the command line and in table labels, written once for every
//! subcommand.
//!
//! Parsing and measured quantities ("1.50 GiB", "812.00 MiB/s") come from
//! `wd_heap::units`, so `wd load --chunk 4M` and `wd bench load --sizes 4M`
//! accept exactly what the library documents. What is added here is the
//! label of a size the user chose (a request size, a buffer size): those
//! are round numbers, and a table reads better with "64 KiB" than with
//! "64.00 KiB".

pub use wd_heap::units::{format_rate, format_size};

/// Clap value parser for a byte count ("4096", "64k", "2M", "1GiB").
///
/// Clap wants `Result<_, String>`-like errors; this keeps the library's
/// message, which lists valid examples.
pub fn size_arg(s: &str) -> Result<u64, String> {
    wd_heap::units::parse_size(s).map_err(|e| e.to_string())
}

/// Clap value parser for a run's length in seconds: a finite number from
/// 0.01 to a day (NaN, infinities and 1e300 cannot become a `Duration`).
pub fn seconds_arg(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.01..=86_400.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "'{s}' is not a number of seconds from 0.01 to 86400"
        )),
    }
}

/// [`seconds_arg`], or 0 for "never".
pub fn seconds_or_never_arg(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(0.0) => Ok(0.0),
        _ => seconds_arg(s).map_err(|e| format!("{e} (or 0: never)")),
    }
}

/// A chosen size as a table label: exact in the largest binary unit that
/// divides it ("64 B", "4 KiB", "2 MiB", "3 GiB"); a size of 1 MiB or more
/// that is not a whole number of MiB is rounded to MiB and marked "~"
/// ("~18 MiB"), since its exact digits would only hide its magnitude.
pub fn exact_size(n: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    match n {
        0 => "0 B".into(),
        n if n % GIB == 0 => format!("{} GiB", n / GIB),
        n if n % MIB == 0 => format!("{} MiB", n / MIB),
        // Rounded half up; written without `n + MIB / 2`, which overflows
        // near u64::MAX.
        n if n >= MIB => format!("~{} MiB", n / MIB + (n % MIB >= MIB / 2) as u64),
        n if n % KIB == 0 => format!("{} KiB", n / KIB),
        n => format!("{n} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_arg_accepts_suffixes_and_rejects_the_rest() {
        assert_eq!(size_arg("0"), Ok(0));
        assert_eq!(size_arg("64k"), Ok(64 << 10));
        assert_eq!(size_arg("2m"), Ok(2 << 20));
        assert_eq!(size_arg("1G"), Ok(1 << 30));
        assert_eq!(size_arg("4MiB"), Ok(4 << 20));
        assert_eq!(size_arg("16777215T"), Ok(16_777_215 << 40));
        // Overflow, in the digits and in the multiplication.
        assert!(size_arg("18446744073709551616").is_err());
        assert!(size_arg("16777216T").is_err());
        // Bad suffixes and no digits.
        for bad in ["", "k", "12Q", "1.5G", "4 MB/s", "-1", "0x10"] {
            let e = size_arg(bad).expect_err(bad);
            assert!(e.contains("not a size") || e.contains("too large"), "{e}");
        }
    }

    #[test]
    fn exact_size_labels() {
        assert_eq!(exact_size(0), "0 B");
        assert_eq!(exact_size(1), "1 B");
        assert_eq!(exact_size(64), "64 B");
        assert_eq!(exact_size(1023), "1023 B");
        assert_eq!(exact_size(1024), "1 KiB");
        assert_eq!(exact_size(1025), "1025 B");
        assert_eq!(exact_size(65536), "64 KiB");
        assert_eq!(exact_size((1 << 20) - 1024), "1023 KiB");
        assert_eq!(exact_size(1 << 20), "1 MiB");
        assert_eq!(exact_size(2 << 20), "2 MiB");
        assert_eq!(exact_size((18 << 20) + (340 << 10)), "~18 MiB");
        assert_eq!(exact_size((18 << 20) + (512 << 10)), "~19 MiB");
        assert_eq!(exact_size(1 << 30), "1 GiB");
        assert_eq!(exact_size(3 << 30), "3 GiB");
        assert_eq!(exact_size(1 << 40), "1024 GiB");
        assert_eq!(exact_size(u64::MAX), "~17592186044416 MiB");
    }
}
