//! A small SVG plotter with no dependencies: line charts in stacked panels, with an optional
//! shaded interval and a linear or logarithmic y axis.
//!
//! It draws what the demo needs and nothing more: the outage runs (successes, errors and
//! timeouts per second, the pause shaded) and the article's figure of delay against attempt
//! number.

use std::fmt::Write as _;

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// The legend text.
    pub label: String,
    /// An SVG colour, such as `#1f77b4` or `green`.
    pub color: String,
    /// The points, in data coordinates, in drawing order.
    pub points: Vec<(f64, f64)>,
}

/// The scale of a panel's y axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scale {
    /// Linear, from 0.
    #[default]
    Linear,
    /// Base-10 logarithmic; points with y <= 0 are left out.
    Log,
}

/// One chart: a title, axis labels, lines, and an optional shaded x interval.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Panel {
    /// The title, drawn above the chart.
    pub title: String,
    /// The x axis label.
    pub x_label: String,
    /// The y axis label.
    pub y_label: String,
    /// The lines.
    pub lines: Vec<Line>,
    /// An x interval drawn as a shaded band, with its legend text (e.g. the pause).
    pub shade: Option<(f64, f64, String)>,
    /// The y scale.
    pub scale: Scale,
    /// The top of a linear y axis, to give several panels one scale; `None` fits the
    /// panel's own data. A value below the data's maximum is raised to it.
    pub y_max: Option<f64>,
}

const WIDTH: f64 = 960.0;
const PANEL_HEIGHT: f64 = 260.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 46.0;

/// Renders `panels` stacked vertically into one SVG document.
pub fn render(panels: &[Panel]) -> String {
    let height = PANEL_HEIGHT * panels.len().max(1) as f64;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="white"/>"#
    );
    for (i, panel) in panels.iter().enumerate() {
        draw_panel(&mut svg, panel, PANEL_HEIGHT * i as f64);
    }
    svg.push_str("</svg>\n");
    svg
}

fn draw_panel(svg: &mut String, panel: &Panel, y0: f64) {
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = PANEL_HEIGHT - TOP - BOTTOM;
    let (px, py) = (LEFT, y0 + TOP);

    let points = panel.lines.iter().flat_map(|l| l.points.iter());
    let usable = |&&(x, y): &&(f64, f64)| {
        x.is_finite() && y.is_finite() && (panel.scale == Scale::Linear || y > 0.0)
    };
    let (mut x_min, mut x_max) = (f64::INFINITY, f64::NEG_INFINITY);
    let (mut y_min, mut y_max) = (f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in points.filter(usable) {
        x_min = x_min.min(x);
        x_max = x_max.max(x);
        y_min = y_min.min(y);
        y_max = y_max.max(y);
    }
    if let Some((a, b, _)) = &panel.shade {
        x_min = x_min.min(*a);
        x_max = x_max.max(*b);
    }
    if !x_min.is_finite() {
        (x_min, x_max) = (0.0, 1.0);
    }
    if x_max <= x_min {
        x_max = x_min + 1.0;
    }
    let (y_lo, y_hi, y_ticks) = match panel.scale {
        Scale::Linear => {
            let y_max = panel
                .y_max
                .filter(|m| m.is_finite())
                .map_or(y_max, |m| m.max(y_max));
            let top = if y_max.is_finite() && y_max > 0.0 {
                y_max
            } else {
                1.0
            };
            let step = nice_step(top / 5.0);
            let hi = (top / step).ceil() * step;
            let ticks: Vec<f64> = (0..)
                .map(|i| f64::from(i) * step)
                .take_while(|t| *t <= hi + step * 1e-9)
                .collect();
            (0.0, hi, ticks)
        }
        Scale::Log => {
            let (lo, hi) = if y_min.is_finite() {
                (
                    y_min.log10().floor(),
                    y_max.log10().ceil().max(y_min.log10().floor() + 1.0),
                )
            } else {
                (0.0, 1.0)
            };
            let ticks: Vec<f64> = (lo as i32..=hi as i32).map(f64::from).collect();
            (lo, hi, ticks)
        }
    };
    let tx = |x: f64| px + (x - x_min) / (x_max - x_min) * plot_w;
    let ty = |y: f64| {
        let v = match panel.scale {
            Scale::Linear => y,
            Scale::Log => y.log10(),
        };
        py + plot_h - (v - y_lo) / (y_hi - y_lo) * plot_h
    };
    let ty_axis = |v: f64| py + plot_h - (v - y_lo) / (y_hi - y_lo) * plot_h;

    // Title.
    let _ = writeln!(
        svg,
        r#"<text x="{px}" y="{:.1}" font-size="14" font-weight="bold">{}</text>"#,
        y0 + 20.0,
        escape(&panel.title)
    );
    // Shaded interval.
    if let Some((a, b, label)) = &panel.shade {
        let (xa, xb) = (tx(*a), tx(*b));
        let _ = writeln!(
            svg,
            r##"<rect x="{xa:.1}" y="{py:.1}" width="{:.1}" height="{plot_h:.1}" fill="#d9d9d9" fill-opacity="0.6"/>"##,
            (xb - xa).max(0.0)
        );
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
            (xa + xb) / 2.0,
            py + 14.0,
            escape(label)
        );
    }
    // Grid and y ticks.
    for &t in &y_ticks {
        let y = ty_axis(t);
        let text = match panel.scale {
            Scale::Linear => format_number(t),
            Scale::Log => format_number(10f64.powf(t)),
        };
        let _ = writeln!(
            svg,
            r##"<line x1="{px}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{text}</text>"##,
            px + plot_w,
            px - 6.0,
            y + 4.0
        );
    }
    // X ticks.
    let step = nice_step((x_max - x_min) / 10.0);
    let mut t = (x_min / step).ceil() * step;
    while t <= x_max + step * 1e-9 {
        let x = tx(t);
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#333"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            py + plot_h,
            py + plot_h + 5.0,
            py + plot_h + 18.0,
            format_number(t)
        );
        t += step;
    }
    // Axes and labels.
    let _ = writeln!(
        svg,
        r##"<rect x="{px}" y="{py:.1}" width="{plot_w:.1}" height="{plot_h:.1}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        px + plot_w / 2.0,
        py + plot_h + 36.0,
        escape(&panel.x_label)
    );
    let (lx, ly) = (16.0, py + plot_h / 2.0);
    let _ = writeln!(
        svg,
        r#"<text x="{lx}" y="{ly:.1}" text-anchor="middle" transform="rotate(-90 {lx} {ly:.1})">{}</text>"#,
        escape(&panel.y_label)
    );
    // Lines.
    for line in &panel.lines {
        let mut d = String::new();
        for &(x, y) in line.points.iter().filter(|p| usable(p)) {
            let cmd = if d.is_empty() { 'M' } else { 'L' };
            let _ = write!(d, "{cmd}{:.1},{:.1} ", tx(x), ty(y));
        }
        if !d.is_empty() {
            let _ = writeln!(
                svg,
                r#"<path d="{}" fill="none" stroke="{}" stroke-width="1.6"/>"#,
                d.trim_end(),
                escape(&line.color)
            );
        }
    }
    // Legend, top right.
    let mut lx = px + plot_w - 10.0;
    for line in panel.lines.iter().rev() {
        let w = 7.0 * line.label.chars().count() as f64 + 28.0;
        lx -= w;
        let _ = writeln!(
            svg,
            r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx,
            y0 + 16.0,
            lx + 18.0,
            y0 + 16.0,
            escape(&line.color),
            lx + 22.0,
            y0 + 20.0,
            escape(&line.label)
        );
    }
}

/// A step of the form 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if !raw.is_finite() || raw <= 0.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(raw.log10().floor());
    let fraction = raw / magnitude;
    let nice = if fraction <= 1.0 {
        1.0
    } else if fraction <= 2.0 {
        2.0
    } else if fraction <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

fn format_number(v: f64) -> String {
    if v.abs() >= 1.0 || v == 0.0 {
        if (v - v.round()).abs() < 1e-9 {
            format!("{}", v.round() as i64)
        } else {
            format!("{v:.1}")
        }
    } else {
        let s = format!("{v:.6}");
        s.trim_end_matches('0').to_owned()
    }
}

/// Escapes text for SVG content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn panel(scale: Scale) -> Panel {
        Panel {
            title: "runs <a & b>".to_owned(),
            x_label: "second".to_owned(),
            y_label: "req/s".to_owned(),
            lines: vec![
                Line {
                    label: "OK".to_owned(),
                    color: "green".to_owned(),
                    points: vec![(0.0, 1.0), (1.0, 10.0), (2.0, 100.0)],
                },
                Line {
                    label: "timeouts".to_owned(),
                    color: "red".to_owned(),
                    points: vec![(0.0, 0.0), (1.0, f64::NAN), (2.0, 5.0)],
                },
            ],
            shade: Some((1.0, 2.0, "paused".to_owned())),
            scale,
            y_max: None,
        }
    }

    #[test]
    fn a_given_y_max_sets_the_top_but_never_cuts_the_data() {
        let svg = |y_max| {
            render(&[Panel {
                y_max,
                ..panel(Scale::Linear)
            }])
        };
        // The data reach 100; a common top of 500 is kept...
        assert!(svg(Some(500.0)).contains(">500<"));
        assert!(!svg(None).contains(">500<"));
        // ...and one below the data is raised to them.
        assert!(svg(Some(10.0)).contains(">100<"));
    }

    #[test]
    fn renders_a_well_formed_document() {
        let svg = render(&[panel(Scale::Linear), panel(Scale::Log)]);
        assert!(svg.starts_with("<svg "));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains(r#"height="520""#), "two panels stacked");
        assert!(svg.contains("runs &lt;a &amp; b&gt;"), "titles are escaped");
        assert!(
            !svg.contains("NaN") && !svg.contains("inf"),
            "no invalid numbers"
        );
        assert_eq!(svg.matches("paused").count(), 2);
        // Linear: one path per line; log: the zero point of "timeouts" is left out but the
        // line still has its other point.
        assert_eq!(svg.matches("<path").count(), 4);
        // Log ticks are powers of ten.
        assert!(svg.contains(">100</text>"));
    }

    #[test]
    fn empty_panels_do_not_break() {
        let svg = render(&[Panel::default()]);
        assert!(svg.contains("</svg>"));
        assert!(!svg.contains("NaN"));
        let svg = render(&[]);
        assert!(svg.contains("</svg>"));
    }

    #[test]
    fn nice_steps() {
        assert!((nice_step(0.7) - 1.0).abs() < 1e-12);
        assert!((nice_step(1.5) - 2.0).abs() < 1e-12);
        assert!((nice_step(3.0) - 5.0).abs() < 1e-12);
        assert!((nice_step(7.0) - 10.0).abs() < 1e-12);
        assert!((nice_step(42.0) - 50.0).abs() < 1e-12);
        assert!((nice_step(0.0) - 1.0).abs() < 1e-12);
        assert_eq!(format_number(0.1), "0.1");
        assert_eq!(format_number(20.0), "20");
    }
}
