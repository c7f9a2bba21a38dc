//! What every benchmark reports besides its table: its targets, each a
//! measured ratio against a bound, met or missed.

use serde::Serialize;

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
