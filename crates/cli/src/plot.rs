//! A small SVG line-chart writer for `uroce bench`: log2 sizes on x, a log
//! scale on y, one line per series, two panels side by side. No
//! dependencies; a PNG is made from it with `rsvg-convert` when present.

use std::fmt::Write as _;

/// One line: a name, a colour, and (x, y) points with x > 0 and y > 0.
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) color: &'static str,
    pub(crate) dashed: bool,
    pub(crate) points: Vec<(f64, f64)>,
}

/// One chart.
pub(crate) struct Panel {
    pub(crate) title: String,
    pub(crate) y_label: String,
    pub(crate) series: Vec<Series>,
}

const W: f64 = 560.0;
const H: f64 = 400.0;
const ML: f64 = 70.0;
const MR: f64 = 20.0;
const MT: f64 = 40.0;
const MB: f64 = 60.0;

pub(crate) const COLORS: [&str; 8] =
    ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];

/// Renders the panels side by side with a caption line under them.
pub(crate) fn svg(panels: &[Panel], caption: &str) -> String {
    let total_w = W * panels.len() as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{}" font-family="sans-serif" font-size="12">"#,
        H + 30.0
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, p) in panels.iter().enumerate() {
        panel(&mut s, p, W * i as f64);
    }
    let _ = writeln!(s, r##"<text x="10" y="{}" fill="#555">{}</text>"##, H + 20.0, esc(caption));
    s.push_str("</svg>\n");
    s
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn size_label(x: f64) -> String {
    let v = x as u64;
    if v >= 1 << 20 {
        format!("{}M", v >> 20)
    } else if v >= 1 << 10 {
        format!("{}K", v >> 10)
    } else {
        v.to_string()
    }
}

fn panel(s: &mut String, p: &Panel, ox: f64) {
    let pts = p.series.iter().flat_map(|se| se.points.iter()).filter(|(x, y)| *x > 0.0 && *y > 0.0);
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x.log2());
        x1 = x1.max(x.log2());
        y0 = y0.min(y.log10());
        y1 = y1.max(y.log10());
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (1.0, 23.0, 0.0, 1.0);
    }
    let (x0, x1) = (x0.floor(), x1.ceil().max(x0.floor() + 1.0));
    let (y0, y1) = (y0.floor(), y1.ceil().max(y0.floor() + 1.0));
    let pw = W - ML - MR;
    let ph = H - MT - MB;
    let fx = |x: f64| ox + ML + (x.log2() - x0) / (x1 - x0) * pw;
    let fy = |y: f64| MT + ph - (y.log10() - y0) / (y1 - y0) * ph;
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" font-size="15" font-weight="bold">{}</text>"#,
        ox + ML,
        esc(&p.title)
    );
    // Grid and axes.
    let mut e = y0;
    while e <= y1 {
        let y = MT + ph - (e - y0) / (y1 - y0) * ph;
        let _ = writeln!(
            s,
            r##"<line x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            ox + ML,
            ox + ML + pw,
            ox + ML - 6.0,
            y + 4.0,
            fmt_pow10(e)
        );
        e += 1.0;
    }
    let mut k = x0;
    while k <= x1 {
        let x = ox + ML + (k - x0) / (x1 - x0) * pw;
        let _ =
            writeln!(s, r##"<line x1="{x}" y1="{MT}" x2="{x}" y2="{}" stroke="#eee"/>"##, MT + ph);
        if (k as i64) % 2 == 1 || x1 - x0 < 12.0 {
            let _ = writeln!(
                s,
                r#"<text x="{x}" y="{}" text-anchor="middle">{}</text>"#,
                MT + ph + 16.0,
                size_label(2f64.powf(k))
            );
        }
        k += 1.0;
    }
    let _ = writeln!(
        s,
        r##"<rect x="{}" y="{MT}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##,
        ox + ML
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">message size [bytes]</text>"#,
        ox + ML + pw / 2.0,
        MT + ph + 36.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate({},{}) rotate(-90)" text-anchor="middle">{}</text>"#,
        ox + 16.0,
        MT + ph / 2.0,
        esc(&p.y_label)
    );
    for (i, se) in p.series.iter().enumerate() {
        let path: Vec<String> = se
            .points
            .iter()
            .filter(|(x, y)| *x > 0.0 && *y > 0.0)
            .map(|&(x, y)| format!("{:.1},{:.1}", fx(x), fy(y)))
            .collect();
        if path.is_empty() {
            continue;
        }
        let dash = if se.dashed { r#" stroke-dasharray="6,4""# } else { "" };
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
            path.join(" "),
            se.color
        );
        for pt in &path {
            let (x, y) = pt.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(s, r#"<circle cx="{x}" cy="{y}" r="2.5" fill="{}"/>"#, se.color);
        }
        let ly = MT + 14.0 + 16.0 * i as f64;
        let lx = ox + ML + 10.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{}" x2="{}" y2="{}" stroke="{}" stroke-width="2"{dash}/><text x="{}" y="{ly}">{}</text>"#,
            ly - 4.0,
            lx + 18.0,
            ly - 4.0,
            se.color,
            lx + 24.0,
            esc(&se.name)
        );
    }
}

fn fmt_pow10(e: f64) -> String {
    let v = 10f64.powf(e);
    if (0.001..1e7).contains(&v) { format!("{v}") } else { format!("1e{e}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_points_legend_and_axes() {
        let p = Panel {
            title: "Bandwidth".into(),
            y_label: "MB/s".into(),
            series: vec![Series {
                name: "uroce write".into(),
                color: COLORS[0],
                dashed: false,
                points: vec![(2.0, 1.0), (1024.0, 500.0), (8.0 * 1048576.0, 3000.0)],
            }],
        };
        let s = svg(&[p], "machine <x>");
        assert!(s.starts_with("<svg"));
        assert_eq!(s.matches("<circle").count(), 3);
        assert!(s.contains("uroce write") && s.contains("machine &lt;x&gt;"));
        assert!(s.contains(">8M<") || s.contains(">4M<"), "{s}");
        assert!(s.trim_end().ends_with("</svg>"));
    }
}
