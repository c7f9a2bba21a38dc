//! Small SVG charts for benchmark results: a log-scale line chart of
//! throughput per block size, one line per configuration, and the escaping
//! every chart's text needs.

use std::fmt::Write;
use std::path::Path;

/// Fails when a chart could not be written to `path`: checked before a
/// benchmark runs, so that a bad path does not cost the measurements.
pub fn check_writable(path: &Path) -> Result<(), String> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| format!("cannot write the chart to {}: {e}", path.display()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// One line of the chart.
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Values per x position (None: not measured).
    pub values: Vec<Option<f64>>,
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// `s` as SVG (XML) text or attribute value: labels come from the command
/// line (a cipher name, a directory, a load average) and must not end the
/// element or the attribute they are written into. `&` goes first, so the
/// entities made for the others are not escaped again.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A line chart with categorical x labels and a logarithmic y axis.
pub fn log_lines(title: &str, x_labels: &[String], y_label: &str, series: &[Series]) -> String {
    let (w, h) = (820.0f64, 480.0f64);
    let (left, right, top, bottom) = (80.0, 230.0, 40.0, 60.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let all: Vec<f64> = series
        .iter()
        .flat_map(|s| s.values.iter().flatten().copied())
        // (An infinite value would make the decades endless.)
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let (lo, hi) = if all.is_empty() {
        (1.0, 10.0)
    } else {
        let lo = all.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = all.iter().copied().fold(0.0, f64::max);
        (
            10f64.powf(lo.log10().floor()),
            10f64.powf(hi.log10().ceil().max(lo.log10().floor() + 1.0)),
        )
    };
    let y = |v: f64| top + ph * (1.0 - (v.log10() - lo.log10()) / (hi.log10() - lo.log10()));
    let n = x_labels.len().max(1);
    let x = |i: usize| left + pw * (i as f64 + 0.5) / n as f64;
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        left + pw / 2.0,
        esc(title)
    );
    // Decades of the y axis.
    let mut d = lo;
    while d <= hi * 1.0001 {
        let yy = y(d);
        let _ = writeln!(
            s,
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            left + pw,
            left - 6.0,
            yy + 4.0,
            human(d)
        );
        d *= 10.0;
    }
    for (i, l) in x_labels.iter().enumerate() {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x(i),
            top + ph + 20.0,
            esc(l)
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"18\" y=\"{:.1}\" transform=\"rotate(-90 18 {:.1})\" text-anchor=\"middle\">{}</text>",
        top + ph / 2.0,
        top + ph / 2.0,
        esc(y_label)
    );
    let _ = writeln!(
        s,
        "<rect x=\"{left}\" y=\"{top}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#444\"/>"
    );
    for (k, se) in series.iter().enumerate() {
        let c = COLORS[k % COLORS.len()];
        let pts: Vec<String> = se
            .values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                v.filter(|v| v.is_finite() && *v > 0.0)
                    .map(|v| format!("{:.1},{:.1}", x(i), y(v)))
            })
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>",
            pts.join(" ")
        );
        for p in &pts {
            let (px, py) = p.split_once(',').expect("x,y");
            let _ = writeln!(s, "<circle cx=\"{px}\" cy=\"{py}\" r=\"3\" fill=\"{c}\"/>");
        }
        let ly = top + 10.0 + k as f64 * 20.0;
        let lx = left + pw + 15.0;
        let _ = writeln!(
            s,
            "<line x1=\"{lx}\" x2=\"{}\" y1=\"{ly}\" y2=\"{ly}\" stroke=\"{c}\" stroke-width=\"2\"/><text x=\"{}\" y=\"{}\">{}</text>",
            lx + 20.0,
            lx + 26.0,
            ly + 4.0,
            esc(&se.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn human(v: f64) -> String {
    match v {
        v if v >= 1e9 => format!("{}G", v / 1e9),
        v if v >= 1e6 => format!("{}M", v / 1e6),
        v if v >= 1e3 => format!("{}k", v / 1e3),
        v => format!("{v}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An infinite value is left out (the axis' decades never ended).
    #[test]
    fn an_infinite_value_is_no_point() {
        let svg = log_lines(
            "t",
            &["a".into()],
            "x",
            &[Series {
                name: "s".into(),
                values: vec![Some(f64::INFINITY)],
            }],
        );
        assert!(svg.ends_with("</svg>\n"), "{svg}");
    }

    #[test]
    fn escapes_markup_once() {
        assert_eq!(esc(""), "");
        assert_eq!(esc("aes-128-cbc"), "aes-128-cbc");
        assert_eq!(esc("a<b>&\"c\""), "a&lt;b&gt;&amp;&quot;c&quot;");
        assert_eq!(esc("&lt;"), "&amp;lt;");
    }

    #[test]
    fn chart_has_every_series_and_label() {
        let svg = log_lines(
            "t",
            &["16".into(), "64".into()],
            "bytes/s",
            &[
                Series {
                    name: "a<b".into(),
                    values: vec![Some(10.0), Some(1000.0)],
                },
                Series {
                    name: "c".into(),
                    values: vec![None, Some(5.0)],
                },
            ],
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("a&lt;b") && svg.contains(">64<"));
        assert_eq!(svg.matches("<polyline").count(), 2);
    }
}
