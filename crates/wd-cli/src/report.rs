//! What every benchmark reports besides its table: its targets, each a
//! measured ratio against a bound, met or missed.

use std::io::{IsTerminal, Write};

use serde::Serialize;

/// A progress bar on standard error for long benchmarks (only on a
/// terminal, and not when the output is JSON).
pub struct Progress {
    total: usize,
    done: usize,
    tty: bool,
}

impl Progress {
    /// A bar of `total` steps, shown when `show` and stderr is a terminal.
    pub fn new(total: usize, show: bool) -> Progress {
        Progress {
            total,
            done: 0,
            tty: show && std::io::stderr().is_terminal(),
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
    /// How it must compare: ">= ", "<= " or "> ".
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
            op: ">= ",
            target,
            met: value >= target,
        }
    }

    /// `value` must be at most `target`.
    pub fn at_most(name: impl Into<String>, value: f64, target: f64) -> Target {
        Target {
            name: name.into(),
            value,
            op: "<= ",
            target,
            met: value <= target,
        }
    }

    /// `value` must exceed `target`.
    pub fn above(name: impl Into<String>, value: f64, target: f64) -> Target {
        Target {
            name: name.into(),
            value,
            op: "> ",
            target,
            met: value > target,
        }
    }

    /// `PASS name: value (target >= bound)`.
    pub fn line(&self) -> String {
        format!(
            "{} {}: {:.3} (target {}{})",
            if self.met { "PASS" } else { "MISS" },
            self.name,
            self.value,
            self.op,
            self.target
        )
    }
}
