//! The report's charts, drawn with plotters into inline SVG: bar charts (bars of several
//! series side by side or over each other, an optional line of points over them, a word
//! above chosen bars) and heat maps. Legends are HTML beside the SVG, so a reader's
//! browser lays their text out; every colour here differs from the others in lightness
//! too (Okabe and Ito's palette, viridis), so the charts survive greyscale printing.

use std::fmt::Write as _;

use plotters::{
    coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged},
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};

use super::escape;
use crate::report::units::Unit;

/// Dark blue: the main quantity (calls, communication time, measured bandwidth).
pub const BLUE: RGBColor = RGBColor(0x00, 0x5A, 0x8C);
/// Light orange: the second quantity (time beside calls).
pub const ORANGE: RGBColor = RGBColor(0xE6, 0x9F, 0x00);
/// Vermillion, mid-dark: what is wrong (below the expected bandwidth, the late rank).
pub const VERMILLION: RGBColor = RGBColor(0xC0, 0x3C, 0x00);
/// Light grey: the background quantity (elapsed time behind communication time).
pub const GREY: RGBColor = RGBColor(0xC8, 0xC8, 0xC8);
/// Further series, alternating dark and light.
pub const PALETTE: [RGBColor; 6] = [
    BLUE,
    ORANGE,
    RGBColor(0x00, 0x80, 0x60),
    RGBColor(0x56, 0xB4, 0xE9),
    RGBColor(0x6A, 0x3D, 0x9A),
    RGBColor(0xF0, 0xE4, 0x42),
];

const WIDTH: u32 = 560;
const HEIGHT: u32 = 300;
/// Category labels shown at most: past it, every k-th.
const MAX_LABELS: usize = 32;

/// One series of a bar chart: a value (or none) per category.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Fill colour.
    pub colour: RGBColor,
    /// Per category; `None` draws no bar.
    pub values: Vec<Option<f64>>,
}

/// How a bar chart places its series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Side by side within a category.
    Grouped,
    /// Each over the one before, full width (a smaller value in front shows as its share).
    Overlaid,
}

/// A bar chart over named categories.
#[derive(Clone, Debug)]
pub struct BarChart {
    /// The figure's `id` in the page.
    pub id: String,
    /// Caption.
    pub title: String,
    /// Horizontal axis label (what a category is).
    pub x_desc: String,
    /// Vertical axis label, without its unit.
    pub y_desc: String,
    /// Unit of every value.
    pub unit: Unit,
    /// Category labels, left to right.
    pub categories: Vec<String>,
    /// Bars.
    pub series: Vec<Series>,
    /// Placement of the series.
    pub layout: Layout,
    /// Points joined by a line over the bars (an expected curve), in `unit`.
    pub line: Option<Series>,
    /// A word over category `i`'s tallest bar.
    pub marks: Vec<(usize, String)>,
    /// Draw on a log axis when the values span more than this ratio (0: never).
    pub log_above_ratio: f64,
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// An axis of `n` categories, category `i` spanning [i, i + 1), labelled at the middles
/// of every `step`-th (plotters' own key points would fall on round numbers instead).
struct Categories {
    n: usize,
    step: usize,
}

impl Categories {
    fn new(n: usize) -> Categories {
        Categories {
            n: n.max(1),
            step: n.div_ceil(MAX_LABELS).max(1),
        }
    }
}

impl Ranged for Categories {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, (from, to): (i32, i32)) -> i32 {
        from + (f64::from(to - from) * v / self.n as f64).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, _: H) -> Vec<f64> {
        (0..self.n)
            .step_by(self.step)
            .map(|i| i as f64 + 0.5)
            .collect()
    }

    fn range(&self) -> std::ops::Range<f64> {
        0.0..self.n as f64
    }
}

impl BarChart {
    /// A chart with nothing but its labels (add series, line and marks).
    pub fn new(id: &str, title: &str, x_desc: &str, y_desc: &str, unit: Unit) -> BarChart {
        BarChart {
            id: id.to_string(),
            title: title.to_string(),
            x_desc: x_desc.to_string(),
            y_desc: y_desc.to_string(),
            unit,
            categories: Vec::new(),
            series: Vec::new(),
            layout: Layout::Grouped,
            line: None,
            marks: Vec::new(),
            log_above_ratio: 1000.0,
        }
    }

    fn values(&self) -> impl Iterator<Item = f64> + '_ {
        self.series
            .iter()
            .chain(&self.line)
            .flat_map(|s| s.values.iter().flatten().copied())
    }

    /// Whether the axis is logarithmic: the positive values span more than the ratio.
    fn log_axis(&self) -> bool {
        let (lo, hi) = self
            .values()
            .filter(|v| *v > 0.0)
            .fold((f64::MAX, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
        self.log_above_ratio > 0.0 && hi > 0.0 && hi / lo > self.log_above_ratio
    }

    /// The `<figure>`: caption, SVG and legend (an error drawing is said in place of the SVG).
    pub fn render(&self) -> String {
        let legend = self
            .series
            .iter()
            .chain(&self.line)
            .map(|s| (s.name.as_str(), s.colour))
            .collect::<Vec<_>>();
        let svg = svg(&self.title, |out| self.draw_into(out));
        figure(&self.id, &self.title, &svg, &legend)
    }

    fn draw_into(&self, svg: &mut String) -> DrawResult {
        let n = self.categories.len().max(1);
        let log = self.log_axis();
        // On a log axis, values are drawn as their log10 on a linear axis labelled in
        // powers of ten: one code path for both axes, and bars rise from a visible floor.
        let map = |v: f64| if log { v.log10() } else { v };
        let drawn: Vec<f64> = self
            .values()
            .filter(|v| !log || *v > 0.0)
            .map(map)
            .collect();
        let top = drawn.iter().copied().fold(f64::MIN, f64::max);
        let (floor, ceil) = if log {
            let lo = drawn.iter().copied().fold(f64::MAX, f64::min);
            // Half a decade below the smallest value at least, so its bar shows.
            let floor = (lo - 0.5).floor();
            (floor, top.ceil().max(floor + 1.0) + 0.15)
        } else {
            (0.0, if top > 0.0 { top * 1.15 } else { 1.0 })
        };
        let root = SVGBackend::with_string(svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        let rotate = n > 12 || self.categories.iter().any(|c| c.chars().count() > 9);
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(if rotate { 90 } else { 40 })
            .y_label_area_size(78)
            .build_cartesian_2d(Categories::new(n), floor..ceil)?;
        let categories = &self.categories;
        let unit = self.unit;
        let x_label = |x: &f64| {
            categories
                .get(x.floor() as usize)
                .cloned()
                .unwrap_or_default()
        };
        let y_label = |y: &f64| {
            // A log axis names whole decades only, a count axis whole counts.
            if (log || unit == Unit::Count) && y.fract().abs() > 1e-9 {
                String::new()
            } else if log {
                unit.format(10f64.powf(*y))
            } else {
                unit.format(*y)
            }
        };
        let x_style = x_label_style(&root, rotate);
        let mut mesh = chart.configure_mesh();
        mesh.disable_x_mesh()
            .light_line_style(TRANSPARENT)
            .x_desc(&self.x_desc)
            .y_desc(format!(
                "{}{}",
                self.y_desc,
                if log { " (log scale)" } else { "" }
            ))
            .x_label_formatter(&x_label)
            .y_label_formatter(&y_label)
            .x_label_style(x_style)
            .axis_desc_style(("sans-serif", 14));
        if log {
            let labels = (ceil - floor).floor() as usize + 1;
            mesh.y_labels(labels * 2 + 1);
        }
        mesh.draw()?;

        let k = self.series.len().max(1) as f64;
        // A few categories get bars of the width they would have among four.
        let span = 0.8 * (n as f64 / 4.0).min(1.0);
        let start = 0.5 - span / 2.0;
        for (s_index, s) in self.series.iter().enumerate() {
            let (offset, width) = match self.layout {
                Layout::Grouped => (start + span * s_index as f64 / k, span / k),
                Layout::Overlaid => (start, span),
            };
            let bars = s.values.iter().enumerate().filter_map(|(i, v)| {
                let v = (*v)?;
                if log && v <= 0.0 {
                    return None;
                }
                let x0 = i as f64 + offset;
                Some(Rectangle::new(
                    [(x0, floor), (x0 + width, map(v))],
                    s.colour.filled(),
                ))
            });
            chart.draw_series(bars)?;
        }
        if let Some(line) = &self.line {
            let points: Vec<(f64, f64)> = line
                .values
                .iter()
                .enumerate()
                .filter_map(|(i, v)| {
                    v.filter(|v| !log || *v > 0.0)
                        .map(|v| (i as f64 + 0.5, map(v)))
                })
                .collect();
            chart.draw_series(LineSeries::new(points.clone(), line.colour.stroke_width(2)))?;
            chart.draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 4, line.colour.filled())),
            )?;
        }
        let mark_style = ("sans-serif", 12)
            .into_font()
            .into_text_style(&root)
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        let tallest = |i: usize| {
            self.series
                .iter()
                .filter_map(|s| s.values.get(i).copied().flatten())
                .filter(|v| !log || *v > 0.0)
                .map(map)
                .fold(floor, f64::max)
        };
        chart.draw_series(self.marks.iter().map(|(i, word)| {
            Text::new(
                word.clone(),
                (*i as f64 + 0.5, tallest(*i) + (ceil - floor) * 0.01),
                mark_style.clone(),
            )
        }))?;
        root.present()?;
        Ok(())
    }
}

/// A heat map: a coloured cell per (row, column) with a value, none where there is none.
#[derive(Clone, Debug)]
pub struct HeatMap {
    /// The figure's `id` in the page.
    pub id: String,
    /// Caption.
    pub title: String,
    /// Row labels, top to bottom.
    pub rows: Vec<String>,
    /// Column labels, left to right.
    pub cols: Vec<String>,
    /// What a row is.
    pub row_desc: String,
    /// What a column is.
    pub col_desc: String,
    /// (row, column, value), values positive.
    pub cells: Vec<(usize, usize, f64)>,
    /// Unit of the values.
    pub unit: Unit,
    /// Colours on a log scale of the values (else linear from zero).
    pub log: bool,
}

impl HeatMap {
    /// The `<figure>`: caption, SVG and the colour scale.
    pub fn render(&self) -> String {
        let drawn = svg(&self.title, |out| self.draw_into(out));
        let (lo, hi) = self.range();
        let mut scale = String::new();
        let (lo, how) = if self.log {
            (lo, "log scale")
        } else {
            (0.0, "linear")
        };
        let _ = write!(
            scale,
            "<p class=\"scale\">colour: {} (dark) to {} (light), {how}; no cell: nothing</p>",
            escape(&self.unit.format(lo)),
            escape(&self.unit.format(hi))
        );
        figure(&self.id, &self.title, &(drawn + &scale), &[])
    }

    fn range(&self) -> (f64, f64) {
        self.cells
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), c| (lo.min(c.2), hi.max(c.2)))
    }

    fn draw_into(&self, svg: &mut String) -> DrawResult {
        let (rows, cols) = (self.rows.len().max(1), self.cols.len().max(1));
        let (width, height) = (640u32, (160 + 14 * rows as u32).clamp(240, 620));
        let root = SVGBackend::with_string(svg, (width, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let rotate = cols > 12;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(if rotate { 90 } else { 50 })
            .y_label_area_size(70)
            .build_cartesian_2d(Categories::new(cols), Categories::new(rows))?;
        let x_style = x_label_style(&root, rotate);
        // Row 0 at the top, as in a table.
        let col_label = |x: &f64| {
            self.cols
                .get(x.floor() as usize)
                .cloned()
                .unwrap_or_default()
        };
        let row_label = |y: &f64| {
            self.rows
                .get(rows - 1 - (y.floor() as usize).min(rows - 1))
                .cloned()
                .unwrap_or_default()
        };
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc(&self.col_desc)
            .y_desc(&self.row_desc)
            .x_label_formatter(&col_label)
            .y_label_formatter(&row_label)
            .x_label_style(x_style)
            .axis_desc_style(("sans-serif", 14))
            .draw()?;
        let (lo, hi) = self.range();
        let scale = |v: f64| -> f32 {
            let (v, lo, hi) = if self.log {
                (v.log10(), lo.log10(), hi.log10())
            } else {
                (v, 0.0, hi)
            };
            if hi > lo {
                ((v - lo) / (hi - lo)) as f32
            } else {
                1.0
            }
        };
        let map = ViridisRGB;
        chart.draw_series(self.cells.iter().map(|&(row, col, v)| {
            let y = (rows - 1 - row) as f64;
            Rectangle::new(
                [(col as f64, y), (col as f64 + 1.0, y + 1.0)],
                map.get_color(scale(v)).filled(),
            )
        }))?;
        root.present()?;
        Ok(())
    }
}

/// The category axis's labels, turned upright when there are many or long ones.
fn x_label_style(
    root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    rotate: bool,
) -> TextStyle<'static> {
    let font = ("sans-serif", 12).into_font();
    if rotate {
        font.transform(FontTransform::Rotate270)
            .into_text_style(root)
            .pos(Pos::new(HPos::Right, VPos::Center))
    } else {
        font.into_text_style(root)
    }
}

/// What `draw` draws, made readable by assistive technology (a role and a title), or
/// the error in its place.
fn svg(title: &str, draw: impl FnOnce(&mut String) -> DrawResult) -> String {
    let mut svg = String::new();
    match draw(&mut svg) {
        Ok(()) => accessible(&svg, title),
        Err(e) => format!(
            "<p class=\"error\">could not draw: {}</p>",
            escape(&e.to_string())
        ),
    }
}

/// `svg` with a role and a title.
fn accessible(svg: &str, title: &str) -> String {
    svg.replacen(
        "<svg ",
        &format!("<svg role=\"img\" aria-label=\"{}\" ", escape(title)),
        1,
    )
    .replacen('>', &format!("><title>{}</title>", escape(title)), 1)
}

/// A `<figure>` with a caption, a body and, when given, a legend of coloured swatches.
pub fn figure(id: &str, title: &str, body: &str, legend: &[(&str, RGBColor)]) -> String {
    let mut o = String::new();
    let _ = write!(
        o,
        "<figure class=\"chart\" id=\"{}\"><figcaption>{}</figcaption>",
        escape(id),
        escape(title)
    );
    o.push_str(body);
    if !legend.is_empty() {
        o.push_str("<ul class=\"legend\">");
        for (name, c) in legend {
            let _ = write!(
                o,
                "<li><span class=\"swatch\" data-fill=\"{}\" style=\"background:{}\"></span>{}</li>",
                hex(*c),
                hex(*c),
                escape(name)
            );
        }
        o.push_str("</ul>");
    }
    o.push_str("</figure>\n");
    o
}

/// `#RRGGBB`, as plotters writes fills.
pub fn hex(c: RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(values: &[f64]) -> BarChart {
        let mut c = BarChart::new("t", "T <x>", "size", "calls", Unit::Count);
        c.categories = (0..values.len()).map(|i| format!("c{i}")).collect();
        c.series.push(Series {
            name: "calls".into(),
            colour: BLUE,
            values: values.iter().map(|v| Some(*v)).collect(),
        });
        c
    }

    fn bars(html: &str, c: RGBColor) -> usize {
        html.matches(&format!(" fill=\"{}\"", hex(c))).count()
    }

    #[test]
    fn a_bar_per_value_on_either_axis() {
        let linear = chart(&[3.0, 5.0, 1.0]);
        assert!(!linear.log_axis());
        assert_eq!(bars(&linear.render(), BLUE), 3);
        let log = chart(&[1.0, 1e6, 20.0, 4.0]);
        assert!(log.log_axis());
        let html = log.render();
        assert_eq!(bars(&html, BLUE), 4);
        assert!(html.contains("(log scale)"));
        assert!(html.contains("T &lt;x&gt;"), "title escaped");
    }
}
