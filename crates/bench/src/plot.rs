//! PNG charts laid out like the UKSM paper's Figure 9 (FAST '18 §8.1):
//! 9a memory saved vs time and 9b CPU vs time are [`line_chart`]s, one line
//! per system; 9c saving vs CPU is a [`scatter_chart`] of labelled points.
//!
//! How it is drawn: `plotters` with its bitmap backend and PNG encoder only.
//! Text goes through plotters' `ab_glyph` path (a pure-Rust rasterizer) with
//! DejaVu Sans embedded in the binary by the `dejavu` crate, so the charts
//! render on a fresh machine with no fontconfig or freetype installed and
//! look the same on every machine. The font is registered once, as
//! plotters' `sans-serif` family, before the first chart.
//!
//! Layout: the plot on the left, the legend in its own panel on the right
//! (never over a curve). Colours follow the order systems are given in, so
//! the harness gets the same colour per system in 9a, 9b and 9c by passing
//! systems in the same order. Non-finite values are skipped; an empty chart
//! still gets its axes, title and a "no data" note.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use crate::series::Series;

/// Width and height of every chart, pixels.
pub const CHART_SIZE: (u32, u32) = (1200, 720);

/// Width of the legend panel on the right of every chart, pixels.
pub const LEGEND_WIDTH: u32 = 240;

/// A chart that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the chart {path}: {reason}")]
pub struct PlotError {
    /// The PNG file that was being written.
    pub path: PathBuf,
    /// What went wrong.
    pub reason: String,
}

impl PlotError {
    fn new(path: &Path, reason: impl ToString) -> PlotError {
        PlotError {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        }
    }
}

/// Distinct colours for up to 10 systems (Tableau 10), then Palette99.
const COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn colour(i: usize) -> RGBColor {
    match COLOURS.get(i) {
        Some(&c) => c,
        None => {
            let c = Palette99::pick(i).to_rgba();
            RGBColor(c.0, c.1, c.2)
        }
    }
}

const FONT: &str = "sans-serif";

fn register_embedded_font(path: &Path) -> Result<(), PlotError> {
    static ONCE: Once = Once::new();
    let mut ok = true;
    ONCE.call_once(|| {
        ok = register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok();
    });
    if ok {
        Ok(())
    } else {
        Err(PlotError::new(
            path,
            "the embedded DejaVu Sans font is invalid",
        ))
    }
}

/// Axis range covering `values` (finite ones), always including 0 and
/// never empty, with 5 % headroom above.
fn range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    padded_range(values, 0.05)
}

/// [`range`] with `headroom` (a fraction of the span) above.
fn padded_range(values: impl Iterator<Item = f64>, headroom: f64) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = (0.0f64, 0.0f64);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
        hi = lo + 1.0;
    }
    let pad = (hi - lo) * 0.05;
    (if lo < 0.0 { lo - pad } else { lo })..hi + (hi - lo) * headroom
}

fn finite(p: &(f64, f64)) -> bool {
    p.0.is_finite() && p.1.is_finite()
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

/// How a legend entry shows its system.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Marker {
    /// A short line (line charts).
    Line,
    /// A dot (scatter charts).
    Dot,
}

/// What both charts share: the file, the texts and the legend.
struct Layout<'a> {
    path: &'a Path,
    title: &'a str,
    x_label: &'a str,
    y_label: &'a str,
    legend: &'a [(String, RGBColor)],
    marker: Marker,
}

/// Writes a PNG of `series` as lines against time (seconds on x), one line
/// per series in its own colour, legend = `Series::system`. Figures 9a
/// (memory saved vs time) and 9b (CPU vs time). Creates missing parent
/// directories.
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[&Series],
) -> Result<(), PlotError> {
    let legend: Vec<(String, RGBColor)> = series
        .iter()
        .enumerate()
        .map(|(i, s)| (s.system.clone(), colour(i)))
        .collect();
    let points = || {
        series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|p| finite(p))
    };
    let xs = range(points().map(|p| p.0));
    let ys = range(points().map(|p| p.1));
    let empty = points().next().is_none();
    let layout = Layout {
        path,
        title,
        x_label,
        y_label,
        legend: &legend,
        marker: Marker::Line,
    };
    layout.draw(xs, ys, empty, |chart| {
        for (s, (_, c)) in series.iter().zip(&legend) {
            let pts: Vec<(f64, f64)> = s.points.iter().copied().filter(finite).collect();
            match pts.len() {
                0 => {}
                // One sample is no line: show it as a dot.
                1 => {
                    chart.draw_series(std::iter::once(Circle::new(pts[0], 4, c.filled())))?;
                }
                _ => {
                    chart.draw_series(LineSeries::new(pts, c.stroke_width(2)))?;
                }
            }
        }
        Ok(())
    })
}

/// Writes a PNG of labelled points `(system, x, y)`, each point in its
/// system's colour (by order of first appearance) with the system's name
/// beside it. Figure 9c (memory saved vs CPU spent). Creates missing parent
/// directories.
pub fn scatter_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    points: &[(String, f64, f64)],
) -> Result<(), PlotError> {
    let mut legend: Vec<(String, RGBColor)> = Vec::new();
    for (name, _, _) in points {
        if !legend.iter().any(|(n, _)| n == name) {
            legend.push((name.clone(), colour(legend.len())));
        }
    }
    let good = || points.iter().filter(|p| finite(&(p.1, p.2)));
    // Room on the right for the label of the rightmost point.
    let xs = padded_range(good().map(|p| p.1), 0.18);
    let ys = range(good().map(|p| p.2));
    let empty = good().next().is_none();
    let label = (FONT, 15).into_font().color(&BLACK);
    let layout = Layout {
        path,
        title,
        x_label,
        y_label,
        legend: &legend,
        marker: Marker::Dot,
    };
    layout.draw(xs, ys, empty, |chart| {
        for (name, x, y) in good() {
            let c = legend
                .iter()
                .find(|(n, _)| n == name)
                .map_or(BLACK, |l| l.1);
            chart.draw_series(std::iter::once(
                EmptyElement::at((*x, *y))
                    + Circle::new((0, 0), 6, c.filled())
                    + Text::new(name.clone(), (9, -18), label.clone()),
            ))?;
        }
        Ok(())
    })
}

type Chart<'a, 'b> = ChartContext<
    'a,
    BitMapBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;
type DrawResult =
    Result<(), DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>>;

impl Layout<'_> {
    fn err<E: std::error::Error + Send + Sync>(
        &self,
    ) -> impl Fn(DrawingAreaErrorKind<E>) -> PlotError + '_ {
        |e| PlotError::new(self.path, e)
    }

    /// Draws the frame: background, title, the split into plot and legend
    /// panels, and the legend entries (marker, name) in the legend panel.
    fn frame<'b>(&self, root: &Area<'b>) -> Result<Area<'b>, PlotError> {
        root.fill(&WHITE).map_err(self.err())?;
        let root = root
            .margin(8, 0, 0, 0)
            .titled(self.title, (FONT, 28).into_font().color(&BLACK))
            .map_err(self.err())?;
        let (plot, side) = root.split_horizontally(CHART_SIZE.0 - LEGEND_WIDTH);
        let style = (FONT, 18).into_font().color(&BLACK);
        for (i, (name, c)) in self.legend.iter().enumerate() {
            let y = 60 + 28 * i as i32;
            match self.marker {
                Marker::Line => {
                    side.draw(&PathElement::new(vec![(10, y), (40, y)], c.stroke_width(3)))
                }
                Marker::Dot => side.draw(&Circle::new((25, y), 6, c.filled())),
            }
            .map_err(self.err())?;
            side.draw(&Text::new(name.as_str(), (50, y - 10), style.clone()))
                .map_err(self.err())?;
        }
        Ok(plot)
    }

    /// Draws the whole chart: frame, axes with labels and grid, the data
    /// (drawn by `body`), a "no data" note when `empty`, and writes the PNG.
    fn draw(
        &self,
        xs: std::ops::Range<f64>,
        ys: std::ops::Range<f64>,
        empty: bool,
        body: impl FnOnce(&mut Chart<'_, '_>) -> DrawResult,
    ) -> Result<(), PlotError> {
        let path = self.path;
        register_embedded_font(path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| PlotError::new(path, e))?;
        }
        let root = BitMapBackend::new(path, CHART_SIZE).into_drawing_area();
        let plot = self.frame(&root)?;
        let mut chart = ChartBuilder::on(&plot)
            .margin(16)
            .x_label_area_size(56)
            .y_label_area_size(88)
            .build_cartesian_2d(xs, ys)
            .map_err(self.err())?;
        chart
            .configure_mesh()
            .x_desc(self.x_label)
            .y_desc(self.y_label)
            .axis_desc_style((FONT, 20))
            .label_style((FONT, 16))
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .light_line_style(RGBColor(235, 235, 235))
            .bold_line_style(RGBColor(200, 200, 200))
            .draw()
            .map_err(self.err())?;
        if empty {
            plot.draw(&Text::new(
                "no data",
                (CHART_SIZE.0 as i32 / 3, CHART_SIZE.1 as i32 / 2),
                (FONT, 24).into_font().color(&RGBColor(127, 127, 127)),
            ))
            .map_err(self.err())?;
        }
        body(&mut chart).map_err(self.err())?;
        root.present().map_err(self.err())?;
        Ok(())
    }
}

/// A tick label: no trailing zeros ("2500", "0.25", "1.5").
fn tick(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_includes_zero_and_pads() {
        let r = range([2.0, 10.0].into_iter());
        assert_eq!(r.start, 0.0);
        assert!((r.end - 10.5).abs() < 1e-9);
        let r = range([-4.0, 6.0].into_iter());
        assert!(r.start < -4.0 && r.end > 6.0);
    }

    #[test]
    fn ticks_have_no_trailing_zeros() {
        assert_eq!(tick(2500.0), "2500");
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(1.5), "1.5");
        assert_eq!(tick(-0.0001), "0");
        assert_eq!(tick(0.0), "0");
    }

    #[test]
    fn range_is_never_empty() {
        let r = range(std::iter::empty());
        assert!(r.end > r.start);
        let r = range([0.0, 0.0, f64::NAN, f64::INFINITY].into_iter());
        assert_eq!(r.start, 0.0);
        assert!(r.end > 0.0 && r.end.is_finite());
    }

    #[test]
    fn colours_are_distinct_for_many_systems() {
        let cs: Vec<RGBColor> = (0..20).map(colour).collect();
        for i in 0..cs.len() {
            for j in i + 1..cs.len() {
                assert_ne!(cs[i], cs[j], "colours {i} and {j}");
            }
        }
    }
}
