//! An SVG line chart like the fragmentation paper's Fig. 9(a): unallocated GPU (% of capacity)
//! against arrived workload (% of capacity), one line per policy (mean over seeds).

use std::fmt::Write;

const W: f64 = 720.0;
const H: f64 = 440.0;
const LEFT: f64 = 60.0;
const BOTTOM: f64 = 50.0;
const TOP: f64 = 20.0;
const RIGHT: f64 = 170.0;
const COLOURS: &[&str] = &[
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22",
];

/// Arrived workload shown, in %: below it every policy places everything.
const X_MIN: f64 = 50.0;
const X_MAX: f64 = 130.0;
const Y_MAX: f64 = 50.0;

/// `series`: (label, points of (x = arrived %, y = unallocated %)).
#[must_use]
pub fn svg(title: &str, series: &[(String, Vec<(f64, f64)>)]) -> String {
    let (x_max, y_max) = (X_MAX, Y_MAX);
    let px = |x: f64| LEFT + (x - X_MIN) / (x_max - X_MIN) * (W - LEFT - RIGHT);
    let py = |y: f64| H - BOTTOM - y / y_max * (H - BOTTOM - TOP);
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="14" text-anchor="middle">{title}</text>
<clipPath id="plot"><rect x="{LEFT}" y="{TOP}" width="{}" height="{}"/></clipPath>
"#,
        (LEFT + W - RIGHT) / 2.0,
        W - LEFT - RIGHT,
        H - BOTTOM - TOP
    );
    for x in (50..=130).step_by(10) {
        let x = f64::from(x);
        let _ = writeln!(
            s,
            r##"<line x1="{0}" y1="{1}" x2="{0}" y2="{2}" stroke="#ddd"/><text x="{0}" y="{3}" text-anchor="middle">{x}</text>"##,
            px(x),
            py(0.0),
            py(y_max),
            py(0.0) + 16.0
        );
    }
    for y in (0..=50).step_by(10) {
        let y = f64::from(y);
        let _ = writeln!(
            s,
            r##"<line x1="{0}" y1="{2}" x2="{1}" y2="{2}" stroke="#ddd"/><text x="{3}" y="{4}" text-anchor="end">{y}</text>"##,
            px(X_MIN),
            px(x_max),
            py(y),
            px(X_MIN) - 6.0,
            py(y) + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">Arrived workload (% of cluster GPU capacity)</text>
<text transform="translate(16 {}) rotate(-90)" text-anchor="middle">Unallocated GPU (%)</text>"#,
        (LEFT + W - RIGHT) / 2.0,
        H - 12.0,
        (H - BOTTOM + TOP) / 2.0
    );
    for (i, (label, points)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let path: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline clip-path="url(#plot)" fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>
<line x1="{1}" y1="{2}" x2="{3}" y2="{2}" stroke="{colour}" stroke-width="2"/><text x="{4}" y="{5}">{label}</text>"#,
            path.join(" "),
            W - RIGHT + 15.0,
            TOP + 10.0 + 18.0 * i as f64,
            W - RIGHT + 35.0,
            W - RIGHT + 40.0,
            TOP + 14.0 + 18.0 * i as f64
        );
    }
    s.push_str("</svg>\n");
    s
}
