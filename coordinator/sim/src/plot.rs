//! Hand-written SVG charts: allocation curves of the fill experiment, queue shares of a replay.

use std::fmt::Write as _;

use super::report::FillJson;

const W: f64 = 760.0;
const H: f64 = 460.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 50.0;
const COLORS: [&str; 8] = [
    "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#7f7f7f", "#e377c2",
];

/// A named polyline of (x, y) data points.
pub struct Series<'a> {
    /// Legend label.
    pub label: &'a str,
    /// Points in data coordinates.
    pub points: Vec<(f64, f64)>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Axis labels and ranges of one chart.
pub struct Axes<'a> {
    /// Chart title.
    pub title: &'a str,
    /// X axis label.
    pub x_label: &'a str,
    /// Y axis label.
    pub y_label: &'a str,
    /// X data range.
    pub x_range: (f64, f64),
    /// Y data range.
    pub y_range: (f64, f64),
}

/// A tick step of 1, 2 or 5 times a power of ten giving at most about eight ticks.
fn tick_step(span: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / 8.0;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

/// Draws line series on linear axes with titles and a legend, as a standalone SVG document.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    x_range: (f64, f64),
    y_range: (f64, f64),
    series: &[Series],
) -> String {
    let axes = Axes {
        title,
        x_label,
        y_label,
        x_range,
        y_range,
    };
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    s.push('\n');
    s.push_str(&chart_body(&axes, series));
    s.push_str("</svg>\n");
    s
}

/// Several charts stacked vertically in one SVG document.
pub fn stacked(charts: &[String]) -> String {
    let total = H * charts.len() as f64;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{total}" viewBox="0 0 {W} {total}" font-family="sans-serif" font-size="12">"#
    );
    s.push('\n');
    for (i, c) in charts.iter().enumerate() {
        let _ = writeln!(s, r#"<g transform="translate(0 {})">"#, H * i as f64);
        s.push_str(c);
        s.push_str("</g>\n");
    }
    s.push_str("</svg>\n");
    s
}

/// The elements of one chart (no document root), `W` × `H` units from the origin.
pub fn chart_body(axes: &Axes, series: &[Series]) -> String {
    let Axes {
        title,
        x_label,
        y_label,
        x_range,
        y_range,
    } = *axes;
    let (x0, x1) = x_range;
    let (y0, y1) = y_range;
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let sx = |x: f64| LEFT + (x - x0) / (x1 - x0).max(f64::EPSILON) * pw;
    let sy = |y: f64| TOP + ph - (y - y0) / (y1 - y0).max(f64::EPSILON) * ph;
    let mut s = String::new();
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="18" text-anchor="middle" font-size="14">{}</text>"#,
        LEFT + pw / 2.0,
        esc(title)
    );
    let (xs, ys) = (tick_step(x1 - x0), tick_step(y1 - y0));
    let digits = |step: f64| {
        if step >= 1.0 {
            0
        } else {
            (-step.log10().floor()) as usize
        }
    };
    let (xd, yd) = (digits(xs), digits(ys));
    let (x_first, y_first) = ((x0 / xs).ceil(), (y0 / ys).ceil());
    for k in 0.. {
        let fx = (x_first + f64::from(k)) * xs;
        if fx > x1 + 1e-9 {
            break;
        }
        let _ = writeln!(
            s,
            r##"<line x1="{:.1}" y1="{TOP}" x2="{:.1}" y2="{:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{fx:.xd$}</text>"##,
            sx(fx),
            sx(fx),
            TOP + ph,
            sx(fx),
            TOP + ph + 16.0
        );
    }
    for k in 0.. {
        let fy = (y_first + f64::from(k)) * ys;
        if fy > y1 + 1e-9 {
            break;
        }
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{fy:.yd$}</text>"##,
            sy(fy),
            LEFT + pw,
            sy(fy),
            LEFT - 6.0,
            sy(fy) + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        H - 12.0,
        esc(x_label)
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        esc(y_label)
    );
    for (i, ser) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = ser
            .points
            .iter()
            .filter(|(x, _)| *x >= x0 && *x <= x1)
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y.clamp(y0, y1))))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
            pts.join(" ")
        );
        let ly = TOP + 14.0 + 18.0 * i as f64;
        let lx = LEFT + pw + 12.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            lx + 20.0,
            lx + 26.0,
            ly + 4.0,
            esc(ser.label)
        );
    }
    s
}

/// GPU allocation vs arrived workload, one curve per policy: the whole run, and a zoom on
/// the saturated end where the policies differ.
pub fn fill_svg(doc: &FillJson) -> String {
    let x_max = doc
        .policies
        .iter()
        .flat_map(|p| p.curve.iter().map(|c| f64::from(c.arrived_pct)))
        .fold(100.0f64, f64::max);
    let series: Vec<Series> = doc
        .policies
        .iter()
        .map(|p| Series {
            label: &p.policy,
            points: p
                .curve
                .iter()
                .map(|c| (f64::from(c.arrived_pct), c.alloc_pct))
                .collect(),
        })
        .collect();
    let full = Axes {
        title: "GPU allocation vs arrived workload",
        x_label: "arrived workload (% of GPU capacity)",
        y_label: "GPU milli allocated (%)",
        x_range: (0.0, x_max),
        y_range: (0.0, 100.0),
    };
    let tail: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().filter(|p| p.0 >= 80.0).map(|p| p.1))
        .collect();
    let lo = tail.iter().copied().fold(100.0f64, f64::min);
    let zoom = Axes {
        title: "zoom: 80% arrived and beyond",
        x_range: (80.0, x_max.max(81.0)),
        y_range: ((lo - 1.0).floor().clamp(0.0, 99.0), 100.0),
        ..full
    };
    stacked(&[chart_body(&full, &series), chart_body(&zoom, &series)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_steps_are_round() {
        assert_eq!(tick_step(130.0), 20.0);
        assert_eq!(tick_step(50.0), 10.0);
        assert_eq!(tick_step(20.0), 5.0);
        assert_eq!(tick_step(0.5), 0.1);
    }

    #[test]
    fn chart_is_one_document_with_clipped_series() {
        let s = Series {
            label: "a<b",
            points: vec![(0.0, 1.0), (50.0, 2.0), (200.0, 3.0)],
        };
        let svg = line_chart("t", "x", "y", (0.0, 100.0), (0.0, 10.0), &[s]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<svg").count(), 1);
        assert!(svg.contains("a&lt;b"));
        let line = svg.lines().find(|l| l.starts_with("<polyline")).unwrap();
        assert_eq!(
            line.matches(',').count(),
            2,
            "the point beyond the x range is dropped"
        );
    }
}
