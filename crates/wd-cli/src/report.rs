//! What every benchmark shares besides its own table: the statistics of its
//! repetitions, a progress bar, its targets (each a measured ratio against
//! a bound, met or missed) and the printing of its results.

use std::cmp::Ordering;
use std::io::{IsTerminal, Write};

use serde::Serialize;

/// The median of `v` by `cmp`: the element at index `len / 2` once sorted
/// (the upper one of an even count). A sample that was really measured is
/// reported, never an average of two, so every column of a row comes from
/// the same repetition.
///
/// Panics when `v` is empty: every benchmark checks `--reps >= 1` first.
pub fn median_by<T>(mut v: Vec<T>, cmp: impl FnMut(&T, &T) -> Ordering) -> T {
    v.sort_by(cmp);
    let mid = v.len() / 2;
    v.swap_remove(mid)
}

/// The median of measured values (as [`median_by`]; 0 when there are none,
/// so a table shows an empty measurement as 0 rather than aborting).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    median_by(v.to_vec(), f64::total_cmp)
}

/// The `p` quantile (0..=1) of sorted values, nearest rank (0 when empty).
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize]
}

/// Print to stdout; a closed stdout (`| head`) is not an error.
pub fn emit(text: &str) {
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(text.as_bytes());
    let _ = o.flush();
}

/// `print!` through [`emit`]: `print!` panics on a closed stdout.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::report::emit(&format!($($arg)*))
    };
}

/// `println!` through [`emit`].
macro_rules! outln {
    () => {
        $crate::report::emit("\n")
    };
    ($($arg:tt)*) => {
        $crate::report::emit(&format!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {out, outln};

/// Print a benchmark's `--json` result, pretty, as every subcommand does.
pub fn print_json(v: &serde_json::Value) {
    emit(&format!(
        "{}\n",
        serde_json::to_string_pretty(v).expect("a JSON value serializes")
    ));
}

/// A progress bar on standard error for long benchmarks (only on a
/// terminal, and not when the output is JSON).
pub struct Progress {
    total: usize,
    done: usize,
    tty: bool,
}

impl Progress {
    /// A bar of `total` steps, shown when stderr is a terminal (with
    /// `--json` too: the JSON goes to stdout, and a run of minutes should
    /// not look hung).
    pub fn new(total: usize) -> Progress {
        Progress {
            total,
            done: 0,
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// One step done; `what` is being measured next.
    pub fn step(&mut self, what: &str) {
        self.done += 1;
        if self.tty {
            let w = 30;
            let fill = w * self.done.min(self.total) / self.total.max(1);
            eprint!(
                "\r[{}{}] {}/{} {what:<36}",
                "#".repeat(fill),
                " ".repeat(w - fill),
                self.done,
                self.total
            );
            let _ = std::io::stderr().flush();
        }
    }

    /// End the bar's line.
    pub fn finish(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

/// One target of a benchmark.
#[derive(Debug, Serialize)]
pub struct Target {
    /// What is compared.
    pub name: String,
    /// The measured value.
    pub value: f64,
    /// How it must compare: ">=" or "<=".
    pub op: &'static str,
    /// The bound.
    pub target: f64,
    /// Whether the value meets it.
    pub met: bool,
}

impl Target {
    /// `value` must be at least `target`.
    pub fn at_least(name: impl Into<String>, value: f64, target: f64) -> Target {
        Target {
            name: name.into(),
            value,
            op: ">=",
            target,
            met: value >= target,
        }
    }

    /// `value` must be at most `target`.
    pub fn at_most(name: impl Into<String>, value: f64, target: f64) -> Target {
        Target {
            name: name.into(),
            value,
            op: "<=",
            target,
            met: value <= target,
        }
    }

    /// `PASS name: value (target >= bound)`.
    pub fn line(&self) -> String {
        format!(
            "{} {}: {:.3} (target {} {})",
            if self.met { "PASS" } else { "MISS" },
            self.name,
            self.value,
            self.op,
            self.target
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_takes_the_upper_middle_sample() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0]), 3.0);
        assert_eq!(median(&[5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
        assert_eq!(median(&[f64::INFINITY, 0.0, -1.0]), 0.0);
        // By a key, the whole element comes back.
        let rows = vec![(30, "c"), (10, "a"), (20, "b"), (40, "d")];
        assert_eq!(median_by(rows, |x, y| x.0.cmp(&y.0)), (30, "c"));
    }

    #[test]
    fn percentile_nearest_rank() {
        assert_eq!(percentile(&[], 0.5), 0);
        assert_eq!(percentile(&[7], 0.99), 7);
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.0), 1);
        assert_eq!(percentile(&v, 0.5), 51);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&v, 1.0), 100);
        assert_eq!(percentile(&v, 2.0), 100);
    }
}
